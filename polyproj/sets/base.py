"""The :class:`Projector` interface: a closed convex set one projects onto and differentiates through.

A Projector projects a batch ``(batch, n)`` in the input's array namespace (NumPy, PyTorch on any
device, CuPy, ``array_api_strict``: tensors stay tensors) and returns a
:class:`~polyproj.projection.result.ProjectionResult` that carries the active set; its :meth:`vjp` is the
HS-Jacobian product at that result; :meth:`as_polyhedron` writes the set as a
:class:`~polyproj.problem.Polyhedron`, so that any QP backend can cross-check it.

Writing a set (see ``docs/architecture.md``)::

    class HalfSpace(pp.Projector):
        def __init__(self, w, c):
            self.w, self.c = np.asarray(w, float), float(c)

        @property
        def n(self):
            return self.w.size

        def project_batch(self, X):                       # X (batch, n), any namespace
            xp = array_api_compat.array_namespace(X)
            w = xp.asarray(self.w, dtype=X.dtype, device=array_api_compat.device(X))
            viol = xp.maximum(X @ w - self.c, 0.0)
            Y = X - viol[:, None] * w / float(self.w @ self.w)
            return self.result(X, Y, active=viol[:, None] > 0, multipliers=(viol / float(self.w @ self.w))[:, None])

        def vjp(self, result, G):                          # J g: remove the normal where active
            ...

        def as_polyhedron(self):
            return pp.Polyhedron(A=self.w[None, :], a=[self.c])
"""

from __future__ import annotations

import abc
import math
from typing import Any

import numpy as np
from array_api_compat import array_namespace
from array_api_compat import device as _device

from ..errors import ProblemError, SolverError
from ..linalg import holds, host_copy, own_contiguous, require_int64
from ..problem import Polyhedron
from ..projection.result import Degeneracy, ProjectionResult
from ..solution import Status

__all__ = ["Projector", "as_array", "as_namespace"]


def as_array(X: Any) -> Any:
    """``X`` as an array of its namespace (lists and scalars become NumPy), real and floating."""
    if isinstance(X, (list, tuple, int, float, complex)):
        try:
            X = np.asarray(X, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise ProblemError(f"X must hold real numbers: {exc}") from exc
    if isinstance(X, np.ndarray) and type(X) is not np.ndarray:  # np.matrix (its * and @ differ), masked arrays
        X = np.asarray(X)
    try:
        xp = array_namespace(X)
    except TypeError as exc:
        raise ProblemError(f"X must be an array (NumPy, torch, CuPy, ...), got {type(X).__name__}") from exc
    if xp.isdtype(X.dtype, "bool") or not xp.isdtype(X.dtype, ("real floating", "integral")):
        raise ProblemError(f"X must hold real numbers, got dtype {X.dtype}")
    if not xp.isdtype(X.dtype, "real floating"):  # integers: float64, or float32 on a device without float64
        X = xp.astype(X, xp.float64 if holds(xp, xp.float64, _device(X)) else xp.float32)
    return X


def as_namespace(v: Any, like: Any) -> Any:
    """``v`` (an array of any namespace, or array-like) in the namespace, device and dtype of ``like``."""
    xp = array_namespace(like)
    try:
        same = array_namespace(v) is xp
    except TypeError:
        same = False
    if same and str(_device(v)) == str(_device(like)):
        return v if v.dtype == like.dtype else xp.astype(v, like.dtype)
    # another namespace or another device: through the host, by an explicit transfer (np.asarray is refused by
    # arrays off the host: CuPy's TypeError, array_api_strict's RuntimeError; same-namespace arrays of two devices
    # do not combine). Lists and scalars are read by NumPy.
    host = host_copy(v)
    return xp.asarray(own_contiguous(np.asarray(host, dtype=np.float64)), dtype=like.dtype, device=_device(like))


def result_on(res: ProjectionResult, like: Any, dtype: Any = None) -> ProjectionResult:
    """A result computed on the host (NumPy) moved to the namespace and device of ``like`` (its dtypes kept).

    For the samples a set solves in float64 on a device that has no float64 (torch's MPS, array_api_strict's
    ``"no_float64"``): the float32 points are exact in float64, so their float64 projection, rounded once to
    float32 (by the caller, or here: real arrays to the NumPy ``dtype`` when given), is the answer. Boolean arrays
    stay boolean; an array ``face`` (the simplices' active mask) moves too, any other face is the set's to handle.
    """
    from dataclasses import replace

    xp, dev = array_namespace(like), _device(like)

    def move(a: Any) -> Any:
        if not isinstance(a, np.ndarray):
            return a
        if dtype is not None and a.dtype.kind == "f":
            a = a.astype(dtype)
        return xp.asarray(own_contiguous(a), device=dev)

    dg = res.degenerate
    return replace(res, y=move(res.y), active=move(res.active), multipliers=move(res.multipliers),
                   violation=move(res.violation), polished=move(np.asarray(res.polished)), face=move(res.face),
                   degenerate=None if dg is None else Degeneracy(move(np.asarray(dg.weak)),
                                                                 move(np.asarray(dg.dependent))))


class OnHost:
    """The backward of samples projected on the host (:func:`result_on`): ``J g`` there, returned on G's device."""

    def __init__(self, S: Projector, res: ProjectionResult) -> None:
        self.S, self.res = S, res

    def vjp(self, _result: Any, G: Any) -> Any:
        """``J g`` at the host result (float64), in G's namespace, device and dtype."""
        h = host_copy(G)
        g = np.asarray(self.S.vjp(self.res, h.astype(np.float64)), dtype=h.dtype)
        return array_namespace(G).asarray(own_contiguous(g), device=_device(G))


class Projector(abc.ABC):
    """A closed convex set with an exact projection and its HS-Jacobian (see the module docstring).

    Subclasses implement :attr:`n`, :meth:`project_batch`, :meth:`vjp` and :meth:`as_polyhedron`;
    :meth:`project` (validation, single points, shapes) is shared. Sets whose points have a shape (a
    k × k matrix) set :attr:`event_shape`.
    """

    #: name reported as ``ProjectionResult.backend`` by closed-form projections
    method: str = "closed form"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fn = cls.__dict__.get("vjp")
        if fn is not None and not getattr(fn, "_cotangent_checked", False):
            cls.vjp = _checked_vjp(fn)

    @property
    @abc.abstractmethod
    def n(self) -> int:
        """Dimension of a (flattened) point."""

    @property
    def event_shape(self) -> tuple[int, ...]:
        """Shape of one point (default ``(n,)``)."""
        return (self.n,)

    @abc.abstractmethod
    def project_batch(self, X: Any) -> ProjectionResult:
        """Project a batch ``X`` (batch, n) of a floating dtype; arrays of the result in X's namespace."""

    @abc.abstractmethod
    def vjp(self, result: ProjectionResult, G: Any) -> Any:
        """``J g`` (batch, n) for ``G`` (batch, n): the HS-Jacobian at a result of :meth:`project_batch`."""

    @abc.abstractmethod
    def as_polyhedron(self) -> Polyhedron:
        """The set as a :class:`~polyproj.problem.Polyhedron` (its rows number ``result.active``)."""

    # ------------------------------------------------------------------ differentiable data
    def parameters(self) -> dict[str, Any]:
        """Arrays of the set's data that can receive gradients (none by default)."""
        return {}

    def with_parameters(self, **values: Any) -> Projector:
        """The same set with some of :meth:`parameters` replaced (default: the set itself)."""
        return self

    def parameter_vjp(self, result: ProjectionResult, G: Any, names: tuple[str, ...]) -> dict[str, Any]:
        """Gradients of ``⟨G, y⟩`` with respect to the parameters ``names`` at ``result``."""
        return {}

    # ------------------------------------------------------------------ shared entry point
    def checked_result(self, res: Any, X: Any) -> ProjectionResult:
        """``res`` (what :meth:`project_batch` returned for the batch ``X``) when it is of the right kind.

        A SolverError naming the set unless it is a ProjectionResult whose ``y`` is an array of ``X``'s kind and
        shape (a set's y of another shape or namespace was returned as it was, or failed deep in the torch layer).
        """
        name = type(self).__name__
        if not isinstance(res, ProjectionResult):
            raise SolverError(f"{name}.project_batch returned {type(res).__name__}, not a ProjectionResult (build it "
                              "with self.result(X, Y, active=..., multipliers=...))")
        if type(res.y) is not type(X) or tuple(res.y.shape) != tuple(X.shape):
            raise SolverError(f"{name}.project_batch returned y as {type(res.y).__name__} of shape "
                              f"{tuple(getattr(res.y, 'shape', ()))} for X as {type(X).__name__} of shape "
                              f"{tuple(X.shape)}; y must be an array of X's kind and shape")
        if third_party(self):  # polyproj's sets build theirs right (and per-sample data number rows otherwise)
            self._check_row_shapes(res, X)
        return res

    def _check_row_shapes(self, res: ProjectionResult, X: Any) -> None:
        """A SolverError unless ``active`` is (batch, n_ineq) and ``multipliers`` (batch, n_ineq + m_eq).

        The rows are :meth:`as_polyhedron`'s; multipliers missing the rows of B were returned as they were, and the
        property checks failed on them with a bare NumPy matmul error.
        """
        try:
            ni, me = self.row_counts()
        except NotImplementedError:  # a set without a polyhedral form: nothing to compare with
            return
        name, batch = type(self).__name__, int(X.shape[0])
        for what, arr, cols, rows in (("active", res.active, ni, "one column per inequality row"),
                                      ("multipliers", res.multipliers, ni + me,
                                       "the inequality rows, then the rows of B")):
            shape = tuple(getattr(arr, "shape", ()))
            if shape != (batch, cols):
                raise SolverError(f"{name}.project_batch returned {what} of shape {shape} for a batch of {batch}; "
                                  f"expected ({batch}, {cols}): {rows} of as_polyhedron() ({ni} inequality rows: "
                                  f"rows of A, finite lower bounds, finite upper bounds; {me} rows of B)")

    def own_copy(self, X: Any) -> Any:
        """``X`` for :meth:`project_batch`: itself for polyproj's sets, a copy for a third party's.

        A set that wrote into its input changed the caller's array, or the torch layer's leaf tensor, silently.
        """
        if not third_party(self):
            return X
        return array_namespace(X).asarray(X, copy=True)

    def project(self, X: Any) -> ProjectionResult:
        """Project ``X``: one point of shape :attr:`event_shape` (or ``(n,)``), or a batch of them.

        Not differentiated: a torch tensor that requires a gradient is projected as its ``detach()``, and so
        are the set's :meth:`parameters` (a per-sample total): the result holds no autograd graph
        (:func:`polyproj.adapters.torch.project` is the differentiable form, with the HS-Jacobian).
        float16 and bfloat16 points are solved in float32, long double ones in float64 (as the generic path
        of :class:`~polyproj.sets.Polyhedral` does), the answer returned in X's dtype.

        Raises
        ------
        ProblemError
            X of the wrong shape or dtype, holding NaN/inf, or a torch meta tensor (no values).
        """
        X = as_array(X)
        if getattr(X, "is_meta", False):  # (Tensor.item() failed deep in the set on its first test)
            raise ProblemError(f"X is a meta tensor (device 'meta', shape {tuple(X.shape)}): it holds no values to "
                               "project")
        if getattr(X, "requires_grad", False):
            X = X.detach()
        require_int64(array_namespace(X), X, f"projecting onto {type(self).__name__}")
        S = self._without_graph()
        X2, single, shape = S._as_batch(X)
        xp = array_namespace(X2)
        bits = xp.finfo(X2.dtype).bits
        # float16, bfloat16: solved in float32; long double: in float64 (the linear algebra of the matrix sets
        # has no long double, and the simplices computed in it silently: the generic path's rule)
        low = X2.dtype if bits < 32 or bits > 64 else None
        if low is not None:
            X2 = xp.astype(X2, xp.float32 if bits < 32 else xp.float64)
        # one sum tells that every entry is finite (NaN and inf propagate; an overflow only sends a finite
        # batch to the entrywise test): a pass without the (batch, n) boolean array
        if X2.shape[0] and not bool(xp.isfinite(xp.sum(X2))) and not bool(xp.all(xp.isfinite(X2))):
            bad = xp.nonzero(~xp.all(xp.isfinite(X2), axis=1))[0]
            first = int(bad[0])
            raise ProblemError(f"X contains NaN or inf (first in {'the point' if single else f'sample {first}'})")
        res = S.checked_result(S.project_batch(S.own_copy(X2)), X2) if X2.shape[0] else S.empty_result(X2)
        from dataclasses import replace

        if low is not None and bits > 64:  # long double: the float64 answer, exactly (its violation too)
            res = replace(res, y=xp.astype(res.y, low), multipliers=xp.astype(res.multipliers, low),
                          violation=xp.astype(res.violation, low))
        elif low is not None:  # returned in X's dtype, with the violation of the rounded points
            with np.errstate(over="ignore"):
                y = xp.astype(res.y, low)
            if X2.shape[0] and bool(xp.all(xp.isfinite(res.y))) and not bool(xp.all(xp.isfinite(y))):
                raise ProblemError(f"the projection has entries beyond the range of {low} (largest "
                                   f"{float(xp.max(xp.abs(res.y))):.3g}): project in float32 or float64")
            viol = S.violation(xp.astype(y, xp.float32))
            res = replace(res, y=y, multipliers=xp.astype(res.multipliers, low), violation=xp.astype(viol, low),
                          max_violation=float(xp.max(viol)) if X2.shape[0] else 0.0)
        if len(shape) > 1:  # points with a shape: y in the input's layout
            res = replace(res, y=xp.reshape(res.y, (X2.shape[0], *shape)))
        return res.single() if single else res

    def _without_graph(self) -> Projector:
        """The set with its :meth:`parameters` detached from autograd (itself when none requires a gradient).

        :meth:`project` is not differentiated: a per-sample total that required a gradient had its answer,
        multipliers and violation built into the graph (and a far row's backward gave NaN there); the torch
        layer detaches them likewise and differentiates with :meth:`parameter_vjp`.
        """
        graph = {k: v.detach() for k, v in self.parameters().items() if getattr(v, "requires_grad", False)}
        return self.with_parameters(**graph) if graph else self

    def checked_event_shape(self) -> tuple[int, ...]:
        """:attr:`event_shape` as a tuple, refused (:class:`ProblemError`) unless its entries number :attr:`n`."""
        ev = tuple(self.event_shape)
        if math.prod(ev) != self.n:
            raise ProblemError(f"{type(self).__name__}.event_shape {ev} has {math.prod(ev)} entries, but its n is "
                               f"{self.n}: a point of shape event_shape must flatten to n entries")
        return ev

    def _as_batch(self, X: Any) -> tuple[Any, bool, tuple[int, ...]]:
        xp = array_namespace(X)
        n, ev = self.n, self.checked_event_shape()
        shp = tuple(X.shape)
        if shp == ev or shp == (n,):
            return xp.reshape(X, (1, n)), True, shp
        if len(shp) == len(ev) + 1 and shp[1:] == ev:
            return xp.reshape(X, (shp[0], n)), False, ev
        if len(shp) == 2 and shp[1] == n:
            return X, False, (n,)
        want = f"({n},) or (batch, {n})" if ev == (n,) else f"{ev}, (batch, *{ev}) or (batch, {n})"
        raise ProblemError(f"X must have shape {want}, got {shp}")

    def row_counts(self) -> tuple[int, int]:
        """``(n_ineq, m_eq)``: inequality and equality rows of :meth:`as_polyhedron` (the result's shapes)."""
        P = self.as_polyhedron()
        return P.n_ineq, P.m_eq

    def empty_result(self, X: Any) -> ProjectionResult:
        """The result of an empty batch."""
        xp = array_namespace(X)
        dev = _device(X)
        ni, me = self.row_counts()
        none = xp.zeros((0,), dtype=xp.bool, device=dev)
        return ProjectionResult(
            xp.zeros((0, self.n), dtype=X.dtype, device=dev), xp.zeros((0, ni), dtype=xp.bool, device=dev),
            xp.zeros((0, ni + me), dtype=X.dtype, device=dev), (), 0.0,
            xp.zeros((0,), dtype=X.dtype, device=dev), none, self.method, degenerate=Degeneracy(none, none))

    def result(self, X: Any, Y: Any, active: Any, multipliers: Any, *, violation: Any = None,
               face: Any = None, degenerate: Any = None) -> ProjectionResult:
        """A result for an exact (closed-form) projection: every sample SOLVED and verified.

        Except a sample whose point or violation is not finite (its arithmetic overflowed: entries near the
        float64 range), NUMERICAL_ERROR and not verified (such a NaN point was reported SOLVED).
        """
        xp = array_namespace(Y)
        batch = Y.shape[0]
        if violation is None:
            violation = self.violation(Y)
        worst = xp.max(violation) if batch else None
        worst = getattr(worst, "detach", lambda: worst)()  # a torch graph (inputs that need a gradient)
        worst = float(worst) if batch else 0.0
        status, verified = (Status.SOLVED,) * batch, xp.ones((batch,), dtype=xp.bool, device=_device(Y))
        if not math.isfinite(worst):  # (a non-finite point has a non-finite violation: NaN and inf propagate)
            v = getattr(violation, "detach", lambda: violation)()
            verified = xp.isfinite(v) & xp.all(xp.isfinite(getattr(Y, "detach", lambda: Y)()), axis=1)
            status = tuple(Status.SOLVED if bool(ok) else Status.NUMERICAL_ERROR for ok in verified)
        return ProjectionResult(Y, active, multipliers, status, worst, violation, verified, self.method,
                                degenerate=degenerate, face=face)

    def violation(self, Y: Any) -> Any:
        """Largest constraint violation of each row of ``Y`` (batch, n), in Y's namespace."""
        from ..polydata import PolyData

        return PolyData.from_polyhedron(self.as_polyhedron(), like=Y).violation(Y)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n})"


def third_party(S: Any) -> bool:
    """Whether ``S`` is a set defined outside polyproj (its outputs are checked, its inputs copied)."""
    return not type(S).__module__.startswith("polyproj.")


def _checked_vjp(fn: Any) -> Any:
    """``vjp`` refusing a cotangent ``G`` that is not one entry per entry of the result's ``y``.

    Broadcasting would otherwise take a (2, n) ``G`` at a result of one point, or fail inside the set's
    arithmetic with a bare NumPy error; a G of y's size in another shape ((3, 2) for (2, 3)) failed inside
    torch. The result of a single point (``pp.project`` of one point) is differentiated on the batch of one
    it came from, ``J g`` returned in the point's shape.

    polyproj's sets return ``J g`` in G's dtype, as :class:`~polyproj.sets.Polyhedral` does (its
    ``hs_vjp``): a float64 result with a float32 G gave float32 from the simplices and float64 from the box and
    the Birkhoff polytope (float32 for float16 data, whose result is solved in float32). A G of long double is
    applied in float64 (the result's precision), one of an integer dtype in the result's dtype.
    """
    import functools

    @functools.wraps(fn)
    def vjp(self: Any, result: Any, G: Any) -> Any:
        y = getattr(result, "y", None)
        if y is not None:  # G moved to the result's namespace (the set computes in y's namespace)
            try:  # and to its device: arrays of two devices do not combine
                same = array_namespace(G) is array_namespace(y) and str(_device(G)) == str(_device(y))
            except TypeError:
                same = False
            if not same:
                G = as_namespace(G, y)
        if third_party(self) or getattr(G, "dtype", None) is None:
            return _shaped_vjp(fn, self, result, G, y)
        xp = array_namespace(G)
        want = G.dtype if xp.isdtype(G.dtype, "real floating") else (y.dtype if y is not None else xp.float64)
        if not xp.isdtype(G.dtype, "real floating") or xp.finfo(G.dtype).bits > 64:
            G = xp.astype(G, want if xp.finfo(want).bits <= 64 else xp.float64)
        out = _shaped_vjp(fn, self, result, G, y)
        return out if out.dtype == want else xp.astype(out, want)

    vjp._cotangent_checked = True  # type: ignore[attr-defined]
    return vjp


def _shaped_vjp(fn: Any, self: Any, result: Any, G: Any, y: Any) -> Any:
    """``fn(self, result, G)`` with ``G`` checked against ``y`` and shaped (b, n) for it (see :func:`_checked_vjp`)."""
    gs, ys = getattr(G, "shape", None), getattr(y, "shape", None)
    if gs is not None and ys is not None and (math.prod(gs) != math.prod(ys) or (
            tuple(gs) != tuple(ys) and not ((len(gs) == 1 and not getattr(result, "batched", True))
                                            or gs[0] == ys[0]))):
        raise ProblemError(f"G must have one entry per entry of the result's y, shape {tuple(ys)} (or its "
                           f"points flattened); got {tuple(gs)}")
    # the set's vjp takes G as (batch, n), as project_batch takes X: points with a shape (Birkhoff's k x k)
    # are flattened for it (a set written for (batch, n) failed on (1, 3, 3)); J g of a batch comes as
    # (batch, n), that of a single point in the point's shape
    if gs is not None and len(gs) >= 1 and gs[0] == 0 and getattr(result, "batched", True):
        return array_namespace(G).zeros_like(G)  # an empty batch: J g is empty (the sets' faces are None there)
    one = getattr(result, "batch_of_one", None)
    if one is not None and not getattr(result, "batched", True):  # a single point: its batch of one, J g
        out = fn(self, one, array_namespace(G).reshape(G, (1, -1)))
        return array_namespace(out).reshape(out, tuple(ys))
    if gs is not None and len(gs) > 2:
        return fn(self, result, array_namespace(G).reshape(G, (gs[0], -1)))
    return fn(self, result, G)
