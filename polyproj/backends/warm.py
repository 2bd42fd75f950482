"""A warm start is a hint: what the backends that verify a warm-started answer share.

:func:`kkt_sizes` gives the scales a KKT test of a :class:`~polyproj.solution.Solution` is relative to (the
largest term of the primal sums ``x, Cx`` and of the stationarity sum ``Px, q, Cᵀz, z_box``); each backend holds
its residuals to its own tolerances at those scales. :func:`solved_again_cold` is the answer of the cold re-solve
that replaces an unverified warm-started one, with the costs of both runs.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..solution import Solution

__all__ = ["kkt_sizes", "solved_again_cold"]


def kkt_sizes(sol: Solution) -> tuple[float, float] | None:
    """``(size_p, size_d)``: the largest primal and stationarity terms of ``sol``; None where it is not finite."""
    qp, x, z, zb = sol.qp, sol.x, sol.z, sol.z_box
    if not (np.isfinite(x).all() and np.isfinite(z).all() and np.isfinite(zb).all()):
        return None
    cx = np.asarray(qp.C @ x).reshape(-1) if qp.m else np.zeros(0)
    cz = np.asarray(qp.C.T @ z).reshape(-1) if qp.m else np.zeros(0)
    size_p = max(float(np.max(np.abs(v), initial=0.0)) for v in (x, cx))
    size_d = max(float(np.max(np.abs(v), initial=0.0)) for v in (np.asarray(qp.P @ x).reshape(-1), qp.q, cz, zb))
    return size_p, size_d


def solved_again_cold(warm: Solution, cold: Solution) -> Solution:
    """``cold`` with the iterations and times of both runs, and ``info["warm_start"]`` saying why."""
    return replace(cold, iterations=warm.iterations + cold.iterations, solve_time=warm.solve_time + cold.solve_time,
                   setup_time=warm.setup_time + cold.setup_time,
                   info={**cold.info, "warm_start": f"solved again cold: the warm-started answer "
                         f"({warm.info.get('raw_status', warm.status.name)}) was not verified"})
