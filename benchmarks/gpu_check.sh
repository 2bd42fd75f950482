#!/usr/bin/env bash
# GPU check of the batched IPM (issue 4): correctness of the `cupy` backend and of the torch-CUDA
# path, then the GPU benchmark (batch 8192, n 100, m 200, one equality) against ProxSuite's
# solve_in_parallel on the CPU; then the structured sets (issue 15): CUDA == NumPy for Birkhoff,
# capped simplex and partial matchings, and benchmarks/bench_sets.py --device cuda (parts a and c,
# Sinkhorn on the same device; figures to $OUT/sets_cuda.json); then the torch layer (issue 19): the
# bench_layer problem (n 50, m 100, one equality, bounds, float64) at batch 8192 on CUDA, forward +
# backward, checked against the float64 NumPy reference and timed against the same layer on this
# machine's CPU (figures to $OUT/layer_gpu.json). `bash benchmarks/gpu_check.sh ipm`, `... sets` or
# `... layer` runs one part (each sized to well under 8 minutes on one H200; all together do not fit
# one 15-minute device budget).
#
# Machine: Python 3.12 with CuPy, torch, numpy, scipy, pytest, rich (no array_api_compat, no
# proxsuite). Carry them as wheels, prepared here once (repo root):
#
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       -d .whl array-api-compat proxsuite
#
# then run through the device tool with carry [".whl"] and the command
#   bash benchmarks/gpu_check.sh
# Figures go to $OUT/batch_gpu.json (device tool) or benchmarks/results/batch_gpu.json.
set -uo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
OUTDIR="${OUT:-benchmarks/results}"
mkdir -p "$OUTDIR"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

PART="${1:-all}"
rc=0
if [ "$PART" != "sets" ] && [ "$PART" != "layer" ]; then
timeout 420 python3 - "$OUTDIR/batch_gpu.json" <<'PY'
import json, platform, sys, time
import numpy as np

out_path = sys.argv[1]
report = {"machine": {"python": platform.python_version(), "platform": platform.platform()}, "checks": {}, "bench": {}}
ok_all = True

def check(name, cond, detail=""):
    global ok_all
    report["checks"][name] = {"ok": bool(cond), "detail": detail}
    ok_all &= bool(cond)
    print(("PASS " if cond else "FAIL ") + name, detail, flush=True)

import cupy as cp
import torch
import polyproj as pp
from polyproj.solvers.ipm import solve_qp_batch

report["machine"]["gpu"] = torch.cuda.get_device_name(0)
report["machine"]["cupy"] = cp.__version__
report["machine"]["torch"] = torch.__version__
check("cupy backend available", "cupy" in pp.available_backends(), str(pp.backend_info()[-1]))

# ---------------------------------------------------------------- correctness: random QPs
rng = np.random.default_rng(0)
n, m, b = 30, 50, 64
A = rng.standard_normal((n, n)); P = A @ A.T / n + 0.1 * np.eye(n)
C = rng.standard_normal((m, n)); x0 = rng.uniform(-1, 1, n)
l = C @ x0 - rng.uniform(0.1, 1, m); u = C @ x0 + rng.uniform(0.1, 1, m)
l[:5] = -np.inf; u[5:10] = np.inf; l[10] = u[10] = (C @ x0)[10]
lb = -2 * np.ones(n); ub = np.full(n, np.inf)
q = 3 * rng.standard_normal((b, n))
ref = solve_qp_batch(P, q, C, l, u, lb, ub, eps_abs=1e-9)
g = solve_qp_batch(*(cp.asarray(v) for v in (P, q, C, l, u, lb, ub)), eps_abs=1e-9)
check("cupy result stays cupy", isinstance(g.x, cp.ndarray))
err = float(np.max(np.abs(cp.asnumpy(g.x) - ref.x)))
check("cupy == numpy (random QPs)", err < 1e-7 and all(s.name == "SOLVED" for s in g.statuses()), f"max|dx| {err:.2e}")
dev = torch.device("cuda")
t = solve_qp_batch(*(torch.from_numpy(v).to(dev) for v in (P, q, C, l, u, lb, ub)), eps_abs=1e-9)
check("torch CUDA result stays on the GPU", t.x.is_cuda)
err = float(np.max(np.abs(t.x.cpu().numpy() - ref.x)))
check("torch CUDA == numpy", err < 1e-7, f"max|dx| {err:.2e}")
# one infeasible element
C2 = C.copy(); C2[1] = C2[0]
L = np.tile(l, (4, 1)); U = np.tile(u, (4, 1))
L[:, 1], U[:, 1] = L[:, 0], U[:, 0]
L[2, 1], U[2, 1] = U[2, 0] + 1, U[2, 0] + 2
r = solve_qp_batch(*(cp.asarray(v) for v in (P, q[:4], C2, L, U, lb, ub)))
st = [s.name for s in r.statuses()]
check("infeasible element flagged alone (cupy)", st[2] == "PRIMAL_INFEASIBLE" and st.count("SOLVED") == 3, str(st))
# backend + polish
poly = pp.Polyhedron(A=rng.standard_normal((59, 30)), a=np.ones(59) * 2, B=np.ones((1, 30)), b=[1.0])
X = 3 * rng.standard_normal((128, 30))
ry = pp.project(X, poly, backend="cupy").y
rr = pp.project(X, poly, backend="proxsuite").y if "proxsuite" in pp.available_backends() else pp.project(X, poly, backend="ipm").y
check("pp.project(backend='cupy') after polish", float(np.max(np.abs(ry - rr))) < 1e-7, f"{float(np.max(np.abs(ry - rr))):.1e}")

# ---------------------------------------------------------------- benchmark: batch 8192, n 100
n, batch = 100, 8192
rng = np.random.default_rng(0)
A = rng.standard_normal((2 * n - 1, n)); y0 = rng.standard_normal(n)
a = A @ y0 + rng.uniform(0.1, 1.0, 2 * n - 1); B = rng.standard_normal((1, n)); bb = B @ y0
X = 2.0 * rng.standard_normal((batch, n))
Cm = np.vstack([A, B]); lo = np.concatenate([np.full(2 * n - 1, -np.inf), bb]); hi = np.concatenate([a, bb])

def gpu_run(mod, eps):
    if mod == "cupy":
        args = [cp.asarray(v) for v in (np.eye(n), -X, Cm, lo, hi)]
        sync = cp.cuda.Device().synchronize
    else:
        args = [torch.from_numpy(v).to(dev) for v in (np.eye(n), -X, Cm, lo, hi)]
        sync = torch.cuda.synchronize
    res = solve_qp_batch(*args, eps_abs=eps); sync()  # warm-up
    times = []
    for _ in range(3):
        t0 = time.perf_counter(); res = solve_qp_batch(*args, eps_abs=eps); sync(); times.append(time.perf_counter() - t0)
    x = cp.asnumpy(res.x) if mod == "cupy" else res.x.cpu().numpy()
    return float(np.median(times)), times, x, [s.name for s in res.statuses()]

for mod in ("cupy", "torch-cuda"):
    tm, times, x, st = gpu_run("cupy" if mod == "cupy" else "torch", 1e-8)
    report["bench"][mod] = {"median_s": tm, "times": times, "solved": st.count("SOLVED"), "batch": batch, "n": n}
    print(f"{mod}: {tm:.3f} s (solved {st.count('SOLVED')}/{batch})", flush=True)
    report["bench"][mod + "_x_sample"] = x[:2].tolist()

try:
    import os, proxsuite
    t0 = time.perf_counter()
    bq = proxsuite.proxqp.dense.BatchQP()
    for i in range(batch):
        qp = bq.init_qp_in_place(n, 1, 2 * n - 1)
        qp.settings.eps_abs = 1e-8; qp.settings.eps_rel = 0.0
        qp.init(np.eye(n), -X[i], B, bb, A, np.full(2 * n - 1, -1e20), a)
    t1 = time.perf_counter()
    proxsuite.proxqp.dense.solve_in_parallel(bq, os.cpu_count())
    t2 = time.perf_counter()
    xp_ = np.stack([bq.get(i).results.x for i in range(batch)])
    report["bench"]["proxsuite_parallel_this_cpu"] = {"total_s": t2 - t0, "solve_s": t2 - t1, "threads": os.cpu_count()}
    for mod in ("cupy", "torch-cuda"):
        report["bench"][mod]["speedup_vs_proxsuite_this_cpu"] = (t2 - t0) / report["bench"][mod]["median_s"]
        print(f"{mod}: {(t2 - t0) / report['bench'][mod]['median_s']:.1f}x vs ProxSuite solve_in_parallel ({os.cpu_count()} threads here)")
except ImportError:
    print("proxsuite not carried: compare with the CPU figure of benchmarks/results/batch_cpu.json")
report["all_checks_passed"] = ok_all
with open(out_path, "w") as fh:
    json.dump(report, fh, indent=2)
print("wrote", out_path)
PY
rc=$?
fi

if [ "$PART" = "layer" ] || [ "$PART" = "all" ]; then
# ---------------------------------------------------------------- the torch layer on CUDA (issue 19)
timeout 300 python3 - "$OUTDIR/layer_gpu.json" <<'PY' || rc=1
import json, sys, time
import numpy as np, torch
sys.path.insert(0, "benchmarks")
from bench_layer import make_problem, reference
from polyproj.adapters.torch import project

out, ok = {"batch": 8192, "n": 50, "m": 100, "gpu": torch.cuda.get_device_name(0)}, True
d = make_problem(8192, 50, 100)
_, y_ref, g_ref = reference(d)

def timed(device, reps=3):
    t = {k: torch.tensor(v, dtype=torch.float64, device=device) for k, v in d.items()}
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def once():
        x = t["X"].clone().requires_grad_()
        y = project(x, t["A"], t["a"], t["B"], t["b"], t["lb"], t["ub"])
        (y * t["V"]).sum().backward()
        sync()
        return y.detach(), x.grad
    once()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter(); y, g = once(); times.append(time.perf_counter() - t0)
    return float(np.median(times)), times, y, g

for dev in ("cuda", "cpu"):
    med, times, y, g = timed(dev, 3 if dev == "cuda" else 1)
    ey = float(np.abs(y.cpu().numpy() - y_ref).max()); eg = float(np.abs(g.cpu().numpy() - g_ref).max())
    good = ey < 1e-9 and eg < 1e-8 and (y.is_cuda if dev == "cuda" else True)
    ok &= good
    out[dev] = {"median_s": med, "times": times, "max_dy": ey, "max_dgrad": eg}
    print(("PASS " if good else "FAIL ") + f"layer fwd+bwd on {dev}: {med:.3f} s, max|dy| {ey:.1e}, max|dgrad| {eg:.1e}",
          flush=True)
out["speedup_cuda_vs_cpu"] = out["cpu"]["median_s"] / out["cuda"]["median_s"]
print(f"layer CUDA vs this machine's CPU: {out['speedup_cuda_vs_cpu']:.1f}x", flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=2)
raise SystemExit(0 if ok else 1)
PY
[ "$PART" = "layer" ] && exit $rc
fi

if [ "$PART" != "ipm" ]; then
# ---------------------------------------------------------------- structured sets (issue 15): CUDA == CPU, then the benchmark
timeout 120 python3 - <<'PY' || rc=1
import numpy as np, torch, polyproj as pp
rng = np.random.default_rng(0)
ok = True
for S, X in ((pp.sets.Birkhoff(4), rng.normal(size=(4096, 16))), (pp.sets.Birkhoff(30), rng.normal(size=(64, 900))),
             (pp.sets.CappedSimplex(100, 1.0, 0.05), rng.normal(size=(4096, 100))),
             (pp.sets.PartialMatching(20, 20, 10.0), rng.normal(size=(256, 400)))):
    ref = S.project(X)
    for dt, tol in ((torch.float64, 1e-10), (torch.float32, 1e-4)):
        res = S.project(torch.tensor(X, dtype=dt, device="cuda"))
        err = float(np.abs(res.y.reshape(X.shape).double().cpu().numpy() - ref.y.reshape(X.shape)).max())
        good = res.y.is_cuda and err < tol and bool(res.polished.all())
        ok &= good
        print(("PASS " if good else "FAIL ") + f"{S!r} {dt} on CUDA == NumPy: max|dy| {err:.1e}", flush=True)
    x = torch.tensor(X[:256], device="cuda", requires_grad=True)
    from polyproj.adapters.torch import project
    project(x, S).sum().backward()
    print(("PASS " if x.grad.is_cuda else "FAIL ") + f"{S!r} backward on CUDA", flush=True)
raise SystemExit(0 if ok else 1)
PY
timeout 360 python3 benchmarks/bench_sets.py --device cuda --part a --part c --outer 1 --inner 3 --timeout 100 || true
fi
[ "$PART" = "sets" ] && exit $rc
# the GPU-relevant unit tests (NumPy/torch/array_api_strict ones run on CPU CI; here torch CUDA is exercised above)
timeout 200 python3 -m pytest -q -x tests/test_ipm.py -k "not strict" -p no:cacheprovider 2>&1 | tail -5 || true
exit $rc
