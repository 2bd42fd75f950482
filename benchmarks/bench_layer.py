"""Benchmark of the torch projection layer against differentiable-optimisation peers.

Same process, same data, medians of repeats: forward+backward time of ``polyproj`` (``project``
with the HS-Jacobian backward), qpth ``QPFunction`` (OptNet), ProxSuite ``QPLayer``, cvxpylayers
``CvxpyLayer`` (default and tight tolerances) and LinSATNet ``linsat_layer`` (on a polytope with
non-negative coefficients, the only kind it accepts, at several ``tau`` / ``max_iter``; it is an
entropic (Sinkhorn) map, not the Euclidean projection: its distance to the projection and the
difference of its gradient to the projection's are reported, as measured, with that caveat). Peak
memory of one forward+backward is measured in a fresh subprocess per method (peak RSS above the
baseline after imports and data, ``clear_refs``); max violation of the outputs; gradient error
against the float64 reference ``J v`` (the Jacobian of the exact projection at the active set of
``pp.project``: at these random, non-degenerate points it is the true Jacobian).

qpth runs with its defaults (``eps=1e-12``, ``maxIter=20``). In a long benchmark process its
initial KKT LU sometimes fails (``torch.linalg.lu_factor: U[200,200] is zero``, preceded by MKL's
``Parameter 6 was incorrect on entry to DLASWP``) although the matrix it factors, ``R + I`` with ``R``
positive semidefinite, is positive definite; the same call in a fresh process succeeds. When that
happens the row records the in-process error and qpth is timed in a fresh subprocess instead
(``timed_in_subprocess``); its timing is not favoured by that (no other work in the process).

Sweeps skip a peer once its time *extrapolated* to the next config (log-log slope of its last two
points, else linear in the batch and cubic in n) exceeds ``--budget`` seconds per call: the row
says ``skipped: budget`` with the prediction.

Headline: batch 128, n 50, m 100 inequalities, 1 equality, box bounds, float64. Sweeps over the
batch (1 to 4096) and n (10 to 1000, m = 2n). JSON goes to ``benchmarks/results/layer.json`` with
the machine description, a plot to ``benchmarks/results/layer.png``.

``--threads k`` sets torch's and Moreau's (Rayon's) threads to k and keeps the process on k cores
(``pin_cores``): polyproj's polish parts run on batch threads, one per core it may use, and without the
pin a one-thread run gave it both cores of a 2-core machine from batch 1024 on (runs before 2026-12-04
late evening).

Run::

    .venv/bin/python benchmarks/bench_layer.py                 # headline + sweeps (long)
    .venv/bin/python benchmarks/bench_layer.py --only headline  # the headline only
    .venv/bin/python benchmarks/bench_layer.py --quick          # smoke run (results/layer_quick.json)

Each ``--only`` part updates its key of an existing JSON (so parts can run separately).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
NOTES: dict[str, dict] = {}
# LinSATNet (tau, max_iter) settings: its defaults are (0.05, 100); its autograd graph grows with
# max_iter x constraints x batch (100 iterations at batch 128 here: > 5.8 GB), so fewer iterations
LINSAT = {"linsatnet_t0.05_i10": (0.05, 10), "linsatnet_t0.05_i50": (0.05, 50), "linsatnet_t0.01_i50": (0.01, 50)}
# Moreau (moreau 0.4): its CPU dual active-set solver (its "auto" choice for QPs with n <= 500 and only
# zero / non-negative cones) and its interior-point method; torch layer with autograd (enable_grad)
MOREAU = {"moreau": "active_set", "moreau_ipm": "ipm"}
# Moreau's default max_iter (200) stops the active-set solver before it converges from n ~ 200 here (an
# iteration adds or drops one row; ~270 are needed at n 200) and returns that iterate without a warning:
# the benchmark raises the cap so that it converges, and records the iterations it took
MOREAU_MAX_ITER = 20000
METHODS = ["polyproj", "moreau", "moreau_ipm", "qpth", "proxsuite_qplayer", "cvxpylayers", "cvxpylayers_default",
           *LINSAT]


# ----------------------------------------------------------------------------- data
def make_problem(batch: int, n: int, m: int, seed: int = 0, nonneg: bool = False):
    """Random bounded polytope with an interior point, and points to project (scale 3)."""
    rng = np.random.default_rng(seed)
    if nonneg:  # LinSATNet's class: non-negative A, E, x in [0, 1]
        x0 = rng.uniform(0.2, 0.4, size=n)
        A = rng.uniform(0.0, 1.0, size=(m, n))
        a = A @ x0 + rng.uniform(0.1, 1.0, size=m)
        B = np.ones((1, n))
        b = B @ x0
        lb, ub = np.zeros(n), np.ones(n)
        X = rng.uniform(-0.5, 1.5, size=(batch, n))
    else:
        x0 = rng.normal(size=n)
        A = rng.normal(size=(m, n))
        a = A @ x0 + rng.uniform(0.1, 1.0, size=m)
        B = rng.normal(size=(1, n))
        b = B @ x0
        lb, ub = x0 - 2.0, x0 + 2.0
        X = x0 + 3.0 * rng.normal(size=(batch, n))
    V = rng.normal(size=(batch, n))
    return dict(A=A, a=a, B=B, b=b, lb=lb, ub=ub, X=X, V=V)


def reference(d):
    """Float64 reference: exact projection and J v from pp.project / pp.hs_jacobian."""
    import polyproj as pp

    P = pp.Polyhedron(A=d["A"], a=d["a"], B=d["B"], b=d["b"], lb=d["lb"], ub=d["ub"])
    res = pp.project(d["X"], P, eps_abs=1e-10)
    G = pp.hs_vjp(P, res.active, d["V"])
    return P, res.y, G


# ----------------------------------------------------------------------------- methods
def build(method: str, d):
    """Return f() -> (y, grad_x) running one forward+backward on fresh leaf tensors."""
    import torch

    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in d.items()}
    batch, n = d["X"].shape
    G = torch.cat([t["A"], -torch.eye(n, dtype=torch.float64), torch.eye(n, dtype=torch.float64)])
    h = torch.cat([t["a"], -t["lb"], t["ub"]])
    if method == "polyproj":
        from polyproj.adapters.torch import project

        def f():
            x = t["X"].clone().requires_grad_()
            y = project(x, t["A"], t["a"], t["B"], t["b"], t["lb"], t["ub"])
            (y * t["V"]).sum().backward()
            return y.detach(), x.grad
    elif method == "qpth":
        from qpth.qp import QPFunction

        Q = torch.eye(n, dtype=torch.float64)

        def f():  # its defaults: eps 1e-12, maxIter 20 (it converges in ~10-20 iterations here)
            p = (-t["X"]).clone().requires_grad_()
            y = QPFunction(verbose=-1)(Q, p, G, h, t["B"], t["b"])
            (y * t["V"]).sum().backward()
            return y.detach(), -p.grad
    elif method == "proxsuite_qplayer":
        from proxsuite.torch.qplayer import QPFunction

        Q = torch.eye(n, dtype=torch.float64).expand(batch, n, n)
        Bb, bb = t["B"].expand(batch, -1, -1), t["b"].expand(batch, -1)
        Gb, lo, hi = G.expand(batch, -1, -1), torch.full_like(h, -1e20).expand(batch, -1), h.expand(batch, -1)

        def f():
            p = (-t["X"]).clone().requires_grad_()
            y = QPFunction(eps=1e-9, eps_backward=1e-9)(Q, p, Bb, bb, Gb, lo, hi)[0]
            (y * t["V"]).sum().backward()
            return y.detach(), -p.grad
    elif method in ("cvxpylayers", "cvxpylayers_default"):
        import cvxpy as cp
        from cvxpylayers.torch import CvxpyLayer

        xp = cp.Parameter(n)
        yv = cp.Variable(n)
        cons = [d["A"] @ yv <= d["a"], d["B"] @ yv == d["b"], yv >= d["lb"], yv <= d["ub"]]
        layer = CvxpyLayer(cp.Problem(cp.Minimize(0.5 * cp.sum_squares(yv - xp)), cons), parameters=[xp],
                           variables=[yv])
        args = {} if method == "cvxpylayers_default" else {"eps_abs": 1e-9, "eps_rel": 1e-9, "max_iters": 200_000}

        def f():
            x = t["X"].clone().requires_grad_()
            (y,) = layer(x, solver_args=args)
            (y * t["V"]).sum().backward()
            return y.detach(), x.grad
    elif method in MOREAU:
        f = _moreau(method, d, t)
    elif method in LINSAT:
        from LinSATNet import linsat_layer

        tau, max_iter = LINSAT[method]
        # float64 (empty C, d given explicitly: LinSATNet creates missing ones in the default dtype)
        C0, d0 = torch.zeros(0, n, dtype=torch.float64), torch.zeros(0, dtype=torch.float64)

        def f():
            x = t["X"].clone().requires_grad_()
            y = linsat_layer(x, A=t["A"], b=t["a"], C=C0, d=d0, E=t["B"], f=t["b"], tau=tau, max_iter=max_iter,
                             no_warning=True)
            (y * t["V"]).sum().backward()
            return y.detach(), x.grad
    else:
        raise ValueError(method)
    return f


def _moreau(method: str, d, t):
    """Moreau's torch layer as its docs show: min ½yᵀy − xᵀy s.t. A_m y + s = b_m, s in {0}^p x R_+^(m+2n)."""
    import moreau
    import torch
    from moreau.torch import Solver

    batch, n = d["X"].shape
    rows = np.vstack([d["B"], d["A"], -np.eye(n), np.eye(n)])  # zero cone first, then the non-negative one
    rhs = np.concatenate([d["b"], d["a"], -d["lb"], d["ub"]])
    p = d["B"].shape[0]
    csr = lambda M: (torch.tensor(np.r_[0, np.cumsum((M != 0).sum(1))]), torch.tensor(np.nonzero(M)[1]))  # noqa: E731
    P_ro, P_ci = csr(np.eye(n))
    A_ro, A_ci = csr(rows)
    cones = moreau.Cones(num_zero_cones=p, num_nonneg_cones=rows.shape[0] - p)
    settings = moreau.Settings(solver=MOREAU[method], device="cpu", batch_size=batch, enable_grad=True,
                               max_iter=MOREAU_MAX_ITER)
    solver = Solver(n=n, m=rows.shape[0], P_row_offsets=P_ro, P_col_indices=P_ci, A_row_offsets=A_ro,
                    A_col_indices=A_ci, cones=cones, settings=settings)
    Pv = torch.ones(batch, n, dtype=torch.float64)
    Av = torch.tensor(rows[rows != 0], dtype=torch.float64).expand(batch, -1).contiguous()
    b = torch.tensor(rhs, dtype=torch.float64).expand(batch, -1).contiguous()

    def f():
        q = (-t["X"]).clone().requires_grad_()
        y = solver.solve(Pv, Av, q, b).x
        its = getattr(solver.info, "iterations", None)
        if its is not None:
            NOTES.setdefault(method, {}).update(max_iter=MOREAU_MAX_ITER, iterations_max=int(max(its)))
        (y * t["V"]).sum().backward()
        return y.detach(), -q.grad

    return f


HEAP_WARMUP_MIB = 16
THREADS = 1  # torch intra-op threads of every method (--threads)


def warm_heap() -> None:
    """Allocate and free one 16 MiB block, as any training process has done before the layer runs.

    glibc serves blocks above its mmap threshold (128 KiB at the start of a process) with fresh
    pages and raises the threshold to the size of the largest such block freed (up to 32 MiB);
    until then it also hands the top of the heap back above twice that size. In a fresh benchmark
    process the first method timed therefore pays a page fault per 4 KiB of its multi-MiB
    temporaries on every call (polyproj at the headline: ~2500 faults, ~3-5 ms of ~30), and the
    methods timed after it do not. One freed block levels that for every method; ``--cold-heap``
    skips it. Neither the library nor the allocator's settings are changed.
    """
    import torch

    block = torch.empty(HEAP_WARMUP_MIB << 20, dtype=torch.uint8)
    block.fill_(0)
    del block


def pin_cores(threads: int) -> list[int] | None:
    """Keep this process (and the fresh ones it starts) on ``threads`` cores; returns them (None: no affinity).

    Torch's and Moreau's thread counts are set directly, but polyproj also runs polish parts on batch threads,
    one per core of the process's affinity mask (``polyproj.runtime.cpu_count``), and BLAS pools size
    themselves by the cores: on the mask every method gets the same ``threads`` cores.
    """
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return None
    if 0 < threads < len(cores):
        os.sched_setaffinity(0, cores[-threads:])
    return sorted(os.sched_getaffinity(0))


#: every method is called for at least this long (and at least once) before it is timed: a millisecond call
#: is slower for its first few dozen calls (allocator, caches) and one warm-up call left that in the medians
WARMUP_S = 0.5


def time_method(method: str, d, repeats: int, max_total: float = 60.0):
    """Median of ``repeats`` forward+backward calls after a warm-up (fewer, at least 2, for slow ones)."""

    from polyproj.runtime import set_torch_threads  # not torch.set_num_threads: see there
    set_torch_threads(THREADS)  # every method on the same thread count, whatever ran before
    f = build(method, d)
    t0 = time.perf_counter()
    f()  # warm-up (imports, caches, JIT of peers)
    first = time.perf_counter() - t0
    while time.perf_counter() - t0 < WARMUP_S:  # then steady state, the same time for every method
        t1 = time.perf_counter()
        f()
        first = min(first, time.perf_counter() - t1)
    reps = max(2, min(repeats, int(max_total / max(first, 1e-9))))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        y, g = f()
        times.append(time.perf_counter() - t0)
    NOTES.setdefault(method, {}).update(repeats=reps, times_s=[float(t) for t in times])
    return float(np.median(times)), y.numpy(), g.numpy()


def time_in_subprocess(method: str, cfg: dict, repeats: int, timeout: float):
    """``time_method`` in a fresh process (same data from the same seed); returns (median, y, g)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        code = (
            "import json, os, sys, numpy as np, torch\n"
            "from polyproj.runtime import set_torch_threads\n"
            "set_torch_threads(int(os.environ.get('OMP_NUM_THREADS') or 1))\n"
            f"sys.path.insert(0, {str(HERE)!r})\n"
            "import bench_layer as bl\n"
            "bl.THREADS = torch.get_num_threads()\n"
            "cfg = json.loads(sys.argv[1]); d = bl.make_problem(**cfg)\n"
            f"med, y, g = bl.time_method({method!r}, d, {repeats})\n"
            f"np.savez({tmp + '/out.npz'!r}, med=med, y=y, g=g)\n"
        )
        out = subprocess.run([sys.executable, "-c", code, json.dumps(cfg)], capture_output=True, text=True,
                             timeout=timeout)
        if out.returncode:
            raise RuntimeError(f"also failed in a fresh process: {out.stderr.strip().splitlines()[-1][:200]}")
        r = np.load(tmp + "/out.npz")
        return float(r["med"]), r["y"], r["g"]


def peak_memory(method: str, cfg: dict, timeout: float) -> tuple[float | None, float | None]:
    """Peak RSS (MiB) above the post-setup baseline for one forward+backward, in a fresh process: the first
    call (with whatever the method imports or builds on first use) and a second one (its steady state)."""
    code = (
        "import json, os, sys, torch\n"
        "from polyproj.runtime import set_torch_threads\n"
            "set_torch_threads(int(os.environ.get('OMP_NUM_THREADS') or 1))\n"
        f"sys.path.insert(0, {str(HERE)!r})\n"
        "import bench_layer as bl\n"
        "cfg = json.loads(sys.argv[1]); d = bl.make_problem(**cfg)\n"
        f"f = bl.build({method!r}, d)\n"
        "def rss(key):\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith(key): return int(line.split()[1]) / 1024\n"
        "open('/proc/self/clear_refs', 'w').write('5')\n"
        "base = rss('VmRSS:'); f(); first = rss('VmHWM:') - base\n"
        "open('/proc/self/clear_refs', 'w').write('5')\n"
        "base = rss('VmRSS:'); f(); print(json.dumps([first, rss('VmHWM:') - base]))\n"
    )
    try:
        out = subprocess.run([sys.executable, "-c", code, json.dumps(cfg)], capture_output=True, text=True,
                             timeout=timeout)
        first, steady = json.loads(out.stdout.strip().splitlines()[-1])
        return float(first), float(steady)
    except (subprocess.TimeoutExpired, ValueError, IndexError, TypeError):
        return None, None


def _predict(history: list[tuple[float, float]], x_next: float, key: str, floor: float = 1.0,
             model: float | None = None) -> float:
    """Time (or memory) at ``x_next`` extrapolated from (x, value) points: log-log slope of the last two (at
    least ``floor``), else the slope ``model`` (default: linear in the batch, cubic in n)."""
    if len(history) >= 2:
        (x0, t0), (x1, t1) = history[-2:]
        slope = max(floor, np.log(t1 / t0) / np.log(x1 / x0)) if x1 != x0 and t0 > 0 and t1 > 0 else floor
    else:
        slope = model if model is not None else (1.0 if key == "batch" else 3.0)
    x1, t1 = history[-1]
    return t1 * (x_next / x1) ** slope


#: sweeps skip a peer whose extrapolated peak memory (log-log slope of its last two points, at least 2 in n: the
#: dense data grow like n m) exceeds this share of the memory available (cvxpylayers at n 200, batch 128 was
#: OOM-killed at 20 GB, taking the benchmark down with it)
MEMORY_SHARE = 0.5


def _available_mib() -> float | None:
    """MemAvailable of /proc/meminfo in MiB (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run_config(cfg: dict, methods: list[str], repeats: int, memory: bool, console, *, sweep: dict | None = None,
               key: str = "", budget: float = float("inf")):
    """Time every method on one config; ``sweep`` (method -> [(x, time)]) drives the budget skips."""
    nonneg = cfg.get("nonneg", False)
    d = make_problem(**cfg)
    P, yref, gref = reference(d)
    gscale = max(1.0, float(np.max(np.abs(gref))))
    rows = []
    for meth in methods:
        if meth in LINSAT and not nonneg:
            continue
        if sweep is not None and sweep.get(meth):
            pred = _predict(sweep[meth], cfg[key], key)
            if pred > budget:
                rows.append(dict(method=meth, skipped=f"skipped: budget (extrapolated {pred:.1f} s > {budget:g} s)"))
                console.print(f"  {meth:20s} skipped: budget (extrapolated {pred:.1f} s)")
                continue
        mem_hist = None if sweep is None else sweep.get(("memory", meth))
        if mem_hist:  # a peer that would exhaust the machine's memory is skipped, not run into the OOM killer
            pred_mib, avail = _predict(mem_hist, cfg[key], key, floor=2.0 if key == "n" else 1.0,
                                        model=2.0 if key == "n" else 1.0), _available_mib()
            if avail is not None and pred_mib > MEMORY_SHARE * avail:
                rows.append(dict(method=meth, skipped=f"skipped: memory (extrapolated {pred_mib / 1024:.1f} GiB > "
                                                      f"{MEMORY_SHARE:g} x {avail / 1024:.1f} GiB available)"))
                console.print(f"  {meth:20s} skipped: memory (extrapolated {pred_mib / 1024:.1f} GiB)")
                continue
        NOTES.pop(meth, None)
        extra: dict = {}
        try:
            try:
                med, y, g = time_method(meth, d, repeats)
            except ImportError:
                raise
            except Exception as exc:
                if meth != "qpth":
                    raise
                extra["in_process_failure"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                console.print(f"  {meth:20s} failed in-process ({str(exc)[:60]}...), timing in a fresh process")
                med, y, g = time_in_subprocess(meth, cfg, repeats, timeout=1800)
                extra["timed_in_subprocess"] = True
        except ImportError as exc:
            rows.append(dict(method=meth, skipped=f"not importable: {exc}"))
            continue
        except Exception as exc:  # a peer that crashes is a failed row, not a failed benchmark
            rows.append(dict(method=meth, failed=f"{type(exc).__name__}: {str(exc)[:200]}", **extra))
            console.print(f"  {meth:20s} FAILED: {type(exc).__name__}: {str(exc)[:100]}")
            continue
        viol = float(np.max(P.violation(y)))
        finite = bool(np.all(np.isfinite(y)) and np.all(np.isfinite(g)))
        gerr = float(np.max(np.abs(g - gref)) / gscale) if finite else float("nan")
        yerr = float(np.max(np.abs(y - yref))) if finite else float("nan")
        mem, steady = peak_memory(meth, cfg, timeout=max(120.0, 20 * med)) if memory else (None, None)
        note = dict(NOTES.get(meth, {}), **extra)
        if meth in LINSAT:
            note["caveat"] = ("entropic (Sinkhorn) map, not the Euclidean projection: y_error and grad_rel_error "
                              "are its distance to the projection and to the projection's J v")
        times = note.get("times_s") or [med]
        rows.append(dict(method=meth, time_s=med, time_min_s=min(times), time_max_s=max(times),
                         max_violation=viol, grad_rel_error=gerr, y_error=yerr, peak_mem_mib=mem,
                         peak_mem_steady_mib=steady, note=note))
        console.print(f"  {meth:20s} {1e3 * med:10.1f} ms  viol {viol:8.1e}  y err {yerr:8.1e}  grad err "
                      f"{gerr:8.1e}  mem {'n/a' if mem is None else f'{mem:8.1f} MiB'}")
        if sweep is not None:
            sweep.setdefault(meth, []).append((float(cfg[key]), med))
            if mem:
                sweep.setdefault(("memory", meth), []).append((float(cfg[key]), mem))
    return rows


def machine() -> dict:
    import torch

    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    return dict(cpu=cpu, cores=os.cpu_count(), torch_threads=torch.get_num_threads(), python=platform.python_version(),
                torch=torch.__version__, platform=platform.platform(), load_average=os.getloadavg(),
                allocator_env={k: v for k, v in os.environ.items() if k.startswith("MALLOC_") or k == "LD_PRELOAD"})


def ratios(rows, eq_tol=1e-6):
    """Speed and memory ratios of polyproj to each peer (peers meeting the accuracy marked)."""
    ours = next((r for r in rows if r["method"] == "polyproj" and "time_s" in r), None)
    out: dict = {}
    if ours is None:
        return out
    for r in rows:
        if r["method"] == "polyproj" or "time_s" not in r:
            continue
        out[r["method"]] = dict(
            speedup=r["time_s"] / ours["time_s"],
            memory_ratio=(r["peak_mem_mib"] / ours["peak_mem_mib"]) if r.get("peak_mem_mib") and ours.get("peak_mem_mib")
            else None,
            equal_accuracy=bool(r["max_violation"] <= eq_tol and r["grad_rel_error"] <= eq_tol))
    return out


def plot(results: dict, path: Path, tags: list[str] | None = None) -> None:
    """Both sweeps, one line per method and tag (``--tag``: e.g. the thread count); a cross marks a point
    whose answer is not feasible to 1e-6."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if tags is None:
        tags = sorted({k.split("_", 2)[2] if k.count("_") >= 2 else "" for k in results if k.startswith("sweep_")})
    styles = ["-", "--", ":", "-."]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, xlabel in ((axes[0], "batch", "batch size (n = 50, m = 100)"), (axes[1], "n", "n (m = 2n, batch 128)")):
        for j, tag in enumerate(tags):
            sweep = results.get(f"sweep_{key}" + (f"_{tag}" if tag else ""), [])
            for i, meth in enumerate(METHODS):
                pts = [(c["config"][key], r["time_s"], r["max_violation"] <= 1e-6) for c in sweep for r in c["rows"]
                       if r["method"] == meth and "time_s" in r]
                if not pts:
                    continue
                xs, ys, ok = (np.array(v) for v in zip(*pts, strict=True))
                ax.loglog(xs, ys * 1e3, styles[j % 4], marker="o", ms=4, color=f"C{i}",
                          label=f"{meth}" + (f" ({tag})" if tag else ""))
                if (~ok).any():
                    ax.loglog(xs[~ok], ys[~ok] * 1e3, "x", ms=10, mew=2, color="k")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("forward + backward [ms] (median)")
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle("projection layer vs peers (float64, fwd+bwd; x: answer not feasible to 1e-6)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["headline", "batch", "n", "linsat"], action="append")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="small sizes, 2 repeats")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--sweep-memory", action="store_true",
                    help="also measure every sweep point's peak memory (one fresh process per method and point)")
    ap.add_argument("--budget", type=float, default=30.0,
                    help="sweeps: skip a peer whose extrapolated time per call exceeds this (s)")
    ap.add_argument("--methods", nargs="*", default=METHODS)
    ap.add_argument("--linsat-batch", type=int, default=128, help="batch of the non-negative polytope config")
    ap.add_argument("--batches", type=int, nargs="*", help="batch sweep (default 1 16 128 1024 4096)")
    ap.add_argument("--ns", type=int, nargs="*", help="n sweep (default 10 50 200 500 1000)")
    ap.add_argument("--n-batch", type=int, default=128, help="batch of the n sweep")
    ap.add_argument("--tag", default="", help="suffix of the headline and sweep keys in the JSON (e.g. a second "
                    "n sweep, or a run under other allocator settings)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads for every method (1: no oversubscription on a shared machine)")
    ap.add_argument("--cold-heap", action="store_true",
                    help="skip the heap warm-up (see warm_heap): the first method timed in the process then "
                    "pays glibc's page faults on its temporaries")
    ap.add_argument("--out", default=None,
                    help="JSON results file (default benchmarks/results/layer.json; --quick: layer_quick.json, so "
                    "that a smoke run never replaces the published figures)")
    ap.add_argument("--fresh", action="store_true", help="start a new JSON instead of updating --out")
    ap.add_argument("--merge", action="store_true",
                    help="sweeps: replace only the rows of --methods, keep the other methods' earlier rows")
    ap.add_argument("--plot-only", action="store_true", help="redraw the plot from --out")
    ap.add_argument("--plot-tags", nargs="*", default=None,
                    help="the sweep tags to draw (default: every tag in --out; '' is the untagged sweep)")
    args = ap.parse_args(argv)
    from common import quick_name  # this script's folder is on sys.path (run as a script or imported beside it)

    out = Path(args.out) if args.out else RESULTS / f"{quick_name('layer', args.quick)}.json"
    if args.plot_only:
        plot(json.loads(out.read_text()), out.with_suffix(".png"), args.plot_tags)
        return 0

    global THREADS
    THREADS = args.threads
    from polyproj.runtime import set_torch_threads  # not torch.set_num_threads: see there
    set_torch_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # Moreau's thread pool, read at its first use
    cores = pin_cores(args.threads)
    if not args.cold_heap:
        warm_heap()
    console = Console()
    parts = args.only or ["headline", "linsat", "batch", "n"]
    reps = 2 if args.quick else args.repeats
    batches = args.batches or ([1, 16, 128] if args.quick else [1, 16, 128, 1024, 4096])
    ns = args.ns or ([10, 50] if args.quick else [10, 50, 200, 500, 1000])
    results: dict = {} if args.fresh or not out.exists() else json.loads(out.read_text())
    results.setdefault("runs", {})
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every config: a long run interrupted keeps what it measured
        out.write_text(json.dumps(results, indent=1))

    def record(part: str) -> None:
        m = machine()
        m["load_average_end"] = os.getloadavg()
        m["affinity"] = cores  # the cores this run was kept on (pin_cores)
        results["runs"][part] = dict(machine=m, repeats=reps, date=time.strftime("%Y-%m-%d %H:%M:%S"),
                                     heap_warmup_mib=0 if args.cold_heap else HEAP_WARMUP_MIB, quick=bool(args.quick))
        if args.quick:  # a smoke run's sizes and repeats: say so (also when --out adds it to another file)
            results["quick"] = True

    if "headline" in parts:
        cfg = dict(batch=128, n=50, m=100)
        console.rule(f"headline {cfg}")
        rows = run_config(cfg, args.methods, reps, not args.no_memory, console)
        results["headline" + args.tag] = dict(config=cfg, rows=rows, ratios=ratios(rows))
        record("headline" + args.tag)
        save()
        for k, v in results["headline" + args.tag]["ratios"].items():
            mem = "n/a" if v["memory_ratio"] is None else f"{v['memory_ratio']:.1f}"
            console.print(f"  polyproj vs {k:20s}: {v['speedup']:6.1f}x faster, peer/polyproj memory {mem}, "
                          f"peer at equal accuracy: {v['equal_accuracy']}")
    if "linsat" in parts:
        cfg = dict(batch=args.linsat_batch, n=50, m=100, nonneg=True)
        console.rule(f"non-negative polytope (LinSATNet's class) {cfg}")
        rows = run_config(cfg, args.methods, reps, not args.no_memory, console)
        results["linsat"] = dict(config=cfg, rows=rows, ratios=ratios(rows))
        record("linsat")
        save()
    for key, values in (("batch", batches), ("n", ns)):
        if key not in parts:
            continue
        history: dict = {}
        name = f"sweep_{key}{args.tag}"
        earlier = {json.dumps(c["config"], sort_keys=True): c["rows"] for c in results.get(name, [])} \
            if args.merge else {}
        old_date = results["runs"].get(name, {}).get("date")
        for k in sorted(earlier, key=lambda k: json.loads(k)[key]):  # --merge: smaller points drive the skips
            x = float(json.loads(k)[key])
            if values and x < min(values):
                for r in earlier[k]:
                    if "time_s" in r:
                        history.setdefault(r["method"], []).append((x, r["time_s"]))
                    if r.get("peak_mem_mib"):
                        history.setdefault(("memory", r["method"]), []).append((x, r["peak_mem_mib"]))
        results[name] = []
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        for v in values:
            cfg = dict(batch=v, n=50, m=100) if key == "batch" else dict(batch=args.n_batch, n=v, m=2 * v)
            console.rule(f"sweep {key}: {cfg}")
            meths = [m for m in args.methods if m != "cvxpylayers_default" and m not in LINSAT]
            rows = run_config(cfg, meths, max(1, reps // 2 + 1) if args.quick else reps,
                              args.sweep_memory and not args.no_memory, console, sweep=history, key=key,
                              budget=args.budget)
            for r in rows:
                r["measured"] = stamp
            kept = [dict(r, measured=r.get("measured", old_date))
                    for r in earlier.get(json.dumps(cfg, sort_keys=True), []) if r["method"] not in meths]
            rows = rows + kept  # --merge: the methods not rerun keep their earlier rows (with their date)
            this = json.dumps(cfg, sort_keys=True)  # a kept earlier row of this config (merged in below) goes
            results[name] = [c for c in results[name] if json.dumps(c["config"], sort_keys=True) != this]
            results[name].append(dict(config=cfg, rows=rows, ratios=ratios(rows)))
            if args.merge:  # the configs not rerun keep their earlier rows
                done = {json.dumps(c["config"], sort_keys=True) for c in results[name]}
                rest = [dict(config=json.loads(k), rows=r, ratios=ratios(r)) for k, r in earlier.items() if k not in done]
                results[name] = sorted(results[name] + rest, key=lambda c: c["config"][key])
            record(name)
            results["runs"][name]["budget_s"] = args.budget
            save()
    save()
    console.print(f"wrote {out}")
    if any(k.startswith("sweep_") for k in results):
        plot(results, out.with_suffix(".png"), args.plot_tags)
        console.print(f"wrote {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
