"""pp.project vs calling ProxSuite directly (loop and batch API): the framework's overhead.

Problem: batch 128 points, polytope with n = 50, m = 100 inequalities, one equality (no bounds).
Contenders, all measured in this process on the same data, medians of interleaved repeats:

- ``direct loop``: ``proxsuite.proxqp.dense.QP`` built and solved per point (eps_abs as below);
- ``direct batch``: ``BatchQP`` + ``solve_in_parallel`` on all cores;
- ``pp.project``: the same backend through polyproj (native batch, then active-set polish).

Accuracy: for each contender the max constraint violation and the max distance to a reference
projection (ProxSuite at 1e-12 then polished). The headline compares pp.project at the same
backend tolerance as the direct calls (1e-9); ``pp.project @1e-6`` shows that polish gives a more
accurate answer than direct 1e-9 solves from a looser (cheaper) solve.

Run: ``.venv/bin/python benchmarks/bench_projection.py [--repeats 7] [--out NAME_OR_PATH]`` (default
``benchmarks/results/projection.json``; give another ``--out`` for a trial at other sizes).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import write_results

import polyproj as pp


def make_problem(seed: int, batch: int, n: int, m: int):
    rng = np.random.default_rng(seed)
    x0 = rng.normal(size=n)
    A = rng.normal(size=(m, n))
    a = A @ x0 + rng.uniform(0.1, 1.0, size=m)
    B = rng.normal(size=(1, n))
    b = B @ x0
    X = x0 + 3.0 * rng.normal(size=(batch, n))
    return pp.Polyhedron(A=A, a=a, B=B, b=b), X


def _settings(qp, eps):
    import proxsuite

    qp.settings.eps_abs = eps
    qp.settings.eps_rel = 0.0
    qp.settings.check_duality_gap = True
    qp.settings.eps_duality_gap_abs = eps
    qp.settings.eps_duality_gap_rel = 0.0
    qp.settings.initial_guess = proxsuite.proxqp.InitialGuess.EQUALITY_CONSTRAINED_INITIAL_GUESS


def direct_loop(P, X, eps):
    import proxsuite

    n, m = P.n, P.m_ineq
    lo = np.full(m, -np.inf)
    out = np.empty_like(X)
    for i, x in enumerate(X):
        qp = proxsuite.proxqp.dense.QP(n, P.m_eq, m)
        _settings(qp, eps)
        qp.init(np.eye(n), -x, P.B, P.b, P.A, lo, P.a)
        qp.solve()
        _check_solved([qp.results])
        out[i] = qp.results.x
    return out


def direct_batch(P, X, eps):
    import proxsuite

    dense = proxsuite.proxqp.dense
    n, m = P.n, P.m_ineq
    lo = np.full(m, -np.inf)
    eye = np.eye(n)
    batch = dense.BatchQP()
    for x in X:
        qp = batch.init_qp_in_place(n, P.m_eq, m)
        _settings(qp, eps)
        qp.init(eye, -x, P.B, P.b, P.A, lo, P.a)
    dense.solve_in_parallel(batch, os.cpu_count() or 1)
    results = [batch.get(i).results for i in range(len(X))]
    _check_solved(results)
    return np.stack([r.x for r in results])


def _check_solved(results) -> None:
    """A direct user has to check the statuses too (pp.project does)."""
    import proxsuite

    solved = proxsuite.proxqp.QPSolverOutput.PROXQP_SOLVED
    bad = sum(r.info.status != solved for r in results)
    if bad:
        raise RuntimeError(f"{bad} direct solves did not finish")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--m", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="projection",
                    help="results name in benchmarks/results or a .json path (default projection)")
    args = ap.parse_args(argv)
    P, X = make_problem(args.seed, args.batch, args.n, args.m)
    ref = pp.project(X, P, eps_abs=1e-12).y
    contenders = {
        "direct loop @1e-9": lambda: direct_loop(P, X, 1e-9),
        "direct batch @1e-9": lambda: direct_batch(P, X, 1e-9),
        "pp.project @1e-9": lambda: pp.project(X, P, backend="proxsuite", eps_abs=1e-9).y,
        "pp.project @1e-6": lambda: pp.project(X, P, backend="proxsuite", eps_abs=1e-6).y,
    }
    times: dict[str, list[float]] = {k: [] for k in contenders}
    outputs = {k: f() for k, f in contenders.items()}  # warm-up and accuracy
    for _ in range(args.repeats):  # interleaved, so load changes hit every contender alike
        for k, f in contenders.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    med = {k: float(np.median(v)) for k, v in times.items()}
    fastest_direct = min(med["direct loop @1e-9"], med["direct batch @1e-9"])
    rows = []
    print(f"batch {args.batch}, n {args.n}, m {args.m}, 1 equality; medians of {args.repeats} repeats")
    print(f"{'contender':22s} {'time [ms]':>10s} {'vs fastest direct':>18s} {'max viol':>10s} {'max |y-ref|':>12s}")
    for k in contenders:
        viol = float(np.max(P.violation(outputs[k])))
        err = float(np.max(np.abs(outputs[k] - ref)))
        ratio = med[k] / fastest_direct
        rows.append({"contender": k, "median_s": med[k], "times_s": times[k], "ratio_vs_fastest_direct": ratio,
                     "max_violation": viol, "max_err_vs_ref": err})
        print(f"{k:22s} {1e3 * med[k]:10.2f} {ratio:18.3f} {viol:10.1e} {err:12.1e}")
    overhead = med["pp.project @1e-9"] / fastest_direct - 1.0
    print(f"framework overhead at equal backend tolerance: {100 * overhead:+.1f}% (target <= +10%)")
    path = write_results(args.out, {"config": vars(args), "rows": rows, "overhead_same_tol": overhead})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
