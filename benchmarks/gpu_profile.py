# ruff: noqa: E702
"""Where the GPU time goes (issue 19's "where the time goes", issue 4's batched IPM), on a CUDA machine.

Three short measurements, each printed and written to ``$OUT/gpu_profile.json`` (or benchmarks/results):

1. the torch layer at batch 8192 (bench_layer's problem, n 50, m 100, one equality, bounds, float64):
   forward and backward timed apart, the forward's stages by torch.profiler (CUDA kernel time and CPU
   time of the top operators) and by cProfile (the Python functions holding the wall clock, syncs
   included);
2. the batched IPM at batch 8192, n 100, m 200 (gpu_check.sh's benchmark) on torch CUDA: iterations,
   statuses of the elements not solved, time per iteration, and its cProfile;
3. gpu_check's random-QP check on torch CUDA against NumPy with the residuals, duality gaps and the bound
   ``sqrt(2 gap / lambda_min(P))`` on |x - x*| that the tolerance guarantees.

Run with ``python3 benchmarks/gpu_profile.py`` (wheels as gpu_check.sh says); about 2 minutes on one H200.
``GPU_PROFILE_DEVICE=cpu GPU_PROFILE_BATCH=256`` runs the same script on the CPU (a dry run).
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_layer import make_problem
from common import random_qp_batch

from polyproj.adapters.torch import project
from polyproj.solvers.ipm import solve_qp_batch

OUT = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
if any(a in ("-h", "--help") for a in sys.argv[1:]):
    print(__doc__)
    raise SystemExit(0)
if os.environ.get("GPU_PROFILE_DEVICE", "cuda") == "cuda" and not torch.cuda.is_available():
    raise SystemExit("gpu_profile.py needs a CUDA GPU (or GPU_PROFILE_DEVICE=cpu for a CPU run)")
dev = torch.device(os.environ.get("GPU_PROFILE_DEVICE", "cuda"))
BATCH = int(os.environ.get("GPU_PROFILE_BATCH", "8192"))
sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
report: dict = {"device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
                "batch": BATCH}


def save():
    (OUT / "gpu_profile.json").write_text(json.dumps(report, indent=2))


def top_cprofile(fn, n=25):
    pr = cProfile.Profile()
    pr.enable(); fn(); sync(); pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(n)
    s2 = io.StringIO()
    pstats.Stats(pr, stream=s2).sort_stats("tottime").print_stats(n)
    return s.getvalue()[-6000:], s2.getvalue()[-6000:]


# ----------------------------------------------------------------------------- 1. the layer
d = make_problem(BATCH, 50, 100)
t = {k: torch.tensor(v, dtype=torch.float64, device=dev) for k, v in d.items()}


def fwd():
    x = t["X"].clone().requires_grad_()
    return x, project(x, t["A"], t["a"], t["B"], t["b"], t["lb"], t["ub"])


for _ in range(2):
    x, y = fwd(); (y * t["V"]).sum().backward(); sync()
tf, tb = [], []
for _ in range(5):
    t0 = time.perf_counter(); x, y = fwd(); sync(); t1 = time.perf_counter()
    (y * t["V"]).sum().backward(); sync(); t2 = time.perf_counter()
    tf.append(t1 - t0); tb.append(t2 - t1)
report["layer_b8192"] = {"forward_s": float(np.median(tf)), "backward_s": float(np.median(tb))}
print(f"layer b8192: forward {np.median(tf):.4f} s, backward {np.median(tb):.4f} s", flush=True)
save()

from torch.profiler import ProfilerActivity, profile  # noqa: E402

with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])) as prof:
    x, y = fwd(); (y * t["V"]).sum().backward(); sync()
ka = prof.key_averages()
by_cuda = ka.table(sort_by="cuda_time_total" if dev.type == "cuda" else "cpu_time_total", row_limit=20)
by_cpu = ka.table(sort_by="self_cpu_time_total", row_limit=20)
n_launch = sum(e.count for e in ka if e.key.startswith("cudaLaunchKernel") or e.key == "cudaLaunchKernel")
n_sync = sum(e.count for e in ka if "Synchronize" in e.key or e.key in ("cudaMemcpyAsync", "cudaStreamSynchronize"))
report["layer_b8192"].update(kernel_launches=n_launch, memcpy_or_sync=n_sync)
print(by_cuda[-5000:]); print(by_cpu[-5000:]); print("kernel launches", n_launch, "memcpy/sync", n_sync, flush=True)
cum, tot = top_cprofile(lambda: fwd())
print(cum); print(tot, flush=True)
report["layer_b8192"]["cprofile_forward_cumulative"] = cum
report["layer_b8192"]["profiler_by_cuda"] = by_cuda[-5000:]
save()

# ----------------------------------------------------------------------------- 2. the IPM at batch 8192
n, batch = 100, BATCH
rng = np.random.default_rng(0)
A = rng.standard_normal((2 * n - 1, n)); y0 = rng.standard_normal(n)
a = A @ y0 + rng.uniform(0.1, 1.0, 2 * n - 1); B = rng.standard_normal((1, n)); bb = B @ y0
X = 2.0 * rng.standard_normal((batch, n))
Cm = np.vstack([A, B]); lo = np.concatenate([np.full(2 * n - 1, -np.inf), bb]); hi = np.concatenate([a, bb])
args = [torch.from_numpy(v).to(dev) for v in (np.eye(n), -X, Cm, lo, hi)]
res = solve_qp_batch(*args, eps_abs=1e-8); sync()
t0 = time.perf_counter(); res = solve_qp_batch(*args, eps_abs=1e-8); sync(); el = time.perf_counter() - t0
it = res.iterations.cpu().numpy(); st = [s.name for s in res.statuses()]
bad = [i for i, s in enumerate(st) if s != "SOLVED"]
report["ipm_b8192"] = {"seconds": el, "iterations_max": int(it.max()), "iterations_median": float(np.median(it)),
                       "not_solved": {str(i): [st[i], int(it[i]), float(res.prim_res[i]), float(res.dual_res[i]),
                                               float(res.gap[i])] for i in bad[:20]}}
print(f"IPM b8192 torch-cuda: {el:.3f} s, iterations median {np.median(it)} max {it.max()}, "
      f"{el / max(int(it.max()), 1) * 1e3:.1f} ms per iteration; not solved: {report['ipm_b8192']['not_solved']}", flush=True)
save()
cum, tot = top_cprofile(lambda: solve_qp_batch(*args, eps_abs=1e-8))
print(cum); print(tot, flush=True)
report["ipm_b8192"]["cprofile_cumulative"] = cum
save()

# ----------------------------------------------------------------------------- 3. the random-QP check
P, q, C, l, u, lb, ub = random_qp_batch()
ref = solve_qp_batch(P, q, C, l, u, lb, ub, eps_abs=1e-9)
g = solve_qp_batch(*(torch.from_numpy(v).to(dev) for v in (P, q, C, l, u, lb, ub)), eps_abs=1e-9)
mu = float(np.linalg.eigvalsh(P).min())
dx = np.abs(g.x.cpu().numpy() - ref.x).max(axis=1)
gaps = g.gap.cpu().numpy() + ref.gap
bound = np.sqrt(2 * gaps / mu)
report["ipm_check"] = {"max_dx": float(dx.max()), "worst": int(dx.argmax()), "lambda_min_P": mu,
                       "gap_torch_cuda": float(g.gap.max()), "gap_numpy": float(ref.gap.max()),
                       "prim_res_torch_cuda": float(g.prim_res.max()), "dual_res_torch_cuda": float(g.dual_res.max()),
                       "iterations_torch_cuda": g.iterations.cpu().numpy().tolist(),
                       "iterations_numpy": np.asarray(ref.iterations).tolist(),
                       "dx_within_gap_bound": bool((dx <= bound + 1e-12).all()), "bound_at_worst": float(bound[dx.argmax()])}
print("IPM check:", {k: v for k, v in report["ipm_check"].items() if not k.startswith("iterations")}, flush=True)
save()
