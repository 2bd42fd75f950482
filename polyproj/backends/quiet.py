"""Silencing what solver libraries print on the C level while polyproj is asked to be quiet.

Some libraries write to the process's standard output whatever their verbosity setting: HiGHS its
banner on the first construction in a process, OSQP 1.1 "Polishing not needed - no active set
detected at optimal point" (through Python's ``sys.stdout``). :func:`c_stdout_silenced` points file
descriptor 1 at ``/dev/null`` and ``sys.stdout`` at a discarded buffer for the duration of a block.
Output of other threads during that block is lost too, so backends use it only around the library
call, and only when ``verbose`` is off.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import sys
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


@contextlib.contextmanager
def c_stdout_silenced(enabled: bool = True) -> Iterator[None]:
    """Redirect file descriptor 1 to ``/dev/null`` inside the block (a no-op when not ``enabled``)."""
    if not enabled:
        yield
        return
    try:
        sys.stdout.flush()
        _flush_c_stdio()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):  # no usable fd 1 (embedded interpreters): nothing to do
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        with contextlib.redirect_stdout(io.StringIO()):  # extensions printing through Python's sys.stdout
            yield
    finally:
        _flush_c_stdio()  # what the library buffered in C's stdout goes to /dev/null, not after the block
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)
