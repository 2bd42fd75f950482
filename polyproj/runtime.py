"""The one thread / BLAS policy of polyproj.

Every decision about threads lives here:

* :func:`small_blas` — batched NumPy work on small matrices (the polish's faces, the IPM's per-element
  systems) runs with one BLAS thread: multithreaded BLAS on many small matrices spends its time
  synchronising threads. OpenMP is not limited, so a solver's own parallel batch keeps its threads.
* :func:`small_work` — small CPU work (below :data:`LARGE_WORK` multiply-adds per sweep) runs on one BLAS
  thread and one torch intra-op thread: long sequences of small operations would otherwise pay a thread
  wake-up each, which dominates on a loaded machine; larger work keeps the user's setting.
* :func:`keep_torch_threads` — OpenMP code called by polyproj (``omp_set_num_threads`` is shared with
  torch) never changes torch's intra-op thread count as seen by the caller.
* :func:`set_torch_threads` — how polyproj changes torch's intra-op thread count: on torch's own OpenMP
  runtime (``omp_set_num_threads``), not ``torch.set_num_threads``. On MKL builds of torch (the Linux CPU
  wheels, 2.13 included) ``torch.set_num_threads(k > 1)`` also calls ``mkl_set_num_threads(k)``, after
  which batched LU factorisations of matrices larger than ~14 (``torch.linalg.lu_factor``, ``solve``,
  ``inv``) run ``dgetrf`` concurrently and return wrong pivots ("oneMKL ERROR: Parameter 6 was incorrect
  on entry to DLASWP", residuals of 1e17; pytorch/pytorch#181570). Restoring the caller's count after a
  one-thread block that way broke every later batched LU of the caller's process.
* :func:`cpu_count`, :func:`batch_parts` and :func:`parallel_map` — independent samples of a large batch
  are processed in parts, one thread per core (NumPy and torch kernels release the GIL).

Measurements behind the thresholds are in ``docs/performance.md``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .errors import PolyprojError, ProblemError, SettingsError

__all__ = [
    "LARGE_WORK",
    "MIN_PER_THREAD",
    "batch_parts",
    "batch_threads",
    "cpu_count",
    "fork_safe_threads",
    "keep_torch_threads",
    "openmp_threads",
    "parallel_map",
    "set_torch_threads",
    "small_blas",
    "small_work",
    "torch_single_thread",
]

#: multiply-adds per sweep above which torch work keeps the user's intra-op threads
LARGE_WORK = 5e7


def cpu_count() -> int:
    """Cores polyproj may use for its own batch threads (the affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


@functools.cache
def _controller() -> Any:
    """One ThreadpoolController per process (building one scans the loaded libraries)."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        return None
    return ThreadpoolController()


_TORCH_OMP: list[Any] = []  # [pools] once looked up (torch must be imported first)


def _torch_openmp_pools() -> tuple[Any, ...]:
    """Threadpoolctl controllers of the OpenMP runtime torch's intra-op pool runs on (empty when none is found).

    The runtime shipped inside torch's package (``torch/lib/libgomp.so.1`` on Linux, ``libomp.dylib`` on
    macOS); where torch uses a system runtime, every OpenMP runtime loaded.
    """
    if _TORCH_OMP:
        return _TORCH_OMP[0]
    torch = sys.modules.get("torch")
    pools: tuple[Any, ...] = ()
    try:
        from threadpoolctl import ThreadpoolController

        omp = [lc for lc in ThreadpoolController().lib_controllers if lc.user_api == "openmp"]
        here = os.path.dirname(os.path.realpath(torch.__file__)) if torch is not None else None
        own = [lc for lc in omp if here and os.path.realpath(lc.filepath).startswith(here + os.sep)]
        pools = tuple(own or omp)
        if torch is not None and pools and pools[0].get_num_threads() != torch.get_num_threads():
            pools = ()  # not the pool torch reads its thread count from
    except Exception:  # pragma: no cover - threadpoolctl missing or a library it cannot read
        pools = ()
    if torch is not None:
        _TORCH_OMP.append(pools)
    return pools


def set_torch_threads(threads: int) -> None:
    """Set torch's intra-op thread count without ``torch.set_num_threads`` where torch runs on OpenMP.

    ``omp_set_num_threads`` on torch's OpenMP runtime is what ``torch.get_num_threads`` reads back and what
    its parallel loops use, and it leaves MKL's own setting alone (see the module notes: changing that one
    breaks torch's batched LU). Builds without an OpenMP runtime found here fall back to
    ``torch.set_num_threads``.
    """
    import numbers

    import torch

    if not (isinstance(threads, numbers.Integral) and not isinstance(threads, bool) and threads >= 1):
        # 0 or -1 was ignored, 2.5 taken as 2
        raise SettingsError(f"the torch thread count must be an integer >= 1, got {threads!r}")
    threads = int(threads)
    pools = _torch_openmp_pools()
    if not pools:
        torch.set_num_threads(threads)
        return
    for lc in pools:
        lc.set_num_threads(threads)


@contextlib.contextmanager
def keep_torch_threads() -> Iterator[None]:
    """Restore torch's intra-op thread count after the block, if torch is imported."""
    torch = sys.modules.get("torch")
    prev = torch.get_num_threads() if torch is not None else None
    try:
        yield
    finally:
        if prev is not None and torch.get_num_threads() != prev:
            set_torch_threads(prev)


_FORKED = False


def _mark_forked() -> None:
    global _FORKED
    _FORKED = True


os.register_at_fork(after_in_child=_mark_forked)


def openmp_threads(requested: int) -> int:
    """The OpenMP threads a solver's parallel region may use here: ``requested``, or 1 in a forked child.

    A process forked (``os.fork``, a ``"fork"`` multiprocessing pool: the default on Linux up to Python 3.13)
    from one whose OpenMP runtime (GNU libgomp) already ran a thread team inherits that team's state but
    not its threads: its first parallel region of more than one thread waits at a barrier forever (a
    ``ProcessPoolExecutor`` scoring DIF removals hung in ProxSuite's ``solve_in_parallel``). One thread
    runs no team; the pool's processes are the parallelism there.
    """
    return 1 if _FORKED else max(1, int(requested))


@contextlib.contextmanager
def torch_single_thread() -> Iterator[None]:
    """One torch intra-op thread inside the block (restored after); a no-op when torch is not imported."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    prev = torch.get_num_threads()
    if prev == 1:
        yield
        return
    try:  # the change inside the try: an interrupt raised as it returns still restores the caller's count
        set_torch_threads(1)
        yield
    finally:
        set_torch_threads(prev)


@contextlib.contextmanager
def small_blas() -> Iterator[None]:
    """One BLAS thread inside the block, and one torch intra-op thread when torch is loaded.

    Torch counts too because :mod:`polyproj.linalg` uses torch's batched triangular solves on NumPy
    memory when torch is loaded; the caller's torch thread count is restored after the block.
    """
    if getattr(_SMALL, "inside", False):  # nested: the limits are already in force (one call costs ~50 µs)
        yield
        return
    ctl = _controller()
    _SMALL.inside = True
    try:
        with keep_torch_threads(), torch_single_thread():
            if ctl is None:  # pragma: no cover
                yield
                return
            with _one_blas_thread(ctl):
                yield
    finally:
        _SMALL.inside = False


@functools.cache
def _blas_pools(ctl: Any) -> tuple[Any, ...]:
    """The BLAS thread pools of the controller's snapshot of the loaded libraries."""
    return tuple(lc for lc in ctl.lib_controllers if lc.user_api == "blas")


@contextlib.contextmanager
def _one_blas_thread(ctl: Any) -> Iterator[None]:
    """One thread for every BLAS pool in the block: ``ctl.limit(limits=1, user_api="blas")`` without its bookkeeping.

    The pools above one thread are set to one and restored after the block (~1 µs against ~10 µs).
    """
    changed = []
    try:
        for lc in _blas_pools(ctl):
            threads = lc.get_num_threads()
            if threads is not None and threads > 1:
                # recorded before it is changed, inside the try: an interrupt that lands anywhere in this loop (a
                # signal arriving during a set_num_threads call is raised as it returns) still restores every
                # pool changed so far, instead of leaving the process on one BLAS thread for good
                changed.append((lc, threads))
                lc.set_num_threads(1)
        yield
    finally:
        for lc, threads in changed:
            lc.set_num_threads(threads)


#: per thread: inside a small_blas block
_SMALL = threading.local()


@contextlib.contextmanager
def small_work(on_cpu: bool, work: float) -> Iterator[None]:
    """One BLAS thread and one torch intra-op thread for small CPU work (below :data:`LARGE_WORK`).

    Multithreaded BLAS on small products spins: on a loaded 2-core machine a (50, 151) x (151, 128)
    product took 25 ms with two OpenBLAS threads and 0.03 ms with one.
    """
    if not on_cpu or work > LARGE_WORK:
        yield
        return
    with small_blas():
        yield


#: smallest part of a batch a thread of its own is used for
MIN_PER_THREAD = 64
#: from this n a part's factorisations dominate, and batch threads pay from MIN_PER_THREAD elements ...
THREAD_MIN_N = 64
#: ... below it a part needs this many entries of its (part, m + n) arrays for a thread of its own
THREAD_MIN_SIZE = 50_000


def batch_threads(on_cpu: bool, batch: int, threads: int | None, n: int, m: int) -> int:
    """Threads sharing the parts of a batch of ``batch`` problems of size ``n`` with ``m`` rows (CPU only).

    ``threads=None`` means one per core, at most one per :data:`MIN_PER_THREAD` elements; below n
    :data:`THREAD_MIN_N` a part pays for its thread only when its arrays hold at least
    :data:`THREAD_MIN_SIZE` entries (smaller ones are dominated by per-operation costs that hold the GIL).
    """
    if threads == 1 or not on_cpu:
        return 1
    want = cpu_count() if threads is None else int(threads)
    if want < 1:
        raise ProblemError(f"threads must be >= 1 or None, got {threads}")
    w = max(1, min(want, batch // MIN_PER_THREAD))
    if threads is None and n < THREAD_MIN_N:
        while w > 1 and (batch // w) * (m + n) < THREAD_MIN_SIZE:
            w -= 1
    return w


def batch_parts(batch: int, part: int) -> list[slice]:
    """Split ``range(batch)`` into about ``batch // part`` equal slices (one slice when that is < 2)."""
    count = batch // max(part, 1)
    if count < 2:
        return [slice(0, batch)]
    bounds = [round(i * batch / count) for i in range(count + 1)]
    return [slice(i, j) for i, j in itertools.pairwise(bounds)]


#: the threads parallel_map shares its items with: one fewer than the cores (the caller works too), made at first
#: use and again when the cores change (affinity); a pool thread runs its own nested parallel_map serially
_POOL: ThreadPoolExecutor | None = None
_POOL_SIZE = 0
_POOL_LOCK = threading.Lock()
_POOL_THREAD = threading.local()


def _pool_thread() -> None:
    _POOL_THREAD.active = True


def _shared_pool(workers: int) -> ThreadPoolExecutor:
    global _POOL, _POOL_SIZE
    with _POOL_LOCK:
        if _POOL is None or _POOL_SIZE != workers:
            if _POOL is not None:
                _POOL.shutdown(wait=False)  # its threads end once their current work is done
            _POOL, _POOL_SIZE = ThreadPoolExecutor(workers, thread_name_prefix="polyproj",
                                                   initializer=_pool_thread), workers
        return _POOL


def _forget_pool() -> None:
    """In a forked child: the parent's pool threads do not exist there (a submit would wait forever)."""
    global _POOL, _POOL_SIZE, _POOL_LOCK
    _POOL, _POOL_SIZE, _POOL_LOCK = None, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def parallel_map(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """``[fn(i) for i in items]`` shared by the caller and a persistent pool of threads (in order).

    One item, one core, or a call from a pool thread: in the caller, no thread. Otherwise the caller and up
    to ``cpu_count() - 1`` pool threads take the items one at a time from a counter of this call (a pool made
    per call cost ~0.15 ms, more than a small batch's work). The caller keeps taking items until none is left,
    so it never waits behind another caller's items in the pool's queue; a pool thread that has not started
    by then is cancelled, and the running ones are waited for (none is left writing into the caller's arrays).
    The first error (an exception in an item, or ``KeyboardInterrupt`` in the caller) stops every thread from
    taking another item and is raised once the items running are done.
    """
    n, workers = len(items), min(len(items), cpu_count()) - 1
    if workers < 1 or getattr(_POOL_THREAD, "active", False):
        return [fn(i) for i in items]
    out: list[Any] = [None] * n
    errors: list[BaseException] = []
    stop = threading.Event()
    counter = itertools.count()  # next() on it is atomic: each item is taken once

    def work() -> None:
        while not stop.is_set():
            i = next(counter)
            if i >= n:
                return
            try:
                out[i] = fn(items[i])
            except BaseException as exc:  # the caller's KeyboardInterrupt too: recorded, then raised there
                errors.append(exc)
                stop.set()
                return

    helpers: list[Any] = []
    try:
        helpers.extend(_shared_pool(cpu_count() - 1).submit(work) for _ in range(workers))
        work()
    finally:
        # However the caller's share ends: its items all taken (the flag then changes nothing), an item's error,
        # or an interrupt that lands between items (outside ``fn``, where ``work`` does not record it), no helper
        # takes another item, and the call returns (or raises) only once the helpers have stopped.
        stop.set()
        for f in helpers:
            f.cancel()  # not started: queued behind another caller's work, and nothing is left for it
        for f in helpers:
            if not f.cancelled():
                f.result()
    if errors:
        raise errors[0]
    return out


@contextlib.contextmanager
def fork_safe_threads() -> Iterator[None]:
    """One torch intra-op thread and one MKL thread in a forked child (:func:`openmp_threads`); else nothing.

    Torch's CPU kernels run on the same OpenMP runtime: in a child forked after the parent ran a torch
    operation on two or more threads, the child's first multithreaded kernel never returns. MKL's own count
    counts too: ``torch.set_num_threads(k)`` in the parent also sets MKL's, and the child's first MKL product
    (``g @ M`` of the scores, the SQP's Hessian) then ran a team of k and hung. The child is a pool's worker,
    whose processes are the parallelism: it keeps one thread of both for good (``torch.set_num_threads(1)``;
    the MKL fault of :func:`set_torch_threads` comes from counts above 1).
    """
    if not _FORKED:
        yield
        return
    torch = sys.modules.get("torch")
    if torch is not None and not _CHILD_ONE_THREAD:
        torch.set_num_threads(1)
        _CHILD_ONE_THREAD.append(True)
    with torch_single_thread():
        yield


#: set in a forked child once its torch (and MKL) thread counts are 1
_CHILD_ONE_THREAD: list[bool] = []


class _Job:
    """``fn`` as an executor runs it: under :func:`fork_safe_threads` (picklable when ``fn`` is)."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, item: Any) -> Any:
        with fork_safe_threads():
            return self.fn(item)


def map_jobs(fn: Callable[[Any], Any], items: Sequence[Any], *, executor: Any = None, progress: bool | None = None,
             bar_from: int, description: str) -> list[Any]:
    """``[fn(i) for i in items]`` in order, on ``executor`` or here.

    With an executor: ``executor.map`` (threads, processes, a Dask ``Client.get_executor()``), else here. A
    transient progress bar (over the results as they arrive, in order) when ``progress`` is True or, with
    ``progress=None``, from ``bar_from`` items.
    """
    bar = progress or (progress is None and len(items) >= bar_from)

    def tracked(seq):  # (a list comprehension over it: a job's StopIteration is the job's, not the loop's end)
        if not bar:
            return seq
        from rich.console import Console
        from rich.progress import track

        # on stderr, and only where it is a terminal: a transient bar left a blank line in a redirected stdout
        console = Console(stderr=True)
        if not console.is_terminal:
            return seq
        return track(seq, total=len(items), description=description, transient=True, console=console)

    def drained(seq, job):
        """``[job(v) for v in tracked(seq)]``; the bar's generator and ``seq`` are closed however it ends.

        An error or a KeyboardInterrupt leaves both suspended at their ``yield``, and the traceback (kept by
        IPython as ``sys.last_traceback``, by a debugger, by ``except ... as e``) keeps them alive: closing them
        stops the bar's refresh thread and cancels ``executor.map``'s futures not yet running (so that a
        ``with executor:`` does not wait for them).
        """
        it = tracked(seq)
        try:
            return [job(v) for v in it]
        finally:
            for gen in (it, seq):
                close = getattr(gen, "close", None)
                if callable(close):
                    close()

    if executor is not None:
        try:
            submitted = executor.map(_Job(fn), items)
        except Exception as exc:  # a pool shut down, a closed Dask client: it takes no jobs (a user's error)
            if isinstance(exc, PolyprojError):
                raise
            raise ProblemError(f"{description}: the executor refused the jobs ({type(exc).__name__}: {exc}); "
                               "is it shut down (or its client closed)?") from exc
        try:
            return drained(submitted, lambda v: v)
        except Exception as exc:
            import pickle
            from concurrent.futures import ThreadPoolExecutor

            # a pickling failure of the jobs themselves (not a user's function that mentions "pickle", nor on a
            # thread pool, which pickles nothing)
            sent = isinstance(exc, (pickle.PicklingError, AttributeError, TypeError)) and "pickle" in str(exc).lower()
            if not sent or isinstance(exc, PolyprojError) or isinstance(executor, ThreadPoolExecutor):
                raise
            # a process pool pickles each job: its functions and data (a lambda or a local function does not)
            raise ProblemError(f"{description}: the executor could not send the jobs to its workers ({exc}); "
                               "a process pool needs the problem's functions defined at module level (not "
                               "lambdas or local functions): use them, a thread pool, or a Dask executor "
                               "(cloudpickle)") from exc
    return drained(items, fn)


def is_vmapped(t: Any) -> bool:
    """True for a torch tensor inside ``torch.func.vmap``; False without torch loaded.

    A batched tensor's values differ per slice: they cannot be tested in Python (``bool(...)``). The functorch
    wrappers are looked through: under ``vmap(jacrev(f))`` the tensor is a gradient-tracking wrapper of a batched
    one (only the outermost was tested, and torch's own error about ``.item()`` came from inside the library).
    """
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(t, torch.Tensor):
        return False
    ft = torch._C._functorch
    for _ in range(64):  # one level per transform around the tensor
        if ft.is_batchedtensor(t):
            return True
        if not ft.is_functorch_wrapped_tensor(t):
            return False
        t = ft.get_unwrapped(t)
    return False
