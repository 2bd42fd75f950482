"""``polyproj demo`` section: the constrained regression study in short form."""

from __future__ import annotations

import time
import warnings

import numpy as np
import torch

__all__ = ["dif_section"]


def dif_section(console, quick: bool, seed: int) -> None:
    """DIF vs classic IF vs Penalty-IF against leave-one-out retraining on constrained regression."""
    from rich.table import Table

    from ...errors import PolyprojWarning
    from ...runtime import set_torch_threads
    from . import DIF, classic_if, penalty_if, retrain
    from .study import make_regression_study, pearson

    old = torch.get_num_threads()
    set_torch_threads(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PolyprojWarning)
            n, k = (300, 30) if quick else (500, 120)
            S = make_regression_study(n=n, seed=seed)
            R = S.removals[:k]
            t0 = time.perf_counter()
            om = DIF(S.problem, S.kkt).influence(None, R).numpy()
            t_dif = time.perf_counter() - t0
            t0 = time.perf_counter()
            loo = retrain(S.problem, R, warm_start=S.kkt)
            t_loo = time.perf_counter() - t0
            act = np.array([(q.theta - S.kkt.theta).numpy() for q in loo])
            rows = [("DIF", om), ("classic IF", classic_if(S.problem, S.kkt, R).numpy())]
            pen = max(((rho, penalty_if(S.problem, S.kkt, R, rho).numpy()) for rho in (1.0, 1e2, 1e4)),
                      key=lambda p: pearson(p[1], act))
            rows.append((f"Penalty-IF (best ρ={pen[0]:g})", pen[1]))
    finally:
        set_torch_threads(old)
    cls = ", ".join(f"{a}: {b}" for a, b in S.kkt.classification.items())
    table = Table(title=f"constrained regression (n={n}; {cls}); leave-one-out over {k} points")
    for col in ("method", "Pearson r vs LOO (Δθ)", "max |pred − LOO|"):
        table.add_column(col)
    for name, pred in rows:
        table.add_row(name, f"{pearson(pred, act):.4f}", f"{np.max(np.abs(pred - act)):.1e}")
    console.print(table)
    console.print(f"DIF for {k} removals: {t_dif:.2f} s; LOO retraining to 1e-10: {t_loo:.2f} s")
    r = pearson(om, act)
    if r < (0.98 if quick else 0.999) or r <= pearson(rows[1][1], act):
        raise AssertionError(f"DIF correlation with leave-one-out too low: r = {r:.4f}")
