"""What one training run reports, and the summary of a method over seeds (no torch here)."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["METRICS", "EpochPoint", "MethodSummary", "RunRecord", "Spread", "summarise", "worst"]

#: the numbers every run reports, in table order
METRICS = ("max_violation", "train_loss", "test_metric", "time_s", "peak_mem_mb")
#: the numbers a finished run must have finite: a run whose outputs or metric are NaN / inf counts as failed
MUST_BE_FINITE = ("max_violation", "test_metric")


def worst(values) -> float:
    """The largest of ``values``, NaN if any is NaN (Python's ``max`` keeps or drops a NaN by its position)."""
    vs = [float(v) for v in values]
    return math.nan if any(math.isnan(v) for v in vs) else max(vs, default=0.0)


@dataclass(frozen=True)
class EpochPoint:
    """The state after one epoch: cumulated training time, mean training loss, validation metric."""

    epoch: int
    time_s: float
    train_loss: float
    val_metric: float


@dataclass(frozen=True)
class RunRecord:
    """One training run of one method with one seed.

    Attributes
    ----------
    method, seed : the run.
    variant : the application's variant (the portfolio's constraint set; empty for the others).
    max_violation : float
        Largest constraint violation of the method's outputs over every evaluated input (train,
        validation and test), measured in float64 against the set's own constraints.
    train_loss : float
        Mean training loss of the last epoch.
    test_metric : float
        The application's test metric (Sharpe ratio, F1, accuracy) of the model chosen on validation.
    time_s : float
        Wall time of the optimisation steps (forward, backward, optimiser; evaluation excluded).
    peak_mem_mb : float
        Peak resident memory of the training above the process's resident memory before it (MiB).
    curve : one :class:`EpochPoint` per epoch.
    details : app-specific diagnostics (saturation counts, time to a target F1, ...).
    status : ``"ok"``, or the error that ended the run.
    """

    method: str
    seed: int
    variant: str = ""
    max_violation: float = math.nan
    train_loss: float = math.nan
    test_metric: float = math.nan
    time_s: float = math.nan
    peak_mem_mb: float = math.nan
    curve: tuple[EpochPoint, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)
    status: str = "ok"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dictionary."""
        d = asdict(self)
        d["curve"] = [asdict(p) for p in self.curve]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunRecord:
        """Inverse of :meth:`to_json`, also of its JSON file, where NaN and inf are written as ``null``."""
        d = {k: _number(v) if k in METRICS else v for k, v in d.items()}
        d["curve"] = tuple(EpochPoint(**{k: _number(v) if k != "epoch" else v for k, v in p.items()})
                           for p in d.get("curve", ()))
        return cls(**d)

    @property
    def failed(self) -> bool:
        """Its status is not ``"ok"``, or one of :data:`MUST_BE_FINITE` is NaN or inf (outputs that diverged)."""
        return self.status != "ok" or not all(math.isfinite(getattr(self, k)) for k in MUST_BE_FINITE)


def _number(v: Any) -> Any:
    """A metric read back from JSON: ``null`` (NaN or inf written out) is NaN."""
    return math.nan if v is None else v


@dataclass(frozen=True)
class Spread:
    """Median, mean, standard deviation, minimum and maximum of a metric over seeds."""

    median: float
    mean: float
    std: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        """The spread of the finite ``values`` (NaN fields when there are none)."""
        v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
        if not v:
            return cls(math.nan, math.nan, math.nan, math.nan, math.nan, 0)
        std = statistics.stdev(v) if len(v) > 1 else 0.0
        return cls(statistics.median(v), statistics.fmean(v), std, min(v), max(v), len(v))


@dataclass(frozen=True)
class MethodSummary:
    """A method over its seeds: the spread of every metric of :data:`METRICS`."""

    method: str
    runs: int
    failed: int
    spreads: dict[str, Spread]


def summarise(records: list[RunRecord]) -> list[MethodSummary]:
    """One summary per method, in the order the methods first appear.

    A run counts as failed by :attr:`RunRecord.failed` (outputs that diverged: their spread, over finite values
    only, would hide them).
    """
    order: list[str] = []
    for r in records:
        if r.method not in order:
            order.append(r.method)
    out = []
    for m in order:
        rs = [r for r in records if r.method == m]
        ok = [r for r in rs if not r.failed]
        out.append(MethodSummary(m, len(rs), len(rs) - len(ok),
                                 {k: Spread.of([getattr(r, k) for r in ok]) for k in METRICS}))
    return out
