"""Constrained linear regression study (the DIF paper's first table).

Leave-one-out ground truth (every training point, re-solved to KKT residual 1e-10, warm-started
from the KKT point) against all-point scores of DIF, the classic influence function and Penalty-IF
(best ρ of a sweep, quadratic and hinge penalties). Reports Pearson r of predicted vs actual
parameter change and test-loss change, the constraint violation of θ̄ + ω in the retrained problem,
and the time of all-point DIF vs all-point LOO retraining. Writes
``benchmarks/results/dif_regression.json`` and ``dif_regression.png`` (``--quick``: ``dif_regression_quick``).

    .venv/bin/python benchmarks/dif_regression.py            # n = 500 (about 2 minutes)
    .venv/bin/python benchmarks/dif_regression.py --quick    # n = 150 (dif_regression_quick.json)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import polyproj as pp
from polyproj.adapters.dif import DIF, classic_if, penalty_if, retrain
from polyproj.adapters.dif.study import make_regression_study, pearson
from polyproj.runtime import set_torch_threads

RHOS = (1e-2, 1e-1, 1.0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6)


def violation(problem, removals, theta, omegas) -> np.ndarray:
    """Largest constraint violation of θ̄ + ω in each retrained problem (|g| on equalities, g⁺ else)."""
    eq = problem.eq_mask
    out = np.empty(len(removals))
    for k, (rem, om) in enumerate(zip(removals, omegas, strict=True)):
        g = problem.remove(rem).constraint_values(theta + torch.as_tensor(om)).detach().numpy()
        out[k] = float(np.max(np.where(eq, np.abs(g), np.maximum(g, 0.0)), initial=0.0))
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the study, print the table, write JSON and the scatter plot."""
    from common import RESULTS, quick_name, write_json
    from rich.console import Console
    from rich.table import Table

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=500, help="training points (default 500)")
    ap.add_argument("--d", type=int, default=10, help="parameters (default 10)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=5, help="repeats of the all-point DIF timing")
    ap.add_argument("--backend", default="proxsuite")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: tiny tensors, shared cores)")
    ap.add_argument("--quick", action="store_true", help="n = 150, 3 repeats")
    ap.add_argument("--name", default="dif_regression", help="results name (--quick appends _quick)")
    args = ap.parse_args(argv)
    if args.quick:  # a smoke run never replaces the published figures (as the other dif_*.py scripts)
        args.n, args.repeats = 150, 3
    args.name = quick_name(args.name, args.quick)
    set_torch_threads(args.threads)
    warnings.simplefilter("ignore", pp.PolyprojWarning)
    console = Console()

    t0 = time.perf_counter()
    S = make_regression_study(n=args.n, d=args.d, seed=args.seed, backend=args.backend)
    t_train = time.perf_counter() - t0
    prob, kkt, R = S.problem, S.kkt, S.removals
    console.print(f"study: n={args.n}, d={args.d}, {kkt}; trained in {t_train:.2f} s", markup=False)

    # ---- all-point DIF (H, per-sample gradients, batched QPs), timed
    def run_dif():
        return DIF(prob, kkt, backend=args.backend).influence(None, R).numpy()

    dif_times = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        om_dif = run_dif()
        dif_times.append(time.perf_counter() - t)
    t_dif = statistics.median(dif_times)

    # ---- leave-one-out ground truth, timed (one pass: it is the expensive side)
    t = time.perf_counter()
    loo = retrain(prob, R, warm_start=kkt, tol=1e-10, backend=args.backend, progress=True)
    t_loo = time.perf_counter() - t
    act = np.array([(k.theta - kkt.theta).numpy() for k in loo])
    worst_res = max(k.residual for k in loo)

    F = S.test_loss
    F0 = float(F(kkt.theta))
    dF_act = np.array([float(F(k.theta)) - F0 for k in loo])
    gF = torch.func.grad(F)(kkt.theta).numpy()

    # ---- baselines
    t = time.perf_counter()
    om_if = classic_if(prob, kkt, R).numpy()
    t_if = time.perf_counter() - t
    sweep = []
    for pen in ("quadratic", "hinge"):
        for rho in RHOS:
            om = penalty_if(prob, kkt, R, rho, penalty=pen).numpy()
            sweep.append({"penalty": pen, "rho": rho, "r_param": pearson(om, act), "r_test": pearson(om @ gF, dF_act),
                          "omega": om})
    best_p = max(sweep, key=lambda s: s["r_param"])
    best_t = max(sweep, key=lambda s: s["r_test"])

    rows = {}
    for name, om, r_test_override in (("DIF", om_dif, None), ("classic IF", om_if, None),
                                      (f"Penalty-IF ({best_p['penalty']}, ρ={best_p['rho']:g})", best_p["omega"],
                                       best_t["r_test"])):
        viol = violation(prob, R, kkt.theta, om)
        rows[name] = {"r_param": pearson(om, act),
                      "r_test": pearson(om @ gF, dF_act) if r_test_override is None else r_test_override,
                      "max_violation": float(viol.max()), "mean_violation": float(viol.mean())}
    viol_loo = violation(prob, R, kkt.theta, act)

    table = Table(title=f"Constrained linear regression, leave-one-out over all {args.n} training points")
    for col in ("method", "Pearson r (Δθ)", "Pearson r (Δ test loss)", "max violation θ̄+ω", "mean violation"):
        table.add_column(col)
    for name, row in rows.items():
        table.add_row(name, f"{row['r_param']:.4f}", f"{row['r_test']:.4f}", f"{row['max_violation']:.1e}",
                      f"{row['mean_violation']:.1e}")
    table.add_row("LOO retrain (truth)", "1", "1", f"{viol_loo.max():.1e}", f"{viol_loo.mean():.1e}")
    console.print(table)
    console.print(f"Penalty-IF test-loss r is the best over the sweep ({best_t['penalty']}, ρ={best_t['rho']:g})")
    console.print(f"all-point DIF: {t_dif:.3f} s (median of {args.repeats}); all-point LOO retraining: {t_loo:.2f} s; "
                  f"ratio LOO / DIF = {t_loo / t_dif:.0f}x; classic IF {t_if:.3f} s; "
                  f"worst LOO KKT residual {worst_res:.1e}")

    # ---- scatter plot
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    for (label, om), mk in zip((("DIF", om_dif), ("classic IF", om_if),
                                (f"Penalty-IF (ρ={best_p['rho']:g})", best_p["omega"])), ("o", "x", "+"), strict=True):
        r_p = pearson(om, act)
        axes[0].scatter(act.ravel(), om.ravel(), s=6, marker=mk, alpha=0.5, label=f"{label}  r={r_p:.3f}")
        r_t = pearson(om @ gF, dF_act)
        axes[1].scatter(dF_act, om @ gF, s=8, marker=mk, alpha=0.6, label=f"{label}  r={r_t:.3f}")
    for ax, what in zip(axes, ("parameter change Δθ (all coordinates)", "test-loss change"), strict=True):
        lo, hi = ax.get_xlim()
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set_xlabel(f"actual {what} (LOO retraining)")
        ax.set_ylabel("predicted")
        ax.legend(fontsize=8)
    fig.suptitle(f"Constrained linear regression (n={args.n}, d={args.d}): predicted vs leave-one-out")
    fig.tight_layout()
    png = RESULTS / f"{args.name}.png"
    RESULTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)

    path = write_json(args.name, {
        "quick": bool(args.quick),
        "study": {"n": args.n, "d": args.d, "seed": args.seed, "backend": args.backend,
                  "torch_threads": args.threads, "classification": kkt.classification,
                  "kkt_residual": kkt.residual, "lambdas": kkt.lambdas.tolist()},
        "methods": rows,
        "loo_violation": {"max": float(viol_loo.max()), "mean": float(viol_loo.mean())},
        "penalty_sweep": [{k: v for k, v in s.items() if k != "omega"} for s in sweep],
        "timing": {"dif_all_points_s": t_dif, "dif_all_points_runs_s": dif_times, "loo_all_points_s": t_loo,
                   "loo_over_dif": t_loo / t_dif, "classic_if_all_points_s": t_if, "train_s": t_train,
                   "worst_loo_kkt_residual": worst_res},
        "paper": {"DIF": 0.999, "classic IF": 0.412, "Penalty-IF": 0.683},
    })
    console.print(f"wrote {path} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
