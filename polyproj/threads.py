"""Single-threaded BLAS for batches of small dense problems.

Multithreaded OpenBLAS on many small matrices (the polish's k×n faces, the IPM's n×n systems)
spends its time synchronising threads: on a 2-core machine a batched polish measured 55 ms median
(24 ms best) with 2 BLAS threads and 18 ms with one. Batched NumPy work in polyproj runs inside
:func:`small_blas`, which limits BLAS (not OpenMP, so ProxSuite's ``solve_in_parallel`` keeps its
threads) to one thread for the duration of the call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["small_blas"]


@contextlib.contextmanager
def small_blas() -> Iterator[None]:
    """Limit BLAS to one thread inside the block (no-op without threadpoolctl)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield
