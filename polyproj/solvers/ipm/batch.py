"""Batches: parts, worker threads, and compaction of finished elements.

A batch iterates until its slowest element is done, and every iteration costs a factorisation per
element; most elements converge in 10–15 iterations, a few take many more. Whenever at most
:data:`COMPACT_FRAC` of a batch is still running, the run hands back its state
(:class:`~.state.ResumeState`); the running elements are gathered into a smaller batch that continues
exactly where it stopped (no restart), and the results are merged back with a gather on the device,
not a Python loop over the batch.

Large batches are solved in parts of equal size (as many for each thread), by several threads on the
CPU (NumPy and torch: the heavy kernels release the GIL).
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from array_api_compat import device as _device
from array_api_compat import is_numpy_namespace, is_torch_namespace

from ...linalg import cumulative_sum
from ...runtime import MIN_PER_THREAD
from . import iteration
from .iteration import Settings
from .problem import BatchQP
from .result import FIELDS, RUNNING, IPMResult
from .state import ResumeState

__all__ = [
    "COMPACT_FRAC",
    "COMPACT_MIN",
    "PART_BYTES",
    "SMALL_N",
    "on_cpu",
    "plan_parts",
    "single_threaded_kernels",
    "solve_batch",
    "solve_compacted",
    "workers",
]

#: compact a batch once at most this fraction of its elements is still running ...
COMPACT_FRAC = 0.75
#: ... down to batches of this size
COMPACT_MIN = 2
#: CPU: largest part of a batch, in bytes of its n x n matrices (assembly, factorisation and
#: triangular solves are bound by memory traffic)
PART_BYTES = 2**26
#: up to this n the per-element kernels run single-threaded
SMALL_N = 256


def on_cpu(xp: Any, q: Any) -> bool:
    """NumPy arrays, or torch tensors on the CPU."""
    return is_numpy_namespace(xp) or (is_torch_namespace(xp) and q.device.type == "cpu")


def workers(xp: Any, q: Any, b: int, threads: int | None, n: int, m: int) -> int:
    """Threads for a batch of ``b`` (:func:`polyproj.runtime.batch_threads`; NumPy and torch CPU arrays only)."""
    from ...runtime import batch_threads

    return batch_threads(on_cpu(xp, q), b, threads, n, m)


def plan_parts(xp: Any, qp: BatchQP, batch_chunk: int | None, threads: int | None) -> tuple[int, int]:
    """``(chunk, workers)``: the largest part solved at once and the threads sharing the parts.

    Default parts keep the work arrays near 512 MB (``2**26`` entries of ``n (m + n)``) and, on the
    CPU, at most :data:`PART_BYTES` of n x n matrices; with several threads there are as many equal
    parts for each.
    """
    b, n, m = qp.b, qp.n, qp.m
    chunk = batch_chunk or max(1, int(2**26 // max(1, n * (m + n))))
    w = workers(xp, qp.q, b, threads, n, m)
    if batch_chunk is None and on_cpu(xp, qp.q):
        chunk = min(chunk, max(MIN_PER_THREAD, PART_BYTES // (8 * n * n)))
    if w > 1:
        chunk = min(chunk, -(-b // w))
    if batch_chunk is None and b > chunk:  # equal parts, as many for each thread
        parts = -(-b // chunk)
        parts = -(-parts // w) * w
        chunk = -(-b // parts)
    return chunk, w


@contextlib.contextmanager
def single_threaded_kernels(xp: Any, q: Any):
    """One BLAS thread (and one torch intra-op thread, torch being loaded) on the CPU; nothing elsewhere."""
    from ...runtime import small_blas

    if not on_cpu(xp, q):
        yield
        return
    with small_blas():
        yield


def solve_batch(xp: Any, qp: BatchQP, settings: Settings, chunk: int, n_workers: int) -> IPMResult:
    """The batch in parts of ``chunk`` elements, solved by ``n_workers`` threads, each part compacted."""
    b = qp.b
    if b <= chunk:
        return solve_compacted(xp, qp, settings)

    def part(i):
        return solve_compacted(xp, qp.part(i, min(b, i + chunk)), settings)

    starts = range(0, b, chunk)
    if n_workers > 1:
        with ThreadPoolExecutor(n_workers) as pool:
            parts = list(pool.map(part, starts))
    else:
        parts = [part(i) for i in starts]
    return IPMResult(*[xp.concat([getattr(p, f) for p in parts], axis=0) for f in FIELDS])


def solve_compacted(xp: Any, qp: BatchQP, settings: Settings, resume: ResumeState | None = None) -> IPMResult:
    """Run the IPM on a batch, compacting it as its elements finish (see the module docstring)."""
    b = qp.b
    # float32 iterates of elements at their limits overflow to inf / NaN in NumPy's elementwise kernels (their
    # status records it; the step rules mask them): no RuntimeWarning, which -W error turns into a failure.
    # Per call, in this thread (errstate is thread-local: parts run on worker threads); for every namespace, as
    # array_api_strict (and others wrapping NumPy) run NumPy's kernels underneath; torch's ignore it
    with np.errstate(over="ignore", invalid="ignore"):
        out = iteration.run(xp, qp, settings, resume=resume, stop_frac=COMPACT_FRAC if b >= COMPACT_MIN else None)
    if isinstance(out, IPMResult):
        return out
    part, state = out
    running = part.status == RUNNING
    idx = xp.nonzero(running)[0]  # indices on the device (no host round trip of the status array)
    sub = solve_compacted(xp, qp.take(xp, idx), settings, resume=state.take(xp, idx))
    # element i of the merged result: its place in the continued batch if it was running, else its own
    rank = cumulative_sum(xp, xp.astype(running, idx.dtype)) - 1
    gidx = xp.where(running, b + rank, xp.arange(b, dtype=idx.dtype, device=_device(qp.q)))
    return IPMResult(*[xp.take(xp.concat([getattr(part, f), getattr(sub, f)], axis=0), gidx, axis=0)
                       for f in FIELDS])

