"""Probe: is one exact-Hessian Newton step a better second-order correction than DIF's chord step?

DIF's second order is one chord-Newton step with H̄ (the Hessian at θ̄) on the removed problem's KKT residual.
This probe takes instead ``--steps`` Newton-MINRES steps (the exact ∇²L at the current point by Hessian-vector
products, MINRES preconditioned by H̄: the retraining's own second stage, :func:`newton_kkt` with one iteration
a step) from the first-order point (θ̄ + ω₁, λ̄ + μ₁), and prints per removal the test-loss change after each step
against the retrained truth.

Needs a trained study cache of ``dif_fairness.py`` (``--cache``; kkt.npz, H.npy and truth.jsonl in it)::

    .venv/bin/python benchmarks/probe_dif_newton_step.py --cache /tmp/polyproj_dif_fairness --removals 95 98 56 92 94 87

Measured 2026-12-06 on the cache of ``dif_fairness_rerun.json`` (one core, 21-41 s a removal against 2.6 s for the
chord step): after one step g15 −3.22e-3 (truth −1.76e-4; chord −1.11e-3), g18 8.72e-4 (1.05e-3; 1.02e-4), s56
5.65e-4 (4.99e-4; 2.34e-5), g12 −5.90e-4 (−3.30e-4; −4.95e-4), g14 5.76e-4 (1.55e-3; 8.31e-4), g7 −2.53e-4
(−9.83e-5; −3.62e-4): better on 3, worse on 3, g15 (which holds r below 0.95) among the worse. Not adopted.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dif_fairness as study

from polyproj.adapters.dif.newton import newton_kkt


def main(argv=None) -> int:
    ap = study.probe_parser(__doc__)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    st, rows = study.probe_removals(args)
    for key, removed, first, t0 in rows:
        th, lam = st.kkt.theta + first.omega, st.dif.lin.lam + first.multipliers
        changes, residuals = [float(st.F(st.prob.wrap(th))) - st.F0], []
        for _ in range(args.steps):
            th, lam, info = newton_kkt(removed, th, lam, tol=st.sargs.tol, preconditioner=st.frozen,
                                       chunk_size=st.sargs.chunk, max_iter=1, rtol=1e-8)
            changes.append(float(st.F(st.prob.wrap(th))) - st.F0)
            residuals.append(info.residuals[-1])
        print(json.dumps({"removal": key, "retrained": st.truth[key]["dF"], "after_each_step": changes,
                          "kkt_residuals": residuals, "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
