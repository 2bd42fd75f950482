"""The threshold of the (capped) simplex, exactly and batched: ``θ`` with ``Σ_i clip(x_i − θ, 0, u) = t``.

The projection of ``x`` onto ``{0 <= y <= u, Σ y = t}`` (``u = inf``: the simplex) is
``y = clip(x − θ, 0, u)`` where ``θ`` solves ``f(θ) := Σ_i clip(x_i − θ, 0, u) = t``. ``f`` is piecewise
linear and non-increasing; on the piece of a partition (coordinates capped at ``u``: ``C``, free:
``F``) ``f(θ) = u|C| + Σ_F x_i − θ|F|``, whose root

    θ_N = (u|C| + Σ_F x_i − t) / |F|

is a Newton step. :func:`threshold` takes Newton steps from ``θ₀ = max((Σx − t)/n, max x − t) <= θ*``
(for the simplex ``f`` is convex and the steps increase monotonically to the root: Michelot's method),
safeguarded by the bracket ``[lo, hi]`` (``f(lo) >= t >= f(hi)``): a step that leaves its interior or
meets a flat piece is replaced by the secant of the bracket's ends (exact once they lie on one piece),
else by bisection. A sample is done when a Newton step lands on the piece it was taken from, or when
``|f(θ) − t|`` is at the rounding of ``f`` (summed as ``u|C| + Σ_F (x_i − θ)``): its partition is then
the one of the solution and ``θ`` is recomputed from it exactly. Every step is a few passes over the
batch (no sort); samples still open after ``max_iter`` steps get the exact sort of the ``2n``
breakpoints (:func:`sorted_threshold`): rare, rows spread far wider than the cap, where the secant keeps
one end of the bracket (23 of 1200 solves in a random sweep, mostly rows of scale 100 with caps ~0.01).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from array_api_compat import array_namespace, is_cupy_namespace, is_numpy_namespace, is_torch_namespace
from array_api_compat import device as _device

from ..linalg import cumulative_sum
from ..projection.faces import put_rows

__all__ = ["Threshold", "native_module", "sorted_threshold", "threshold"]


@dataclass(frozen=True)
class Threshold:
    """The threshold ``θ`` (b, 1) of each sample, the iterations taken, ``near`` and ``free``.

    ``near`` (b,): an entry lies within the given tolerance of a breakpoint (``x_i − θ ∈ {0, u}``: a
    weakly active coordinate); ``free`` (b,): some entry has ``0 < x_i − θ < u``. Both None when no
    tolerance was given.
    """

    theta: Any
    iterations: int
    near: Any = None
    free: Any = None


def _near_free(xp: Any, V: Any, theta: Any, upper: float, tol: Any) -> tuple[Any, Any]:
    """``(near, free)`` of :class:`Threshold` from the entries ``V`` that decide them."""
    D = V - theta
    free = D > 0 if upper == float("inf") else (D > 0) & (D < upper)
    return _near(xp, V, theta, upper, tol), xp.any(free, axis=1)


def _near(xp: Any, V: Any, theta: Any, upper: float, tol: Any) -> Any:
    """(b,) some entry of ``V`` within ``tol`` of ``θ`` or of ``θ + upper``."""
    D = V - theta
    hit = xp.min(xp.abs(D), axis=1, keepdims=True) <= tol
    if upper != float("inf"):
        hit = hit | (xp.min(xp.abs(D - upper), axis=1, keepdims=True) <= tol)
    return hit[:, 0]


def _eps(xp: Any, dtype: Any) -> float:
    return float(np.finfo(np.float32 if dtype == xp.float32 else np.float64).eps)


def _piece(xp: Any, X: Any, theta: Any, upper: float):
    """``(f(θ), |F|, |C|, u|C| + Σ_F x)`` at ``θ`` (b, 1) for each row of ``X`` (``|C|`` 0 for the simplex).

    ``f`` is summed as ``u|C| + Σ_F (x_i − θ)``: the capped entries enter as one product with their count,
    so the rounding of ``f`` is that of the free entries' sum and of one product, not that of adding ``u``
    ``|C|`` times (``|C| eps t``; see the stop test in :func:`_newton`).
    """
    D = X - theta
    if upper == float("inf"):
        pos = D > 0
        f = xp.sum(xp.where(pos, D, xp.zeros_like(D)), axis=1, keepdims=True)
        nf = xp.sum(xp.astype(pos, X.dtype), axis=1, keepdims=True)
        return f, nf, xp.zeros_like(nf), f + theta * nf
    capped = D >= upper
    if is_numpy_namespace(xp):  # counts and a masked sum without float copies of the masks (~1.5x faster)
        free = D > 0
        free &= ~capped
        nc = np.count_nonzero(capped, axis=1, keepdims=True).astype(X.dtype)
        nf = np.count_nonzero(free, axis=1, keepdims=True).astype(X.dtype)
        sf = np.sum(D, axis=1, keepdims=True, where=free)
    elif is_torch_namespace(xp):  # integer counts of the masks (no float copies)
        free = (D > 0) & ~capped
        nc = capped.sum(1, keepdim=True).to(X.dtype)
        nf = free.sum(1, keepdim=True).to(X.dtype)
        sf = xp.where(free, D, xp.zeros_like(D)).sum(1, keepdim=True)
    else:
        free = (D > 0) & ~capped
        nc = xp.sum(xp.astype(capped, X.dtype), axis=1, keepdims=True)
        nf = xp.sum(xp.astype(free, X.dtype), axis=1, keepdims=True)
        sf = xp.sum(xp.where(free, D, xp.zeros_like(D)), axis=1, keepdims=True)
    f = upper * nc + sf
    return f, nf, nc, f + theta * nf  # u|C| + Σ_F (x − θ) + θ|F|


#: entries kept by the prefilter beyond those the cap forces to be positive (``total / upper``)
CANDIDATES = 16


def threshold(X: Any, total: Any, upper: float = float("inf"), *, max_iter: int = 60, tol: Any = None
              ) -> Threshold:
    """``θ`` (b, 1) with ``Σ clip(x − θ, 0, upper) = total`` for each row of ``X`` (b, n).

    ``total`` is (b, 1) in X's namespace and dtype, with ``0 <= total <= n·upper`` (not checked here).
    See the module docstring for the method.

    Prefilter (NumPy, PyTorch, CuPy): the threshold of the ``K`` largest entries of a row is the row's
    threshold exactly when its ``(K+1)``-th largest entry is ``<= θ`` (every other entry is then at 0);
    ``K = ⌈total/upper⌉ + CANDIDATES`` (at least ``total/upper`` entries are positive). The ``K`` largest
    come from a partial selection (``partition`` / ``topk``: no full sort); rows that fail the test are
    solved on all their entries. With ``tol`` (a function of ``θ`` and the total of the same rows, both
    (r, 1), giving (r, 1): it is called on the whole batch and on the subset of rows solved again, so it
    must not hold per-sample data of its own), ``near`` is computed on the entries that decide it: the
    candidates and the ``(K+1)``-th (all others lie below).
    """
    xp = array_namespace(X)
    b, n = X.shape
    cap = upper
    if upper != float("inf") and b and upper >= float(xp.max(total)):
        # no entry reaches the cap at the root (each is at most the total), so θ is the uncapped one; with the
        # cap the stop test's width carried u (1e15 stopped Newton on the wrong piece: sums 10 % off)
        upper = float("inf")
    K = CANDIDATES + (int(np.ceil(float(xp.max(total)) / upper)) if upper != float("inf") and b else 0)
    top = _largest(xp, X, K) if 2 * K < n else None
    if top is None:
        th = _newton(X, total, upper, max_iter)
        near, free = (None, None) if tol is None else _near_free(xp, X, th.theta, cap, tol(th.theta, total))
        return Threshold(th.theta, th.iterations, near, free)
    cand, kth, ordered = top
    lower = None
    m = int(np.ceil(float(xp.min(total)) / upper)) if upper != float("inf") else 0
    if 1 <= m < K:  # f(x_(m) − u) >= m u >= t: the m-th largest entry less u is below the root
        if ordered:
            lower = cand[:, m - 1: m] - upper
        else:
            mth = _largest(xp, cand, m - 1) if m > 1 else (None, xp.max(cand, axis=1, keepdims=True))
            lower = None if mth is None else mth[1] - upper
        if lower is not None:  # m is the smallest total's: the bound holds on the rows with t <= m u only
            lower = xp.where(total <= m * upper, lower, xp.full_like(lower, -float("inf")))
    th = _newton(cand, total, upper, max_iter, lower)
    near = free = None
    if tol is not None:  # the entries below the (K+1)-th are neither near a breakpoint nor free
        near, free = _near_free(xp, xp.concat([cand, kth], axis=1), th.theta, cap, tol(th.theta, total))
    bad = kth > th.theta
    if not bool(xp.any(bad)):
        return Threshold(th.theta, th.iterations, near, free)
    rows = xp.nonzero(bad[:, 0])[0]
    Xr = xp.take(X, rows, axis=0)
    tr = xp.take(total, rows, axis=0)
    full = _newton(Xr, tr, upper, max_iter)
    theta = _put(xp, th.theta, rows, full.theta)
    if near is not None:
        nr, fr = _near_free(xp, Xr, full.theta, cap, tol(full.theta, tr))
        near, free = put_rows(xp, near, rows, nr), put_rows(xp, free, rows, fr)
    return Threshold(theta, max(th.iterations, full.iterations), near, free)


def native_module(xp: Any) -> Any:
    """The array library behind the namespace (NumPy, torch, CuPy: partial selection, ``out=``), else None."""
    if is_numpy_namespace(xp):
        return np
    if is_torch_namespace(xp):
        import torch

        return torch
    if is_cupy_namespace(xp):
        import importlib

        return importlib.import_module("cupy")
    return None


def _largest(xp: Any, X: Any, K: int) -> tuple[Any, Any, bool] | None:
    """The ``K`` largest entries of each row, the ``(K+1)``-th largest (b, 1), and their order.

    The third value is True when the ``K`` entries are in decreasing order (``topk``), False for any
    order (``partition``). None where the namespace has no partial selection (``array_api_strict``).
    """
    n = X.shape[1]
    if is_numpy_namespace(xp) or is_cupy_namespace(xp):
        part = native_module(xp).partition(X, n - K - 1, axis=1)  # the namespace's own partition
        return part[:, n - K:], part[:, n - K - 1: n - K], False
    if is_torch_namespace(xp):
        vals = xp.topk(X, K + 1, dim=1).values  # sorted, decreasing
        return vals[:, :K], vals[:, K:], True
    return None


def _newton(X: Any, total: Any, upper: float, max_iter: int, lower: Any = None) -> Threshold:
    """The safeguarded Newton steps of the module docstring on every row of ``X``.

    ``lower`` (b, 1), a bound with ``f(lower) >= total``, is the start where it is above the usual one.
    """
    xp = array_namespace(X)
    b, n = X.shape
    eps = _eps(xp, X.dtype)
    xmax = xp.max(X, axis=1, keepdims=True)
    xmin = xp.min(X, axis=1, keepdims=True)
    capped = upper != float("inf")
    lo = xmin - upper if capped else xmax - total
    hi = xmax
    theta = xp.maximum(xp.sum(X, axis=1, keepdims=True) / n - total / n, xmax - total)
    if lower is not None:
        theta = xp.maximum(theta, lower)
    if capped:  # at total = n·upper every θ <= lo is a root (f is flat there): take lo
        theta = xp.where(total >= n * upper, lo, xp.clip(theta, lo, hi))
    # A sample is done in either of two ways.
    # * The piece is identified: θ is the root of the line of the previous θ's piece (a Newton step), and the
    #   two lie on one piece (the same counts |F| and |C|: as θ grows each entry only moves from capped to
    #   free to zero, so equal counts mean the same partition). The test is comparisons only, free of rounding.
    # * |f(θ) − t| is at the rounding of f = u|C| + Σ_F (x_i − θ) (_piece): the best float θ is eps |θ| from
    #   the root and moves f by |F| eps |θ|; each free entry is below w = min(t, u) (below t for the simplex)
    #   and is rounded to eps w, their sum to |F| eps w in all; u|C| and the last addition to eps t. This
    #   ends roots at a breakpoint, where rounding sends the steps from one piece to the next. It must stay
    #   at rounding: a θ on a neighbouring piece whose f is within the test's width of t is taken for the
    #   root's piece, the answer off by up to that width over |F| (a width of n eps t, from summing u once per
    #   capped entry, had float32 sums 6e-3 off at n 1000, t 19.5, u 0.02). (A scale of n max |x| called
    #   x = (1e17, 3, 0), u = 1, t = 2 done at θ = 1e17, f = 0.)
    width = xp.minimum(xp.abs(total), xp.full_like(total, upper)) if capped else xp.abs(total)
    width0 = width  # (the whole batch's: width is compacted with the open rows below)
    f_lo = xp.full_like(lo, n * upper if capped else float("nan"))  # f at the bracket's ends (NaN: unknown)
    f_hi = xp.zeros_like(hi)
    # counts (|F|, |C|) of the piece whose root the current θ is (-1: θ is not a Newton step)
    prev_nf = prev_nc = xp.full_like(theta, -1.0)
    idx = None  # rows of the batch still open (None: all)
    Xa, ta, out = X, total, theta
    it = 0
    for it in range(1, max_iter + 1):
        f, nf, nc, s = _piece(xp, Xa, theta, upper)
        same = (nf > 0) & (nf == prev_nf) & (nc == prev_nc)
        done = same | (xp.abs(f - ta) <= 4.0 * eps * (nf * (xp.abs(theta) + width) + xp.abs(ta)))
        if capped:  # t = n·u to its rounding (the set admits that much above it): every entry at the cap
            done = done | (ta >= n * upper)
        # exact on the identified piece; a flat piece (|F| = 0) at the root keeps θ
        exact = xp.where(nf > 0, (s - ta) / xp.where(nf > 0, nf, xp.ones_like(nf)), theta)
        above, below = f > ta, f < ta
        lo, f_lo = xp.where(above, theta, lo), xp.where(above, f, f_lo)
        hi, f_hi = xp.where(below, theta, hi), xp.where(below, f, f_hi)
        step, newton = _safeguard(xp, exact, nf > 0, lo, hi, f_lo, f_hi, ta)
        theta = xp.where(done, exact, step)
        none = xp.full_like(nf, -1.0)
        prev_nf, prev_nc = xp.where(newton, nf, none), xp.where(newton, nc, none)
        out = _put(xp, out, idx, theta)
        open_ = ~done[:, 0]
        left = int(xp.sum(xp.astype(open_, xp.int64)))
        if left == 0:
            return Threshold(_from_partition(xp, X, total, upper, out, width0), it)
        if 2 * left <= open_.shape[0]:  # fewer rows: keep only the open ones
            keep = xp.nonzero(open_)[0]
            idx = keep if idx is None else xp.take(idx, keep, axis=0)
            Xa, ta, theta, lo, hi, f_lo, f_hi, width, prev_nf, prev_nc = (
                xp.take(v, keep, axis=0) for v in (Xa, ta, theta, lo, hi, f_lo, f_hi, width, prev_nf, prev_nc))
    rest = xp.arange(b, device=_device(X)) if idx is None else idx
    sub = sorted_threshold(xp.take(X, rest, axis=0), xp.take(total, rest, axis=0), upper)
    return Threshold(_from_partition(xp, X, total, upper, _put(xp, out, rest, sub), width0), it)


def _from_partition(xp: Any, X: Any, total: Any, upper: float, theta: Any, width: Any) -> Any:
    """``θ`` (b, 1) recomputed from the partition at ``θ``: ``(u|C| + Σ_F x_i − t) / |F|`` (``θ`` kept where |F| = 0).

    The iteration's exact step is ``u|C| + Σ_F (x_i − θ) + θ|F|``, which carries the rounding of the θ it was
    taken at (``eps |θ|``): a row stopped by its piece test at a far θ (``1e15``, its entries near 0 after a
    shift) kept an error of ``0.125 / |F|``, sums 1.495 for 1.47. The sum of the free entries themselves has
    only their own rounding. Only where some θ lies beyond 4 times its set's size (``t + width``): nearer, that
    rounding is a few eps of the size, and the extra pass over the batch is saved.
    """
    if not bool(xp.any(xp.abs(theta) > 4.0 * (xp.abs(total) + width))):
        return theta
    D = X - theta
    capped = D >= upper
    free = (D > 0) & ~capped
    nc = xp.sum(xp.astype(capped, X.dtype), axis=1, keepdims=True)
    nf = xp.sum(xp.astype(free, X.dtype), axis=1, keepdims=True)
    sx = xp.sum(xp.where(free, X, xp.zeros_like(X)), axis=1, keepdims=True)
    capped_sum = upper * nc if upper != float("inf") else xp.zeros_like(nc)
    return xp.where(nf > 0, (capped_sum + sx - total) / xp.where(nf > 0, nf, xp.ones_like(nf)), theta)


def _safeguard(xp: Any, newton: Any, ok: Any, lo: Any, hi: Any, f_lo: Any, f_hi: Any, t: Any) -> tuple[Any, Any]:
    """The Newton step when strictly inside the bracket, else the secant of its ends, else its midpoint.

    Returns the step and where it is the Newton step (b, 1).

    ``f`` is linear between two adjacent breakpoints: once the bracket holds one piece, the secant is
    its root (a Newton step landing on an end of the bracket would otherwise alternate between them).
    """
    inside = ok & (newton > lo) & (newton < hi)
    df = f_lo - f_hi
    known = xp.isfinite(f_lo) & (df > 0)
    secant = lo + (f_lo - t) * (hi - lo) / xp.where(known, df, xp.ones_like(df))
    sec_ok = known & (secant > lo) & (secant < hi)
    return xp.where(inside, newton, xp.where(sec_ok, secant, 0.5 * (lo + hi))), inside


def _put(xp: Any, full: Any, idx: Any, part: Any) -> Any:
    """``full`` with rows ``idx`` replaced by ``part`` (``idx`` None: ``part`` is the whole)."""
    if idx is None:
        return part
    return put_rows(xp, full, idx, part)


def sorted_threshold(X: Any, total: Any, upper: float = float("inf")) -> Any:
    """``θ`` (b, 1) by sorting the ``2n`` breakpoints ``x_i`` and ``x_i − upper`` (exact, ``O(n log n)``).

    ``f`` is linear between consecutive breakpoints; its values there follow from the sorted order, and
    the root lies on the first segment (in decreasing ``θ``) where ``f`` reaches ``total``.
    """
    xp = array_namespace(X)
    n = X.shape[1]
    if upper == float("inf"):
        u = xp.flip(xp.sort(X, axis=1), axis=1)
        css = cumulative_sum(xp, u, axis=1) - total
        j = xp.arange(1, n + 1, dtype=X.dtype, device=_device(X))
        rho = xp.sum(xp.astype(u * j > css, xp.int64), axis=1)
        rho = xp.maximum(rho, xp.ones_like(rho))
        return xp.take_along_axis(css, (rho - 1)[:, None], axis=1) / xp.astype(rho, X.dtype)[:, None]
    # the breakpoints in decreasing θ, each tagged +1 (x_i: the entry becomes free below it) or −1 (x_i − u: it
    # becomes capped); f at each is the sum of its slope (the free count, a cumulative sum of the tags) times the
    # steps between them: O(n log n) (evaluated directly, f took a (b, 2n, n) array: 2.5 GB at n = 9000)
    order = xp.flip(xp.argsort(xp.concat([X, X - upper], axis=1), axis=1, stable=True), axis=1)
    bp = xp.take_along_axis(xp.concat([X, X - upper], axis=1), order, axis=1)
    ones = xp.ones_like(X)
    free = cumulative_sum(xp, xp.take_along_axis(xp.concat([ones, -ones], axis=1), order, axis=1), axis=1)
    steps = (bp[:, :-1] - bp[:, 1:]) * free[:, :-1]
    f = xp.concat([xp.zeros_like(bp[:, :1]), cumulative_sum(xp, steps, axis=1)], axis=1)
    reach = xp.sum(xp.astype(f < total, xp.int64), axis=1)  # f increases as θ decreases
    reach = xp.minimum(reach, xp.full_like(reach, 2 * n - 1))
    t1 = xp.take_along_axis(bp, reach[:, None], axis=1)
    t0 = xp.take_along_axis(bp, xp.maximum(reach - 1, xp.zeros_like(reach))[:, None], axis=1)
    f1 = xp.take_along_axis(f, reach[:, None], axis=1)
    f0 = xp.take_along_axis(f, xp.maximum(reach - 1, xp.zeros_like(reach))[:, None], axis=1)
    slope = xp.where(f1 != f0, (t1 - t0) / xp.where(f1 != f0, f1 - f0, xp.ones_like(f1)), xp.zeros_like(f1))
    return xp.where(reach[:, None] == 0, t1, t0 + (total - f0) * slope)
