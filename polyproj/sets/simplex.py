"""The simplex ``{y >= 0, Σ y = t}`` and the capped simplex ``{0 <= y <= u, Σ y = t}``: exact thresholds.

Both project by a threshold, ``y = clip(x − θ, 0, u)`` with ``Σ y = t`` (:mod:`polyproj.sets.threshold`:
safeguarded Newton steps on the piecewise-linear ``θ ↦ Σ clip(x − θ, 0, u)``, exact once the piece is
identified; no sort). The total ``t`` is one number (a float, or a 0-d array) or one per sample (a
``(batch,)`` array); a torch tensor total can receive gradients. With ``F`` the free coordinates
(``0 < y_i < u``), the active rows are the coordinates at a bound, the multipliers are ``λ_i = θ − x_i`` at
zero, ``λ_i = x_i − θ − u`` at the cap and ``μ = θ`` for the sum, and the HS-Jacobian is
``J g = f ⊙ (g − mean_F g)``; ``∂y/∂t = f/|F|``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from array_api_compat import array_namespace
from array_api_compat import device as _device

from ..errors import ProblemError
from ..linalg import holds, host_copy
from ..problem import _INF_THRESHOLD as NO_BOUND
from ..problem import Polyhedron
from ..projection.result import Degeneracy, ProjectionResult
from ..runtime import is_vmapped
from .base import Projector, as_namespace, result_on
from .threshold import native_module, threshold

#: rows with an entry beyond FAR times the set's size (t + min(u, t)) are solved shifted by one of their entries
#: (:meth:`_shift`; float32 batches with such a row in float64, :meth:`CappedSimplex._in_float64`)
FAR = 1024.0

__all__ = ["CappedSimplex", "Simplex"]


def _check_n(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ProblemError(f"n must be an integer >= 1, got {n!r}")
    return int(n)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool)


class CappedSimplex(Projector):
    """``{y : 0 <= y <= upper, Σ y = total}`` with ``0 <= total <= n·upper``.

    Parameters
    ----------
    n : int
    total : float, 0-d array or (batch,) array
        One total for every point (a number, or a 0-d array of any namespace), or one per point (a
        ``(batch,)`` array). A torch tensor that requires grad receives the gradient through the layer: per
        point, or summed over the batch for a 0-d one.
    upper : float
        The cap (``inf``: the simplex, :class:`Simplex`). A cap at or beyond ``1e20`` is no cap, as a
        :class:`~polyproj.problem.Polyhedron` (and :class:`~polyproj.sets.Box`) reads such a bound: the set is
        the simplex, its rows those of :meth:`as_polyhedron`; such a cap would bind only a total above it,
        which is refused.

    Examples
    --------
    >>> import numpy as np, polyproj as pp
    >>> res = pp.project(np.array([2.0, 0.9, 0.1, -1.0]), pp.sets.CappedSimplex(4, total=1.5, upper=1.0))
    >>> np.round(res.y, 12), res.active
    (array([1. , 0.5, 0. , 0. ]), array([False, False,  True,  True,  True, False, False, False]))
    """

    def __init__(self, n: int, total: Any = 1.0, upper: float = 1.0) -> None:
        self._n = _check_n(n)
        if not (_is_number(upper) and upper > 0 and not np.isnan(upper)):
            raise ProblemError(f"upper must be a number > 0 (or inf), got {upper!r}")
        # a cap at or beyond 1e20 (finite) is no cap, as a Polyhedron reads it: the results kept a column per cap
        # while as_polyhedron() had none (hs_jacobian and check_projector failed on the numbering); the totals it
        # could bind (above it) are refused (_cap)
        self._no_cap = float(upper) if NO_BOUND <= float(upper) < float("inf") else None
        self.upper = float("inf") if self._no_cap is not None else float(upper)
        if _is_number(total):
            total = float(total)
            if not (np.isfinite(total) and 0 <= total <= self._cap()):
                raise ProblemError(f"total must be a finite number in {self._range()}, got {total!r}")
        else:
            total = self._check_totals(total)
        self.total = total

    def _cap(self) -> float:
        """The largest total: ``n·upper`` and its rounding (``CappedSimplex(3, 0.9, 0.3)``: 3·0.3 < 0.9 in floats).

        A cap read as none (``>= 1e20``): the cap itself, up to which it never binds (no entry exceeds the total).
        """
        if self._no_cap is not None:
            return self._no_cap
        return self._n * self.upper * (1.0 + 4.0 * self._n * float(np.finfo(np.float64).eps))

    def _range(self) -> str:
        """The allowed totals and why, for messages."""
        if self._no_cap is not None:
            return (f"[0, upper] = [0, {self._no_cap:g}] (a cap >= {NO_BOUND:g} reads as no cap, as in a Polyhedron: "
                    "it must not bind)")
        return f"[0, n·upper] = [0, {self._n * self.upper:g}] (the set is empty otherwise)"

    def _check_totals(self, t: Any) -> Any:
        try:
            xp = array_namespace(t)
        except TypeError as exc:
            raise ProblemError(f"total must be a number, a 0-d array or a (batch,) array, got "
                               f"{type(t).__name__}") from exc
        # a 0-d array is the one total of every point, kept as an array: a torch tensor that requires grad learns it
        if t.ndim > 1:
            raise ProblemError(f"an array total must have shape () (one total) or (batch,) (one per point), got "
                               f"{tuple(t.shape)}")
        if xp.isdtype(t.dtype, ("bool", "complex floating")):  # complex lost its imaginary part with a warning only,
            raise ProblemError(f"an array total must hold real numbers, got dtype {t.dtype}")  # bool read as 1, 0
        if not xp.isdtype(t.dtype, "real floating"):
            t = xp.astype(t, xp.float64)
        td = t.detach() if hasattr(t, "detach") else t
        if is_vmapped(td):
            raise ProblemError("torch.func.vmap over a set's total is not supported: give the set a (batch,) total "
                               "instead (per-sample totals), outside the vmapped function")
        self._check_range(td)
        return t

    def _check_range(self, td: Any) -> None:
        """Every total of an array total finite and in ``[0, n·upper]``.

        Checked at every projection too: the array may be the caller's, changed in place, or a learned
        parameter that a step took past ``n·upper``.
        """
        xp = array_namespace(td)
        if math.prod(td.shape) and not bool(xp.all(xp.isfinite(td) & (td >= 0) & (td <= self._cap()))):
            raise ProblemError(f"every total must be a finite number in {self._range()}")

    # ------------------------------------------------------------------ the Projector interface
    @property
    def n(self) -> int:
        """Number of variables."""
        return self._n

    @property
    def per_sample(self) -> bool:
        """True when the total is one per point (a ``(batch,)`` array)."""
        return self._array_total and self.total.ndim == 1

    @property
    def _array_total(self) -> bool:
        """True when the total is an array (one per point, or a 0-d one): a parameter, checked at every use."""
        return not isinstance(self.total, float)

    def _number(self) -> float:
        """The shared total as a float (a 0-d array's current value)."""
        t = self.total
        return t if isinstance(t, float) else float(t.detach() if hasattr(t, "detach") else t)

    def as_polyhedron(self) -> Polyhedron:
        """``Polyhedron(B=1ᵀ, b=total, lb=0, ub=upper)``: rows ``y_i >= 0``, then ``y_i <= upper`` (if finite).

        Refused (ProblemError) for a total at or beyond ``1e20``, which a Polyhedron reads as infinite (the set
        projects all the same).
        """
        if self.per_sample:
            raise ProblemError("a per-sample total is not one Polyhedron: project with a number as total")
        total = self._number()  # a 0-d total: its current value
        if total >= NO_BOUND:
            raise ProblemError(f"total = {total:g} has no Polyhedron form: a Polyhedron reads a right-hand side "
                               f">= {NO_BOUND:g} as infinite (the set projects, but as_polyhedron(), hs_jacobian and "
                               "check_projector need a smaller total: scale the problem)")
        ub = None if self.upper == float("inf") else np.full(self._n, self.upper)
        return Polyhedron(B=np.ones((1, self._n)), b=[total], lb=np.zeros(self._n), ub=ub)

    def row_counts(self) -> tuple[int, int]:
        """``(n_ineq, m_eq)`` of :meth:`as_polyhedron` (known without building it)."""
        return (self._n if self.upper == float("inf") else 2 * self._n), 1

    def _largest_total(self) -> float:
        """The largest total (0 for an empty per-sample array)."""
        if not self.per_sample:
            return self._number()
        td = self.total.detach() if hasattr(self.total, "detach") else self.total
        return float(array_namespace(td).max(td)) if td.shape[0] else 0.0

    def _totals(self, X: Any) -> Any:
        """The totals (b, 1) in X's namespace, device and dtype (an array total checked again)."""
        xp = array_namespace(X)
        if not self._array_total:
            return xp.full((X.shape[0], 1), self.total, dtype=X.dtype, device=_device(X))
        self._check_range(self.total.detach() if hasattr(self.total, "detach") else self.total)  # in its own dtype
        t = as_namespace(self.total, X)
        if self.total.ndim == 0:  # one total for every point (as_namespace may have made it (1,))
            return xp.zeros((X.shape[0], 1), dtype=X.dtype, device=_device(X)) + xp.reshape(t, (1, 1))
        if t.shape[0] != X.shape[0]:
            raise ProblemError(f"total has {t.shape[0]} entries but X has {X.shape[0]} points")
        return t[:, None]

    def project_batch(self, X: Any) -> ProjectionResult:
        """``clip(x − θ, 0, upper)`` with the exact threshold of every row (few passes over the batch)."""
        xp = array_namespace(X)
        U = self.upper
        if X.dtype != xp.float64 and max(self._largest_total(), U if U != float("inf") else 0.0) \
                > float(xp.finfo(X.dtype).max):
            return self._in_float64(X)  # a total or cap beyond X's range (1e39 in float32) is solved in float64
        t = self._totals(X)
        shift = self._shift(xp, X, t)
        if shift is not None and X.dtype != xp.float64:
            return self._in_float64(X)
        Xs = X
        if shift is not None:  # Π(x − c1) = Π(x) (Σy is fixed), θ moves by c: solved near θ = 0
            c, far = shift
            with np.errstate(over="ignore"):
                X = X - c
            # θ lies within u below 0 now (or anywhere on a flat piece below): an entry above 2 (t + u) is at the
            # cap, one below −2 FAR (t + u) at 0, whatever their values; clipped there they keep the iteration's
            # numbers small (an entry at 3e15 beside the zeros that decide a root near −0.1 sent its steps to the
            # wrong piece; one clipped at 4854 still left the final step the rounding of θ ~ 4852: sums 3.6e-13 off)
            size = xp.abs(t) + self._binding_cap(xp, t)
            Xs = xp.where(far, xp.clip(X, -2.0 * FAR * size, 2.0 * size), X)
            shift = c
        th = threshold(Xs, t, U, tol=self._weak_tol(xp, X.dtype))
        Y, active, mult = _outputs(xp, X, th.theta, U)
        if shift is not None:
            mult = xp.concat([mult[:, :-1], mult[:, -1:] + shift], axis=1)
        dependent = ~th.free
        if U != float("inf"):
            Y, active, dependent = self._full(xp, t, Y, active, dependent)
        viol = xp.abs(xp.sum(Y, axis=1) - t[:, 0])
        # weakly active: a coordinate at a breakpoint (x_i − θ ∈ {0, u}); dependent: no free coordinate
        # (the sum row is then a combination of the bound rows). The face is the active set.
        return self.result(X, Y, active, mult, violation=viol, face=active,
                           degenerate=Degeneracy(th.near, dependent))

    def _full(self, xp: Any, t: Any, Y: Any, active: Any, dependent: Any) -> tuple[Any, Any, Any]:
        """Rows whose total is ``n·upper`` (to its rounding): the set is the point ``u·1``, every cap active.

        The threshold ``min x − u`` leaves ``x − θ`` a rounding off ``u``: the point itself is exact, and its caps
        are all active (the face is dependent: the sum row is their sum).
        """
        n, U = self._n, self.upper
        full = t >= n * U * (1.0 - 4.0 * float(np.finfo(np.float64).eps))  # (b, 1): fl(n·u) to a few roundings
        if not bool(xp.any(full)):
            return Y, active, dependent
        Y = xp.where(full, xp.full_like(Y, U), Y)
        zeros = xp.zeros_like(active[:, :n])
        active = xp.concat([xp.where(full, zeros, active[:, :n]), xp.where(full, ~zeros, active[:, n:])], axis=1)
        return Y, active, dependent | full[:, 0]

    def _in_float64(self, X: Any) -> ProjectionResult:
        """A float32 batch with a far row, projected in float64 and returned in float32.

        In float32 the threshold's window can be narrower than the spacing of the floats near it (a cap of 0.4
        among entries ~1e7 apart at |x| 1e8: no float32 θ gives the total, and the sums came out 2.8 or 3.2 for
        3); the float32 points are exact in float64, where the shift of :meth:`_shift` resolves them.
        """
        from dataclasses import replace

        xp = array_namespace(X)
        if not holds(xp, xp.float64, _device(X)):
            # a device without float64 (torch's MPS): the same float64 solve on the host (these rows only reach
            # here: far ones, or a total beyond float32), the float32 answer moved back (the device's float32
            # arithmetic would leave the sums off by the rounding at |x|, as above)
            host = self if not self._array_total else self.with_parameters(total=host_copy(self.total))
            return result_on(host._in_float64(host_copy(X)), X)
        X64 = xp.astype(X, xp.float64)
        wide = self if not self._array_total else self.with_parameters(total=as_namespace(self.total, X64))
        res = wide.project_batch(X64)
        with np.errstate(over="ignore"):  # values beyond X's range (a total of 1e39 in float32) are its ±inf
            y, mult = xp.astype(res.y, X.dtype), xp.astype(res.multipliers, X.dtype)
        viol = xp.abs(xp.sum(xp.astype(y, xp.float64), axis=1) - wide._totals(X64)[:, 0])
        return replace(res, y=y, multipliers=mult, violation=xp.astype(viol, X.dtype),
                       max_violation=float(xp.max(viol)) if X.shape[0] else 0.0)

    def _shift(self, xp: Any, X: Any, t: Any) -> Any:
        """``(c, far)``: each far row's ``m``-th largest entry, ``m = max(1, ⌈t/u⌉)``, and the far rows (b, 1).

        A row is far where its largest entry lies beyond ``FAR (t + u)`` (the set's size), or fewer than ``m`` of
        its entries lie above ``−FAR (t + u)``; ``c`` is 0 elsewhere, and None is returned where no row is far.

        ``y = clip(x − θ, 0, u)`` keeps the rounding of ``x − θ``, ``eps |θ|``: with ``|θ| ≫ t + u`` the
        sums and the active sets drift (``x = (1e17, 3, 0)`` on the simplex came out all 0; a capped
        simplex of size 1e-12 at |x| 1e3 missed its total by 10 %). ``Π(x − c1) = Π(x)`` for any ``c``
        (``Σy = t`` on the set). The root lies in ``[x_(⌊t/u⌋+1) − u, x_(⌈t/u⌉))`` (at most ``t/u`` entries are
        capped, at least ``t/u`` are positive): within ``u`` below ``c``, or on a flat piece there. ``c`` is an
        entry, so ``x_i − c`` is exact for every entry within a factor 2 of it (Sterbenz), which holds the free
        ones. (A shift by a first pass's ``θ``, not an entry and as wrong as that pass — at |x| 1e16 the
        breakpoints ``x − u`` round to ``x`` and no float ``θ`` is a root: ``(1e16, 1e16, 0)`` on the capped
        simplex of total 1.5 gave θ = 2.5e15 — left answers with sums 2, 3 or 0 reported SOLVED.) Decided per
        row, on its own total.
        """
        b, n = X.shape
        if not b or not n:
            return None
        size = FAR * (xp.abs(t) + self._binding_cap(xp, t))
        # far where the largest entry is, or where fewer than m entries lie above −size (the root then lies among
        # the far negative ones): far negative entries alone (a mask at −1e9) are at 0 whatever the shift
        top = xp.max(X, axis=1, keepdims=True)
        far = xp.abs(top) > size
        if self.upper != float("inf"):
            # float bounds for a float array: array-api-compat 1.9 (the declared floor) reads a Python int bound
            # as an integer limit of x's dtype (iinfo(float64): ValueError)
            m = xp.clip(xp.ceil(t / self.upper), 1.0, float(n))  # (b, 1), float
            near = xp.sum(xp.astype(X >= -size, X.dtype), axis=1, keepdims=True)
            far = far | (near < m)
        if not bool(xp.any(far)):
            return None
        if self.upper == float("inf"):
            c = top
        else:
            desc = xp.flip(xp.sort(X, axis=1), axis=1)
            c = xp.take_along_axis(desc, xp.astype(m, xp.int64) - 1, axis=1)
        return xp.where(far, c, xp.zeros_like(c)), far

    def _weak_tol(self, xp: Any, dtype: Any):
        """The rounding of ``x − θ`` at a breakpoint: ``8 n eps (1 + |θ| + t + min(u, t))``.

        A function of ``θ`` and ``t`` of the same rows ((r, 1) each): :func:`threshold` calls it on the whole
        batch and again on the rows it solves on all their entries, so a per-sample total is never read here.

        ``min(u, t)``: a cap above the total never binds and sets no breakpoint's rounding (a cap of 1e15 on a
        total of 1 called every point weakly active).
        """
        eps = float(np.finfo(np.float32 if dtype == xp.float32 else np.float64).eps)
        return lambda theta, t: 8.0 * self._n * eps * (1.0 + xp.abs(theta) + xp.abs(t) + self._binding_cap(xp, t))

    def violation(self, Y: Any) -> Any:
        """Largest violation of each row of ``Y`` (b, n): below 0, above ``upper``, the sum's miss of its total.

        Without :meth:`as_polyhedron`, which a per-sample total has not (half-precision points, whose violation is
        measured on the rounded answer, failed for every such set); ``inf`` where Y is not finite.
        """
        xp = array_namespace(Y)
        t = xp.astype(self._totals(Y)[:, 0], Y.dtype) if self._array_total else self.total
        v = xp.maximum(xp.max(-Y, axis=1), xp.abs(xp.sum(Y, axis=1) - t))
        if self.upper != float("inf"):
            v = xp.maximum(v, xp.max(Y, axis=1) - self.upper)
        v = xp.where(v > 0, v, xp.zeros_like(v))
        return xp.where(xp.all(xp.isfinite(Y), axis=1), v, xp.full_like(v, float("inf")))

    def _binding_cap(self, xp: Any, t: Any) -> Any:
        """``min(u, t)`` (0 without a cap): the largest entry of a point of the set.

        A cap above the total never binds: ``CappedSimplex(3, 1e-12, 1000)`` is the simplex of total 1e-12, and
        the set's size ``t + u`` said 1000 (its far-point shift and its weak tolerance read this instead).
        """
        U = self.upper if self.upper != float("inf") else 0.0
        return xp.minimum(xp.abs(t), xp.full_like(t, U))

    def vjp(self, result: ProjectionResult, G: Any) -> Any:
        """``J g = f ⊙ (g − mean_F g)`` on the free coordinates ``F`` (zero where none is free)."""
        xp = array_namespace(G)
        fixed = _fixed(result.face, self._n)
        Gf = xp.where(fixed, xp.zeros_like(G), G)
        return xp.where(fixed, Gf, Gf - _free_mean(xp, fixed, Gf))

    # ------------------------------------------------------------------ the total as a parameter
    def parameters(self) -> dict[str, Any]:
        """``{"total": t}`` for an array total, per point or 0-d (the array that can receive gradients), else ``{}``."""
        return {"total": self.total} if self._array_total else {}

    def with_parameters(self, **values: Any) -> CappedSimplex:
        """The same set with another array ``total`` (not validated again: it is the same data)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        if "total" in values:
            new.total = values["total"]
        return new

    def parameter_vjp(self, result: ProjectionResult, G: Any, names: tuple[str, ...]) -> dict[str, Any]:
        """``∂⟨G, y⟩/∂t = mean_F g`` per sample (``∂y_F/∂t = 1/|F|``), summed over the batch for a 0-d total.

        Where nothing is free (a total at a kink: ``k·upper``, or 0) ``t ↦ y`` has one-sided derivatives: a
        larger total frees the zero coordinates with the largest x (each ``1/|A|``), a smaller one the capped
        coordinates with the smallest x (``1/|B|``). Their mean (or the one that exists: at 0 only the first,
        at ``n·upper`` only the second) is an element of the Clarke Jacobian, which 0 is not (``Σy = t``: every
        element sums to 1).
        """
        if "total" not in names:
            return {}
        xp = array_namespace(G)
        fixed = _fixed(result.face, self._n)
        out = _free_mean(xp, fixed, xp.where(fixed, xp.zeros_like(G), G))[:, 0]
        stuck = xp.all(fixed, axis=1)
        if G.shape[0] and bool(xp.any(stuck)):
            out = xp.where(stuck, self._kink_mean(xp, result, G), out)
        if self.total.ndim == 0:  # one total shared by every point: the sum of theirs
            out = xp.sum(out)
        return {"total": out}

    def _kink_mean(self, xp: Any, result: ProjectionResult, G: Any) -> Any:
        """The mean of the one-sided ``∂⟨G, y⟩/∂t`` at a point with no free coordinate (b,)."""
        n, act, mult = self._n, result.active, result.multipliers
        sides = [(act[:, :n], mult[:, :n])]  # at zero: θ − x, least for the largest x
        if act.shape[1] > n:
            sides.append((act[:, n:2 * n], mult[:, n:2 * n]))  # at the cap: x − θ − u, least for the smallest x
        total, count = xp.zeros_like(G[:, 0]), xp.zeros_like(G[:, 0])
        for at, m in sides:
            big = xp.full_like(m, float("inf"))
            least = xp.min(xp.where(at, m, big), axis=1, keepdims=True)
            pick = at & (m == least)
            k = xp.sum(xp.astype(pick, G.dtype), axis=1)
            side = xp.sum(xp.where(pick, G, xp.zeros_like(G)), axis=1) / xp.where(k > 0, k, xp.ones_like(k))
            total, count = total + side, count + xp.astype(k > 0, G.dtype)
        return total / xp.where(count > 0, count, xp.ones_like(count))

    def __repr__(self) -> str:
        t = "per sample" if self.per_sample else f"{self._number():g}"
        return f"{type(self).__name__}(n={self._n}, total={t}, upper={self.upper:g})"


def _outputs(xp: Any, X: Any, theta: Any, upper: float) -> tuple[Any, Any, Any]:
    """``(y, active, multipliers)`` of the threshold ``θ`` (b, 1).

    ``y = clip(x − θ, 0, u)``; active: ``θ − x >= 0`` (at zero), ``x − θ >= u`` (at the cap); multipliers
    ``max(θ − x, 0)``, ``max(x − θ − u, 0)`` and ``θ`` (``fl(θ − x) = −fl(x − θ)`` exactly, so both sides
    agree on every entry). NumPy, PyTorch and CuPy write them into the result arrays in place (``out=``):
    at large batches a fresh array costs more in page faults than the arithmetic that fills it.
    """
    b, n = X.shape
    capped = upper != float("inf")
    mod = native_module(xp)
    if mod is not None and (getattr(X, "requires_grad", False) or getattr(theta, "requires_grad", False)):
        mod = None  # torch's out= writes are not differentiable: the array-API branch keeps the graph
    if mod is None:
        D = X - theta
        Y = xp.clip(D, min=0.0, max=upper) if capped else xp.clip(D, min=0.0)
        low = xp.clip(-D, min=0.0)
        if not capped:
            return Y, D <= 0, xp.concat([low, theta], axis=1)
        return Y, xp.concat([D <= 0, D >= upper], axis=1), xp.concat([low, xp.clip(D - upper, min=0.0), theta],
                                                                         axis=1)
    m = 2 * n if capped else n
    mult = xp.empty((b, m + 1), dtype=X.dtype, device=_device(X))
    active = xp.empty((b, m), dtype=xp.bool, device=_device(X))
    low = mult[:, :n]
    mod.subtract(theta, X, out=low)  # θ − x
    mod.greater_equal(low, 0.0, out=active[:, :n])
    mod.clip(low, 0.0, None, out=low)
    mult[:, m:] = theta
    Y = X - theta
    if capped:
        high = mult[:, n:m]
        mod.greater_equal(Y, upper, out=active[:, n:])
        mod.subtract(Y, upper, out=high)
        mod.clip(high, 0.0, None, out=high)
    mod.clip(Y, 0.0, upper if capped else None, out=Y)
    return Y, active, mult


def _fixed(active: Any, n: int) -> Any:
    """Coordinates at a bound (b, n) from the active rows: (b, n) at zero, or (b, 2n) at zero and at the cap."""
    return active if active.shape[1] == n else active[:, :n] | active[:, n:]


def _free_mean(xp: Any, fixed: Any, Gf: Any) -> Any:
    """``mean_F g`` (b, 1) from ``Gf`` (``g`` with the fixed coordinates zeroed); 0 where nothing is free."""
    count = xp.astype(fixed.shape[1] - xp.sum(xp.astype(fixed, xp.int32), axis=1, keepdims=True), Gf.dtype)
    return xp.sum(Gf, axis=1, keepdims=True) / xp.where(count > 0, count, xp.ones_like(count))


class Simplex(CappedSimplex):
    """``{y : y >= 0, Σ y = total}`` with ``total >= 0`` (one number, or one per point).

    The exact projection ``y = max(x − θ, 0)`` (Held, Wolfe & Crowder; Duchi et al. 2008); the threshold by
    Michelot's Newton steps from below (:mod:`polyproj.sets.threshold`). The active rows are the
    coordinates at zero; the multipliers are ``λ_i = θ − x_i`` there and ``μ = θ`` for the sum; the
    HS-Jacobian is ``J g = f ⊙ (g − mean_F g)`` on the support ``F``.

    Examples
    --------
    >>> import numpy as np, polyproj as pp
    >>> res = pp.project(np.array([0.9, 0.5, -1.0]), pp.sets.Simplex(3))
    >>> np.round(res.y, 12), res.active
    (array([0.7, 0.3, 0. ]), array([False, False,  True]))
    """

    def __init__(self, n: int, total: Any = 1.0) -> None:
        n = _check_n(n)
        if _is_number(total) and not (np.isfinite(total) and total >= 0):
            raise ProblemError(f"total must be a finite number >= 0 (the simplex is empty otherwise), got {total!r}")
        super().__init__(n, total, float("inf"))

    def __repr__(self) -> str:
        t = "per sample" if self.per_sample else f"{self._number():g}"
        return f"Simplex(n={self._n}, total={t})"

