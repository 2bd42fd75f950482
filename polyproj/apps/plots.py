"""The figure of an application run: training loss, validation metric over training time, test metric."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .records import RunRecord

__all__ = ["plot_runs", "plotting_unavailable"]


def plotting_unavailable() -> str | None:
    """Why :func:`plot_runs` cannot draw here (matplotlib not importable), or None: checked before a long run."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot
    except ImportError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def plot_runs(records: list[RunRecord], title: str, metric: str, prefix: Path) -> list[Path]:
    """One PNG per variant, ``<prefix>[_<variant>].png``, with three panels.

    Left: the mean training loss per epoch (line: the mean over seeds; band: min to max). Middle: the
    validation metric against cumulated training time (seed 0 of each method). Right: the test metric of
    every seed (dots) and its mean (bar).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for variant in dict.fromkeys(r.variant for r in records):
        rs = [r for r in records if r.variant == variant and r.status == "ok"]
        methods = list(dict.fromkeys(r.method for r in rs))
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
        colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for i, m in enumerate(methods):
            c = colours[i % len(colours)]
            mine = [r for r in rs if r.method == m]
            curves = [r.curve for r in mine if r.curve]
            if curves:
                k = min(len(cv) for cv in curves)
                L = np.array([[p.train_loss for p in cv[:k]] for cv in curves])
                ep = np.arange(1, k + 1)
                axes[0].plot(ep, L.mean(0), color=c, label=m)
                axes[0].fill_between(ep, L.min(0), L.max(0), color=c, alpha=0.15)
                cv = curves[0]
                axes[1].plot([p.time_s for p in cv], [p.val_metric for p in cv], color=c, marker=".", label=m)
            vals = [r.test_metric for r in mine]
            axes[2].bar(i, np.nanmean(vals), color=c, alpha=0.35)
            axes[2].plot(np.full(len(vals), i), vals, "o", color=c)
        axes[0].set(xlabel="epoch", ylabel="training loss", title="training loss (mean; band: min-max over seeds)")
        axes[1].set(xlabel="training time (s)", ylabel=f"validation {metric.removeprefix('test ')}",
                    title="validation metric over training time (seed 0)")
        axes[1].set_xscale("symlog", linthresh=1.0)
        axes[2].set_xticks(range(len(methods)), methods, rotation=35, ha="right")
        axes[2].set(ylabel=metric, title=f"{metric} per seed (bar: mean)")
        axes[0].legend(fontsize=8)
        fig.suptitle(title + (f" — {variant}" if variant else ""))
        fig.tight_layout()
        path = Path(f"{prefix}_{variant}.png" if variant else f"{prefix}.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths
