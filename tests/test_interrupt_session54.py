"""Interrupted runs (session 54): a KeyboardInterrupt leaves no helper thread working through the rest of a batch, no
thread limit changed, no progress bar drawing, no stale entry in the DIF's second-order log; a real SIGINT during a
threaded batch of projections surfaces at once as KeyboardInterrupt and leaves the process as it was.

Signals that land between two bytecodes are simulated in process by raising KeyboardInterrupt where the signal's
handler would (as a call returns); the end-to-end checks send a real SIGINT to a subprocess.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
import threading
import time
import types
import warnings

import numpy as np
import pytest

from polyproj import runtime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------- parallel_map
def test_an_interrupt_between_two_items_stops_the_helper_threads(monkeypatch):
    """A KeyboardInterrupt that lands in the caller between items (outside the item's function, where the caller's
    loop did not record it) left ``parallel_map`` at once, while its pool threads went on through the whole batch
    (and the interpreter's exit waited for them)."""
    monkeypatch.setattr(runtime, "cpu_count", lambda: 2)
    main = threading.main_thread()

    class Counter:  # itertools.count, with the signal's KeyboardInterrupt on the caller's third take
        def __init__(self) -> None:
            self.it, self.main_takes = itertools.count(), 0

        def __iter__(self):
            return self

        def __next__(self) -> int:
            i = next(self.it)
            if threading.current_thread() is main:
                self.main_takes += 1
                if self.main_takes == 3:
                    raise KeyboardInterrupt
            return i

    monkeypatch.setattr(runtime, "itertools", types.SimpleNamespace(count=Counter, pairwise=itertools.pairwise))
    calls: list[int] = []

    def f(i: int) -> int:
        time.sleep(0.005)
        calls.append(i)
        return i

    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        runtime.parallel_map(f, list(range(400)))
    done = len(calls)
    time.sleep(0.2)
    assert len(calls) == done, "a helper thread kept taking items after the KeyboardInterrupt"
    assert done < 60 and time.perf_counter() - t0 < 2.0


# ----------------------------------------------------------------------------- thread limits
def _set_then_interrupted(setter, threads: int) -> None:
    """The setter's call, then a KeyboardInterrupt where it set one thread: a signal raised as the call returns."""
    setter()
    if threads == 1:
        raise KeyboardInterrupt


def test_small_blas_restores_the_blas_pools_when_interrupted_while_limiting_them(monkeypatch):
    """A signal arriving while ``small_blas`` set a BLAS pool to one thread (raised as the call returned) left the pool
    at one thread for the rest of the process: the change was made before the block's try."""
    pools = runtime._blas_pools(runtime._controller())
    if not pools:
        pytest.skip("no BLAS pool that threadpoolctl controls")
    before = [lc.get_num_threads() for lc in pools]
    try:
        for lc in pools:
            lc.set_num_threads(2)
        if any(lc.get_num_threads() != 2 for lc in pools):
            pytest.skip("the BLAS pools do not take two threads here")
        cls = type(pools[0])
        orig = cls.set_num_threads
        monkeypatch.setattr(cls, "set_num_threads", lambda self, k: _set_then_interrupted(lambda: orig(self, k), k))
        with pytest.raises(KeyboardInterrupt), runtime.small_blas():
            pytest.fail("the block ran")
        monkeypatch.undo()
        assert [lc.get_num_threads() for lc in pools] == [2] * len(pools)
        with runtime.small_blas():  # the next block limits (and restores) as usual
            assert all(lc.get_num_threads() == 1 for lc in pools)
        assert [lc.get_num_threads() for lc in pools] == [2] * len(pools)
    finally:
        for lc, k in zip(pools, before, strict=True):
            lc.set_num_threads(k)


def test_torch_single_thread_restores_the_count_when_interrupted_while_setting_it(monkeypatch):
    torch = pytest.importorskip("torch")
    prev = torch.get_num_threads()
    try:
        runtime.set_torch_threads(2)
        if torch.get_num_threads() != 2:
            pytest.skip("torch does not take two threads here")
        orig = runtime.set_torch_threads
        monkeypatch.setattr(runtime, "set_torch_threads", lambda k: _set_then_interrupted(lambda: orig(k), k))
        with pytest.raises(KeyboardInterrupt), runtime.torch_single_thread():
            pytest.fail("the block ran")
        monkeypatch.undo()
        assert torch.get_num_threads() == 2
    finally:
        runtime.set_torch_threads(prev)


# ----------------------------------------------------------------------------- progress bars
def _refresh_threads(wait: float = 1.0) -> list[threading.Thread]:
    """rich's bar-drawing threads still running after ``wait`` s (a stopped bar's thread ends at its next tick)."""
    deadline = time.perf_counter() + wait
    while True:
        alive = [t for t in threading.enumerate() if type(t).__name__ == "_RefreshThread" and t.is_alive()]
        if not alive or time.perf_counter() > deadline:
            return alive
        time.sleep(0.02)


@pytest.mark.parametrize("where", ["here", "threads"])
def test_the_progress_bar_stops_when_a_job_is_interrupted(monkeypatch, where):
    """With the traceback kept (``pytest.raises`` does, as IPython's ``sys.last_traceback`` and a debugger do), the
    in-process bar's generator stayed suspended: its refresh thread went on drawing after the KeyboardInterrupt."""
    pytest.importorskip("rich")
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich draws the bar as on a terminal
    assert not _refresh_threads()

    def job(i: int) -> int:
        if i == 5:
            raise KeyboardInterrupt
        return i

    ex = ThreadPoolExecutor(1) if where == "threads" else None
    try:
        with pytest.raises(KeyboardInterrupt) as kept:
            runtime.map_jobs(job, list(range(40)), executor=ex, progress=True, bar_from=8, description="probe")
        assert kept.value is not None
        assert not _refresh_threads(), "the progress bar is still drawing"
    finally:
        if ex is not None:
            ex.shutdown(wait=True, cancel_futures=True)


def test_an_executors_queued_jobs_are_cancelled_when_the_caller_is_interrupted(monkeypatch):
    """An interrupt that lands in the progress bar's code (between two results, outside ``executor.map``'s iterator)
    left the queued jobs queued while the traceback lived: ``with executor:`` then waited for all of them."""
    rich_progress = pytest.importorskip("rich.progress")
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # the bar's path, as on a terminal
    started: list[int] = []

    def job(i: int) -> int:
        started.append(i)
        time.sleep(0.01)
        return i

    def interrupted_bar(seq, **kw):  # the caller interrupted in the bar's code as it handles the third result
        for k, v in enumerate(seq):
            if k == 2:
                raise KeyboardInterrupt
            yield v

    monkeypatch.setattr(rich_progress, "track", interrupted_bar)
    with ThreadPoolExecutor(1) as ex:
        with pytest.raises(KeyboardInterrupt) as kept:
            runtime.map_jobs(job, list(range(300)), executor=ex, progress=True, bar_from=8, description="probe")
        t0 = time.perf_counter()
    assert kept.value is not None and time.perf_counter() - t0 < 1.0  # not the 3 s of every queued job
    assert len(started) < 30


# ----------------------------------------------------------------------------- DIF second-order log
def test_an_interrupted_second_order_call_leaves_no_entries_in_the_log(study, monkeypatch):
    """``second_order_log`` holds one entry per removal of each call that returned: an interrupted
    ``influence(order=2)`` left the entries of the removals it had done, and the next call's came after them (its
    removal i no longer at the call's offset + i); an interrupt inside the empty removal's run left that entry."""
    from polyproj.adapters.dif import DIF, second_order

    rems = [{"objective": [i]} for i in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fresh = DIF(study.problem, study.kkt)
        want = fresh.influence(lambda th: th.sum(), rems, order=2).numpy()
        orig = second_order.step_length
        for interrupt_at in (1, 3):  # 1: the empty removal's own run (_own_correction); 3: the second removal
            dif = DIF(study.problem, study.kkt)
            calls = [0]

            def step_length(*args, _at=interrupt_at, _calls=calls, **kw):
                _calls[0] += 1
                if _calls[0] == _at:
                    raise KeyboardInterrupt
                return orig(*args, **kw)

            monkeypatch.setattr(second_order, "step_length", step_length)
            with pytest.raises(KeyboardInterrupt):
                dif.influence(lambda th: th.sum(), rems, order=2)
            monkeypatch.setattr(second_order, "step_length", orig)
            assert dif.second_order_log == []
            got = dif.influence(lambda th: th.sum(), rems, order=2).numpy()
            np.testing.assert_array_equal(got, want)
            assert dif.second_order_log == fresh.second_order_log


# ----------------------------------------------------------------------------- a real SIGINT
#: the subprocesses' SIGINT to themselves, one second after the clock t0 starts
_SIGINT_IN_ONE_SECOND = """def fire():
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=fire, daemon=True).start()
    t0 = time.perf_counter()"""


def _interrupted(script: str) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    """Run ``script`` (its ``{SIGINT_IN_ONE_SECOND}`` filled in) in a subprocess; its output lines as a dict."""
    code = textwrap.dedent(script.replace("{SIGINT_IN_ONE_SECOND}", _SIGINT_IN_ONE_SECOND))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    return run, dict(line.split(" ", 1) for line in run.stdout.splitlines() if " " in line)


_THREADED_DAQP = """
    import os, signal, sys, threading, time
    import numpy as np, torch
    from threadpoolctl import threadpool_info
    import polyproj as pp
    from polyproj import runtime
    runtime.cpu_count = lambda: 2  # the batch on threads, as on two cores
    rng = np.random.default_rng(0)
    n, m = 60, 120
    P = pp.Polyhedron(A=rng.standard_normal((m, n)), a=rng.random(m))
    X = 3 * rng.standard_normal((40000, n))
    X0 = X.copy()
    few = X[:8].copy()
    ref = pp.project(few, P, backend="daqp").y
    before = ([(d["internal_api"], d["num_threads"]) for d in threadpool_info()], torch.get_num_threads())
    {SIGINT_IN_ONE_SECOND}
    try:
        pp.project(X, P, backend="daqp")
        print("NOT INTERRUPTED")
    except KeyboardInterrupt:
        print("KI", time.perf_counter() - t0)
    after = ([(d["internal_api"], d["num_threads"]) for d in threadpool_info()], torch.get_num_threads())
    print("THREADS", before == after)
    print("UNCHANGED", np.array_equal(X, X0))
    print("AGAIN", float(np.max(np.abs(pp.project(few, P, backend="daqp").y - ref))))
"""


def test_sigint_during_a_threaded_batch_surfaces_at_once_and_leaves_the_process_as_it_was():
    t0 = time.perf_counter()
    run, out = _interrupted(_THREADED_DAQP)
    wall = time.perf_counter() - t0
    assert run.returncode == 0, run.stderr[-2000:]
    assert "KI" in out, run.stdout
    assert float(out["KI"]) < 4.0  # the signal at 1 s; the threads stop at the end of their part (<= 64 points)
    assert out["THREADS"] == "True" and out["UNCHANGED"] == "True" and float(out["AGAIN"]) == 0.0
    assert wall < 60  # nothing left running keeps the interpreter from exiting


_OSQP_BATCH = """
    import os, signal, threading, time
    import numpy as np
    import polyproj as pp
    rng = np.random.default_rng(0)
    n, m = 60, 120
    P = pp.Polyhedron(A=rng.standard_normal((m, n)), a=rng.random(m))
    X = 3 * rng.standard_normal((30000, n))
    {SIGINT_IN_ONE_SECOND}
    try:
        r = pp.project(X, P, backend="osqp")
        print("NOT INTERRUPTED", time.perf_counter() - t0)
    except KeyboardInterrupt:
        print("KI", time.perf_counter() - t0)
"""


def test_sigint_caught_by_osqps_own_handler_surfaces_as_keyboardinterrupt():
    # OSQP's C library takes SIGINT during its solve and returns OSQP_SIGINT: the glue raises it as Python's
    # KeyboardInterrupt (before: a NUMERICAL_ERROR status for that element, the batch ran on to the end)
    pytest.importorskip("osqp")
    run, out = _interrupted(_OSQP_BATCH)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "KI" in out, run.stdout
    assert float(out["KI"]) < 10.0  # the signal at 1 s; 30,000 points take minutes


def test_a_time_limit_does_not_polish_the_points_a_per_point_backend_never_began(monkeypatch):
    # DAQP solves point by point and stops at the limit: the points after it have no start at all (NaN). The
    # late polish takes only the begun ones (polishing the others is a whole solve: 20,000 points under a 0.5 s
    # limit took 13 s); the others stay NaN as TIME_LIMIT, the begun ones are the exact projections
    pytest.importorskip("daqp")
    import polyproj as pp
    import polyproj.backends.daqp as DQ
    import polyproj.projection.pipeline as PL

    rng = np.random.default_rng(3)
    n, m = 12, 24
    P = pp.Polyhedron(A=rng.standard_normal((m, n)), a=rng.random(m))
    X = 3 * rng.standard_normal((200, n))
    ref = pp.project(X, P, backend="daqp").y
    clock = itertools.count()  # one tick a reading: the limit passes after ~60 points, whatever the machine
    monkeypatch.setattr(DQ, "time", types.SimpleNamespace(perf_counter=lambda: float(next(clock))))
    polished = []
    real = PL._polish

    def spy(Xp, *a, **k):
        polished.append(Xp.shape[0])
        return real(Xp, *a, **k)

    monkeypatch.setattr(PL, "_polish", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pp.PolyprojWarning)
        r = pp.project(X, P, backend="daqp", time_limit=60.0)
    begun = np.isfinite(r.y).all(axis=1)
    assert 0 < begun.sum() < X.shape[0]
    assert sum(polished) == begun.sum()
    assert all(s is pp.Status.TIME_LIMIT for s, b in zip(r.status, begun, strict=True) if not b)
    assert np.isnan(r.y[~begun]).all() and not r.active[~begun].any()
    np.testing.assert_allclose(r.y[begun], ref[begun], atol=1e-10)
