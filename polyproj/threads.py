"""Single-threaded BLAS for batches of small dense problems.

Multithreaded OpenBLAS on many small matrices (the polish's k×n faces, the IPM's n×n systems)
spends its time synchronising threads: on a 2-core machine a batched polish measured 55 ms median
(24 ms best) with 2 BLAS threads and 18 ms with one. Batched NumPy work in polyproj runs inside
:func:`small_blas`, which limits BLAS (not OpenMP, so ProxSuite's ``solve_in_parallel`` keeps its
threads) to one thread for the duration of the call.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["keep_torch_threads", "small_blas", "torch_single_thread"]


@functools.cache
def _controller() -> Any:
    """One ThreadpoolController per process (building one scans the loaded libraries)."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        return None
    return ThreadpoolController()


@contextlib.contextmanager
def keep_torch_threads() -> Iterator[None]:
    """Restore torch's intra-op thread count after the block, if torch is imported.

    OpenMP code called from here (ProxSuite's ``solve_in_parallel``, an OpenBLAS built on OpenMP
    restoring its thread count) sets the count through ``omp_set_num_threads``, which is also
    torch's: a process that had called ``torch.set_num_threads(1)`` ran on every core after one
    ``pp.project``.
    """
    torch = sys.modules.get("torch")
    prev = torch.get_num_threads() if torch is not None else None
    try:
        yield
    finally:
        if prev is not None and torch.get_num_threads() != prev:
            torch.set_num_threads(prev)


@contextlib.contextmanager
def small_blas() -> Iterator[None]:
    """Limit BLAS to one thread inside the block (no-op without threadpoolctl).

    When torch is loaded its intra-op threads are limited to one too (the batched NumPy solves of
    :mod:`polyproj.linalg` use its triangular-solve kernels then; with two intra-op threads on top of
    polyproj's own threads they gained nothing: n 100, batch 1024 projections 0.86 vs 0.73 s), and
    its thread count is restored after the block (:func:`keep_torch_threads`).
    """
    ctl = _controller()
    torch_loaded = sys.modules.get("torch") is not None
    with keep_torch_threads(), (torch_single_thread() if torch_loaded else contextlib.nullcontext()):
        if ctl is None:  # pragma: no cover
            yield
            return
        with ctl.limit(limits=1, user_api="blas"):
            yield


@contextlib.contextmanager
def torch_single_thread() -> Iterator[None]:
    """One torch intra-op thread inside the block (restored after; needs torch imported by the caller).

    Batched small operations gain nothing from intra-op threads, and on a loaded machine each one
    pays a thread wake-up: measured 4.7 s vs 22 ms per call of the torch layer (batch 128, n 12).
    """
    import torch

    prev = torch.get_num_threads()
    if prev == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(prev)
