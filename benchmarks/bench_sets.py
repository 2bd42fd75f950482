"""Benchmark of the structured sets against Sinkhorn, LinSATNet, the generic QP path and a bare sort.

Every measurement runs in its own subprocess (``--worker``): after a warm-up on a small batch (imports,
lazy initialisation), peak memory is that process's peak RSS above its baseline with the data built
(``/proc/self/clear_refs``, ``VmHWM``) during the first full call, then the call is timed ``--inner`` times; the parent runs the methods of a comparison in turn, ``--outer`` times
(interleaved, so that a slow period of a shared machine hits every method), and reports the median over all
timed calls and their spread (min, max). torch runs with ``--threads`` intra-op threads in every worker
(default 1).

(a) ``birkhoff4``: doubly stochastic 4 × 4 matrices (mHC's H_res), batch 1e5 and 1e6, float32,
    forward + backward: polyproj (``adapters.torch.project(x, pp.sets.Birkhoff(4))``, exact projection,
    HS-Jacobian backward) vs Sinkhorn with 20 and 30 iterations as mHC writes it (``exp``, then
    alternating row and column normalisation, autograd backward). Violation: the largest
    ``|row sum − 1|``, ``|column sum − 1|``, negative entry over the batch; distance: to the exact
    projection (float64) on the first 2000 samples (Sinkhorn is an entropic map, not the projection).
(b) ``birkhoff_large``: k = 20 and 50, batch 256, float64, forward + backward: polyproj vs the generic path
    (the same Polyhedron through the layer with ``structured=False``: ADMM start, exact polish, HS-Jacobian)
    and LinSATNet ``linsat_layer`` (its Sinkhorn on the constraints; ``tau = 0.05``, 10 and 50 iterations).
(c) ``simplex``: the simplex and the capped simplex (``u = 0.05``, total 1), n 100, batch 1e5, float64,
    forward: ``pp.project`` with the set vs ``pp.project`` of its Polyhedron with ``structured=False``
    (the default backend ``auto``: the batched ADMM start and the exact polish; on the first
    ``--generic-rows`` rows, scaled to the batch linearly) vs a bare ``sort`` of X in the same
    namespace; NumPy and torch inputs.
(d) ``matching``: partial matchings 20 × 20 (row and column sums <= 1, total <= 10), batch 1024,
    float64, forward + backward: polyproj vs LinSATNet (as in (b)).

On a GPU machine ``--device cuda`` puts the torch data on the device (times synchronised, peak memory
from ``torch.cuda.max_memory_allocated``) and part (c) runs on torch CUDA tensors and CuPy arrays
(``benchmarks/gpu_check.sh`` runs it); results go to ``sets_cuda.json``.

Run::

    .venv/bin/python benchmarks/bench_sets.py                 # all parts (about an hour on 2 loaded cores)
    .venv/bin/python benchmarks/bench_sets.py --part a --outer 3
    .venv/bin/python benchmarks/bench_sets.py --quick         # smoke run (small batches)

JSON goes to ``benchmarks/results/sets.json`` (each part updates its key), a plot to
``benchmarks/results/sets.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import RESULTS, machine  # noqa: E402

OUT = RESULTS / "sets.json"  # sets_<device>.json for another device


# ----------------------------------------------------------------------------- data and methods (worker side)
def _rss(key: str) -> float:
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def _birkhoff_rows(k: int) -> np.ndarray:
    return np.vstack([np.kron(np.eye(k), np.ones((1, k))), np.kron(np.ones((1, k)), np.eye(k))])


def _sinkhorn(x, iters: int):
    import torch

    X = torch.exp(x)
    for _ in range(iters):
        X = X / X.sum(-1, keepdim=True)
        X = X / X.sum(-2, keepdim=True)
    return X


def _linsat(x, rows: np.ndarray, rhs: np.ndarray, equality: bool, iters: int):
    import torch
    from LinSATNet import linsat_layer

    n, dt, dev = x.shape[-1], x.dtype, x.device
    R, r = torch.tensor(rows, dtype=dt, device=dev), torch.tensor(rhs, dtype=dt, device=dev)
    empty, none = torch.zeros(0, n, dtype=dt, device=dev), torch.zeros(0, dtype=dt, device=dev)
    A, a, E, f = (empty, none, R, r) if equality else (R, r, empty, none)
    return linsat_layer(x, A=A, b=a, C=empty, d=none, E=E, f=f, tau=0.05, max_iter=iters, no_warning=True)


def _task(spec: dict):
    """``(fn, violation_of_output, reference_inputs)`` for one measurement."""
    import torch

    import polyproj as pp
    from polyproj.adapters.torch import project

    rng = np.random.default_rng(spec.get("seed", 0))
    part, method = spec["part"], spec["method"]
    dt = torch.float32 if spec.get("dtype") == "float32" else torch.float64
    dev = spec.get("device", "cpu")
    if part in ("birkhoff4", "birkhoff_large", "matching"):
        r = c = spec["k"]
        X = torch.tensor(rng.normal(size=(spec["batch"], r, c)), dtype=dt, device=dev)
        V = torch.tensor(rng.normal(size=X.shape), dtype=dt, device=dev)
        if part == "matching":
            S = pp.sets.PartialMatching(r, c, max_matches=spec["alpha"])
        else:
            S = pp.sets.Birkhoff(r)
        P = S.as_polyhedron()

        def make(fwd):
            def fn():
                x = X.clone().requires_grad_()
                y = fwd(x)
                (y * V).sum().backward()
                return y.detach()
            return fn

        if method == "polyproj":
            fn = make(lambda x: project(x, S))
        elif method.startswith("sinkhorn"):
            fn = make(lambda x: _sinkhorn(x, int(method.split("-")[1])))
        elif method == "generic":
            fn = make(lambda x: project(x.reshape(x.shape[0], -1), P, structured=False).reshape(x.shape))
        elif method.startswith("linsat"):
            its = int(method.split("-")[1])
            if part == "matching":
                rows = np.vstack([_birkhoff_rows(r), np.ones((1, r * c))])
                rhs, eq = np.r_[np.ones(2 * r), spec["alpha"]], False
            else:
                rows, rhs, eq = _birkhoff_rows(r), np.ones(2 * r), True
            fn = make(lambda x: _linsat(x.reshape(x.shape[0], -1), rows, rhs, eq, its).reshape(x.shape))
        else:
            raise ValueError(method)
        return fn, S, X
    if part == "simplex":
        n, batch = spec["n"], spec["batch"]
        S = pp.sets.Simplex(n) if spec["set"] == "simplex" else pp.sets.CappedSimplex(n, 1.0, spec["upper"])
        Xn = rng.normal(size=(batch, n))
        if spec["ns"] == "torch":
            X = torch.tensor(Xn, device=dev)
        elif spec["ns"] == "cupy":
            import cupy

            X = cupy.asarray(Xn)
        else:
            X = Xn
        if method == "polyproj":
            def fn():
                return pp.project(X, S).y
        elif method == "sort":
            def fn():
                if spec["ns"] == "torch":
                    return torch.sort(X, dim=1)[0]
                return (cupy.sort if spec["ns"] == "cupy" else np.sort)(X, axis=1)
        elif method == "generic":
            rows = spec["generic_rows"]
            Xg = X[:rows]
            P = S.as_polyhedron()

            def fn():
                return pp.project(Xg, P, structured=False).y
        else:
            raise ValueError(method)
        return fn, S, X
    raise ValueError(part)


def _quality(spec: dict, S, X, Y) -> dict:
    """Violation of the output (the whole batch) and distance to the exact projection (float64, a subset)."""
    import torch

    def host(a):
        if isinstance(a, torch.Tensor):
            return a.detach().cpu().numpy()
        return a.get() if hasattr(a, "get") else np.asarray(a)

    Yn, Xn = host(Y).astype(np.float64), host(X).astype(np.float64)
    if spec["method"] == "sort":
        return {}
    b = Yn.shape[0]
    Yf, Xf = Yn.reshape(b, -1), Xn.reshape(Xn.shape[0], -1)[:b]
    out = {"violation": float(S.as_polyhedron().violation(Yf).max()) if b else 0.0}
    m = min(b, 2000)
    ref = np.asarray(S.project(Xf[:m]).y).reshape(m, -1)
    out["distance"] = float(np.abs(Yf[:m] - ref).max())
    return out


def worker(spec: dict) -> dict:
    """Run one measurement (in this process): peak memory of one call, then ``inner`` timed calls."""
    import torch

    from polyproj.runtime import set_torch_threads  # not torch.set_num_threads: see there
    set_torch_threads(spec["threads"])
    gpu = spec.get("device", "cpu") != "cpu" or spec.get("ns") == "cupy"
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    if spec.get("ns") == "cupy":
        import cupy

        sync = cupy.cuda.Device().synchronize
    small = {**spec, "batch": min(spec["batch"], 8), "generic_rows": min(spec.get("generic_rows", 1), 8)}
    _task(small)[0]()  # warm-up on a small batch (imports, lazy initialisation) that leaves no large heap
    fn, S, X = _task(spec)
    sync()
    if gpu and spec.get("ns") != "cupy":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**20
    else:
        open("/proc/self/clear_refs", "w").write("5")
        base = _rss("VmRSS:")
    Y = fn()  # the first full call: its peak is the method's working memory
    sync()
    if gpu and spec.get("ns") != "cupy":
        peak = torch.cuda.max_memory_allocated() / 2**20 - base  # device memory
    else:
        peak = _rss("VmHWM:") - base  # host memory (CuPy: its pool is not measured)
    times = []
    for _ in range(spec["inner"]):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return {"times": times, "peak_mib": peak, **_quality(spec, S, X, Y)}


# ----------------------------------------------------------------------------- parent side
def run(spec: dict, timeout: float) -> dict:
    """One measurement in a fresh subprocess (a failure or a timeout is recorded, not raised)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(spec["threads"]), PYTHONPATH=os.pathsep.join(
        [str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    try:
        out = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True,
                             text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    if out.returncode:
        return {"error": (out.stderr.strip().splitlines() or ["exit " + str(out.returncode)])[-1][:300]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _bytes_estimate(spec: dict) -> float:
    """Rough peak of a peer's forward+backward (host memory).

    Sinkhorn: two saved tensors per normalisation plus the data. LinSATNet: its autograd graph, about
    20 bytes per (sample, constraint, variable, iteration) in float64 (16.5 GB measured for partial
    matchings 20 × 20, 41 constraints, batch 1024, 50 iterations).
    """
    m = spec["method"]
    if spec.get("device", "cpu") != "cpu" or not m.startswith(("sinkhorn", "linsat")):
        return 0.0
    its = int(m.split("-")[1])
    k = spec["k"]
    if m.startswith("sinkhorn"):
        return spec["batch"] * k * k * (4 if spec.get("dtype") == "float32" else 8) * (4 * its + 8)
    rows = 2 * k + (1 if spec["part"] == "matching" else 0)
    return 20.0 * spec["batch"] * rows * k * k * its


def compare(base: dict, methods: list[str], args, timeout: float) -> dict:
    """The methods of one comparison, interleaved ``outer`` times; medians and spread."""
    rows: dict[str, dict] = {m: {"times": [], "peaks": []} for m in methods}
    avail = _available_bytes()
    for _ in range(args.outer):
        for m in methods:
            spec = {**base, "method": m, "threads": args.threads, "inner": args.inner, "device": args.device}
            if avail and _bytes_estimate(spec) > 0.6 * avail:
                rows[m]["error"] = f"skipped: needs ~{_bytes_estimate(spec) / 2**30:.1f} GiB (memory budget)"
                continue
            if rows[m]["times"] and statistics.median(rows[m]["times"]) > args.slow:
                continue  # one round of a peer slower than --slow seconds per call is enough
            r = run(spec, timeout)
            if "error" in r:
                rows[m]["error"] = r["error"]
                continue
            rows[m]["times"] += r["times"]
            rows[m]["peaks"].append(r["peak_mib"])
            for key in ("violation", "distance"):
                if key in r:
                    rows[m][key] = r[key]
            print(f"  {base.get('label', '')} {m}: {statistics.median(r['times']):.4f} s, peak {r['peak_mib']:.0f} MiB"
                  + (f", violation {r['violation']:.2e}" if "violation" in r else ""), flush=True)
    out = {}
    for m, r in rows.items():
        row = {k: v for k, v in r.items() if k not in ("times", "peaks")}
        if r["times"]:
            row.update(median_s=statistics.median(r["times"]), min_s=min(r["times"]), max_s=max(r["times"]),
                       runs=len(r["times"]), peak_mib=statistics.median(r["peaks"]))
        out[m] = row
    return out


def _available_bytes() -> float:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024.0
    except OSError:
        pass
    return 0.0


def _ratio(rows: dict, num: str, den: str) -> float | None:
    a, b = rows.get(num, {}).get("median_s"), rows.get(den, {}).get("median_s")
    return None if a is None or b is None else a / b


def part_a(args) -> dict:
    out = {}
    for batch in ([2000, 20000] if args.quick else [100_000, 1_000_000]):
        base = dict(part="birkhoff4", k=4, batch=batch, dtype="float32", label=f"a b={batch}")
        rows = compare(base, ["polyproj", "sinkhorn-20", "sinkhorn-30"], args, args.timeout)
        out[str(batch)] = dict(config=base, rows=rows, speedup_vs_sinkhorn20=_ratio(rows, "sinkhorn-20", "polyproj"),
                               speedup_vs_sinkhorn30=_ratio(rows, "sinkhorn-30", "polyproj"))
    return out


def part_b(args) -> dict:
    out = {}
    for k in ([6, 10] if args.quick else [20, 50]):
        base = dict(part="birkhoff_large", k=k, batch=32 if args.quick else 256, dtype="float64", label=f"b k={k}")
        rows = compare(base, ["polyproj", "generic", "linsat-10", "linsat-50"], args, args.timeout)
        out[str(k)] = dict(config=base, rows=rows, speedup_vs_generic=_ratio(rows, "generic", "polyproj"),
                           speedup_vs_linsat10=_ratio(rows, "linsat-10", "polyproj"))
    return out


def part_c(args) -> dict:
    out = {}
    batch = 5000 if args.quick else 100_000
    for name, upper in (("simplex", None), ("capped", 0.05)):
        for ns in (("numpy", "torch") if args.device == "cpu" else ("torch", "cupy")):
            base = dict(part="simplex", set=name, upper=upper, n=100, batch=batch, ns=ns,
                        generic_rows=min(batch, args.generic_rows), label=f"c {name} {ns}")
            methods = ["polyproj", "sort"] + (["generic"] if ns == "numpy" else [])
            rows = compare(base, methods, args, args.timeout)
            if "generic" in rows and "median_s" in rows["generic"]:  # point by point: linear in the batch
                g = rows["generic"]
                f = batch / base["generic_rows"]
                g.update(measured_rows=base["generic_rows"], per_batch_s=g["median_s"] * f)
            pp_s = rows.get("polyproj", {}).get("median_s")
            entry = dict(config=base, rows=rows, vs_sort=_ratio(rows, "polyproj", "sort"))
            if pp_s and "per_batch_s" in rows.get("generic", {}):
                entry["speedup_vs_generic"] = rows["generic"]["per_batch_s"] / pp_s
            out[f"{name}-{ns}"] = entry
    return out


def part_d(args) -> dict:
    base = dict(part="matching", k=20, alpha=10.0, batch=128 if args.quick else 1024, dtype="float64",
                label="d 20x20")
    rows = compare(base, ["polyproj", "linsat-10", "linsat-50"], args, args.timeout)
    return {"20x20": dict(config=base, rows=rows, speedup_vs_linsat10=_ratio(rows, "linsat-10", "polyproj"),
                          speedup_vs_linsat50=_ratio(rows, "linsat-50", "polyproj"))}


PARTS = {"a": ("birkhoff4", part_a), "b": ("birkhoff_large", part_b), "c": ("simplex", part_c),
         "d": ("matching", part_d)}


def plot(results: dict, path: Path) -> None:
    """Median times (log scale) of each comparison, one panel per part (skipped without matplotlib)."""
    try:
        import matplotlib
    except ImportError:
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for _, (k, _) in PARTS.items() if k in results]
    fig, axes = plt.subplots(1, len(keys), figsize=(3.6 * len(keys), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        labels, vals = [], []
        for cfg, entry in results[key].items():
            for m, row in entry["rows"].items():
                t = row.get("per_batch_s", row.get("median_s"))
                if t is not None:
                    labels.append(f"{cfg}\n{m}")
                    vals.append(t)
        ax.barh(range(len(vals)), vals, color=["C0" if "polyproj" in s else "C7" for s in labels])
        ax.set_yticks(range(len(vals)), labels, fontsize=6)
        ax.set_xscale("log")
        ax.set_xlabel("seconds (median)", fontsize=7)
        ax.set_title(key, fontsize=8)
        ax.tick_params(axis="x", labelsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=sorted(PARTS), action="append")
    ap.add_argument("--outer", type=int, default=3, help="interleaved rounds of the methods")
    ap.add_argument("--inner", type=int, default=2, help="timed calls per worker")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads in every worker")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per worker")
    ap.add_argument("--generic-rows", type=int, default=2000, help="rows the generic path of (c) projects")
    ap.add_argument("--slow", type=float, default=60.0, help="a method slower than this (s/call) runs one round")
    ap.add_argument("--device", default="cpu", help="torch device of the data (cuda: GPU check)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    out = OUT if args.device == "cpu" else RESULTS / f"sets_{args.device.split(':')[0]}.json"
    if os.environ.get("OUT"):  # the device tool's folder
        out = Path(os.environ["OUT"]) / out.name
    results = json.loads(out.read_text()) if out.exists() and not args.quick else {}
    for p in args.part or sorted(PARTS):
        key, fn = PARTS[p]
        print(f"part {p} ({key})", flush=True)
        results[key] = fn(args)
        results["machine_" + key] = {**machine(), "torch_threads": args.threads, "device": args.device,
                                     "outer": args.outer, "inner": args.inner}
        path = out if not args.quick else RESULTS / "sets_quick.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2) + "\n")
    if not args.quick:
        plot({k: v for k, v in results.items() if not k.startswith("machine")}, out.with_suffix(".png"))
    print(json.dumps({k: {c: {m: r.get("median_s") for m, r in e["rows"].items()} for c, e in v.items()}
                      for k, v in results.items() if not k.startswith("machine")}, indent=1))


if __name__ == "__main__":
    main()
