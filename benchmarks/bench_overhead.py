"""Overhead of polyproj's backend glue: the same problems through each solver's own Python API vs polyproj.

For every problem of the Maros–Meszaros subset (dense matrices) and every backend, two timings of
one solve *including set-up/factorisation* (what ``backend.solve(qp)`` does):

- **direct**: the solver's own API on data already in its native format (prepared outside the
  timer, as a user of that API would hold it) with the same settings, returning the same outputs
  (x and the multipliers);
- **polyproj**: ``pp.get_backend(name, ...).solve(qp)`` on a ready ``pp.QP`` (conversions,
  status/multiplier mapping and the Solution record are inside the timer).

The two are interleaved, repeated, and the median of each is kept. Summaries per backend: the
ratio of shifted geometric means polyproj/direct with qpbenchmark's shift of 10 s (hides any
overhead on millisecond solves, printed for completeness), with a 1 ms shift, and the geometric
mean of per-problem ratios (the strictest), also with the minimum over repeats instead of the
median (robust to stalls of a shared machine). Target: at most 5 % overhead.

Run::

    .venv/bin/python benchmarks/bench_overhead.py --data ../shared/data/maros_meszaros --subset small
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from types import SimpleNamespace

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import scipy.sparse as sp
from rich.console import Console
from rich.progress import track
from rich.table import Table

import polyproj as pp
from polyproj.bench import _finite, machine_description, shifted_geometric_mean, unwritable
from polyproj.maros_meszaros import SUBSETS, list_problems, load_problem


# --------------------------------------------------------------------------- direct solver calls
def direct_osqp(qp, tol):
    import osqp

    box = np.flatnonzero(np.isfinite(qp.lb) | np.isfinite(qp.ub))
    P = sp.triu(sp.csc_matrix(qp.P), format="csc")
    A = sp.vstack([sp.csc_matrix(qp.C), sp.identity(qp.n, format="csr")[box]], format="csc")
    l, u = np.concatenate([qp.l, qp.lb[box]]), np.concatenate([qp.u, qp.ub[box]])
    settings = dict(eps_abs=tol, eps_rel=0.0, verbose=False, polishing=True, warm_starting=True)

    def run():
        s = osqp.OSQP()
        s.setup(P, qp.q, A, l, u, **settings)
        res = s.solve(raise_error=False)
        return res.x, res.y  # the same outputs polyproj returns: x and the multipliers

    return run


def direct_highs(qp, tol):
    import highspy

    model = pp.get_backend("highs")._model(qp)  # HiGHS's own structures, built outside the timer

    def run():
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("primal_feasibility_tolerance", max(tol, 1e-10))
        h.setOptionValue("dual_feasibility_tolerance", max(tol, 1e-10))
        h.setOptionValue("qp_regularization_value", min(1e-7, 1e-9 * tol))
        h.passModel(model)
        h.run()
        status = h.getModelStatus()  # a caller must know whether the answer is one (OSQP and
        sol = h.getSolution()  # ProxSuite hand the status over with their results)
        return np.array(sol.col_value), np.array(sol.row_dual), np.array(sol.col_dual), status

    return run


def direct_proxsuite(qp, tol):
    import proxsuite

    eq = qp.eq_mask
    A, b = qp.C[eq], qp.u[eq]
    C, l, u = qp.C[~eq], qp.l[~eq], qp.u[~eq]
    box = qp.has_bounds
    neq, nin = A.shape[0], C.shape[0]

    def run():
        s = proxsuite.proxqp.dense.QP(qp.n, neq, nin, box)
        st = s.settings
        st.eps_abs, st.eps_rel, st.verbose = tol, 0.0, False
        st.check_duality_gap, st.eps_duality_gap_abs, st.eps_duality_gap_rel = True, tol, 0.0
        st.initial_guess = proxsuite.proxqp.InitialGuess.EQUALITY_CONSTRAINED_INITIAL_GUESS
        args = [qp.P, qp.q, A if neq else None, b if neq else None, C if nin else None, l if nin else None,
                u if nin else None]
        if box:
            args += [qp.lb, qp.ub]
        s.init(*args, compute_preconditioner=True)
        s.solve()
        r = s.results
        return r.x, r.y, r.z

    return run


DIRECT = {"osqp": direct_osqp, "highs": direct_highs, "proxsuite": direct_proxsuite}


def _geomean(ratios) -> float:
    """Geometric mean; NaN (null in the JSON) when no problem was timed (no warning of an empty mean)."""
    return float(np.exp(np.mean(np.log(ratios)))) if len(ratios) else float("nan")


def _refuse(message: str) -> int:
    print(f"bench_overhead.py: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=os.path.join("..", "shared", "data", "maros_meszaros"))
    ap.add_argument("--subset", default="small", choices=sorted(SUBSETS))
    ap.add_argument("--backends", nargs="+", default=[b for b in DIRECT if b in pp.available_backends()],
                    help=f"backends with a direct path here: {', '.join(DIRECT)} (default: those installed)")
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--max-time", type=float, default=0.5, help="skip problems whose direct solve exceeds this (s)")
    ap.add_argument("--problems", nargs="+", default=None, help="only these problems (default: the whole subset)")
    ap.add_argument("--out", default=os.path.join("benchmarks", "results", "overhead.json"))
    args = ap.parse_args(argv)
    console = Console()
    # refused before any timing: a wrong name, a backend without a direct path here, an unwritable --out
    other = [b for b in args.backends if b not in DIRECT]
    if other:
        return _refuse(f"no direct path for backend(s) {other}: this benchmark compares {sorted(DIRECT)} only")
    absent = [b for b in args.backends if b not in pp.available_backends()]
    if absent:
        return _refuse(f"backend(s) {absent} not installed here")
    try:
        names = list_problems(args.data, args.subset)
        if args.problems:
            missing = sorted(set(args.problems) - set(list_problems(args.data, "all")))
            if missing:
                return _refuse(f"unknown problem(s) {missing} in {args.data!r}")
            names = list(args.problems)
    except pp.PolyprojError as exc:  # no such folder, no .mat file in it, an unreadable file
        return _refuse(str(exc))
    if (why := unwritable(args.out)) is not None:
        return _refuse(f"--out: {why}")
    rows: list[dict] = []
    skipped: list[str] = []
    for name in track(names, description="timing", console=console):
        try:
            qp = load_problem(os.path.join(args.data, f"{name}.mat")).qp.dense()
        except pp.ProblemError:  # VALUES: P not PSD; the solvers are not asked to solve it here
            skipped.append(name)
            continue
        mm = SimpleNamespace(name=name)
        for b in args.backends:
            direct = DIRECT[b](qp, args.tol)
            solver = pp.get_backend(b, eps_abs=args.tol, eps_rel=0.0)
            t0 = time.perf_counter()
            x_direct = direct()[0]
            if time.perf_counter() - t0 > args.max_time:
                continue
            x_ours = solver.solve(qp).x  # warm-up both paths
            td, tp = [], []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                direct()
                td.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                solver.solve(qp)
                tp.append(time.perf_counter() - t0)
            same = bool(np.allclose(x_direct, x_ours, atol=1e-9, equal_nan=True))
            rows.append({"problem": mm.name, "backend": b, "direct": statistics.median(td),
                         "polyproj": statistics.median(tp), "direct_min": min(td), "polyproj_min": min(tp),
                         "same_x": same})
    summary = {}
    table = Table(title=f"polyproj overhead vs direct solver API (MM {args.subset}, tol {args.tol:g}, "
                        f"median of {args.repeats})")
    for col in ("backend", "problems", "direct sgm (ms)", "polyproj sgm (ms)", "ratio shift 10 s",
                "ratio shift 1 ms", "geo-mean ratio", "geo-mean ratio (min)", "same x"):
        table.add_column(col, justify="right")
    for b in args.backends:
        r = [row for row in rows if row["backend"] == b]
        d = np.array([row["direct"] for row in r])
        p = np.array([row["polyproj"] for row in r])
        s = {"problems": len(r),
             "sgm_direct_s": shifted_geometric_mean(d), "sgm_polyproj_s": shifted_geometric_mean(p),
             "ratio_shift10s": shifted_geometric_mean(p) / shifted_geometric_mean(d),
             "ratio_shift1ms": shifted_geometric_mean(p, 1e-3) / shifted_geometric_mean(d, 1e-3),
             "geomean_ratio": _geomean(p / d),
             "geomean_ratio_min": _geomean([row["polyproj_min"] / row["direct_min"] for row in r]),
             "sgm_direct_ms_shift1ms": 1e3 * shifted_geometric_mean(d, 1e-3),
             "sgm_polyproj_ms_shift1ms": 1e3 * shifted_geometric_mean(p, 1e-3),
             "same_x": int(sum(row["same_x"] for row in r))}
        summary[b] = s
        table.add_row(b, str(s["problems"]), f"{s['sgm_direct_ms_shift1ms']:.3f}", f"{s['sgm_polyproj_ms_shift1ms']:.3f}",
                      f"{s['ratio_shift10s']:.4f}", f"{s['ratio_shift1ms']:.3f}", f"{s['geomean_ratio']:.3f}", f"{s['geomean_ratio_min']:.3f}",
                      f"{s['same_x']}/{s['problems']}")
    console.print(table)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    payload = {"benchmark": "overhead", "subset": args.subset, "tol": args.tol, "repeats": args.repeats,
               "machine": machine_description(), "summary": summary, "rows": rows, "skipped_not_convex": skipped}
    with open(args.out, "w") as fh:  # NaN (no problem timed: --max-time below every solve) as null
        json.dump(_finite(payload), fh, indent=1, allow_nan=False)
    console.print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
