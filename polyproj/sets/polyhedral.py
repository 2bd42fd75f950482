"""The generic :class:`~polyproj.sets.Projector`: a polyhedron projected by any QP backend, then polished.

``P = {y : A y <= a, B y = b, lb <= y <= ub}`` given as a :class:`~polyproj.problem.Polyhedron` (validated
NumPy / SciPy data, active sets in its compact numbering) or as arrays of any namespace — shared by the
batch or per sample (input-dependent constraints; active sets then in the pipeline's numbering of
:mod:`polyproj.polydata`). Projections go through the one pipeline (:mod:`polyproj.projection.pipeline`);
the backward is the HS-Jacobian on the polished face (:mod:`polyproj.projection.backward`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from array_api_compat import array_namespace
from array_api_compat import device as _device

from ..backends.options import positive
from ..errors import InfeasibleError, PolyprojError, ProblemError
from ..linalg import holds, own_contiguous, to_host
from ..polydata import PolyData, RowLayout, empty_row
from ..problem import Polyhedron
from ..projection import backward
from ..projection.faces import Face, put_rows
from ..projection.pipeline import PolishOptions, run
from ..projection.result import Degeneracy, ProjectionResult
from .base import Projector

__all__ = ["Polyhedral", "polydata_from_arrays"]

PARTS = ("A", "a", "B", "b", "lb", "ub")

#: the least ``tol`` of the polish's KKT checks in float32 (on a device without float64): 64 float32 eps, 7.6e-6.
#: Its residuals round at several eps times the sizes of their terms: at 16 eps faces (n 10 to 30) were refused
#: and their points went through the fallback backends (10x the time, errors 3e-3), at 100 eps a wrong face was
#: accepted (error 2e-4 against 1e-5); 32 and 64 eps verified every face of 24 random polyhedra (n 10 to 80)
FLOAT32_TOL = 64 * float(np.finfo(np.float32).eps)


@dataclass(frozen=True)
class FaceInfo:
    """What the backward needs from a projection (pipeline numbering, the dtype of :meth:`Polyhedral._data_like`)."""

    data: PolyData
    Y: Any
    active: Any  # (b, m + 2n)
    mult: Any  # (b, m + 2n)
    mu: Any  # (b, p)
    faces: list


class Polyhedral(Projector):
    """A polyhedron with a QP backend: the generic Projector.

    Parameters
    ----------
    polyhedron : Polyhedron or PolyData
    backend : str or QPSolver
        Any registered backend; ``"auto"`` chooses by measurement (:mod:`polyproj.backends.defaults`).
    polish : bool
        Polish to the exact projection on the identified face (default True).
    tol : float
        Relative tolerance of the polish's KKT checks (at least :data:`FLOAT32_TOL` where the device has no
        float64 and the projection runs in float32).
    max_polish_iter : int, optional
        Active-set corrections (default: 50; ``12 + n/20`` after a start-only backend's start).
    polish_block_iter : int
        First corrections that change every wrong row at once.
    fallback : str
        Backend for the points a start-only backend (``admm``) leaves to it (``"auto"``).
    given : tuple of str
        Names of the parts the user gave (the others have defaults; they receive no gradient).
    **settings
        Backend settings (unified and backend-specific), validated now.
    """

    def __init__(self, polyhedron: Polyhedron | PolyData, backend: Any = "auto", *, polish: bool = True,
                 tol: float = 1e-9, max_polish_iter: int | None = None, polish_block_iter: int = 0,
                 fallback: str = "auto", given: tuple[str, ...] = PARTS, batch_shape: tuple[int, ...] = (),
                 **settings: Any) -> None:
        from ..backends.defaults import auto_projection
        from ..registry import get_backend

        if isinstance(polyhedron, Polyhedron):
            self.polyhedron, self.data, self.layout = polyhedron, PolyData.from_polyhedron(polyhedron), \
                RowLayout.of(polyhedron)
        elif isinstance(polyhedron, PolyData):
            self.polyhedron, self.data, self.layout = None, polyhedron, None
            # per-sample parts carry the batch (flattened) as their leading axis: one size, read when not given
            sizes = {int(v.shape[0]) for v, nd in zip(polyhedron.parts(), (3, 2, 3, 2, 2, 2), strict=True)
                     if v.ndim == nd}
            if len(sizes) > 1:
                raise ProblemError(f"the per-sample parts of the PolyData disagree on the batch size: {sorted(sizes)}")
            size = sizes.pop() if sizes else None
            if size is not None and not tuple(batch_shape):
                batch_shape = (size,)
            elif size is not None and int(np.prod(batch_shape)) != size:
                raise ProblemError(f"batch_shape {tuple(batch_shape)} does not match the PolyData's per-sample parts "
                                   f"({size} samples)")
        else:
            raise ProblemError(f"Polyhedral takes a Polyhedron or PolyData, got {type(polyhedron).__name__}")
        if positive(tol) is not None:
            raise ProblemError(f"tol must be a positive number, got {tol!r}")
        if not isinstance(polish, (bool, np.bool_)):  # polish="no" is truthy: it polished
            raise ProblemError(f"polish must be True or False, got {polish!r}")
        if max_polish_iter is not None and (not isinstance(max_polish_iter, (int, np.integer))
                                            or isinstance(max_polish_iter, (bool, np.bool_)) or max_polish_iter < 0):
            raise ProblemError(f"max_polish_iter must be an integer >= 0, got {max_polish_iter!r}")
        self.auto = backend == "auto"
        self.settings = dict(settings)
        self.solver = get_backend(auto_projection(self.data.shared_matrices) if self.auto else backend, **settings)
        self._solvers: dict[str, Any] = {self.solver.name: self.solver}
        if not isinstance(fallback, str):
            raise ProblemError(f"fallback must be 'auto' or a backend name, got {fallback!r}")
        if fallback != "auto":
            from ..registry import _resolve

            _resolve(fallback)  # a misspelt name fails now (BackendNotFound), not when a point first needs it
        self.options = PolishOptions(bool(polish), float(tol), max_polish_iter, int(polish_block_iter), fallback)
        self.given, self.batch_shape = tuple(given), tuple(batch_shape)
        self._like: dict[Any, PolyData] = {}

    # ------------------------------------------------------------------ the Projector interface
    @property
    def n(self) -> int:
        """Number of variables."""
        return self.data.n

    @property
    def method(self) -> str:  # type: ignore[override]
        """The backend's name."""
        return self.solver.name

    def as_polyhedron(self) -> Polyhedron:
        """The Polyhedron (data shared by the batch only)."""
        if self.polyhedron is not None:
            return self.polyhedron
        if self.data.batched:
            raise ProblemError("per-sample constraint data are not one Polyhedron")
        d = PolyData(*(to_host(v) for v in self.data.parts()))
        return Polyhedron(A=d.A, a=d.a, B=d.B, b=d.b, lb=d.lb, ub=d.ub, n=d.n)

    def row_counts(self) -> tuple[int, int]:
        """``(n_ineq, m_eq)`` of the results: per-sample data number their rows as the pipeline does."""
        if self.data.batched and self.polyhedron is None:
            return self.data.m + 2 * self.data.n, self.data.p
        return super().row_counts()

    def _data_like(self, X: Any) -> PolyData:
        """The data in X's namespace and device (cached per namespace and device).

        float64, or float32 on a device without float64 (torch's MPS, array_api_strict's ``"no_float64"``): the
        whole projection then runs in float32 (:meth:`project_batch`).
        """
        xp = array_namespace(X)
        key = (xp.__name__, str(_device(X)))
        hit = self._like.get(key)
        if hit is not None:
            return hit
        try:
            same = array_namespace(self.data.A) is xp and str(_device(self.data.A)) == str(_device(X))
        except TypeError:
            same = False
        dt = xp.float64 if holds(xp, xp.float64, _device(X)) else xp.float32
        if same:
            d = self.data.astype(dt)
        else:
            d = PolyData(*(xp.asarray(own_contiguous(to_host(v)), dtype=dt, device=_device(X))
                           for v in self.data.parts()))
        self._like[key] = d
        return d

    def project_batch(self, X: Any, *, record: bool = False, warm_start: Any = None) -> ProjectionResult:
        """Project a batch: small NumPy batches by the direct path first (:meth:`_direct`), else the pipeline.

        ``record`` keeps the faces for :meth:`vjp`; ``warm_start`` (a previous :class:`ProjectionResult`
        of a batch of the same size) starts the polish from its active sets instead of asking the backend.
        """
        xp = array_namespace(X)
        data = self._data_like(X)
        if data.batched and X.shape[0] != self._batch_size():
            raise ProblemError(f"the constraint data carry a batch of {self._batch_size()} but X has "
                               f"{X.shape[0]} points")
        work = data.lb.dtype  # float64, or float32 on a device without float64 (_data_like)
        Xw = xp.astype(X, work)
        opts, warm = replace(self.options, record=record), self._warm(X, warm_start)
        if work != xp.float64:  # float32's rounding fails KKT checks at the float64 default of tol on every face
            opts = replace(opts, tol=max(opts.tol, FLOAT32_TOL))
        out = self._direct(Xw, data, opts, warm)
        if out is None:
            out = run(Xw, data, self._solver_for(X), opts, warm=warm)
        Y = xp.astype(out.Y, X.dtype)
        # the violation of the returned points (their rounding to X's dtype included), in X's dtype
        if out.viol is not None and Y.dtype == work:
            viol = out.viol
        else:
            viol = xp.astype(data.violation(out.Y if Y.dtype == work else xp.astype(Y, work)), X.dtype)
        info = FaceInfo(data, out.Y, out.active, out.mult, out.mu, out.faces)
        active, mult = out.active, out.mult
        if self.layout is not None:
            active, mult = self.layout.to_compact(active), self.layout.to_compact(mult)
        batch = X.shape[0]
        if out.nondegenerate:
            clean = xp.zeros((batch,), dtype=xp.bool, device=_device(X))
            report = Degeneracy(clean, clean)
        else:
            report = degeneracy(Xw, info, opts.tol, self._eq_deficiency())
        return ProjectionResult(Y, active, xp.astype(xp.concat([mult, out.mu], axis=1), X.dtype), out.status,
                                float(xp.max(viol)) if batch else 0.0, viol, out.polished, out.backend,
                                solution=out.start.solution, degenerate=report, face=info)

    def _direct(self, X: Any, data: PolyData, opts: PolishOptions, warm: Any) -> Any:
        """The direct path (:mod:`polyproj.projection.direct`) for a small NumPy batch, or None when not taken.

        Taken for shared data, the default backend choice (or DAQP) without settings and the default polish,
        on data of unit scale. A warm start's active sets are tried first (the exact face on each, verified),
        DAQP for the points they do not give; the samples the path does not take go through :func:`run` as a
        batch of their own (the ``"auto"`` choice for that batch; their part of the warm start; DAQP's start
        from the direct path's solves when DAQP is that choice).
        """
        from ..backends.daqp import DAQPSolver
        from ..backends.defaults import direct_points, thin
        from ..projection import direct
        from ..projection.pipeline import _unit_exponent

        # polyproj's own DAQP glue, not what the registry's "daqp" names: a backend registered over that name
        # has none of the direct path's internals (and, named, is used as the backend it is)
        if not (isinstance(X, np.ndarray) and 0 < X.shape[0] <= direct.DIRECT_BATCH and X.shape[1]
                and not data.batched and opts.polish and opts.max_rounds is None and not self.settings
                and ((self.auto and (X.shape[0] <= direct_points(X.shape[1]) or thin(X.shape[1], data.m)))
                     or type(self.solver) is DAQPSolver)) \
                or _unit_exponent(X, data):
            return None
        dd = self._like.get("direct")
        if dd is None:
            try:
                DAQPSolver.ensure_available()
                daqp = DAQPSolver()
                dd = (direct.DirectData.of(data, daqp), daqp)
            except PolyprojError:  # DAQP missing: the pipeline only
                dd = False
            self._like["direct"] = dd
        if dd is False:
            return None

        def fallback(idx, solved, part):
            Xs = X[idx]
            if _unit_exponent(Xs, data):
                return None  # the pipeline would scale the part otherwise than the batch: the batch goes there
            solver = self._solver_for(Xs)
            # DAQP's start for these samples is the direct path's own solves: not computed twice
            start = solver.solve_projections(Xs, data, solved=solved) if part is None and solved is not None \
                and type(solver) is type(dd[1]) else None
            return run(Xs, data, solver, opts, warm=part, start=start)

        return direct.project_direct(X, data, dd[0], dd[1], opts.tol, opts.record, fallback,
                                     None if warm is None else np.asarray(warm, dtype=bool))

    def _eq_deficiency(self) -> int:
        """``p − rank(B)``: the dependency of the equality rows that the polyhedron itself implies."""
        P = self.polyhedron
        return 0 if P is None or P.eq_rank < 0 else P.m_eq - P.eq_rank

    def _solver_for(self, X: Any):
        """The backend of this call: the given one, or the ``"auto"`` choice for this batch and device."""
        if not self.auto:
            return self.solver
        from ..backends.defaults import auto_projection
        from ..registry import get_backend

        dev = _device(X)
        name = auto_projection(self.data.shared_matrices, X.shape[0], str(getattr(dev, "type", dev)) == "cpu",
                               self.settings, n=X.shape[1], m=self.data.m)
        if name not in self._solvers:
            self._solvers[name] = get_backend(name, **self.settings)
        return self._solvers[name]

    def _warm(self, X: Any, warm_start: Any) -> Any:
        """The active sets (pipeline numbering, X's namespace) of a previous result; None when unusable."""
        if warm_start is None:
            return None
        info = getattr(warm_start, "face", None)
        if not isinstance(info, FaceInfo):
            raise ProblemError("warm_start must be a ProjectionResult of this kind of set (Polyhedral)")
        act = info.active
        if act.shape != (X.shape[0], self.data.m + 2 * self.data.n):
            return None  # another batch size: no guess
        xp = array_namespace(X)
        try:  # and on X's device: arrays of two devices do not combine
            same = array_namespace(act) is xp and str(_device(act)) == str(_device(X))
        except TypeError:
            same = False
        return act if same else xp.asarray(np.asarray(to_host(act) > 0), device=_device(X))

    def _batch_size(self) -> int:
        return int(np.prod(self.batch_shape)) if self.batch_shape else 1

    def vjp(self, result: ProjectionResult, G: Any) -> Any:
        """``J g`` at the polished faces (their factorisation reused when the projection recorded it)."""
        return backward.hs_vjp(result.face, G)

    def parameters(self) -> dict[str, Any]:
        """The given parts of the data (the arrays that can receive gradients)."""
        return {k: getattr(self.data, k) for k in self.given}

    def with_parameters(self, **values: Any) -> Polyhedral:
        """The same polyhedron with some parts replaced (same backend and options)."""
        new = object.__new__(Polyhedral)
        new.__dict__.update(self.__dict__)
        new.data = replace(self.data, **values)
        new._like = {}
        return new

    def parameter_vjp(self, result: ProjectionResult, G: Any, names: tuple[str, ...], *,
                      groups: int | None = None) -> dict[str, Any]:
        """Gradients of ``⟨G, y⟩`` with respect to the parts ``names`` (summed over the batch when shared).

        ``groups``: the batch is that many consecutive slices of equal size; a shared part's gradient is
        summed over each slice (leading dimension ``groups``), as per-slice gradients under ``vmap`` need.
        """
        return backward.data_vjp(result.face, G, names, {k: getattr(self.data, k).ndim for k in names},
                                 groups=groups)

    def __repr__(self) -> str:
        d = self.data
        name = "auto" if self.auto else self.solver.name
        return (f"Polyhedral(n={d.n}, inequalities={d.m}, equalities={d.p}, backend={name!r}"
                + (", per-sample data" if d.batched else "") + ")")


#: samples per factorisation of the degeneracy report (bounds its workspace)
REPORT_PART = 4096


def degeneracy(X: Any, info: FaceInfo, tol: float, eq_deficiency: int = 0) -> Degeneracy:
    """Which samples have a weakly active row or dependent active rows (pipeline numbering).

    Weakly active: an active row whose multiplier, for the normalised row, is at most ``tol`` times the
    sample's scale (``1 + max |x| + max |y|``). Dependent: the active rows ``[A_I; B]`` on the free
    coordinates have a rank below their count less ``eq_deficiency`` (dependent rows of B the
    polyhedron itself has), or a coordinate is at both of its bounds. The rank comes from one
    factorisation of the final faces (:class:`~polyproj.projection.faces.Face`: a sample whose Cholesky
    is refused takes the rank-revealing SVD), in parts of :data:`REPORT_PART` samples.
    """
    xp = array_namespace(X)
    d = info.data
    m, n = d.m, d.n
    act, mult = info.active, info.mult
    norms = xp.concat([xp.broadcast_to(d.row_norms[0], (X.shape[0], m)),
                       xp.ones((X.shape[0], 2 * n), dtype=mult.dtype, device=_device(X))], axis=1)
    # tol (1 + max|x| + max|y|) term by term: the sum alone overflows for points near the float64 maximum
    # (every active row was then reported weak)
    floor = tol * (1.0 + xp.max(xp.abs(X), axis=1, keepdims=True)) + tol * xp.max(xp.abs(info.Y), axis=1,
                                                                                 keepdims=True)
    weak = xp.any(act & (mult * norms <= floor), axis=1)  # an active zero row (norm 0) is weak, without a 1/0
    at_lb, at_ub = act[:, m: m + n], act[:, m + n:]
    both = xp.any(at_lb & at_ub, axis=1)
    return Degeneracy(weak, dependent_fn=lambda: _dependent(info, both, eq_deficiency))


def _dependent(info: FaceInfo, both: Any, eq_deficiency: int) -> Any:
    """The ``dependent`` part of :func:`degeneracy` (rank of the final faces, in parts)."""
    from ..runtime import batch_parts

    xp = array_namespace(info.Y)
    d = info.data
    m, n = d.m, d.n
    act = info.active
    at_lb, at_ub = act[:, m: m + n], act[:, m + n:]
    parts = []
    for sl in batch_parts(info.Y.shape[0], REPORT_PART):
        idx = xp.arange(sl.start, sl.stop, device=_device(info.Y))
        sub = d if not d.batched else d.take(idx)
        free = 1.0 - xp.astype(at_lb[sl, ...] | at_ub[sl, ...], info.Y.dtype)
        face = Face.factor(sub.A, sub.B, act[sl, :m], free)
        count = xp.sum(xp.astype(act[sl, :m], xp.int64), axis=1) + d.p
        rank = xp.sum(xp.astype(face.rows.scale > 0, xp.int64), axis=1)
        if face.svd is not None:
            rank = put_rows(xp, rank, face.svd.idx, xp.sum(xp.astype(face.svd.s_inv > 0, xp.int64), axis=1))
        parts.append(rank < count - eq_deficiency)
    return (xp.concat(parts) if parts else both) | both


# ----------------------------------------------------------------------------- arrays -> PolyData
def polydata_from_arrays(like: Any, A: Any = None, a: Any = None, B: Any = None, b: Any = None, lb: Any = None,
                         ub: Any = None, *, batch_shape: tuple[int, ...] = ()) -> tuple[PolyData, tuple[str, ...]]:
    """Validate constraint arrays (namespace, device and dtype of ``like``) and fill in the missing parts.

    Each part is shared (``A (m, n)``, ``a (m,)``, ``lb (n,)``) or carries ``batch_shape`` (flattened).
    Returns the :class:`PolyData` and the names of the parts given.

    Raises
    ------
    ProblemError
        Shapes, NaN / forbidden infinities, a part without its partner (``A`` without ``a``).
    InfeasibleError
        ``lb > ub`` somewhere, or a zero row that no point satisfies (:func:`~polyproj.polydata.empty_row`).
    """
    xp = array_namespace(like)
    n = like.shape[-1]
    N = int(np.prod(batch_shape)) if batch_shape else 1
    vals = {k: _as_like(v, k, like) for k, v in zip(PARTS, (A, a, B, b, lb, ub), strict=True)}
    out: dict[str, Any] = {}
    for M, v in (("A", "a"), ("B", "b")):
        out[M], out[v] = _matrix_pair(xp, vals[M], vals[v], M, v, n, batch_shape, N, like)
    for k, sign in (("lb", -1), ("ub", 1)):
        out[k] = _bound(xp, vals[k], k, sign, n, batch_shape, N, like)
    crossed = out["lb"] > out["ub"]
    if bool(xp.any(crossed)):  # name the first crossing (learned bounds cross during training: which, and where)
        lb_, ub_ = (xp.broadcast_to(out[k], crossed.shape) for k in ("lb", "ub"))
        first = int(xp.nonzero(xp.reshape(crossed, (-1,)))[0][0])
        at = f"coordinate {first % n}" + (f" of sample {first // n}" if crossed.ndim == 2 else "")
        flat_lb, flat_ub = xp.reshape(lb_, (-1,)), xp.reshape(ub_, (-1,))
        raise InfeasibleError(f"lb > ub at {at} (lb {float(flat_lb[first]):.6g} > ub {float(flat_ub[first]):.6g}"
                              f"{', and elsewhere' if int(xp.sum(xp.astype(crossed, xp.int32))) > 1 else ''}): "
                              "the polyhedron is empty")
    why = empty_row(xp, out["A"], out["a"], out["B"], out["b"])
    if why is not None:
        raise InfeasibleError(why)
    given = tuple(k for k in PARTS if vals[k] is not None)
    return PolyData(*(out[k] for k in PARTS)), given


def _as_like(v: Any, name: str, like: Any) -> Any:
    if v is None:
        return None
    xp = array_namespace(like)
    try:
        same = array_namespace(v) is xp
    except TypeError:
        same = False
    if not same:
        if isinstance(v, (str, bytes, dict)):
            raise ProblemError(f"{name} must be an array or tensor of numbers, got {type(v).__name__} {v!r:.40}"
                               + (" (structured sets are objects: e.g. polyproj.sets.Simplex(n))"
                                  if name == "A" and isinstance(v, str) else ""))
        try:
            arr = np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise ProblemError(f"{name} must be an array or tensor of numbers, got {type(v).__name__}: {exc}") from None
        return xp.asarray(own_contiguous(arr), dtype=like.dtype, device=_device(like))
    if str(_device(v)) != str(_device(like)):
        raise ProblemError(f"{name} is on {_device(v)} but x is on {_device(like)}: move the constraint data to "
                           "the device of x (ProjectionLayer.to(device) does it for its buffers)")
    if v.dtype != like.dtype:
        raise ProblemError(f"{name} has dtype {v.dtype} but x has {like.dtype}: use one dtype "
                           "(float32 or float64) for x and the constraint data (a ProjectionLayer: "
                           "ProjectionLayer(..., dtype=...) or layer.float() / layer.double())")
    return v


def _flat(xp, t: Any, name: str, tail: int, batch_shape: tuple[int, ...], N: int) -> Any:
    """``t`` with its leading dimensions (the batch's) flattened; shared parts unchanged."""
    if t.ndim == tail:
        return t
    if tuple(t.shape[:-tail]) != tuple(batch_shape):
        raise ProblemError(f"{name} carries batch dimensions {tuple(t.shape[:-tail])} but x has {tuple(batch_shape)}")
    return xp.reshape(t, (N, *t.shape[-tail:]))


def _matrix_pair(xp, Mt, vt, M: str, v: str, n: int, batch_shape, N: int, like):
    dt, dev = like.dtype, _device(like)
    if (Mt is None) != (vt is None):
        raise ProblemError(f"{M} and {v} must be given together")
    if Mt is None:
        return xp.zeros((0, n), dtype=dt, device=dev), xp.zeros((0,), dtype=dt, device=dev)
    if Mt.ndim == 1 and Mt.shape[0] == n:
        Mt = Mt[None, :]
    if Mt.ndim < 2 or Mt.shape[-1] != n:
        raise ProblemError(f"{M} must have shape (r, {n}) or (..., r, {n}) to match x, got {tuple(Mt.shape)}")
    r = Mt.shape[-2]
    if vt.ndim == 0 or vt.shape[-1] != r:
        raise ProblemError(f"{v} must have shape ({r},) or (..., {r}) to match {M}, got {tuple(vt.shape)}")
    Mt, vt = _flat(xp, Mt, M, 2, batch_shape, N), _flat(xp, vt, v, 1, batch_shape, N)
    if not bool(xp.all(xp.isfinite(Mt))):
        raise ProblemError(f"{M} contains NaN or inf")
    bad = xp.isnan(vt) | (xp.isinf(vt) if v == "b" else (vt == -float("inf")))
    if bool(xp.any(bad)):
        raise ProblemError(f"{v} contains NaN" + (" or inf" if v == "b" else " or -inf"))
    return Mt, vt


def _bound(xp, t, k: str, sign: int, n: int, batch_shape, N: int, like):
    if t is None:
        return xp.full((n,), sign * float("inf"), dtype=like.dtype, device=_device(like))
    if t.ndim == 0 or t.shape[-1] != n:
        raise ProblemError(f"{k} must have shape ({n},) or (..., {n}), got {tuple(t.shape)}")
    t = _flat(xp, t, k, 1, batch_shape, N)
    if bool(xp.any(xp.isnan(t) | (t == -sign * float("inf")))):
        raise ProblemError(f"{k} contains NaN or {'+' if sign < 0 else '-'}inf")
    return t
