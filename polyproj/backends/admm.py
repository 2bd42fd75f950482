"""``admm`` backend: polyproj's batched ADMM (:mod:`polyproj.solvers.admm`) on one shared factorisation.

Glue only. ``solve`` / ``solve_batch`` run the ADMM to the unified tolerances (residual stop,
infeasibility certificates). ``solve_projections`` runs in the input's namespace and device; with
``rough=True`` it stops once the active faces are identified and leaves the rest to the exact polish,
in ``start_dtype`` (float32 by default: the identified faces are the same and the matrix products twice
as fast). Constraint matrices must be shared by the batch.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import numpy as np
from array_api_compat import array_namespace
from array_api_compat import device as _device

from ..errors import ProblemError
from ..polydata import PolyData
from ..problem import QP
from ..runtime import small_work
from ..solution import BatchSolution, ElementQPs, Solution, Status
from .base import Capabilities, QPSolver, report_batch
from .options import positive_int, unit_interval, within
from .projection import ProjectionStart

__all__ = ["ADMMSolver"]

_CODES = (Status.SOLVED, Status.MAX_ITER, Status.PRIMAL_INFEASIBLE, Status.DUAL_INFEASIBLE, Status.TIME_LIMIT,
          Status.SOLVED_INACCURATE, Status.NUMERICAL_ERROR)
#: rough projections: the polish's candidate thresholds come from this accuracy, and distance candidates
#: from a small fraction of it (the ADMM's multipliers are exact zeros off the identified rows)
_ROUGH_ACCURACY, _ROUGH_DIST = 1e-3, 0.03


class ADMMSolver(QPSolver):
    """Batched ADMM (OSQP splitting) on one factorisation of ``P + σI + CᵀρC``.

    Backend-specific options: ``rho`` (10), ``alpha`` (over-relaxation, 1.6), ``check`` (iterations
    between stopping tests, 25), ``stable`` (rough projections: fraction of samples whose faces may still
    change at the stop; default :data:`STABLE` = 0.05 for a batch of at least 64, else 0), ``start_dtype``
    (``"float32"`` or ``"float64"``: rough projections), ``rough_iter`` (iteration limit of rough
    projections, 300).
    """

    name = "admm"
    capabilities = Capabilities(dense=True, sparse=False, batch=True, warm_start=False, infeasibility=True,
                                array_api=True, early_stop=True, start_only=True)
    requires = ("array_api_compat",)
    extra = "ipm"
    options = {"rho": 10.0, "alpha": 1.6, "check": 25, "stable": None, "start_dtype": "float32", "rough_iter": 300}
    option_checks: ClassVar[dict[str, Any]] = {
        "rho": within(0.0, 1e8), "alpha": within(0.0, 2.0), "check": positive_int, "stable": unit_interval,
        "start_dtype": lambda v: None if str(v).replace("torch.", "") in ("float32", "float64")
        else "must be 'float32' or 'float64'", "rough_iter": positive_int}

    @classmethod
    def version(cls) -> str:
        """The ADMM is polyproj's own: its version is polyproj's."""
        from .._version import __version__

        return f"polyproj {__version__}"

    def _opt(self, key: str) -> Any:
        return self.backend_options.get(key, self.options[key])

    def _deadline(self) -> float | None:
        tl = self.settings["time_limit"]
        return None if tl is None else time.perf_counter() + float(tl)

    # ---------------------------------------------------------------- general QPs
    def solve(self, qp: QP, warm_start: Any = None) -> Solution:
        """One QP (a batch of one)."""
        return self.solve_batch(qp, q=qp.q[None, :]).solution(0)

    def solve_batch(self, qp, q=None, l=None, u=None, lb=None, ub=None, warm_start=None) -> BatchSolution:
        """Native batch: one factorisation for P and C, the vectors per element (residual stop)."""
        from ..solvers import admm

        vecs = self._batch_vectors(qp, q=q, l=l, u=u, lb=lb, ub=ub)
        size = self._batch_size(vecs)
        t0 = time.perf_counter()
        P = qp.P.toarray() if hasattr(qp.P, "toarray") else qp.P
        C = qp.C.toarray() if hasattr(qp.C, "toarray") else qp.C
        Q = vecs.get("q", np.broadcast_to(qp.q, (size, qp.n)))
        lo, hi, nb = _row_bounds(np, vecs.get("l", qp.l), vecs.get("u", qp.u), vecs.get("lb", qp.lb),
                                 vecs.get("ub", qp.ub), size, qp.m, qp.n)
        S = admm.setup(np.asarray(P, dtype=np.float64), np.asarray(C, dtype=np.float64), lo, hi, nb,
                       rho=float(self._opt("rho")), alpha=float(self._opt("alpha")))
        stop = admm.Stop("residuals", float(self.settings["eps_abs"]), float(self.settings["eps_rel"]),
                         int(self.settings["max_iter"] or 4000), int(self._opt("check")), deadline=self._deadline())
        with small_work(True, float(size) * (qp.m + nb) * qp.n):
            res = admm.solve(S, np.ascontiguousarray(Q, dtype=np.float64), stop)
        x, w = np.asarray(res.x), np.asarray(res.w)
        z, z_box = w[:, : qp.m], (w[:, qp.m:] if nb else np.zeros((size, qp.n)))
        status = tuple(_CODES[int(c)] for c in np.asarray(res.code))
        bad = np.array([s in (Status.PRIMAL_INFEASIBLE, Status.DUAL_INFEASIBLE) for s in status])
        if bad.any():
            x, z, z_box = x.copy(), z.copy(), z_box.copy()
            x[bad], z[bad], z_box[bad] = np.nan, np.nan, np.nan
        wall = time.perf_counter() - t0
        iterations = np.asarray(res.stopped_at, dtype=np.int64)  # each element's: where it met the tolerances
        if self.settings["verbose"]:
            residuals = None if res.prim_res is None else {"primal residual": res.prim_res,
                                                             "dual residual": res.dual_res}
            report_batch(self.name, status, iterations, wall, residuals)
        return BatchSolution(x=x, z=z, z_box=z_box, status=status, iterations=iterations,
                             solve_time=wall, backend=self.name, qps=ElementQPs(qp, vecs, size))

    # ---------------------------------------------------------------- projections
    def solve_projections(self, X: Any, data: PolyData, *, rough: bool = False) -> ProjectionStart:
        """Native: the ADMM on the input's namespace and device, ``P = I``; shared matrices only."""
        from ..solvers import admm

        if not data.shared_matrices:
            raise ProblemError("backend 'admm' needs constraint matrices shared by the batch (one factorisation); "
                               "use backend 'ipm' or a CPU backend for per-sample matrices")
        xp = array_namespace(X)
        N, n = X.shape
        dt = _start_dtype(xp, self._opt("start_dtype")) if rough else X.dtype
        with np.errstate(over="ignore"):
            # a right-hand side or bound beyond float32's range (~3.4e38; the pipeline's data are at unit size, and
            # bounds scaled up by tiny points are far beyond their reach) is ±inf there, no limit: the start is only
            # a start, and the float64 polish checks it against the rows as given
            d = data.astype(dt)
        C = xp.concat([d.A, d.B], axis=0)
        a = xp.broadcast_to(d.a, (N, d.m))
        b = xp.broadcast_to(d.b, (N, d.p))
        lo, hi, nb = _row_bounds(xp, xp.concat([xp.full_like(a, -float("inf")), b], axis=1),
                                 xp.concat([a, b], axis=1), d.lb, d.ub, N, d.m + d.p, n)
        S = admm.setup(xp.eye(n, dtype=dt, device=_device(X)), C, lo, hi, nb,
                       rho=float(self._opt("rho")), alpha=float(self._opt("alpha")))
        stop = self._projection_stop(N, rough)
        with small_work(_on_cpu(X), float(N) * (C.shape[0] + n) * n):
            res = admm.solve(S, -xp.astype(X, dt), stop)
        y = xp.astype(res.x, X.dtype)
        w = xp.astype(res.w, X.dtype)
        mult = xp.concat([w[:, : d.m], -w[:, d.m + d.p:], w[:, d.m + d.p:]], axis=1) if nb else \
            xp.concat([w[:, : d.m], xp.zeros((N, 2 * n), dtype=X.dtype, device=_device(X))], axis=1)
        status = tuple(_CODES[int(c)] for c in _host_codes(res.code))
        if rough:
            return ProjectionStart(y, mult, w[:, d.m: d.m + d.p], status, _ROUGH_ACCURACY, _ROUGH_DIST, rough=True)
        return ProjectionStart(y, mult, w[:, d.m: d.m + d.p], status, float(self.settings["eps_abs"]))

    def _projection_stop(self, N: int, rough: bool):
        from ..solvers import admm

        check = int(self._opt("check"))
        if not rough:
            return admm.Stop("residuals", float(self.settings["eps_abs"]), float(self.settings["eps_rel"]),
                             int(self.settings["max_iter"] or 4000), check, deadline=self._deadline())
        stable = self._opt("stable")
        # stragglers allowed at the stop: the polish corrects their few wrong rows (the last few go to
        # DAQP), while every check more costs `check` iterations of the whole batch; below 64 samples a
        # straggler costs a polish round of its own (docs/performance.md)
        stable = (STABLE if N >= STABLE_FROM else 0.0) if stable is None else float(stable)
        limit = int(self.settings["max_iter"] or self._opt("rough_iter"))
        return admm.Stop("faces", max_iter=limit, check=check, stable=stable, deadline=self._deadline())


#: share of a rough start's samples whose faces may still change when the ADMM stops (batches of at
#: least STABLE_FROM samples)
STABLE, STABLE_FROM = 0.05, 64


def _on_cpu(X: Any) -> bool:
    dev = _device(X)
    return str(getattr(dev, "type", dev)) == "cpu"


def _start_dtype(xp: Any, name: Any) -> Any:
    return xp.float32 if str(name).replace("torch.", "") == "float32" else xp.float64


def _host_codes(code: Any) -> list[int]:
    """Status codes on the host, from any namespace and device (np.asarray reads host arrays only)."""
    from ..solvers.ipm.result import host_list

    return [int(c) for c in host_list(code)]


def _row_bounds(xp: Any, l: Any, u: Any, lb: Any, ub: Any, N: int, m: int, n: int):
    """Row bounds (rows, N) of ``[C; I]`` — the bound rows only when some bound is finite."""
    lT = xp.matrix_transpose(xp.broadcast_to(l, (N, m)))
    uT = xp.matrix_transpose(xp.broadcast_to(u, (N, m)))
    boxed = bool(xp.any(xp.isfinite(lb)) or xp.any(xp.isfinite(ub)))
    if not boxed:
        return _c(xp, lT), _c(xp, uT), 0
    lbT = xp.matrix_transpose(xp.broadcast_to(lb, (N, n)))
    ubT = xp.matrix_transpose(xp.broadcast_to(ub, (N, n)))
    return _c(xp, xp.concat([lT, lbT], axis=0)), _c(xp, xp.concat([uT, ubT], axis=0)), n


def _c(xp: Any, a: Any) -> Any:
    """``a`` C-contiguous (the loop reads the bounds at every iteration)."""
    if hasattr(a, "contiguous"):
        return a.contiguous()
    if isinstance(a, np.ndarray):
        return np.ascontiguousarray(a)
    return xp.asarray(a, copy=True)
