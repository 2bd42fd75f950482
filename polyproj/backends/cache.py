"""A small cache of solver-format matrices, keyed by the identity of a QP's ``P`` and ``C``.

``QP`` copies its data on construction and never changes it, and ``QP.with_vectors`` shares ``P``
and ``C``; so the conversions a backend makes of them (upper/lower triangle, CSC, bound rows
appended) can be reused across solves of the same problem, batches and projections. Entries hold
weak references to the source arrays and are dropped once those are collected (LRU of 16): a source's
collection queues its key and the entry goes at once, or at the next call where the cache is busy.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

__all__ = ["converted"]

T = TypeVar("T")
_SIZE = 16
_CACHE: OrderedDict[tuple, tuple[tuple[weakref.ref, ...], Any]] = OrderedDict()
#: solves from several threads share the cache: a key evicted by one between another's lookup and its
#: move_to_end raised KeyError there (the build itself runs outside the lock)
_LOCK = threading.Lock()


#: keys whose sources were collected (weak-reference callbacks, which run wherever the collector does: they
#: never wait for the lock, whose holder may be the very thread they interrupt)
_DEAD: deque[tuple] = deque()


def _source_died(key: tuple) -> None:
    if _CACHE is None or _DEAD is None or _LOCK is None:  # interpreter shutdown: the module's globals are gone
        return
    _DEAD.append(key)
    lock = _LOCK
    if lock.acquire(blocking=False):
        try:
            _purge()
        finally:
            lock.release()


def _purge() -> None:
    """Drop the queued entries whose sources are gone (the lock held); a key reused since by a live entry stays."""
    while _DEAD:
        key = _DEAD.popleft()
        hit = _CACHE.get(key)
        if hit is not None and any(ref() is None for ref in hit[0]):
            del _CACHE[key]


def _after_fork_in_child() -> None:
    global _LOCK
    _LOCK = threading.Lock()  # one held by another thread at the fork is never released in the child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def converted(tag: str, sources: Sequence[Any], extra: Hashable, build: Callable[[], T]) -> T:
    """Return ``build()``, reusing the value from an earlier call with the same sources and ``extra``."""
    key = (tag, *(id(s) for s in sources), extra)
    with _LOCK:
        _purge()
        hit = _CACHE.get(key)
        if hit is not None and all(ref() is src for ref, src in zip(hit[0], sources)):
            _CACHE.move_to_end(key)
            return hit[1]
    value = build()
    try:
        refs = tuple(weakref.ref(s, lambda _ref, key=key: _source_died(key)) for s in sources)
    except TypeError:  # an object without weak references: no caching
        return value
    with _LOCK:
        _CACHE[key] = (refs, value)
        while len(_CACHE) > _SIZE:
            _CACHE.popitem(last=False)
    return value
