"""Silencing what solver libraries print on the C level while polyproj is asked to be quiet.

Some libraries write to the process's standard output whatever their verbosity setting: HiGHS its
banner on the first construction in a process, OSQP 1.1 "Polishing not needed - no active set
detected at optimal point" (through Python's ``sys.stdout``). :func:`c_stdout_silenced` points file
descriptor 1 at ``/dev/null`` and ``sys.stdout`` at a discarded buffer for the duration of a block.
Output of other threads during that block is lost too, so backends use it only around the library
call, and only when ``verbose`` is off. Blocks of several threads nest: the first to enter redirects, the
last to leave restores (each saving and restoring on its own left fd 1 at ``/dev/null`` for good when two
threads' blocks interleaved).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import sys
import threading
from collections.abc import Iterator

__all__ = ["c_stdout_silenced"]


@functools.cache
def _libc():
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or None)
    except OSError:
        return None


def _flush_c_stdio() -> None:
    libc = _libc()
    if libc is not None:
        libc.fflush(None)


#: the silenced blocks open in the process (every thread's), and what the first one saved
_LOCK = threading.Lock()
_OPEN = {"depth": 0, "fd": None, "devnull": None, "stdout": None}


def _after_fork_in_child() -> None:
    """A forked child has only the forking thread: the others' open blocks (and a lock one held) are gone.

    Fresh lock; stdout given back if the fork came inside blocks, which no thread of the child will leave (the
    child's first silenced block waited forever on the inherited lock, or its output stayed at /dev/null).
    """
    global _LOCK
    _LOCK = threading.Lock()
    if _OPEN["fd"] is not None:  # best effort: a fork in the middle of a restore may find an fd closed already
        with contextlib.suppress(OSError):
            os.dup2(_OPEN["fd"], 1)
        for fd in (_OPEN["fd"], _OPEN["devnull"]):
            with contextlib.suppress(OSError, TypeError):
                os.close(fd)
        if _OPEN["stdout"] is not None:
            sys.stdout = _OPEN["stdout"]
    _OPEN.update(depth=0, fd=None, devnull=None, stdout=None)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def c_stdout_silenced(enabled: bool = True) -> Iterator[None]:
    """Redirect file descriptor 1 to ``/dev/null`` inside the block (a no-op when not ``enabled``)."""
    if not enabled:
        yield
        return
    with _LOCK:
        if _OPEN["depth"] == 0:
            try:
                sys.stdout.flush()
                _flush_c_stdio()
                saved = os.dup(1)
            except (OSError, ValueError, AttributeError):  # no usable fd 1 (embedded interpreters): nothing to do
                saved = None
            if saved is not None:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                # extensions printing through Python's sys.stdout write into a discarded buffer
                _OPEN.update(fd=saved, devnull=devnull, stdout=sys.stdout)
                sys.stdout = io.StringIO()
        _OPEN["depth"] += 1
    try:
        yield
    finally:
        with _LOCK:
            _OPEN["depth"] -= 1
            if _OPEN["depth"] == 0 and _OPEN["fd"] is not None:
                _flush_c_stdio()  # what the library buffered in C's stdout goes to /dev/null, not after the block
                os.dup2(_OPEN["fd"], 1)
                os.close(_OPEN["fd"])
                os.close(_OPEN["devnull"])
                sys.stdout = _OPEN["stdout"]
                _OPEN.update(fd=None, devnull=None, stdout=None)
