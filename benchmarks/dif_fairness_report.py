"""Tables of the fairness study from its cache (the scores and the ground truth rows computed so far).

``benchmarks/dif_fairness.py`` keeps every stage on disk; this script turns what is there into
``benchmarks/results/dif_fairness.json`` and the scatter plot, so that a ground truth still being
computed (or cut short) is reported as far as it goes.

    .venv/bin/python benchmarks/dif_fairness_report.py CACHE_DIR TRUTH_FILE [SINGLES GROUPS TOL]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    from common import RESULTS, write_json
    from dif_fairness import _plot, pearson, spearman

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    cache, truth = Path(argv[0]), Path(argv[1])
    singles, groups = int(argv[2]) if len(argv) > 2 else 80, int(argv[3]) if len(argv) > 3 else 20
    n = singles + groups
    keys = [f"s{k}" for k in range(singles)] + [f"g{k}" for k in range(groups)]
    pred = {"DIF": np.load(cache / f"dif_scores_{n}.npy")}
    if (cache / f"dif2_scores_{n}.npy").exists():
        pred["DIF (order 2)"] = np.load(cache / f"dif2_scores_{n}.npy")
    base = np.load(cache / f"baseline_scores_{n}.npz")
    for k in base.files:
        pred.setdefault(k.replace("_", " ").replace("Penalty IF", "Penalty-IF"), base[k])
    tol = float(argv[4]) if len(argv) > 4 else 1e-10  # dif_fairness.py's --tol
    pen_file = cache / "penalty_scores.json"
    penalty = json.loads(pen_file.read_text()) if pen_file.exists() else {}
    sw_file = cache / f"penalty_sweep_{n}.jsonl"  # dif_fairness.py's cache: one row per (penalty, ρ)
    if not penalty and sw_file.exists():  # the quadratic penalty's rows that scored, keyed by ρ as above
        penalty = {str(r["rho"]): {"scores": r["scores"], "damping": r["damping"], "iterations": r["cg_iterations"]}
                   for r in map(json.loads, sw_file.read_text().splitlines())
                   if r["penalty"] == "quadratic" and "scores" in r}
    rows, cut = {}, {}
    for line in truth.read_text().splitlines():
        r = json.loads(line)
        (rows if r["residual"] <= tol else cut)[r["key"]] = r  # only re-solves that reached the tolerance
    idx = np.array([i for i, k in enumerate(keys) if k in rows])
    actual = np.array([rows[keys[i]]["dF"] for i in idx])
    ns = int(np.sum(idx < singles))
    order = np.argsort(idx)
    idx, actual = idx[order], actual[order]
    sweep = {rho: pearson(np.asarray(v["scores"])[idx], actual) for rho, v in penalty.items()}
    if sweep:  # Penalty-IF (quadratic): the best ρ of the sweep
        best = max(sweep, key=sweep.get)
        pred[f"Penalty-IF (quadratic, best ρ = {float(best):g} of {sorted(float(r) for r in sweep)})"] = \
            np.asarray(penalty[best]["scores"])
    table = {}
    for name, p in pred.items():
        q = p[idx]
        table[name] = {"all": {"pearson": pearson(q, actual), "spearman": spearman(q, actual)},
                       "singles": {"pearson": pearson(q[:ns], actual[:ns]) if ns > 2 else None,
                                   "spearman": spearman(q[:ns], actual[:ns]) if ns > 2 else None},
                       "groups": {"pearson": pearson(q[ns:], actual[ns:]) if len(q) - ns > 2 else None,
                                  "spearman": spearman(q[ns:], actual[ns:]) if len(q) - ns > 2 else None}}
        print(f"{name:32s} {table[name]}")
    _plot(RESULTS / "dif_fairness.png", {k: v[idx] for k, v in pred.items()}, actual, ns, table)
    res = [rows[keys[i]]["residual"] for i in idx]
    write_json("dif_fairness", {
        "removals_scored": n, "truth_rows": len(idx), "truth_tol": tol,
        "not_converged": {k: r["residual"] for k, r in cut.items() if k not in rows}, "truth_singles": ns, "truth_groups": len(idx) - ns,
        "correlation": table,
        "penalty_sweep": {rho: {"pearson": r, "damping": penalty[rho]["damping"],
                                "cg_iterations": penalty[rho]["iterations"]} for rho, r in sweep.items()}, "truth": {"worst_residual": max(res), "median_residual": float(np.median(res)),
                                        "converged": int(sum(rows[keys[i]]["converged"] for i in idx)),
                                        "finished_by": {m: sum(rows[keys[i]]["method"] == m for i in idx)
                                                        for m in sorted({rows[keys[i]]["method"] for i in idx})},
                                        "median_time_s": float(np.median([rows[keys[i]]["time"] for i in idx])),
                                        "dF_abs_median": float(np.median(np.abs(actual))),
                                        "rows": [rows[keys[i]] for i in idx]},
        "predicted": {k: v[idx].tolist() for k, v in pred.items()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
