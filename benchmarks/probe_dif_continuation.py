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

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dif_fairness as study

import polyproj as pp
from polyproj.adapters.dif.newton import augmented_lagrangian, newton_kkt
from polyproj.runtime import set_torch_threads


def resolve(p, th, lam, frozen, a):
    """``p``'s KKT point from (θ, λ) by study.retrain_one's chain; returns θ, λ, residual, methods."""
    th, lam, info = newton_kkt(p, th, lam, tol=a.tol, hessian=frozen, chunk_size=a.chunk, max_iter=a.chord_iter)
    method = ["chord"]
    if not info.converged:
        th, lam, info = newton_kkt(p, th, lam, tol=a.tol, preconditioner=frozen, chunk_size=a.chunk,
                                   max_iter=a.newton_iter, rtol=a.minres_rtol)
        method.append("newton-minres")
    if not info.converged:
        th, lam, _ = augmented_lagrangian(p, th, lam, tol=1e-8, chunk_size=a.chunk)
        th, lam, info = newton_kkt(p, th, lam, tol=a.tol, preconditioner=frozen, chunk_size=a.chunk,
                                   max_iter=a.newton_iter, rtol=a.minres_rtol)
        method += ["augmented-lagrangian", "newton-minres"]
    return th, lam, float(info.residuals[-1]), bool(info.converged), "+".join(method)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", required=True, help="dif_fairness.py's --cache of a trained study")
    ap.add_argument("--removals", type=int, nargs="*", default=None, help="positions among the 100 (default all)")
    ap.add_argument("--stages", type=int, default=4, help="path points t = 1/K, ..., 1")
    ap.add_argument("--wd", type=float, default=1e-2)
    args = ap.parse_args(argv)
    set_torch_threads(1)
    warnings.simplefilter("ignore", pp.PolyprojWarning)
    S, kkt, frozen, removals, F0, a = study.cached_study(args.cache, args.wd)
    cache = Path(args.cache) / f"seed0_w16-32-40_nNone_wd{args.wd:g}"
    prob, F = S.problem, S.test_loss
    truth = {r["key"]: r for r in map(json.loads, (cache / "truth.jsonl").read_text().splitlines())}
    keys = [f"s{k}" for k in range(80)] + [f"g{k}" for k in range(20)]
    for i in (args.removals if args.removals is not None else range(len(removals))):
        t0 = time.perf_counter()
        th, lam = kkt.theta, kkt.lambdas.numpy()
        path = []
        for k in range(1, args.stages + 1):
            t = k / args.stages
            p = prob.remove(removals[i]) if k == args.stages else prob.perturbed(removals[i], t)
            th, lam, res, conv, method = resolve(p, th, lam, frozen, a)
            path.append({"t": t, "dF": float(F(prob.wrap(th))) - F0, "residual": res, "converged": conv,
                         "method": method, "g": p.constraint_values(th).tolist()})
        one_go = truth[keys[i]]
        print(json.dumps({"removal": keys[i], "one_go_dF": one_go["dF"], "path_dF": path[-1]["dF"],
                          "one_go_dtheta": one_go["dtheta_norm"], "path_dtheta": float((th - kkt.theta).norm()),
                          "one_go_g": one_go["g_new"],
                          "path": path, "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
