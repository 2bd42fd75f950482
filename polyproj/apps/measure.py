"""Peak resident memory of a stretch of work, and the one progress bar of a training run (no torch here)."""

from __future__ import annotations

import contextlib
import ctypes
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["PeakMemory", "Session"]


def _status_kib(key: str) -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key):
                return float(line.split()[1])
    return math.nan


class PeakMemory:
    """Peak resident set size above a baseline, from ``/proc/self/status`` (Linux; NaN elsewhere).

    :meth:`start` hands freed heap back to the system (``malloc_trim``), resets the kernel's high-water
    mark (``clear_refs`` 5) and records the resident size; :meth:`peak_mb` is ``VmHWM`` minus that
    baseline. In a fresh process (the runner's default) this is the memory the training itself needed:
    parameters, optimiser state, activations kept for the backward, the layer's work space.
    """

    def __init__(self) -> None:
        self.baseline_kib = math.nan

    def start(self) -> None:
        """Reset the high-water mark and take the baseline."""
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")
            self.baseline_kib = _status_kib("VmRSS:")
        except OSError:
            self.baseline_kib = math.nan

    def peak_mb(self) -> float:
        """Peak resident memory since :meth:`start` above the baseline, in MiB."""
        try:
            return (_status_kib("VmHWM:") - self.baseline_kib) / 1024.0
        except OSError:
            return math.nan


@dataclass
class Session:
    """What a training run is given besides its configuration: a console for its progress bar, a meter."""

    console: Any = None
    meter: PeakMemory | None = None

    @contextlib.contextmanager
    def bar(self, description: str, total: int) -> Iterator[Any]:
        """A rich progress bar of ``total`` steps (``advance(k)``, ``update(text)``); silent without a console."""
        if self.console is None:
            yield _Silent()
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("{task.fields[info]}"))
        with Progress(*cols, console=self.console, transient=False) as progress:
            task = progress.add_task(description, total=total, info="")
            yield _Bar(progress, task)


class _Bar:
    def __init__(self, progress: Any, task: Any) -> None:
        self.progress, self.task = progress, task

    def advance(self, k: int = 1) -> None:
        self.progress.advance(self.task, k)

    def update(self, info: str) -> None:
        self.progress.update(self.task, info=info)


class _Silent:
    def advance(self, k: int = 1) -> None:
        pass

    def update(self, info: str) -> None:
        pass
