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


def test_an_error_waits_for_every_item(two_cores):
    done = []

    def f(i):
        if i == 0:
            raise ValueError("first")
        time.sleep(0.05)
        done.append(i)
        return i

    with pytest.raises(ValueError, match="first"):
        runtime.parallel_map(f, [0, 1, 2])
    assert sorted(done) == [1, 2]  # nothing still running when the error reached the caller


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
