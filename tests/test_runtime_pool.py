"""polyproj.runtime.parallel_map: the caller and a persistent pool share the items, in order, safely."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from polyproj import runtime


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr(runtime, "cpu_count", lambda: 2)


def test_results_in_order_and_on_two_threads(two_cores):
    seen = set()

    def f(i):
        seen.add(threading.get_ident())
        time.sleep(0.01)
        return i * i

    assert runtime.parallel_map(f, list(range(6))) == [i * i for i in range(6)]
    assert threading.get_ident() in seen and len(seen) == 2


def test_an_error_stops_the_items_not_started_and_waits_for_the_running_ones(two_cores):
    running, done = [0], []
    lock = threading.Lock()

    def f(i):
        with lock:
            running[0] += 1
        try:
            if i == 0:
                time.sleep(0.02)  # the pool thread has taken item 1 by then
                raise ValueError("first")
            time.sleep(0.05)
            done.append(i)
            return i
        finally:
            with lock:
                running[0] -= 1

    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="first"):
        runtime.parallel_map(f, list(range(40)))
    assert running[0] == 0  # nothing still running when the error reached the caller
    assert len(done) <= 2 and time.perf_counter() - t0 < 0.5  # not the 40 x 0.05 s of every item


def test_keyboard_interrupt_in_the_caller_is_raised_at_once(two_cores):
    def f(i):
        if threading.current_thread() is threading.main_thread():
            raise KeyboardInterrupt
        time.sleep(0.01)
        return i

    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        runtime.parallel_map(f, list(range(200)))
    assert time.perf_counter() - t0 < 0.5


def test_a_small_call_does_not_wait_behind_another_callers_batch(two_cores):
    """Each call's items are taken from its own counter: the caller works through them itself even while
    the pool's thread is busy with another thread's long batch."""
    started = threading.Event()

    def slow(i):
        started.set()
        time.sleep(0.01)
        return i

    other = threading.Thread(target=runtime.parallel_map, args=(slow, list(range(100))))
    other.start()
    started.wait(5)
    t0 = time.perf_counter()
    assert runtime.parallel_map(lambda i: i + 1, [1, 2, 3, 4]) == [2, 3, 4, 5]
    took = time.perf_counter() - t0
    other.join()
    assert took < 0.2, took  # the other batch takes ~0.5 s or more


def test_the_pool_follows_the_cores(monkeypatch):
    for cores in (3, 2):
        monkeypatch.setattr(runtime, "cpu_count", lambda c=cores: c)
        assert runtime.parallel_map(abs, [-1, -2, -3]) == [1, 2, 3]
        assert runtime._POOL_SIZE == cores - 1


def test_nested_calls_in_pool_threads_run_serially(two_cores):
    """A pool thread's own parallel_map does not wait on the pool (which could be busy: a deadlock)."""
    def inner(j):
        return j + 1

    def outer(i):
        return sum(runtime.parallel_map(inner, [i, i, i]))

    assert runtime.parallel_map(outer, [0, 1, 2, 3]) == [3, 6, 9, 12]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_gets_a_pool_of_its_own():
    code = (
        "import os, sys\n"
        "from polyproj import runtime\n"
        "runtime.cpu_count = lambda: 2\n"
        "assert runtime.parallel_map(abs, [-1, -2, -3]) == [1, 2, 3]\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(0 if runtime.parallel_map(abs, [-4, -5]) == [4, 5] else 1)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "sys.exit(os.waitstatus_to_exitcode(status))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], timeout=60, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr


def test_map_jobs_passes_a_jobs_own_stop_iteration():
    """The in-process path ran the jobs in a generator: a job's StopIteration became 'generator raised
    StopIteration' (a review); it reaches the caller as it was raised, with or without a bar."""
    from polyproj.runtime import map_jobs

    def job(i):
        if i == 2:
            raise StopIteration("mine")
        return i

    for progress in (False, True):
        with pytest.raises(StopIteration, match="mine"):
            map_jobs(job, [0, 1, 2], progress=progress, bar_from=8, description="jobs")
    assert map_jobs(lambda i: i * i, [1, 2, 3], bar_from=8, description="jobs") == [1, 4, 9]
