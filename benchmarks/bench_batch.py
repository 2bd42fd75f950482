"""Batched projections onto a polyhedron: polyproj's ``ipm`` (NumPy and torch) vs ProxSuite and qpth.

Problem: project ``x`` onto ``{y : A y <= a, B y = b}`` with ``A`` of ``2n − 1`` rows and one
equality (``m = 2n`` rows in all), i.e. the QP ``P = I, q = −x`` for a batch of points ``x``.
Grid: batch 1, 32, 256, 1024, 4096 × n 20, 100, 400.

Solvers, all in this process on the same data, all asked for ``eps = 1e-8``:

- ``ipm-numpy``   ``polyproj.solvers.ipm.solve_qp_batch`` on NumPy arrays (``threads=None``: the batch is
  shared by one thread per core, as ProxSuite's ``solve_in_parallel`` shares it);
- ``ipm-torch``   the same function on torch CPU tensors (the path of the torch projection layer);
- ``project-ipm`` ``pp.project(X, polyhedron, backend="ipm", eps_abs=--project-eps)``: the IPM stopped
  early, then polyproj's exact polish (the answer is exact to rounding, see the error column);
- ``layer-admm``  the torch layer's forward, ``polyproj.adapters.torch.project(X, A, a, B, b)`` under
  ``torch.no_grad()`` (float32 ADMM on one shared factorisation to identify the face, then the same
  exact polish; not the IPM: listed as the projection-specific path polyproj has for shared
  constraints);
- ``proxsuite-loop``      one dense ProxQP object, ``update(g=−x)`` + ``solve()`` per point;
- ``proxsuite-parallel``  ``proxsuite.proxqp.dense.BatchQP`` + ``solve_in_parallel`` (setup included:
  a new batch of points needs new QPs; the solve-only time is recorded too);
- ``qpth``        ``qpth.qp.QPFunction`` (batched PDIPM in torch, float64).

Accuracy: every answer is compared with a reference (ProxSuite at eps 1e-11, then polyproj's exact
polish) and the largest error is printed next to the time. A configuration is skipped for a solver
when the time extrapolated from its previous (smaller) batch exceeds ``--budget`` seconds, or when
its predicted memory exceeds ``--mem-budget`` GiB (default half the RAM).

Run::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_batch.py            # full grid
    .venv/bin/python benchmarks/bench_batch.py --quick                           # n 20, 100; batch <= 1024
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import quick_name, write_results

import polyproj as pp
from polyproj.runtime import set_torch_threads
from polyproj.solvers.ipm import solve_qp_batch


def make_problem(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((2 * n - 1, n))
    y0 = rng.standard_normal(n)
    a = A @ y0 + rng.uniform(0.1, 1.0, 2 * n - 1)
    B = rng.standard_normal((1, n))
    b = B @ y0
    return A, a, B, b


def points(n: int, batch: int, seed: int = 1) -> np.ndarray:
    return 2.0 * np.random.default_rng(seed + batch).standard_normal((batch, n))


def reference(A, a, B, b, X) -> np.ndarray:
    import warnings

    poly = pp.Polyhedron(A=A, a=a, B=B, b=b)
    # in parts of 64 points: ProxSuite's BatchQP holds ~23 MB per point at n 400 (batch 1024 in one
    # part took the run past 24 GB)
    with warnings.catch_warnings():  # ProxSuite at 1e-11 misreports a few points of large batches
        warnings.simplefilter("ignore", pp.PolyprojWarning)
        y = np.concatenate([pp.project(X[i:i + 64], poly, backend="proxsuite", eps_abs=1e-11).y
                            for i in range(0, X.shape[0], 64)])
    bad = ~np.isfinite(y).all(axis=1)
    if bad.any():  # those points: the IPM, then the same exact polish (verified KKT)
        y[bad] = pp.project(X[bad], poly, backend="ipm", eps_abs=1e-9).y
    return y


# ----------------------------------------------------------------------------- solvers
def run_ipm_numpy(A, a, B, b, X, eps):
    n = X.shape[1]
    C = np.vstack([A, B])
    l = np.concatenate([np.full(A.shape[0], -np.inf), b])
    u = np.concatenate([a, b])
    res = solve_qp_batch(np.eye(n), -X, C, l, u, eps_abs=eps, threads=None)
    return res.x


def run_project_ipm(A, a, B, b, X, eps):
    poly = pp.Polyhedron(A=A, a=a, B=B, b=b)
    res = pp.project(X, poly, backend="ipm", eps_abs=eps)
    if not np.all(res.polished):
        raise RuntimeError(f"polish refused for {int(np.sum(~np.asarray(res.polished)))} points")
    return res.y


def make_ipm_torch(A, a, B, b):
    import torch

    n = A.shape[1]
    C = torch.from_numpy(np.vstack([A, B]))
    l = torch.from_numpy(np.concatenate([np.full(A.shape[0], -np.inf), b]))
    u = torch.from_numpy(np.concatenate([a, b]))
    eye = torch.eye(n, dtype=torch.float64)

    def run(X, eps):
        with torch.no_grad():
            return solve_qp_batch(eye, -X, C, l, u, eps_abs=eps, threads=None).x

    return run


def make_layer_admm(A, a, B, b):
    import torch

    from polyproj.adapters.torch import project

    At, at, Bt, bt = (torch.from_numpy(np.ascontiguousarray(v)) for v in (A, a, B, b))

    def run(X, eps):
        with torch.no_grad():
            return project(X, At, at, Bt, bt, backend="admm")

    return run


def run_proxsuite_loop(A, a, B, b, X, eps):
    import proxsuite

    n = X.shape[1]
    qp = proxsuite.proxqp.dense.QP(n, B.shape[0], A.shape[0])
    qp.settings.eps_abs = eps
    qp.settings.eps_rel = 0.0
    qp.settings.verbose = False
    qp.init(np.eye(n), -X[0], B, b, A, np.full(A.shape[0], -1e20), a)
    out = np.empty_like(X)
    for i in range(X.shape[0]):
        qp.update(g=-X[i])
        qp.solve()
        out[i] = qp.results.x
    return out


def run_proxsuite_parallel(A, a, B, b, X, eps, threads, timings):
    import proxsuite

    n = X.shape[1]
    t0 = time.perf_counter()
    batch = proxsuite.proxqp.dense.BatchQP()
    H = np.eye(n)
    lo = np.full(A.shape[0], -1e20)
    for i in range(X.shape[0]):
        qp = batch.init_qp_in_place(n, B.shape[0], A.shape[0])
        qp.settings.eps_abs = eps
        qp.settings.eps_rel = 0.0
        qp.settings.verbose = False
        qp.init(H, -X[i], B, b, A, lo, a)
    t1 = time.perf_counter()
    proxsuite.proxqp.dense.solve_in_parallel(batch, threads)
    timings.append(time.perf_counter() - t1)  # solve only; the caller times setup + solve
    del t0
    return np.stack([batch.get(i).results.x for i in range(X.shape[0])])


def make_qpth(A, a, B, b):
    import torch
    from qpth.qp import QPFunction

    n = A.shape[1]
    Q = torch.eye(n, dtype=torch.float64)
    G = torch.from_numpy(A)
    h = torch.from_numpy(a)
    Ae = torch.from_numpy(B)
    be = torch.from_numpy(b)

    def run(X, eps):
        with torch.no_grad():
            return QPFunction(verbose=-1, eps=eps, maxIter=50, check_Q_spd=False)(Q, -X, G, h, Ae, be)

    return run


# ----------------------------------------------------------------------------- driver
def predicted_bytes(name: str, n: int, m: int, batch: int) -> float:
    """Rough peak memory of a contender (the batched dense peers hold per-element n+m systems).

    ProxSuite's BatchQP keeps a dense workspace of ~2 (n+m)^2 per QP; qpth's batched PDIPM forms
    (m, m) Schur complements, their LU and the expanded G per element; the torch layer's polish
    holds a few (k, k) Gram matrices with k up to n. The IPM and pp.project work in bounded parts.
    An estimate above --mem-budget skips the configuration instead of letting the kernel kill the
    whole run (n 400, batch 1024: qpth and ProxSuite's batch would need more than 24 GB).
    """
    per = {"proxsuite-parallel": 2 * (n + m) ** 2 + n * n + 2 * m * n,
           "qpth": 4 * m * m + 4 * m * n + 3 * n * n,
           "layer-admm": 4 * n * n}.get(name, 0)
    return 8.0 * batch * per


def _rss_gib() -> float:
    """Resident memory of this process now (GiB; 0 where /proc is not available)."""
    try:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS")) / 2**20
    except (OSError, StopIteration):
        return 0.0


def timed(fn, repeats):
    out = fn()  # warm-up (and the answer used for the accuracy column)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 256, 1024, 4096])
    ap.add_argument("--sizes", type=int, nargs="+", default=[20, 100, 400])
    ap.add_argument("--solvers", nargs="+",
                    default=["ipm-numpy", "ipm-torch", "project-ipm", "layer-admm", "proxsuite-loop",
                             "proxsuite-parallel", "qpth"])
    ap.add_argument("--eps", type=float, default=1e-8, help="tolerance asked of the peers")
    ap.add_argument("--ipm-eps", type=float, default=1e-8,
                    help="tolerance of ipm (an IPM stops inside: its x error is larger at the same residual tolerance)")
    ap.add_argument("--project-eps", type=float, default=1e-6,
                    help="backend tolerance of project-ipm (the polish makes the answer exact)")
    ap.add_argument("--torch-threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", type=float, default=30.0, help="skip runs predicted to take longer (s)")
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        ram = 16.0
    ap.add_argument("--mem-budget", type=float, default=0.5 * ram,
                    help="skip runs predicted to need more memory (GiB; default half the RAM)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="solve_in_parallel threads")
    ap.add_argument("--quick", action="store_true", help="n 20, 100 and batch <= 1024")
    ap.add_argument("--out", default=None,
                    help="results name in benchmarks/results or a .json path (default batch_cpu; --quick: "
                    "batch_cpu_quick)")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes = [s for s in args.sizes if s <= 100]
        args.batches = [b for b in args.batches if b <= 1024]

    import torch
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    if args.torch_threads:
        set_torch_threads(args.torch_threads)
    console = Console()
    rows = []
    last: dict[tuple[str, int], tuple[int, float]] = {}
    total = len(args.sizes) * len(args.batches)
    with Progress(console=console, transient=True) as prog:
        task = prog.add_task("batched projections", total=total)
        for n in args.sizes:
            A, a, B, b = make_problem(n)
            ipm_torch = make_ipm_torch(A, a, B, b)
            layer_admm = make_layer_admm(A, a, B, b)
            qpth_run = make_qpth(A, a, B, b) if "qpth" in args.solvers else None
            for batch in args.batches:
                X = points(n, batch)
                Xt = torch.from_numpy(X)
                ref = reference(A, a, B, b, X)
                solve_only: list[float] = []
                runs = {
                    "ipm-numpy": partial(run_ipm_numpy, A, a, B, b, X, args.ipm_eps),
                    "ipm-torch": partial(ipm_torch, Xt, args.ipm_eps),
                    "project-ipm": partial(run_project_ipm, A, a, B, b, X, args.project_eps),
                    "layer-admm": partial(layer_admm, Xt, args.eps),
                    "proxsuite-loop": partial(run_proxsuite_loop, A, a, B, b, X, args.eps),
                    "qpth": partial(qpth_run, Xt, args.eps) if qpth_run else None,
                    "proxsuite-parallel": partial(run_proxsuite_parallel, A, a, B, b, X, args.eps, args.threads,
                                                  solve_only),
                }
                for name in args.solvers:
                    prog.update(task, description=f"n={n} batch={batch} {name}")
                    prev = last.get((name, n))
                    if prev is not None and prev[1] * batch / prev[0] > args.budget:
                        rows.append(dict(n=n, m=2 * n, batch=batch, solver=name, time=None,
                                         note=f"skipped: predicted {prev[1] * batch / prev[0]:.0f} s > budget"))
                        continue
                    need = predicted_bytes(name, n, 2 * n, batch) / 2**30
                    if need > args.mem_budget:
                        rows.append(dict(n=n, m=2 * n, batch=batch, solver=name, time=None,
                                         note=f"skipped: predicted {need:.0f} GiB > memory budget"))
                        continue
                    solve_only.clear()
                    try:
                        t, times, out = timed(runs[name], args.repeats if batch <= 1024 else 1)
                    except Exception as exc:  # a peer failing (e.g. out of memory) is a result, not a crash
                        rows.append(dict(n=n, m=2 * n, batch=batch, solver=name, time=None,
                                         note=f"{type(exc).__name__}: {exc}"[:200]))
                        continue
                    out = np.asarray(out.detach().numpy() if hasattr(out, "detach") else out)
                    err = float(np.max(np.abs(out - ref)))
                    row = dict(n=n, m=2 * n, batch=batch, solver=name, time=t, times=times, max_err=err)
                    console.log(f"n={n} batch={batch} {name}: {t:.4f} s, err {err:.0e}, rss {_rss_gib():.1f} GiB")
                    if name == "proxsuite-parallel" and solve_only:
                        row["solve_only"] = statistics.median(solve_only)
                    rows.append(row)
                    last[(name, n)] = (batch, t)
                prog.advance(task)

    # ratios vs the best peer, per configuration: the raw IPM (best of numpy / torch) and project-ipm
    table = Table(title=f"batched projections, m = 2n, one equality, eps = {args.eps:g} (ipm {args.ipm_eps:g},"
                        f" project-ipm {args.project_eps:g} + polish), median seconds")
    for col in ["n", "batch", *args.solvers, "peer / ipm", "peer / project-ipm", "peer / layer-admm"]:
        table.add_column(col, justify="right")
    summary = []
    for n in args.sizes:
        for batch in args.batches:
            cfg = {r["solver"]: r for r in rows if r["n"] == n and r["batch"] == batch}
            cells = []
            for s in args.solvers:
                r = cfg.get(s)
                cells.append("skip" if r is None or r["time"] is None else f"{r['time']:.4f} ({r['max_err']:.0e})")
            ipm_t = [cfg[s]["time"] for s in ("ipm-numpy", "ipm-torch") if s in cfg and cfg[s]["time"]]
            proj_t = cfg["project-ipm"]["time"] if "project-ipm" in cfg and cfg["project-ipm"]["time"] else None
            admm_t = cfg["layer-admm"]["time"] if "layer-admm" in cfg and cfg["layer-admm"]["time"] else None
            peer_t = {s: cfg[s]["time"] for s in cfg
                      if not s.startswith(("ipm", "project", "layer")) and cfg[s]["time"]}
            ratio = ratio_p = ratio_a = None
            if peer_t:
                best_peer = min(peer_t, key=peer_t.get)
                ratio = peer_t[best_peer] / min(ipm_t) if ipm_t else None
                ratio_p = peer_t[best_peer] / proj_t if proj_t else None
                ratio_a = peer_t[best_peer] / admm_t if admm_t else None
                summary.append(dict(n=n, batch=batch, best_ipm=min(ipm_t) if ipm_t else None, project_ipm=proj_t,
                                    layer_admm=admm_t, best_peer=best_peer, best_peer_time=peer_t[best_peer],
                                    speedup=ratio, speedup_project=ratio_p, speedup_layer_admm=ratio_a))
            cells.append("-" if ratio is None else f"{ratio:.2f}x")
            cells.append("-" if ratio_p is None else f"{ratio_p:.2f}x")
            cells.append("-" if ratio_a is None else f"{ratio_a:.2f}x")
            table.add_row(str(n), str(batch), *cells)
    console.print(table)
    console.print("cells: median time (largest |y - y_ref|); ratio > 1 means polyproj is faster than the best peer")
    env = {k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    path = write_results(args.out or quick_name("batch_cpu", args.quick),  # --quick: never the published file
                         dict(quick=bool(args.quick), eps=args.eps, ipm_eps=args.ipm_eps, project_eps=args.project_eps,
                              repeats=args.repeats, budget=args.budget, mem_budget=args.mem_budget,
                              torch_threads=torch.get_num_threads(), proxsuite_threads=args.threads,
                              env=env, rows=rows, summary=summary))
    console.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
