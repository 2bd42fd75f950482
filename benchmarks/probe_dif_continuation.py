#!/usr/bin/env python
"""Probe: does the fairness study's ground truth depend on the route retraining takes?

The truth of ``benchmarks/dif_fairness.py`` re-solves each removed problem from θ̄ in one go (chord SQP, then
Newton-MINRES, then an augmented-Lagrangian detour where those stall). On this non-convex loss the removed
problem may have several KKT points; the one DIF describes is the end of the solution path θ(t) of the
perturbed problem (removed samples weighted 1 − t, ``ConstrainedProblem.perturbed``) as t goes from 0 to 1.
This probe follows that path: ``--stages`` re-solves at t = 1/K, 2/K, …, 1, each by the same chain of
methods from the previous stage's point and multipliers, and prints, per removal, the test-loss change
at its end against the one-go truth (and the constraint values of both ends: the truth keeps no θ), and the
KKT residuals.

Needs a trained study cache of ``dif_fairness.py`` (``--cache``: the directory holding ``seed0_…``; kkt.npz,
H.npy and truth.jsonl in it)::

    .venv/bin/python benchmarks/probe_dif_continuation.py --cache /tmp/polyproj_dif_fairness --removals 95 98

Measured 2026-12-06 on the cache of ``dif_fairness_rerun.json`` (one core, 4 stages; the removals whose
second-order correction is shortened or dropped most): the path ends where the one-go re-solve did, g15
−1.7603e-4 against −1.7605e-4 (‖Δθ‖ 1.1384 both), g18, g12, s56 and g14 within |ΔF| <= 3.0e-6 (0.2 % of
g14's effect; both ends at KKT residual <= 1e-10). DIF's misses on these removals are its expansion's, not a
different KKT point reached by retraining.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dif_fairness as study


def main(argv=None) -> int:
    ap = study.probe_parser(__doc__)
    ap.add_argument("--stages", type=int, default=4, help="path points t = 1/K, ..., 1")
    args = ap.parse_args(argv)
    S, kkt, frozen, removals, F0, a, truth = study.cached_study(args.cache, args.wd)
    prob, F, keys = S.problem, S.test_loss, study.KEYS
    for i in (args.removals if args.removals is not None else range(len(removals))):
        t0 = time.perf_counter()
        th, lam = kkt.theta, kkt.lambdas.numpy()
        path = []
        for k in range(1, args.stages + 1):
            t = k / args.stages
            p = prob.remove(removals[i]) if k == args.stages else prob.perturbed(removals[i], t)
            th, lam, info = study.resolve_kkt(p, th, lam, frozen, a)
            path.append({"t": t, "dF": float(F(prob.wrap(th))) - F0, "residual": float(info.residuals[-1]),
                         "converged": bool(info.converged), "method": info.method,
                         "g": p.constraint_values(th).tolist()})
        one_go = truth[keys[i]]
        print(json.dumps({"removal": keys[i], "one_go_dF": one_go["dF"], "path_dF": path[-1]["dF"],
                          "one_go_dtheta": one_go["dtheta_norm"], "path_dtheta": float((th - kkt.theta).norm()),
                          "one_go_g": one_go["g_new"],
                          "path": path, "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
