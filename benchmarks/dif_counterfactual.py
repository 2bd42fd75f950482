"""Counterfactual removal on the digits fairness study: drop the most harmful points, retrain.

For each seed the study of ``polyproj.adapters.dif.digits`` is trained (augmented Lagrangian +
L-BFGS to KKT residual 1e-6; re-solves to ``--retrain-tol``, 1e-5). The target is the test loss of the client the unconstrained model
serves worst. Every training point is scored for that target by DIF (matrix-free, damping floor
from the KKT residual), constrained TracIn, Penalty-IF (quadratic, ``--rho``) and at random; the
2 % and 10 % with the most negative predicted change (their removal should lower the target loss
most) are removed and the constrained problem is re-solved warm-started from θ̄ (same method and
tolerance as the training). Reported: the drop of the target loss, mean ± std over seeds.
Writes ``benchmarks/results/dif_counterfactual.json`` (rows appended per seed as they finish).

    nice -n 10 .venv/bin/python benchmarks/dif_counterfactual.py --seeds 0 1 2 --n-train 600
    .venv/bin/python benchmarks/dif_counterfactual.py --quick
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import polyproj as pp
from polyproj.adapters.dif import DIF, IndefiniteHessianError
from polyproj.adapters.dif.baselines import if_scores, tracin_scores
from polyproj.adapters.dif.digits import make_fairness_study
from polyproj.adapters.dif.newton import augmented_lagrangian
from polyproj.runtime import set_torch_threads


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def removal_of(S, idx: np.ndarray) -> dict:
    out = {"objective": np.sort(idx)}
    for j in range(S.data.n_clients):
        members = np.flatnonzero(S.data.client == j)
        ks = np.flatnonzero(np.isin(members, idx))
        if ks.size:
            out[f"client{j}"] = ks
    return out


def run_seed(seed: int, args) -> dict:
    t0 = time.perf_counter()
    S = make_fairness_study(seed, widths=args.widths, n_train=args.n_train, wd=args.wd, tol=args.tol)
    prob, kkt, F = S.problem, S.kkt, S.client_test_loss
    F0 = float(F(prob.wrap(kkt.theta)))
    log(f"seed {seed}: {kkt}; target client {S.info['target_client']}, loss {F0:.4f}")
    n = prob.objective.n_samples
    dif = DIF(prob, kkt, method="matrix-free", damping="auto", rtol=1e-6)
    scores = {"DIF": dif.influence(F).numpy()}
    scores["TracIn"] = tracin_scores(prob, [*S.checkpoints, (kkt.theta, kkt.lambdas.numpy())], F)
    damping = dif.damping  # the penalty Hessian's curvature differs: the smallest damping CG accepts from here
    for _ in range(12):
        try:
            scores["Penalty-IF"], _ = if_scores(prob, kkt, F, kind="penalty", rho=args.rho, damping=damping,
                                                rtol=1e-6, maxiter=1000)
            break
        except IndefiniteHessianError as err:
            damping = max(2 * damping, damping + 1.5 * -err.curvature)
    else:
        raise pp.SolverError("no damping made the Penalty-IF Hessian positive definite")
    log(f"seed {seed}: Penalty-IF damping {damping:.1e} (DIF's {dif.damping:.1e})")
    rng = np.random.default_rng(1000 + seed)
    rows = []
    for frac in args.fracs:
        k = max(1, round(frac * n))
        picks = {name: np.argsort(s, kind="stable")[:k] for name, s in scores.items()}
        picks["random"] = rng.choice(n, size=k, replace=False)
        for name, idx in picks.items():
            t = time.perf_counter()
            p = prob.remove(removal_of(S, idx))
            th, _, info = augmented_lagrangian(p, kkt.theta, kkt.lambdas.numpy(), tol=args.retrain_tol)
            drop = F0 - float(F(prob.wrap(th)))
            pred = float(dif.influence(F, [removal_of(S, idx)])[0]) if name == "DIF" else None
            rows.append({"seed": seed, "frac": frac, "k": k, "method": name, "loss_drop": drop,
                         "dif_predicted_drop": None if pred is None else -pred,
                         "residual": info.residuals[-1], "converged": info.converged,
                         "time_s": time.perf_counter() - t})
            log(f"  {frac:.0%} {name:10s} drop {drop:+.5f}  (residual {info.residuals[-1]:.1e})")
    return {"seed": seed, "rows": rows, "kkt": repr(kkt), "target_client": S.info["target_client"],
            "target_loss": F0, "damping": dif.damping, "penalty_if_damping": damping, "time_s": time.perf_counter() - t0}


def main(argv=None) -> int:
    from common import RESULTS, write_json

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--fracs", type=float, nargs="+", default=[0.02, 0.10])
    ap.add_argument("--n-train", type=int, default=600)
    ap.add_argument("--widths", type=int, nargs=3, default=(16, 32, 40))
    ap.add_argument("--wd", type=float, default=1e-2)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--retrain-tol", type=float, default=1e-5, help="KKT residual of the re-solves")
    ap.add_argument("--rho", type=float, default=100.0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: shared 2-core machine)")
    ap.add_argument("--quick", action="store_true", help="one seed, widths 2 4 4, 120 samples")
    ap.add_argument("--name", default="dif_counterfactual")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.widths, args.n_train, args.name = [0], (2, 4, 4), 120, args.name + "_quick"
    set_torch_threads(args.threads)
    warnings.simplefilter("ignore", pp.PolyprojWarning)
    partial = RESULTS / f"{args.name}.partial.jsonl"
    done = {json.loads(x)["seed"]: json.loads(x) for x in partial.read_text().splitlines()} if partial.exists() \
        else {}
    for seed in args.seeds:
        if seed in done:
            continue
        res = run_seed(seed, args)
        with partial.open("a") as fh:
            fh.write(json.dumps(res) + "\n")
        done[seed] = res
    rows = [r for s in args.seeds for r in done[s]["rows"]]
    table = {}
    for frac in args.fracs:
        for name in ("DIF", "TracIn", "Penalty-IF", "random"):
            v = np.array([r["loss_drop"] for r in rows if r["frac"] == frac and r["method"] == name])
            table[f"{frac:g}/{name}"] = {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0,
                                         "per_seed": v.tolist()}
            log(f"{frac:.0%} {name:10s} {v.mean():+.5f} ± {table[f'{frac:g}/{name}']['std']:.5f}")
    path = write_json(args.name, {"config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items()},
                                  "table": table, "seeds": [done[s] for s in args.seeds],
                                  "paper": {"0.02/DIF": 0.0031, "0.02/TracIn": 0.0028, "0.1/DIF": 0.0042,
                                            "0.1/TracIn": 0.0038}})
    partial.unlink()
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
