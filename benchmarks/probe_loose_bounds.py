"""Probe: QPs at unit scale inside loose ("big-M") bounds, on every backend — is a SOLVED answer right?

Cases: ``min ½|x|² − x₁ − 2x₂`` s.t. ``x₁ + x₂ <= 1`` in a box of ±B (answer (0, 1)); an LP whose answer sits
at a bound B; an LP with a loose box that does not bind (answer (1, 0)); a singular P whose answer sits at
a bound; the QP with all data at scale s (the case the guard's normalisation is for). Prints per case the
status of each backend, ``!!`` where a SOLVED (or inaccurate) answer's objective is off by more than 1e-6
relative, or where the backend did not solve (docs/checking_a_backend.md, "scale").

Run::

    .venv/bin/python benchmarks/probe_loose_bounds.py
"""

from __future__ import annotations

import warnings

import numpy as np

import polyproj as pp


def cases():
    for B in (1e4, 1e8, 1e10, 1e12, 1e14):
        yield f"QP in a box of ±{B:.0e}", pp.QP(P=np.eye(2), q=[-1, -2], C=[[1, 1]], l=[-np.inf], u=[1],
                                                 lb=[-B, -B], ub=[B, B]), -1.5
    for B in (1e4, 1e8, 1e10, 1e12):
        yield f"LP at a bound {B:.0e}", pp.QP(P=np.zeros((2, 2)), q=[-1, 0], C=[[0, 1]], l=[-1], u=[1],
                                               lb=[0, -B], ub=[B, B]), -B
    for s in (1e8, 1e12):
        yield f"data at scale {s:.0e}", pp.QP(P=np.eye(2), q=[-s, -2 * s], C=[[1, 1]], l=[-np.inf], u=[s],
                                              lb=[-10 * s, -10 * s], ub=[10 * s, 10 * s]), -1.5 * s * s
    for B in (1e8, 1e10, 1e12):
        yield f"LP in a loose box {B:.0e}", pp.QP(P=np.zeros((2, 2)), q=[1, 2], C=[[1, 1]], l=[1], u=[np.inf],
                                                   lb=[0, 0], ub=[B, B]), 1.0
    for B in (1e8, 1e10):
        yield f"singular P at a bound {B:.0e}", pp.QP(P=np.diag([1.0, 0.0]), q=[-1, -1], lb=[-B, -B],
                                                       ub=[B, B]), -0.5 - B


def main() -> None:
    warnings.simplefilter("ignore")
    backends = [b for b in pp.available_backends() if b != "cupy"]
    wrong = 0
    for label, qp, best in cases():
        row = []
        for be in backends:
            sol = pp.solve_qp(qp, be, eps_abs=1e-8, time_limit=10)
            right = sol.status.ok and abs(sol.objective - best) <= 1e-6 * (1 + abs(best))
            wrong += sol.status.ok and not right
            row.append(f"{be}:{sol.status.name[:8]}{'' if right else '!!'}")
        print(f"{label:28s}", " ".join(row))
    print(f"SOLVED answers that are wrong: {wrong}")


if __name__ == "__main__":
    main()
