#!/usr/bin/env bash
# GPU check, in three parts run in this order by default (`bash benchmarks/gpu_check.sh [layer|ipm|sets|all]`):
#   layer (issue 19): the bench_layer problem (n 50, m 100, one equality, bounds, float64) at batch 8192 on
#     CUDA, forward + backward, checked against the float64 NumPy reference and timed against the same layer
#     on this machine's CPU and against qpth's QPFunction on CUDA (when carried); batch 128 and 1024 on CUDA
#     too (figures to $OUT/layer_gpu.json; GPU_LAYER_PEERS=0 leaves qpth out, ~1 minute);
#   ipm (issue 4): correctness of the `cupy` backend and of the torch-CUDA path, then the GPU benchmark
#     (batch 8192, n 100, m 200, one equality) against ProxSuite's solve_in_parallel on the CPU
#     (figures to $OUT/batch_gpu.json);
#   sets (issue 15): CUDA == NumPy for Birkhoff, capped simplex and partial matchings, and
#     benchmarks/bench_sets.py --device cuda (parts a and c, Sinkhorn on the same device).
# The parts share one deadline, GPU_BUDGET seconds (default 540) from the start: each part's timeout is
# cut to what is left and a part with under 20 s left is skipped, so the whole check fits one device call.
#
# Machine: Python 3.12 with CuPy, torch, numpy, scipy, pytest, rich (no array_api_compat, proxsuite, daqp,
# qpth). Carry them, prepared here once (repo root):
#
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       -d .whl array-api-compat proxsuite daqp
#   mkdir -p .whl/py && cp -r .venv/lib/python3.11/site-packages/qpth .whl/py/   # pure Python, sdist only
#
# then run through the device tool with carry [".whl"] and the command
#   bash benchmarks/gpu_check.sh
# Figures go to $OUT (device tool) or benchmarks/results.
set -uo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site:/tmp/site/cmeel.prefix/lib/python3.12/site-packages:${PYTHONPATH:-}"
fi
[ -d .whl/py ] && export PYTHONPATH="$PWD/.whl/py:${PYTHONPATH:-}"
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
OUTDIR="${OUT:-benchmarks/results}"
mkdir -p "$OUTDIR"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

PART="${1:-all}"
rc=0
START=$SECONDS
BUDGET="${GPU_BUDGET:-540}"
# the timeout for a part that wants $1 seconds: what is left of the budget, or 0 (skip) under 20 s
tmo() { local left=$((BUDGET - (SECONDS - START))); local t=$(( $1 < left ? $1 : left )); (( t < 20 )) && t=0; echo $t; }
run_part() { [ "$PART" = "all" ] || [ "$PART" = "$1" ]; }
# ---------------------------------------------------------------- the torch layer on CUDA (issue 19)
if run_part layer && [ "$(tmo 240)" -gt 0 ]; then
timeout "$(tmo 240)" python3 - "$OUTDIR/layer_gpu.json" <<'PY' || rc=1
import json, os, sys, time, types
import numpy as np, torch
sys.path.insert(0, "benchmarks")
from bench_layer import make_problem, reference
from polyproj.adapters.torch import project

out_path = sys.argv[1]
out, ok = {"n": 50, "m": 100, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "cpu_threads": torch.get_num_threads()}, True


def save():
    with open(out_path, "w") as fh:
        json.dump(out, fh, indent=2)


def tensors(d, device):
    return {k: torch.tensor(v, dtype=torch.float64, device=device) for k, v in d.items()}


def timed(once, device, reps):
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    once(); sync()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter(); y, g = once(); sync(); times.append(time.perf_counter() - t0)
    return float(np.median(times)), times, y, g


def polyproj_once(t):
    def once():
        x = t["X"].clone().requires_grad_()
        y = project(x, t["A"], t["a"], t["B"], t["b"], t["lb"], t["ub"])
        (y * t["V"]).sum().backward()
        return y.detach(), x.grad
    return once


def qpth_once(t):
    sys.modules.setdefault("cvxpy", types.ModuleType("cvxpy"))  # qpth imports it for a solver not used here
    from qpth.qp import QPFunction
    n, dev = t["X"].shape[1], t["X"].device
    eye = torch.eye(n, dtype=torch.float64, device=dev)
    G = torch.cat([t["A"], -eye, eye]); h = torch.cat([t["a"], -t["lb"], t["ub"]])

    def once():  # its defaults: eps 1e-12, maxIter 20, as in bench_layer
        p = (-t["X"]).clone().requires_grad_()
        y = QPFunction(verbose=-1)(eye, p, G, h, t["B"], t["b"])
        (y * t["V"]).sum().backward()
        return y.detach(), -p.grad
    return once


def record(key, med, times, y, g, y_ref, g_ref, exact):
    global ok
    ey = float(np.abs(y.cpu().numpy() - y_ref).max()); eg = float(np.abs(g.cpu().numpy() - g_ref).max())
    good = (ey < 1e-9 and eg < 1e-8) if exact else True
    ok &= good
    out[key] = {"median_s": med, "times": times, "max_dy": ey, "max_dgrad": eg, "on_cuda": bool(y.is_cuda)}
    save()
    print(("PASS " if good else "INFO ") + f"{key}: {med:.4f} s fwd+bwd, max|dy| {ey:.1e}, max|dgrad| {eg:.1e}",
          flush=True)


for batch in (8192, 1024, 128):
    d = make_problem(batch, 50, 100)
    _, y_ref, g_ref = reference(d)
    tc = tensors(d, "cuda")
    record(f"polyproj_cuda_b{batch}", *timed(polyproj_once(tc), "cuda", 5), y_ref, g_ref, True)
    if batch == 8192:
        record("polyproj_cpu_b8192", *timed(polyproj_once(tensors(d, "cpu")), "cpu", 1), y_ref, g_ref, True)
        out["speedup_cuda_vs_cpu_b8192"] = out["polyproj_cpu_b8192"]["median_s"] / out["polyproj_cuda_b8192"]["median_s"]
        print(f"layer CUDA vs this machine's CPU ({torch.get_num_threads()} threads), batch 8192: "
              f"{out['speedup_cuda_vs_cpu_b8192']:.1f}x", flush=True)
        try:
            if os.environ.get("GPU_LAYER_PEERS", "1") == "0":
                raise ImportError("GPU_LAYER_PEERS=0")
            record("qpth_cuda_b8192", *timed(qpth_once(tc), "cuda", 2), y_ref, g_ref, False)
            out["speedup_vs_qpth_cuda_b8192"] = out["qpth_cuda_b8192"]["median_s"] / out["polyproj_cuda_b8192"]["median_s"]
            print(f"polyproj vs qpth, both on CUDA, batch 8192: {out['speedup_vs_qpth_cuda_b8192']:.1f}x", flush=True)
        except ImportError as exc:
            print("qpth not carried:", exc, flush=True)
    out["all_checks_passed"] = bool(ok)
    save()
raise SystemExit(0 if ok else 1)
PY
fi

# ---------------------------------------------------------------- the batched IPM on CuPy and torch CUDA (issue 4)
if run_part ipm && [ "$(tmo 240)" -gt 0 ]; then
timeout "$(tmo 240)" python3 - "$OUTDIR/batch_gpu.json" <<'PY' || rc=1
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
sys.path.insert(0, "benchmarks")
from common import random_qp_batch

P, q, C, l, u, lb, ub = random_qp_batch()
n, m, b = C.shape[1], C.shape[0], q.shape[0]
ref = solve_qp_batch(P, q, C, l, u, lb, ub, eps_abs=1e-9)
g = solve_qp_batch(*(cp.asarray(v) for v in (P, q, C, l, u, lb, ub)), eps_abs=1e-9)
check("cupy result stays cupy", isinstance(g.x, cp.ndarray))
# two solves to eps 1e-9 agree to what their duality gaps guarantee: |x - x*|^2 <= 2 gap / lambda_min(P) for each
mu = float(np.linalg.eigvalsh(P).min())


def agree(x, gap):
    dx = np.abs(x - ref.x).max(axis=1)
    bound = np.sqrt(2 * (np.asarray(gap) + ref.gap) / mu)
    return bool((dx <= bound).all()), f"max|dx| {dx.max():.2e}, bound from the gaps {bound[dx.argmax()]:.1e}"


ok, detail = agree(cp.asnumpy(g.x), cp.asnumpy(g.gap))
check("cupy == numpy (random QPs)", ok and all(s.name == "SOLVED" for s in g.statuses()), detail)
dev = torch.device("cuda")
t = solve_qp_batch(*(torch.from_numpy(v).to(dev) for v in (P, q, C, l, u, lb, ub)), eps_abs=1e-9)
check("torch CUDA result stays on the GPU", t.x.is_cuda)
ok, detail = agree(t.x.cpu().numpy(), t.gap.cpu().numpy())
check("torch CUDA == numpy", ok and all(s.name == "SOLVED" for s in t.statuses()), detail)
# one infeasible element
C2 = C.copy(); C2[1] = C2[0]
L = np.tile(l, (4, 1)); U = np.tile(u, (4, 1))
L[:, 1], U[:, 1] = L[:, 0], U[:, 0]
L[2, 1], U[2, 1] = U[2, 0] + 1, U[2, 0] + 2
r = solve_qp_batch(*(cp.asarray(v) for v in (P, q[:4], C2, L, U, lb, ub)))
st = [s.name for s in r.statuses()]
check("infeasible element flagged alone (cupy)", st[2] == "PRIMAL_INFEASIBLE" and st.count("SOLVED") == 3, str(st))
# backend + polish
rng = np.random.default_rng(1)  # the polish check's own data
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
        med = report["bench"][mod]["median_s"]
        report["bench"][mod]["speedup_vs_proxsuite_this_cpu"] = (t2 - t0) / med  # its set-up loop included
        report["bench"][mod]["speedup_vs_proxsuite_solve_only"] = (t2 - t1) / med
        print(f"{mod}: {(t2 - t0) / med:.1f}x vs ProxSuite BatchQP set-up + solve_in_parallel, {(t2 - t1) / med:.2f}x vs "
              f"its solve alone ({os.cpu_count()} threads here)")
except ImportError:
    print("proxsuite not carried: compare with the CPU figure of benchmarks/results/batch_cpu.json")
report["all_checks_passed"] = ok_all
with open(out_path, "w") as fh:
    json.dump(report, fh, indent=2)
print("wrote", out_path)
raise SystemExit(0 if ok_all else 1)
PY
fi

# ---------------------------------------------------------------- structured sets (issue 15): CUDA == CPU, then the benchmark
if run_part sets && [ "$(tmo 120)" -gt 0 ]; then
timeout "$(tmo 120)" python3 - <<'PY' || rc=1
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
[ "$(tmo 300)" -gt 0 ] && timeout "$(tmo 300)" python3 benchmarks/bench_sets.py --device cuda --part a --part c --outer 1 --inner 3 --timeout 100
fi

# the GPU-relevant unit tests (NumPy/torch/array_api_strict ones run on CPU CI; here torch CUDA is exercised above)
if [ "$PART" = "all" ] && [ "$(tmo 200)" -gt 0 ]; then
  timeout "$(tmo 200)" python3 -m pytest -q -x tests/test_ipm.py -k "not strict" -p no:cacheprovider 2>&1 | tail -5
fi
echo "gpu_check: $((SECONDS - START)) s, rc $rc"
exit $rc
