"""Probe of cuSOLVER limits behind polyproj.linalg.EIGH_CHUNK and faces.SVD_HOST_ENTRIES (one H200: benchmarks/results/gpu_probe_h200.log).

torch.linalg.eigh on CUDA batches of 7 x 7 matrices (float32, float64) of growing size, then the SVD of
(s, 101, 50) float64 batches on the GPU against a copy to the host, LAPACK there and back.
"""
# ruff: noqa: E702
import sys
import time

import torch

if any(a in ("-h", "--help") for a in sys.argv[1:]):
    print(__doc__)
    raise SystemExit(0)
if not torch.cuda.is_available():
    raise SystemExit("gpu_probe.py needs a CUDA GPU (torch.cuda.is_available() is False here)")
dev = "cuda"
for dt in (torch.float32, torch.float64):
    for m in (7,):
        for b in (16384, 32768, 65536, 131072, 262144, 524288, 1000000):
            M = torch.randn(b, m, m, device=dev, dtype=dt); S = M @ M.mT
            try:
                lam, Q = torch.linalg.eigh(S); torch.cuda.synchronize(); r = "ok"
            except RuntimeError as e:
                r = "FAIL " + str(e)[:60]
            print(dt, m, b, r, flush=True)
for s, kk, n in ((4, 101, 50), (64, 101, 50), (512, 101, 50)):
    M = torch.randn(s, kk, n, device=dev, dtype=torch.float64)
    for where in ("cuda", "host"):
        def f(M=M, where=where):
            if where == "cuda":
                r = torch.linalg.svd(M, full_matrices=False)
            else:
                r = tuple(t.to(dev) for t in torch.linalg.svd(M.cpu(), full_matrices=False))
            torch.cuda.synchronize(); return r
        f(); t0 = time.perf_counter(); [f() for _ in range(3)]; print("svd", s, kk, n, where, "%.2f ms" % ((time.perf_counter() - t0) / 3 * 1e3), flush=True)
