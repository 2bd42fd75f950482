"""All-point DIF scores on the dense path: the Schur-complement route against one d-variable QP per sample.

Least squares (N samples, d parameters, weight decay 1e-3) with one binding bound, scores of the test function
‖θ‖² for every single removal. The Schur route (H positive definite: one Cholesky factorisation, s_test and
V = H⁻¹C_Aᵀ once, a k-variable dual QP per removal) is what ``DIF.influence`` takes; ``--qp-route`` forces the
d-variable QPs for comparison (minutes at the default size). Both answers are printed with their largest
difference when both are run.

    .venv/bin/python benchmarks/bench_dif_dense_scores.py [--n 2000] [--d 800] [--qp-route]
"""

from __future__ import annotations

import argparse
import time
import warnings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2000, help="training samples (default 2000)")
    p.add_argument("--d", type=int, default=800, help="parameters (default 800)")
    p.add_argument("--qp-route", action="store_true", help="also time one d-variable QP per sample")
    args = p.parse_args(argv)

    import numpy as np
    import torch

    from polyproj.adapters.dif import DIF, ConstrainedProblem, Constraint, Loss, engine, solve
    from polyproj.runtime import set_torch_threads

    set_torch_threads(1)
    rng = np.random.default_rng(0)
    X = torch.as_tensor(rng.normal(size=(args.n, args.d)))
    y = torch.as_tensor(rng.normal(size=args.n))

    def sq(th, b):
        return (b[0] @ th - b[1]) ** 2 + 1e-3 * (th ** 2).sum()

    def cap(th):
        return th[1]

    prob = ConstrainedProblem(torch.zeros(args.d), Loss(sq, (X, y)), [Constraint(cap, None, tau=-0.05, name="cap")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kkt = solve(prob)
    dif = DIF(prob, kkt, method="dense")

    def F(th):
        return (th ** 2).sum()

    t0 = time.perf_counter()
    schur = dif.influence(F).numpy()
    t_schur = time.perf_counter() - t0
    print(f"N {args.n}, d {args.d}, constraint {kkt.classification}: Schur route {t_schur:.3g} s")
    if args.qp_route:
        real = engine.DIF._dense_schur
        engine.DIF._dense_schur = property(lambda self: False)
        try:
            t0 = time.perf_counter()
            qps = dif.influence(F).numpy()
            t_qp = time.perf_counter() - t0
        finally:
            engine.DIF._dense_schur = real
        print(f"one d-variable QP per sample {t_qp:.3g} s ({t_qp / t_schur:.0f}x); largest difference "
              f"{np.abs(schur - qps).max():.2e} (scores up to {np.abs(qps).max():.2e})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
