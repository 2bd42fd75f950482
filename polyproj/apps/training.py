"""The training loop every application shares: epochs of mini-batches, timing, validation, the best model."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any

import torch

from .measure import Session
from .records import EpochPoint

__all__ = ["ANY", "COUNT", "NON_NEGATIVE", "POSITIVE", "UNIT", "Fit", "Range", "check_config", "fit", "set_threads"]


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the model's dense state (layers of peers may hold sparse constant buffers: left out)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items() if v.layout == torch.strided}


def set_threads(threads: int) -> None:
    """``threads`` torch intra-op threads and one inter-op thread (where it can still be set)."""
    from ..runtime import set_torch_threads

    set_torch_threads(threads)  # not torch.set_num_threads: see polyproj.runtime
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already used in this process: it keeps its setting
        pass


@dataclass(frozen=True)
class Fit:
    """The outcome of :func:`fit`: the curve, the epoch chosen on validation, training time and memory."""

    curve: tuple[EpochPoint, ...]
    best_epoch: int
    best_val: float
    time_s: float
    peak_mem_mb: float


def fit(model: torch.nn.Module, optimiser: torch.optim.Optimizer, epochs: int,
        batches: Callable[[int], Iterable[Any]], loss: Callable[[Any], torch.Tensor],
        validate: Callable[[], float], session: Session, label: str, steps_per_epoch: int) -> Fit:
    """Train ``model`` and leave it at the epoch with the best validation metric (higher is better).

    Parameters
    ----------
    batches : epoch -> iterable of batches (the caller shuffles with its own generator).
    loss : batch -> scalar loss (the forward through the constraint layer).
    validate : the validation metric of the current model (run under ``torch.no_grad``).
    steps_per_epoch : for the progress bar.

    Only the optimisation steps are timed; memory is the peak above the resident size after one warm-up
    forward and backward (not an optimisation step: the model is unchanged), so that lazy imports and
    first-call caches of any method are not counted as training memory.
    """
    first = next(iter(batches(0)))
    loss(first).backward()
    optimiser.zero_grad(set_to_none=True)
    if session.meter is not None:
        session.meter.start()
    curve: list[EpochPoint] = []
    best = (-math.inf, 0, _snapshot(model))
    elapsed = 0.0
    with session.bar(label, epochs * steps_per_epoch) as bar:
        for epoch in range(1, epochs + 1):
            model.train()
            total, count = 0.0, 0
            for batch in batches(epoch):
                t0 = time.perf_counter()
                optimiser.zero_grad(set_to_none=True)
                value = loss(batch)
                value.backward()
                optimiser.step()
                elapsed += time.perf_counter() - t0
                total, count = total + float(value.detach()), count + 1
                bar.advance()
            model.eval()
            with torch.no_grad():
                val = float(validate())
            curve.append(EpochPoint(epoch, elapsed, total / max(count, 1), val))
            if val > best[0]:
                best = (val, epoch, _snapshot(model))
            bar.update(f"loss {curve[-1].train_loss:.4g}  val {val:.4g}")
    if epochs and best[1] == 0:  # no epoch validated to a finite metric: the run diverged, no model to keep
        from ..errors import SolverError

        raise SolverError(f"training diverged: no epoch has a finite validation metric (last: {curve[-1].val_metric}, "
                          f"training loss {curve[-1].train_loss})")
    peak = session.meter.peak_mb() if session.meter is not None else math.nan
    model.load_state_dict(best[2], strict=False)
    model.eval()
    return Fit(tuple(curve), best[1], best[0], elapsed, peak)


@dataclass(frozen=True)
class Range:
    """The values a setting may take: ``low`` to ``high``, each end included unless ``open_low`` / ``open_high``."""

    low: float = -math.inf
    high: float = math.inf
    open_low: bool = False
    open_high: bool = False

    def __contains__(self, v: float) -> bool:
        above = self.low < v if self.open_low else self.low <= v
        return above and (v < self.high if self.open_high else v <= self.high)

    def __str__(self) -> str:
        if self.high == math.inf:
            return "" if self.low == -math.inf else f"{'>' if self.open_low else '>='} {self.low:g}"
        return f"in {'(' if self.open_low else '['}{self.low:g}, {self.high:g}{')' if self.open_high else ']'}"


#: the ranges the applications' settings share (``ANY``: every finite number)
ANY, POSITIVE, NON_NEGATIVE, UNIT = Range(), Range(0.0, open_low=True), Range(0.0), Range(0.0, 1.0)
COUNT = Range(1)  # an int field: a positive integer


def check_config(cfg: Any, ranges: dict[str, Range] | None = None) -> None:
    """Refuse an application's settings that would fail deep in training, by name (a ProblemError).

    Every ``int`` field must be an integer in its range of ``ranges`` (>= 0 where it names none), every
    ``float`` field a finite number in its range (any where it names none): ``train = 0`` ended in an empty
    ``StopIteration``, ``epochs = 0`` in an IndexError, ``inliers = 10.5`` in a TypeError, ``rotation = -5`` in
    NumPy's ``high - low < 0``, ``lr = -1`` in torch's ``Invalid learning rate``, ``linsat_tau = 0`` in NaN metrics.
    """
    import numbers

    from ..errors import ProblemError

    ranges = ranges or {}
    names = {f.name for f in fields(cfg)}
    if set(ranges) - names:  # a misspelt name would check nothing
        raise TypeError(f"{type(cfg).__name__} has no field {', '.join(sorted(set(ranges) - names))}")
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        if kind == "int":
            ok = isinstance(v, numbers.Integral) and not isinstance(v, bool) and v in ranges.get(f.name, Range(0))
            what = f"an integer {ranges.get(f.name, Range(0))}"
        elif kind == "float":
            ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) \
                and v in ranges.get(f.name, ANY)
            what = f"a finite number {ranges.get(f.name, ANY)}".rstrip()
        else:
            continue
        if not ok:
            raise ProblemError(f"{type(cfg).__name__}.{f.name} must be {what}, got {v!r}")
