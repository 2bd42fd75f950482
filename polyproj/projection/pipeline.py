"""The one projection pipeline: solve → recover → polish → fall back → result, for every array namespace.

Data far from unit size are projected as ``Π_{sP}(s x) = s Π_P(x)`` with ``s`` a power of 2 near the
polyhedron's size (:func:`_unit_exponent`), so the backends see a polyhedron of unit size however far the
points lie.

For a batch ``X`` (batch, n) and polyhedral data (:class:`~polyproj.polydata.PolyData`, shared or per
sample) in one namespace, :func:`run`

1. **solves**: the backend's :meth:`~polyproj.backends.base.QPSolver.solve_projections` (with
   ``rough=True`` when the backend can stop once the faces look identified and the polish is on);
2. **recovers** false infeasibility reports: the polyhedron is shared, so a sample solved to a feasible
   point proves it is not empty; the flagged samples are solved again one by one, then by an
   independent backend; the polyhedron is called empty only when no backend finds a point of it, not
   even of a point at its own scale (far points can fail on every backend: they stay NaN, flagged);
3. **polishes** on the identified active face (:func:`polyproj.projection.polish.polish`): exact to
   rounding, KKT verified; large NumPy batches in parts on one thread per core;
4. **falls back** for the samples whose polish is refused after a rough start: solved again accurately
   (by the same backend, or by :func:`polyproj.backends.defaults.fallback_for` when the backend's
   projections are starts only) and polished again — after a start-only backend's start the polish
   hands its last few CPU samples to the exact per-point fallback early (:func:`_handoff`); a sample
   whose accurate solve failed (NUMERICAL_ERROR) is solved by the fallback backend, or by the next backend
   of :data:`~polyproj.backends.defaults.RETRY` not yet tried (:func:`_failed_retry`; also, keeping only
   what they verify, the samples a false infeasibility report left unsolved where other samples were
   verified); what is still refused keeps the backend's point with the active set it shows at its own
   accuracy (multiplier and slack, :func:`_unverified_active`), and that point's status (the backend's own;
   SOLVED_INACCURATE where it said SOLVED, NUMERICAL_ERROR where the point lies outside), with a warning.

Once the backend's ``time_limit`` has passed (a start it cut short, or the clock from the outermost run's start:
:func:`_spent`) nothing more is solved: no fallback, retry or accurate re-solve; a start cut short gets at most
:data:`LATE_ROUNDS` polish rounds, none where it shows no face (:func:`_no_face`), and keeps the backend's point as
TIME_LIMIT where they do not verify it (:func:`_late_polish`).

Everything stays in the input's namespace and device; inequality rows are numbered as in
:mod:`polyproj.polydata`.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from array_api_compat import array_namespace, is_numpy_namespace
from array_api_compat import device as _device

from ..backends.projection import ProjectionStart
from ..backends.validation import check_projection_start
from ..errors import InfeasibleError, PolyprojWarning
from ..polydata import PolyData, ineq_slack
from ..runtime import batch_parts, parallel_map, small_blas
from ..solution import BatchSolution, Status
from .faces import scatter_rows
from .polish import FaceRecord, PolishResult, polish

__all__ = ["PipelineOutput", "PolishOptions", "run"]

#: samples per polish part at n = 100 (large NumPy batches are polished in parts, one thread per core)
POLISH_PART = 256


@dataclass(frozen=True)
class PolishOptions:
    """How the pipeline polishes.

    ``tol``: relative tolerance of the KKT checks; ``max_rounds``: active-set corrections (default 50
    after an accurate start, ``12 + n/20`` after the start of a start-only backend, whose refused points
    go to the fallback); ``block_rounds``: first corrections that change every wrong row at once;
    ``fallback``: ``"auto"`` or a backend name (start-only backends); ``record``: keep the factored
    faces for a backward pass; ``tried``: the backends whose pipelines already left these samples
    refused (:func:`_failed_retry` asks another).
    """

    polish: bool = True
    tol: float = 1e-9
    max_rounds: int | None = None
    block_rounds: int = 0
    fallback: str = "auto"
    record: bool = False
    tried: tuple[str, ...] = ()
    #: a run on some samples of another run (:func:`_resolve`, :func:`_run_by`): the emptiness verdict is the
    #: outer run's, which names the samples in the caller's numbering and reports the whole batch
    nested: bool = False
    #: the backend's ``time_limit`` as a ``time.perf_counter()`` instant, from the outermost run's start (set by
    #: :func:`run`; its nested runs share it): past it no retry or fallback starts (:func:`_spent`)
    deadline: float | None = None


@dataclass(frozen=True)
class PipelineOutput:
    """The pipeline's result (rows numbered as in :mod:`polyproj.polydata`)."""

    Y: Any
    active: Any
    mult: Any
    mu: Any
    status: tuple[Status, ...]
    polished: Any
    backend: str
    faces: list[FaceRecord]
    start: ProjectionStart
    #: the violation of every row of ``Y`` (float64), where the path that produced them computed it anyway
    viol: Any = None
    #: every sample verified with strict complementarity and independent active rows, clear of the
    #: degeneracy report's tolerances (the direct path's test): the report is False everywhere
    nondegenerate: bool = False


def run(X: Any, data: PolyData, solver: Any, opts: PolishOptions, *, rough: bool | None = None,
        warm: Any = None, start: ProjectionStart | None = None) -> PipelineOutput:
    """Project the rows of ``X`` onto ``data`` with ``solver`` (see the module docstring).

    ``rough`` (default: when the polish is on and the backend can stop early) asks the backend for a
    rough start. ``warm`` (b, m + 2n) bool: guessed active sets (a previous step's); the polish starts
    from them without asking the backend, and only the samples it cannot verify in a few rounds go
    through the whole pipeline. ``start``: ``solver``'s projections of ``X`` already computed (its
    :meth:`solve_projections` on the unscaled data), taken instead of asking it again.
    """
    if rough is None:
        rough = opts.polish and solver.capabilities.early_stop
    limit = solver.settings.get("time_limit")
    if opts.deadline is None and limit is not None:
        opts = replace(opts, deadline=time.perf_counter() + float(limit))
    e = _unit_exponent(X, data)
    if e:  # Π_{sP}(s x) = s Π_P(x), s = 2^e: the backend sees data of unit size (powers of 2: exact)
        given = None if start is None else replace(start, y=_pow2(start.y, -e), mult=_pow2(start.mult, -e),
                                                   mu=_pow2(start.mu, -e))
        out = run(_pow2(X, -e), _scaled(data, -e), solver, opts, rough=rough, warm=warm, start=given)
        with np.errstate(over="ignore"):  # a projection beyond the float64 range: NUMERICAL_ERROR (_overflow)
            return _overflow(replace(out, Y=_pow2(out.Y, e), mult=_pow2(out.mult, e), mu=_pow2(out.mu, e),
                                     faces=out.faces, start=replace(out.start, y=_pow2(out.start.y, e),
                                                                    mult=_pow2(out.start.mult, e),
                                                                    mu=_pow2(out.start.mu, e))), out.Y)
    if warm is not None and opts.polish:
        return _warm(X, data, solver, opts, warm)
    start = _projections(solver, X, data, rough) if start is None else _checked(start, X, data, solver)
    start, flagged, report = _recover(solver, X, data, start)
    if not opts.polish:
        out = _unpolished_output(X, data, start, solver.name)
    else:
        late = _with_status(X, start, Status.TIME_LIMIT)
        rounds = _rounds(opts, solver, start, X.shape[1])
        handoff = _handoff(X, opts, solver, start)
        if bool(array_namespace(X).any(late)):  # the caller's time is spent: a short polish, none where no face shows
            out = _late_polish(X, data, solver, opts, start, late, min(rounds, LATE_ROUNDS), handoff)
        else:
            out = _output(data, start, _polish(X, data, start, opts, rounds, handoff=handoff), solver.name)
        out = _fall_back(X, data, solver, opts, start, out, flagged, late)
    if report is not None:
        xp = array_namespace(X)
        by_polish = int(xp.sum(xp.astype(flagged & out.polished, xp.int64)))
        # a verified point of the one polyhedron suggests it is not empty: the samples still flagged go to the other
        # backends (_failed_retry); only what they verify is taken (a far point "verified" at the scale of its |y|
        # is no proof for the others: what they leave stays as reported, NaN and PRIMAL_INFEASIBLE)
        retried = flagged & ~out.polished
        by_retry = 0
        if opts.polish and not data.batched and bool(xp.any(out.polished)) and bool(xp.any(retried)) \
                and not _spent(opts, start):
            out = _failed_retry(X, data, solver, opts, out, retried, verified_only=True)
            by_retry = int(xp.sum(xp.astype(retried & out.polished, xp.int64)))
        lost = flagged & ~out.polished
        nan = int(xp.sum(xp.astype(lost, xp.int64)))
        if nan:  # the polish's unverified attempt from x is no answer: NaN, as reported
            out = replace(out, Y=xp.where(lost[:, None], xp.full_like(out.Y, float("nan")), out.Y))
        if not opts.tried:  # a retry's run: the run that asked for it reports
            warnings.warn(report + (f", {by_polish} by the exact polish from x" if by_polish else "")
                          + (f", {by_retry} by other backends" if by_retry else "")
                          + (f", {nan} returned as NaN" if nan else ""), PolyprojWarning, stacklevel=4)
    if opts.polish and not opts.tried and not opts.nested and (report is None or data.batched) \
            and not bool(array_namespace(X).all(out.polished)):
        # no backend reported the set empty, and the polish verified not every sample (a backend's MAX_ITER, an
        # inaccurate point): unless a point in hand is in the set, its LP tells an empty one from a hard projection
        # (per-sample data: every sample not already reported, whatever was reported of the others)
        if data.batched:
            _raise_if_empty_samples(solver, data, start, out, X, skip=None if report is None else flagged)
        else:
            _raise_if_empty(solver, data, start, out.Y, X)
    return out


def _projections(solver, X, data: PolyData, rough: bool = False) -> ProjectionStart:
    """``solver.solve_projections(X, data)``, the answer held to its form (:func:`_checked`)."""
    return _checked(solver.solve_projections(X, data, rough=rough), X, data, solver)


def _checked(start, X, data: PolyData, solver) -> ProjectionStart:
    """A backend's projections of ``X`` as the pipeline receives them, held to their form; else a SolverError.

    A ProjectionStart of the batch's shapes, the error naming the backend and what is wrong
    (:func:`~polyproj.backends.validation.check_projection_start`; shapes and types only). A third party's
    ``solve_projections`` (the override point) answering ``y`` a row short, ``None`` or a short ``status`` ended
    in a broadcast ValueError in the polish, an AttributeError, a ValueError from ``zip``.
    """
    return check_projection_start(start, X, data, solver.name or type(solver).__name__)


def _raise_if_empty(solver, data: PolyData, start, Y, X) -> None:
    """Raise the InfeasibleError of an empty polyhedron when its LP says so (:data:`EMPTY_GAP`); shared data only.

    A point of ``Y`` within the LP's threshold of every row is a witness that the set is not empty (to that
    threshold): then no LP is solved (the usual case: a hard projection of a non-empty set, every call). The
    verdict covers the points of the set near those of ``X`` too (their projections are what is asked).
    """
    from .emptiness import least_violation

    xp = array_namespace(Y)
    limit = EMPTY_GAP * (1.0 + data.distance_size)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN rows (flagged samples): inf, no witness
        if bool(xp.any(data.distance_violation(Y) <= limit)):
            return
    with np.errstate(invalid="ignore"):
        reach = float(xp.max(xp.where(xp.isfinite(X), xp.abs(X), xp.zeros_like(X)))) if X.shape[0] else 0.0
    gap = least_violation(data, reach)
    if gap is not None and gap > limit:
        raise _empty(solver, data, start, f" or fails; every point misses some row by {gap:.2e} or more")


#: per-sample polyhedra: at most this many unverified samples have their emptiness LP solved in one call (each
#: LP is independent; past it, the samples keep their statuses)
EMPTY_LP_SAMPLES = 64


def _raise_if_empty_samples(solver, data: PolyData, start, out, X, skip=None) -> None:
    """:func:`_raise_if_empty` for per-sample polyhedra: each unverified sample without a witness, by its own LP.

    A sample whose point lies within the threshold of its own polyhedron is a witness for itself only. The
    error names the first empty sample (an empty sample beside others had its inaccurate point returned:
    ``{y₀ <= 0, y₀ >= 1e-5}`` in a box of ±1000 as SOLVED_INACCURATE / NUMERICAL_ERROR).
    """
    from .emptiness import least_violation

    xp = array_namespace(out.Y)
    unverified = _host_ints(xp.nonzero(~out.polished if skip is None else ~out.polished & ~skip)[0])
    for i in unverified[:EMPTY_LP_SAMPLES]:
        sel = xp.asarray([i], device=_device(X))
        # sample i's polyhedron as shared data (the batch axis of its per-sample parts dropped)
        one = PolyData(*(v[i] if v.ndim == nd else v for v, nd in zip(data.parts(), (3, 2, 3, 2, 2, 2), strict=True)))
        limit = EMPTY_GAP * (1.0 + one.distance_size)
        Y = xp.take(out.Y, sel, axis=0)
        with np.errstate(invalid="ignore", over="ignore"):
            if bool(xp.all(xp.isfinite(Y))) and bool(one.distance_violation(Y)[0] <= limit):
                continue
        x = xp.take(X, sel, axis=0)
        with np.errstate(invalid="ignore"):
            reach = float(xp.max(xp.where(xp.isfinite(x), xp.abs(x), xp.zeros_like(x))))
        gap = least_violation(one, reach)
        if gap is not None and gap > limit:
            raise _empty(solver, data, start, f" or fails; sample {i}'s polyhedron is empty: every point misses "
                                              f"some row by {gap:.2e} or more", sample=i)


#: the data's size (largest distance of a hyperplane from the origin, else largest |x|) within
#: [2^-SCALE_BAND, 2^SCALE_BAND] is left as it is
SCALE_BAND = 8
#: points beyond 2^FAR_BITS times the polyhedron's size set the scale themselves (no double resolves a
#: unit polytope there: y = x − Aᵀλ cancels to eps |x|)
FAR_BITS = 56


def _unit_exponent(X: Any, data: PolyData) -> int:
    """``e`` with ``2^e`` near the polyhedron's size (of the batch for a cone; 0 when near 1).

    The size is the largest distance of a hyperplane from the origin (:attr:`PolyData.distance_size`), not
    the largest right-hand side: a row ``2.4e8 y_1 + 1e7 y_2 <= 1.4e7`` lies 0.06 from the origin, and a scale
    set by its right-hand side shrank the polyhedron to ~1e-8, below the backends' absolute tolerances.
    The polyhedron sets the scale, not the points: scaling by a far point's size (|x| ≫ the right-hand
    sides) would shrink the polyhedron below the backends' absolute tolerances, where every row is within
    tolerance of every point and no active set can be told. A cone (no finite nonzero right-hand side)
    has no size of its own: ``Π_K(s x) = s Π_K(x)``, and the batch's size is taken. Points beyond
    ``2^FAR_BITS`` times that size raise ``s`` so that they stay finite QP data.
    """
    xp = array_namespace(X)
    far = float(xp.max(xp.abs(X))) if X.shape[0] and X.shape[1] else 0.0
    size = data.distance_size
    if size > 2.0 * far > 0.0 and data.contains_origin:  # (2 max|x| <= 2 max ||x||: else nothing to drop)
        # 0 in P: ||Π(x) − x|| <= ||x||, so ||Π(x)|| <= 2 ||x||, and no hyperplane farther than that from the origin
        # is active at these points' projections: a row written with a big right-hand side for "no limit" (1e10
        # beside a unit polytope) does not set their unit
        reach = 2.0 * float(xp.max(xp.linalg.vector_norm(xp.where(xp.isfinite(X), X, xp.zeros_like(X)), axis=1)))
        if size > reach:
            size = data.distance_size_within(reach)
    size = size or far
    if not (0.0 < size < float("inf")):
        return 0
    e = int(np.round(np.log2(size)))
    if far > 0.0:  # scaled points stay below 2^FAR_BITS (finite as QP data, which reads 1e20 as infinite)
        e = max(e, int(np.ceil(np.log2(far))) - FAR_BITS)
    return 0 if abs(e) <= SCALE_BAND else e


def _pow2(v: Any, e: int) -> Any:
    """``v · 2^e``, exact.

    In two factors, each a normal double: ``2^e`` alone overflows for ``|e| > 1023`` (points of 1e-310 have
    ``e = -1030``).
    """
    half = e // 2
    return (v * (2.0 ** half)) * (2.0 ** (e - half))


def _scaled(data: PolyData, e: int) -> PolyData:
    """The polyhedron ``2^e·P`` (right-hand sides and bounds times ``2^e``; the rows unchanged).

    A right-hand side or bound that overflows becomes ±inf, no limit, and rightly so. A scale-up that large happens
    only where tiny points set the unit (:func:`_unit_exponent`: the polyhedron holds the origin, and its rows farther
    than twice the points' reach are left out of its size), and such a row lies beyond that reach, where no
    projection of these points gets (``‖Π(x)‖ <= 2‖x‖``); the origin in ``P`` makes it ``+inf`` for ``a`` and ``ub``,
    ``-inf`` for ``lb`` (``b = 0``), never a row no point satisfies. (Points of 1e-310 in a box of ±1: the bounds
    times 2^1030.)
    """
    with np.errstate(over="ignore"):
        return PolyData(data.A, _pow2(data.a, e), data.B, _pow2(data.b, e), _pow2(data.lb, e), _pow2(data.ub, e))


def _overflow(out: PipelineOutput, scaled_y: Any) -> PipelineOutput:
    """The samples whose projection overflows on the way back from unit scale: NUMERICAL_ERROR.

    A coordinate beyond ~1.8e308 is not an answer: ``y`` NaN, unpolished.
    """
    xp = array_namespace(out.Y)
    lost = xp.all(xp.isfinite(scaled_y), axis=1) & ~xp.all(xp.isfinite(out.Y), axis=1)
    if not bool(xp.any(lost)):
        return out
    status = tuple(Status.NUMERICAL_ERROR if bool(b) else s for s, b in zip(out.status, lost, strict=True))
    return replace(out, Y=xp.where(lost[:, None], xp.full_like(out.Y, float("nan")), out.Y), status=status,
                   polished=out.polished & ~lost)


#: an unverified point (polish refused) farther than this times a constraint's size (its distance from the origin
#: + max|y|) outside it is no solution: NUMERICAL_ERROR (:func:`violates`)
UNVERIFIED_VIOLATION = 1e-6


def violates(data: PolyData, Y: Any) -> Any:
    """(b,) bool: the points ``Y`` farther outside a constraint than :data:`UNVERIFIED_VIOLATION` of its size.

    Measured as distances, each constraint against its own size (:meth:`PolyData.relative_violation`): in the
    rows' own units a row of norm 1.3e8 with a right-hand side of 4.2e14 made the scale 1.5e15 and let a point
    8.7e5 outside it (35 % of the set's size) pass; against the polyhedron's size a far row (1e10) let points 60
    outside a box of ±1 pass.
    """
    return data.relative_violation(Y) > UNVERIFIED_VIOLATION


#: polish rounds a warm start may take before its samples go through the whole pipeline
WARM_ROUNDS = 4
#: share of the batch left after a warm start's first round beyond which the guess is given up at once
WARM_GIVE_UP = 0.75


def _warm(X, data: PolyData, solver, opts: PolishOptions, warm) -> PipelineOutput:
    """The polish from guessed active sets; the samples it does not verify are solved without the guess.

    A guess far from the answers (more than :data:`WARM_GIVE_UP` of the samples unverified after the
    first round) is given up at once: corrections of many wrong rows at a time meet inconsistent faces
    and cost several cold solves. What is left goes to the exact per-point fallback when few enough
    samples are (:func:`_handoff`), else through the whole pipeline.
    """
    xp = array_namespace(X)
    batch = X.shape[0]
    zeros = xp.zeros((batch, data.m + 2 * data.n), dtype=X.dtype, device=_device(X))
    start = ProjectionStart(X, zeros, xp.zeros((batch, data.p), dtype=X.dtype, device=_device(X)),
                            (Status.SOLVED_INACCURATE,) * batch, 1e-3, rough=True)
    rounds = WARM_ROUNDS if opts.max_rounds is None else min(WARM_ROUNDS, int(opts.max_rounds))
    handoff = _handoff(X, opts, solver)
    # the guess is wrong on a few rows at most: the first correction changes all of them at once
    pol = _polish(X, data, start, replace(opts, block_rounds=max(opts.block_rounds, 1)), rounds, candidates=warm,
                  handoff=handoff, give_up=WARM_GIVE_UP)
    out = _output(data, start, pol, solver.name)
    if bool(xp.all(out.polished)):
        return out
    idx = xp.nonzero(~out.polished)[0]
    Xs, ds = xp.take(X, idx, axis=0), data.take(idx)
    if int(idx.shape[0]) <= handoff:  # few enough for the exact per-point fallback
        from ..backends.defaults import fallback_for
        from ..registry import get_backend

        unified = _unified(solver.settings)
        solver = get_backend(fallback_for(True, X.shape[1], int(idx.shape[0]), unified), **unified)
    return _merge(xp, out, idx, run(Xs, ds, solver, opts))


def _rounds(opts: PolishOptions, solver: Any, start: ProjectionStart, n: int) -> int:
    if opts.max_rounds is not None:
        return int(opts.max_rounds)
    if start.rough and solver.capabilities.start_only:
        return 12 + n // 20  # a round on the few samples left costs less than the fallback solve
    return 50


def _handoff(X, opts: PolishOptions, solver: Any, start: ProjectionStart | None = None) -> int:
    """Samples left by the polish that go straight to the exact per-point fallback (0: none).

    A polish round on the few samples left costs a fixed ~2 ms (n 50) whatever their number, while the
    exact per-point fallback (:func:`polyproj.backends.defaults.exact_points`) costs ~0.25 ms a sample and
    ends on the exact face: once at most that many samples are left the rounds stop. After a backend's
    start (``start`` given) only a start-only backend's rough start is handed off (an accurate backend's
    refused points are its own to solve again); a warm start's always are.
    """
    from ..backends.defaults import exact_points

    if opts.max_rounds is not None or opts.fallback != "auto" or not _on_cpu(X):
        return 0
    if start is not None and not (start.rough and solver.capabilities.start_only):
        return 0
    if solver.settings.get("max_iter") is not None:  # the fallback inherits the limit: it may not be exact
        return 0
    return exact_points(X.shape[1], _unified(solver.settings))


def _polish_part(n: int) -> int:
    """Samples per polish part: ``POLISH_PART (100/n)²`` between 256 and 2048 (small faces need big parts)."""
    return int(min(2048, max(POLISH_PART, POLISH_PART * (100.0 / max(n, 1)) ** 2)))


def _polish(X, data: PolyData, start: ProjectionStart, opts: PolishOptions, rounds: int,
            candidates: Any = None, handoff: int = 0, give_up: float = 1.0, backed_only: bool = False) -> PolishResult:
    """The polish from the backend's start; NumPy batches in parts on one BLAS thread, one part per core.

    ``handoff``: the samples of the whole batch that may be left to the fallback once the rounds stop
    early, ``give_up``: see :func:`polish` (shared out over the parts).
    """
    xp = array_namespace(X)
    cand_tol = max(1e-7, 10.0 * start.accuracy)
    dist_tol = max(1e-9, start.dist_factor * start.accuracy)
    numpy = is_numpy_namespace(xp)
    slices = batch_parts(X.shape[0], _polish_part(X.shape[1])) if numpy else [slice(0, X.shape[0])]
    share = handoff // len(slices)

    def part(sl):
        d = data if not data.batched else data.take(xp.arange(sl.start, sl.stop, device=_device(X)))
        cand = None if candidates is None else candidates[sl, ...]
        return polish(X[sl, ...], d, start.y[sl, ...], start.mult[sl, ...], cand_tol=cand_tol, dist_tol=dist_tol,
                      tol=opts.tol, max_iter=rounds, block_iter=opts.block_rounds, record=opts.record,
                      candidates=cand, handoff=share, give_up=give_up, backed_only=backed_only)

    if not numpy:
        return part(slices[0])
    with small_blas():
        parts = parallel_map(part, slices)
    if len(parts) == 1:
        return parts[0]
    faces = []
    offset = 0
    for p in parts:  # records index their own part: shift them into the batch
        for rec in p.faces or []:
            idx = xp.arange(offset, offset + p.Y.shape[0]) if rec.idx is None else rec.idx + offset
            faces.append(FaceRecord(idx, rec.use, rec.face))
        offset += p.Y.shape[0]
    cat = [xp.concat([getattr(p, f) for p in parts], axis=0) for f in ("Y", "active", "mult", "mu", "accepted")]
    return PolishResult(*cat, faces if opts.record else None)


def _output(data: PolyData, start: ProjectionStart, pol: PolishResult, name: str) -> PipelineOutput:
    status = tuple(Status.SOLVED if bool(a) else s for a, s in zip(_host_bools(pol.accepted), start.status,
                                                                   strict=True))
    return PipelineOutput(pol.Y, pol.active, pol.mult, pol.mu, status, pol.accepted, name, pol.faces or [], start)


def _host_bools(v: Any) -> list[bool]:
    return [bool(b) for b in (v.tolist() if hasattr(v, "tolist") else list(v))]


def _fall_back(X, data: PolyData, solver, opts: PolishOptions, start: ProjectionStart, out: PipelineOutput,
               flagged, late) -> PipelineOutput:
    """Refused samples: after a rough start solved again accurately (their own pipeline); else kept as started.

    ``flagged`` (a false infeasibility report) and ``late`` (cut short by ``time_limit``, :func:`_late_polish`)
    samples are not refused here. Once the caller's time is spent (:func:`_spent`) nothing is solved again.
    """
    xp = array_namespace(X)
    refused = ~out.polished & ~flagged & ~late
    if not bool(xp.any(refused)):
        return out
    spent = _spent(opts, start)
    if start.rough and not spent:
        idx = xp.nonzero(refused)[0]
        try:
            return _merge(xp, out, idx, _resolve(X, data, solver, opts, idx))
        except InfeasibleError as err:  # its samples renumbered as the caller's, with this batch's answer
            raise _renumbered(err, solver, data, start, _host_ints(idx)) from None
    if not spent:
        out = _backed_retry(X, data, solver, opts, start, out, refused)
        refused = ~out.polished & ~flagged & ~late
        if not bool(xp.any(refused)):
            return out
        out = _failed_retry(X, data, solver, opts, out, refused)
        refused = ~out.polished & ~flagged & ~late
        if not bool(xp.any(refused)):
            return out
    bad = int(xp.sum(xp.astype(refused, xp.int64)))
    out = _keep_start(X, data, out, refused)
    wrong = refused & violates(data, out.Y)
    off = int(xp.sum(xp.astype(wrong, xp.int64)))
    # a refused sample keeps the backend's point, and the status is that point's: the backend's own (a retry's,
    # merged by _failed_retry with a point it did not verify, belongs to that point); NUMERICAL_ERROR where the
    # point breaks the constraints, whatever the backend said; a feasible one the backend called SOLVED is
    # unverified (the KKT conditions could not be shown): SOLVED_INACCURATE
    out = replace(out, status=tuple((Status.NUMERICAL_ERROR if w else Status.SOLVED_INACCURATE
                                     if s0 is Status.SOLVED else s0) if r else s
                                    for s, s0, w, r in zip(out.status, start.status, _host_bools(wrong),
                                                           _host_bools(refused), strict=True)))
    if opts.tried:  # a retry of _failed_retry: the run that asked for it warns about what is left
        return out
    cause = "; far points, |x| >> the polyhedron, or badly scaled data (rows or coordinates of very different sizes)"
    warnings.warn(f"polish refused for {bad} of {refused.shape[0]} points: the KKT conditions could not be "
                  "verified on the identified active set; those points keep the backend's accuracy "
                  f"(backend {solver.name!r}"
                  + ("; time_limit reached: not solved again" if spent else "")
                  + "), and their gradient (HS-Jacobian) is that of the approximate active "
                  "set the backend's answer shows (multipliers and slacks at its accuracy), not the exact one"
                  + (f"; {off} of them violate the constraints (status NUMERICAL_ERROR{cause} cause this)"
                     if off else ""),
                  PolyprojWarning, stacklevel=5)
    return out


def _backed_retry(X, data: PolyData, solver, opts: PolishOptions, start: ProjectionStart, out: PipelineOutput,
                  refused) -> PipelineOutput:
    """The refused samples of an accurate start polished once more from the rows its multipliers back.

    At a degenerate vertex — a row through the projection (within the distance threshold) on top of a
    face that already fixes it — the first candidates are dependent: their minimum-norm multipliers
    have negative entries, each drop moves the point off a row that is then violated, and the
    corrections cycle; the backend's own working set, without the rows merely near the point, is often
    a face the KKT tests verify at once.
    """
    xp = array_namespace(X)
    idx = xp.nonzero(refused)[0]
    Xs, ds = xp.take(X, idx, axis=0), data.take(idx)
    take = lambda v: xp.take(v, idx, axis=0)  # noqa: E731
    sub = replace(start, y=take(start.y), mult=take(start.mult), mu=take(start.mu),
                  status=tuple(start.status[i] for i in _host_ints(idx)), solution=None)
    pol = _polish(Xs, ds, sub, opts, _rounds(opts, solver, sub, X.shape[1]), backed_only=True)
    if not bool(xp.any(pol.accepted)):
        return out
    return _merge(xp, out, idx, _output(ds, sub, pol, solver.name))


#: the most backends whose pipelines a refused sample goes through (the first included)
RETRY_BACKENDS = 4


def _failed_retry(X, data: PolyData, solver, opts: PolishOptions, out: PipelineOutput, refused, *,
                  verified_only: bool = False) -> PipelineOutput:
    """The refused samples solved by the fallback backend.

    The polish could not verify the backend's point there: NUMERICAL_ERROR, a point outside the polyhedron (a
    backend whose tolerances are relative to a far point's ``|x|`` may call it solved), a feasible point
    off the projection (PIQP and Clarabel left a point 2.5 from it, in a batch with a point 6e11 away), or
    (from :func:`run`) a false infeasibility report on a polyhedron other samples were verified on. The
    fallback (``opts.fallback``, or :func:`~polyproj.backends.defaults.fallback_for`) runs its own pipeline
    on them, which polishes the points it solves. Where the fallback is ``solver`` itself or
    already left them refused (``opts.tried``), the first backend of
    :data:`~polyproj.backends.defaults.RETRY` not yet tried (on coordinates scaled 1e-3 to 1e3, DAQP ends on a
    working set that no polish round repairs on 1-3 points in 100, and the IPM's or PIQP's point is verified),
    up to :data:`RETRY_BACKENDS` backends in all. Only the outermost run warns about the samples still refused.
    ``verified_only``: only the samples the retry polished replace those of ``out``.
    """
    from ..backends.defaults import retries_of

    xp = array_namespace(X)
    count = int(xp.sum(xp.astype(refused, xp.int64)))
    tried = (*opts.tried, solver.name)
    if not count or len(tried) >= RETRY_BACKENDS:
        return out
    name = _fallback_name(X, solver, opts.fallback, count)
    if name in tried:
        name = next(iter(retries_of(tried)), None)
        if name is None:
            return out
    idx = xp.nonzero(refused)[0]
    try:
        sub = _run_by(name, X, data, solver, replace(opts, tried=tried), idx)
    except InfeasibleError:  # judged on these samples alone; the calling run knows more (other samples solved)
        return out
    return _merge(xp, out, idx, sub, polished_only=verified_only)


def _resolve(X, data: PolyData, solver, opts: PolishOptions, idx) -> PipelineOutput:
    """The samples ``idx`` solved again accurately.

    By the fallback backend when the backend's projections are starts only, else by the same backend
    without the early stop.
    """
    if not solver.capabilities.start_only:
        xp = array_namespace(X)
        return run(xp.take(X, idx, axis=0), data.take(idx), solver, replace(opts, nested=True), rough=False)
    return _run_by(_fallback_name(X, solver, opts.fallback, int(idx.shape[0])), X, data, solver, opts, idx)


def _fallback_name(X, solver, choice: str, count: int) -> str:
    """The backend for ``count`` samples ``solver`` leaves: ``choice`` (``opts.fallback``) unless ``"auto"``.

    For ``"auto"``: :func:`~polyproj.backends.defaults.fallback_for`, on ``solver``'s unified settings.
    """
    from ..backends.defaults import fallback_for

    return choice if choice != "auto" else fallback_for(_on_cpu(X), X.shape[1], count, _unified(solver.settings))


def _run_by(name: str, X, data: PolyData, solver, opts: PolishOptions, idx) -> PipelineOutput:
    """The samples ``idx`` through their own pipeline on backend ``name`` (``solver``'s unified settings)."""
    from ..registry import get_backend

    xp = array_namespace(X)
    return run(xp.take(X, idx, axis=0), data.take(idx), get_backend(name, **_unified(solver.settings)),
               replace(opts, fallback="auto", nested=True))


def _unified(settings: dict) -> dict:
    from ..backends.base import SETTINGS

    return {k: v for k, v in settings.items() if k in SETTINGS and k != "warm_start"}


def _on_cpu(X: Any) -> bool:
    dev = _device(X)
    return str(getattr(dev, "type", dev)) == "cpu"


def _merge(xp, out: PipelineOutput, idx, sub: PipelineOutput, polished_only: bool = False) -> PipelineOutput:
    """``out`` with the samples ``idx`` replaced by ``sub`` (faces re-indexed into the batch).

    ``polished_only``: only the samples ``sub`` polished replace ``out``'s; a face record serves polished
    samples alone (:func:`~polyproj.projection.polish._record`), so ``sub``'s records are taken whole.
    """
    if polished_only and not bool(xp.any(sub.polished)):
        return out
    faces = list(out.faces)
    for rec in sub.faces:
        faces.append(FaceRecord(idx if rec.idx is None else xp.take(idx, rec.idx, axis=0), rec.use, rec.face))
    if polished_only:
        kept = xp.nonzero(sub.polished)[0]
        idx, sub = xp.take(idx, kept, axis=0), _rows_of(xp, sub, kept)
    mask = _index_mask(xp, idx, out.Y.shape[0])
    status = list(out.status)
    for k, i in enumerate(_host_ints(idx)):
        status[i] = sub.status[k]
    put = lambda full, part: scatter_rows(xp, full, mask, part)  # noqa: E731
    return replace(out, Y=put(out.Y, sub.Y), active=put(out.active, sub.active), mult=put(out.mult, sub.mult),
                   mu=put(out.mu, sub.mu), polished=put(out.polished, sub.polished), status=tuple(status),
                   faces=faces, viol=None, nondegenerate=False)


def _rows_of(xp, out: PipelineOutput, idx) -> PipelineOutput:
    """The samples ``idx`` of ``out`` without face records (:func:`_merge` takes the records separately)."""
    take = lambda v: xp.take(v, idx, axis=0)  # noqa: E731
    return replace(out, Y=take(out.Y), active=take(out.active), mult=take(out.mult), mu=take(out.mu),
                   polished=take(out.polished), status=tuple(out.status[i] for i in _host_ints(idx)), faces=[],
                   viol=None, nondegenerate=False)


def _index_mask(xp, idx, size: int):
    """Boolean mask of length ``size`` that is True at ``idx``."""
    mask = xp.zeros((size,), dtype=xp.bool, device=_device(idx))
    if hasattr(mask, "index_put_") or isinstance(mask, np.ndarray):  # torch, NumPy: assignment
        mask[idx] = True
        return mask
    return xp.any(xp.arange(size, device=_device(idx))[:, None] == idx[None, :], axis=1)


def _host_ints(v: Any) -> list[int]:
    return [int(i) for i in (v.tolist() if hasattr(v, "tolist") else list(v))]


# ----------------------------------------------------------------------------- unpolished points
#: an unverified row counts as active when its slack is within this many times the answer's own accuracy
#: (the backend's, or the point's own violation where that is larger) of its hyperplane (:func:`_unverified_active`)
UNVERIFIED_SLACK = 4.0


def _unverified_active(X, data: PolyData, Y, mult0, accuracy: float):
    """Active set of points that were not polished: the rows the backend's answer shows active at its accuracy.

    A row is active when the backend's multiplier is positive (above ``accuracy`` times the sample's largest)
    *and* the point lies on its hyperplane at the answer's own accuracy: a slack within
    :data:`UNVERIFIED_SLACK` times the larger of ``accuracy`` and the point's own violation (times
    ``1 + |rhs|``), or below the multiplier's pull ``mult ‖row‖²`` (an interior-point answer keeps its active
    rows at a slack ``μ / mult``, its barrier parameter over the multiplier; an inactive row has ``mult ≈ μ /
    slack``, far below its slack). Either signal alone is no evidence: a row 0.013 off its hyperplane with a
    zero multiplier was counted active under a slack tolerance of 100 × the setting (0.01–0.02 at 1e-4), and
    every such row fixes a direction of the HS-Jacobian (a zero gradient where it is 1).
    """
    xp = array_namespace(X)
    n, m = data.n, data.m
    batch = X.shape[0]
    rhs = xp.concat([xp.broadcast_to(data.a, (batch, m)), -xp.broadcast_to(data.lb, (batch, n)),
                     xp.broadcast_to(data.ub, (batch, n))], axis=1)
    fin = xp.isfinite(rhs)
    rhs0 = xp.where(fin, rhs, xp.zeros_like(rhs))
    Yf = xp.where(xp.isfinite(Y), Y, X)
    mscale = 1.0 + (xp.max(xp.abs(mult0), axis=1, keepdims=True) if mult0.shape[1] else 0.0)
    slack = ineq_slack(Yf, data.A, data.a, data.lb, data.ub)
    own = xp.reshape(data.violation(Yf), (-1, 1))  # the answer's own accuracy (its largest miss), per sample
    own = xp.where(xp.isfinite(own), own, xp.zeros_like(own))
    near = slack <= UNVERIFIED_SLACK * xp.maximum(own, xp.full_like(own, max(accuracy, 1e-12))) * (1.0 + xp.abs(rhs0))
    norm2 = xp.concat([xp.broadcast_to(data.row_norms[0] ** 2, (batch, m)),
                       xp.ones((batch, 2 * n), dtype=Y.dtype, device=_device(Y))], axis=1)
    return fin & (mult0 > accuracy * mscale) & (near | (slack < mult0 * norm2))


def _unpolished_output(X, data: PolyData, start: ProjectionStart, name: str, shown=None) -> PipelineOutput:
    """The backend's points as they are, with the active sets they show (``shown``, when already computed)."""
    xp = array_namespace(X)
    active = _unverified_active(X, data, start.y, start.mult, start.accuracy) if shown is None else shown
    mult = xp.where(start.mult > 0, start.mult, xp.zeros_like(start.mult))
    polished = xp.zeros((X.shape[0],), dtype=xp.bool, device=_device(X))
    return PipelineOutput(start.y, active, mult, start.mu, _checked_status(X, data, start), polished, name, [],
                          start)


def _checked_status(X, data: PolyData, start: ProjectionStart) -> tuple[Status, ...]:
    """The backend's statuses, a SOLVED demoted when its point is not finite or not feasible at its accuracy."""
    xp = array_namespace(X)
    viol = _host_floats(data.violation(start.y))
    size = _host_floats(xp.maximum(xp.max(xp.abs(X), axis=1), xp.max(xp.abs(xp.where(
        xp.isfinite(start.y), start.y, xp.zeros_like(start.y))), axis=1)))
    out = []
    for st, v, sz in zip(start.status, viol, size, strict=True):
        if st is Status.SOLVED and not np.isfinite(v):
            st = Status.NUMERICAL_ERROR
        elif st is Status.SOLVED and v > max(1e-6, 100.0 * start.accuracy) * (1.0 + sz):
            st = Status.SOLVED_INACCURATE
        out.append(st)
    return tuple(out)


def _host_floats(v: Any) -> list[float]:
    return [float(b) for b in (v.tolist() if hasattr(v, "tolist") else list(v))]


#: polish rounds when the backend's ``time_limit`` cut some start short (the polish verifies a start that is good
#: enough at once; more rounds from poor ones spend seconds after the caller's limit)
LATE_ROUNDS = 2


def _spent(opts: PolishOptions, start: ProjectionStart) -> bool:
    """Whether the caller's ``time_limit`` has passed: its deadline (:attr:`PolishOptions.deadline`), or a start it cut.

    Past it no retry or fallback starts (another backend's solve, an accurate solve again, more polish rounds):
    the points keep what they have, with honest statuses.
    """
    if any(s is Status.TIME_LIMIT for s in start.status):
        return True
    return opts.deadline is not None and time.perf_counter() >= opts.deadline


def _no_face(data: PolyData, shown):
    """(b,) bool: starts that show no face of the polyhedron: more active rows than coordinates.

    ``shown``: the rows the backend's answer shows active at its accuracy (:func:`_unverified_active`); with the
    equality rows they outnumber the coordinates at an interior-point iterate stopped early, whose multipliers are
    all of the order ``μ / slack`` (n 40, m 80 and a box: ~90 of the 160 inequality rows at every point). The polish
    would start from an inconsistent face there (SVDs of big faces, one row dropped a round): seconds for 2,000
    points, where an identified face (the ADMM's start, a start near its end: ~35 rows) is verified in one cheap
    round.
    """
    xp = array_namespace(shown)
    return xp.sum(xp.astype(shown, xp.int64), axis=1) + data.p > data.n


def _late_polish(X, data: PolyData, solver, opts: PolishOptions, start: ProjectionStart, late, rounds: int,
                 handoff: int) -> PipelineOutput:
    """The polish after the caller's ``time_limit`` cut some starts short (``late``): ``rounds`` at most.

    A late start that shows no face (:func:`_no_face`) or has no finite point (never begun) is not polished:
    polishing it would cost more than the solve the limit cut short. The other samples get the short polish. The
    late samples it does not verify keep the backend's point and the active set it shows, with their status
    TIME_LIMIT and a warning; no retry or fallback runs after the caller's limit (:func:`_fall_back` leaves them).
    """
    xp = array_namespace(X)
    shown = _unverified_active(X, data, start.y, start.mult, start.accuracy)
    # a start with no finite point was never begun (a per-point backend stopped by the limit before it): its
    # "polish" would be a whole solve from the input point, the work the limit forbids; it keeps its NaN point as
    # TIME_LIMIT
    unstarted = ~xp.all(xp.isfinite(start.y), axis=1)
    blind = late & (_no_face(data, shown) | unstarted)
    if not bool(xp.any(blind)):
        out = _output(data, start, _polish(X, data, start, opts, rounds, handoff=handoff), solver.name)
    else:
        out = _unpolished_output(X, data, start, solver.name, shown)
        if not bool(xp.all(blind)):
            idx = xp.nonzero(~blind)[0]
            sub, ds = _take_start(xp, start, idx), data.take(idx)
            part = _polish(xp.take(X, idx, axis=0), ds, sub, opts, rounds, handoff=handoff)
            out = _merge(xp, out, idx, _output(ds, sub, part, solver.name))
    keep = late & ~out.polished
    count = int(xp.sum(xp.astype(keep, xp.int64)))
    if not count:
        return out
    warnings.warn(f"time_limit reached: {count} of {keep.shape[0]} points keep backend {solver.name!r}'s "
                  "time-limited answer (status TIME_LIMIT, not polished: not the exact projection; their gradient is "
                  "that of the approximate active set the answer shows)",
                  PolyprojWarning, stacklevel=5)
    return _keep_start(X, data, out, keep, shown)


def _keep_start(X, data: PolyData, out: PipelineOutput, refused, shown=None) -> PipelineOutput:
    """Refused samples keep the backend's point (its start) and the active set it shows.

    That set is :func:`_unverified_active`'s (``shown``, when already computed).
    """
    xp = array_namespace(X)
    st = out.start
    active = _unverified_active(X, data, st.y, st.mult, st.accuracy) if shown is None else shown
    mult = xp.where(st.mult > 0, st.mult, xp.zeros_like(st.mult))
    r = refused[:, None]
    return replace(out, Y=xp.where(r, st.y, out.Y), active=xp.where(r, active, out.active),
                   mult=xp.where(r, mult, out.mult), mu=xp.where(r, st.mu, out.mu))


# ----------------------------------------------------------------------------- false infeasibility
def _with_status(like, start: ProjectionStart, status: Status):
    """(batch,) bool in ``like``'s namespace: the samples whose start has ``status``."""
    xp = array_namespace(like)
    return xp.asarray([s is status for s in start.status], dtype=xp.bool, device=_device(like))


def _flags(xp, start: ProjectionStart, like):
    return _with_status(like, start, Status.PRIMAL_INFEASIBLE)


def _feasible(xp, data: PolyData, Y, ok):
    """Samples solved to a finite point of the polyhedron (a proof that it is not empty)."""
    viol = data.violation(xp.where(xp.isfinite(Y), Y, xp.zeros_like(Y)))
    return ok & xp.all(xp.isfinite(Y), axis=1) & (viol <= 1e-5 * (1.0 + xp.max(xp.abs(Y), axis=1)))


def _recover(solver, X, data: PolyData, start: ProjectionStart):
    """Re-solve samples reported PRIMAL_INFEASIBLE (see the module docstring).

    Returns the patched start, the samples still flagged (their point is NaN; the polish from ``x`` may
    still verify them) and the start of the warning :func:`run` completes (None when nothing was flagged).
    """
    xp = array_namespace(X)
    flagged = _flags(xp, start, X)
    if not bool(xp.any(flagged)):
        return start, flagged, None
    if not data.batched:  # one polyhedron: its LP decides before any backend's loose "feasible" point does
        _raise_if_empty(solver, data, start, start.y, X)
    ok = xp.asarray([s.ok for s in start.status], dtype=xp.bool, device=_device(X))
    # one polyhedron for the batch: a sample solved to a point of it proves it is not empty
    has_donor = not data.batched and bool(xp.any(_feasible(xp, data, start.y, ok)))
    total = int(xp.sum(xp.astype(flagged, xp.int64)))
    head = f"backend {solver.name!r} reported PRIMAL_INFEASIBLE for {total} of {len(start.status)} points "
    report = ""
    if has_donor:
        start, good = _one_by_one(solver, X, data, start, flagged)
        report = head + ("although others were solved to feasible points of the same polyhedron; solved again one "
                         f"by one: {good} recovered")
        flagged = _flags(xp, start, X)
    if bool(xp.any(flagged)):
        start, report = _second_opinion(solver, X, data, start, flagged, has_donor, head, report)
    flagged = _flags(xp, start, X)
    y = xp.where(flagged[:, None], xp.full_like(start.y, float("nan")), start.y)
    return replace(start, y=y), flagged, report


def _probe(solver, X, data: PolyData) -> bool:
    """Whether ``solver`` projects the origin, moved into the finite bounds, to a point of the (shared) polyhedron."""
    xp = array_namespace(X)
    zero = xp.zeros((1, data.n), dtype=X.dtype, device=_device(X))
    lb = xp.where(xp.isfinite(data.lb), data.lb, xp.zeros_like(data.lb))
    ub = xp.where(xp.isfinite(data.ub), data.ub, xp.zeros_like(data.ub))
    probe = xp.minimum(xp.maximum(zero, xp.reshape(lb, (1, -1))), xp.reshape(ub, (1, -1)))
    got = _projections(solver, probe, data)
    one = xp.asarray([got.status[0].ok], dtype=xp.bool, device=_device(X))
    return bool(_feasible(xp, data, got.y, one)[0])


def _as_solution(start: ProjectionStart, data: PolyData, name: str) -> Any:
    """A start without a backend record (the IPM's, the ADMM's) as a BatchSolution in the QP's layout.

    ``z`` = the rows of A, then B's; ``z_box`` upper positive (:func:`~polyproj.polydata.rows_to_qp_multipliers`).
    """
    from ..linalg import to_host
    from ..polydata import rows_to_qp_multipliers

    y, mult, mu = (np.asarray(to_host(v), dtype=np.float64) for v in (start.y, start.mult, start.mu))
    z, z_box = rows_to_qp_multipliers(np, mult, mu, data.m)
    return BatchSolution(x=y, z=z, z_box=z_box, status=tuple(start.status),
                         iterations=np.zeros(y.shape[0], dtype=np.int64), backend=name)


def _one_by_one(solver, X, data: PolyData, start: ProjectionStart, flagged):
    xp = array_namespace(X)
    idx = _host_ints(xp.nonzero(flagged)[0])
    good = 0
    for i in idx:
        sel = xp.asarray([i], device=_device(X))
        again = _projections(solver, xp.take(X, sel, axis=0), data.take(sel))
        one = xp.asarray([True], device=_device(X))
        if again.status[0].ok and bool(_feasible(xp, data.take(sel), again.y, one)[0]):
            start = _patch_start(xp, start, sel, again)
            good += 1
    return start, good


def _renumbered(err: InfeasibleError, solver, data: PolyData, start, idx: list) -> InfeasibleError:
    """``err`` of a run on the samples ``idx`` as this batch's: the first empty one named in its numbering."""
    sol = getattr(err, "solution", None)
    status = getattr(sol, "status", ())
    if not isinstance(status, (tuple, list)):
        status = (status,)
    hit = [k for k, s in enumerate(status) if s is Status.PRIMAL_INFEASIBLE and k < len(idx)]
    sample = idx[hit[0]] if hit else (idx[0] if len(idx) == 1 else None)
    where = f"; sample {sample}'s polyhedron is empty" if sample is not None and data.batched else ""
    return _empty(solver, data, start, f" or fails{where}", sample=sample)


def _empty(solver, data: PolyData, start, why: str = "", sample: int | None = None) -> InfeasibleError:
    """The InfeasibleError of an empty polyhedron, carrying ``solver``'s answer (``why``: what else says so).

    ``sample``: the per-sample polyhedron found empty, PRIMAL_INFEASIBLE in the answer carried.
    """
    sol = start.solution if start.solution is not None else _as_solution(start, data, solver.name)
    if sample is not None and isinstance(sol, BatchSolution) and 0 <= sample < len(sol.status):
        status = list(sol.status)
        status[sample] = Status.PRIMAL_INFEASIBLE
        sol = replace(sol, status=tuple(status))
    return InfeasibleError(f"the polyhedron is empty (backend {solver.name!r} reports PRIMAL_INFEASIBLE{why}): "
                           f"{Status.PRIMAL_INFEASIBLE.message}", solution=sol)


#: an InfeasibleError of per-sample polyhedra names at most this many empty samples
NAMED_SAMPLES = 5


def _empty_samples(solver, data: PolyData, start, samples: list[int]) -> InfeasibleError:
    """The InfeasibleError of per-sample polyhedra of which no backend found a point: the first few ``samples``."""
    shown = ", ".join(str(i) for i in samples[:NAMED_SAMPLES])
    more = f" and {len(samples) - NAMED_SAMPLES} more" if len(samples) > NAMED_SAMPLES else ""
    which = f"sample {shown}'s polyhedron is empty: no backend found a point of it" if len(samples) == 1 else \
        f"the polyhedra of samples {shown}{more} are empty: no backend found a point of them"
    return _empty(solver, data, start, f"; {which}", sample=samples[0])


#: a polyhedron whose least uniform violation (:func:`~polyproj.projection.emptiness.least_violation`) exceeds this
#: times (1 + its size) is empty: a backend's point "feasible" at its own tolerance does not say otherwise
EMPTY_GAP = 1e-8


def _second_opinion(solver, X, data: PolyData, start, flagged, has_donor: bool, head: str, report: str):
    """The still-flagged samples by an independent backend; raise when nothing proves the set non-empty."""
    from ..backends.defaults import independents_of
    from ..registry import get_backend

    xp = array_namespace(X)
    empty = _empty(solver, data, start)
    others = independents_of(solver.name)
    if not others:
        if data.batched:  # (per-sample data have no donor)
            raise _empty_samples(solver, data, start, _host_ints(xp.nonzero(flagged)[0]))
        if not has_donor and not _probe(solver, X, data):
            raise empty
        return start, report or head + "but the polyhedron is not empty (a point at its scale projects into it)"
    idx = xp.nonzero(flagged)[0]
    for other in others:
        # the next opinion where one solves none (the IPM's MAX_ITER on equalities of condition 4e6, where HiGHS
        # solves both points and DAQP's own probe fails its dependence test: a non-empty set was called empty)
        again = _projections(get_backend(other), xp.take(X, idx, axis=0), data.take(idx))
        ok = xp.asarray([s.ok for s in again.status], dtype=xp.bool, device=_device(X))
        good = _feasible(xp, data.take(idx), again.y, ok)
        count = int(xp.sum(xp.astype(good, xp.int64)))
        if count:
            break
    else:  # none solved any: the report names the first opinion asked
        other = others[0]
    label = f"backend {other!r}"
    if (has_donor or count) and count < int(idx.shape[0]):
        # the set is not empty (a sample solved, or another backend's solve): the exact per-point fallback on the
        # rest, before the polish from x (a sample it cannot verify would be returned as NaN)
        again, good, label = _exact_opinion(solver, X, data, idx, again, good, other)
        count = int(xp.sum(xp.astype(good, xp.int64)))
    if data.batched and count < int(idx.shape[0]):  # per-sample polyhedra: a sample no backend solves is empty
        raise _empty_samples(solver, data, start, _host_ints(xp.take(idx, xp.nonzero(~good)[0], axis=0)))
    if not has_donor and count == 0:
        if not _probe(solver, X, data):
            raise empty
        # points far outside (|x| ≫ the polyhedron) can fail on every backend where the set is not empty
        return start, head + (f"and backend {other!r} solved none, but the polyhedron is not empty (a point at "
                              "its scale projects into it)")
    if count:
        gidx = xp.nonzero(good)[0]
        start = _patch_start(xp, start, xp.take(idx, gidx, axis=0), _take_start(xp, again, gidx))
    if not has_donor:
        by = "them" if " and " in label else "it"
        return start, head + f"and solved none; {label} found them feasible: {count} solved by {by}"
    return start, report + (f"; {label} solved {count} it kept flagging" if count else "")


def _exact_opinion(solver, X, data: PolyData, idx, again: ProjectionStart, good, other: str):
    """The samples ``idx`` that backend ``other`` did not solve (``good`` False), by the exact fallback.

    A dual active-set method (:func:`~polyproj.backends.defaults.fallback_for` on the CPU) is exact on its
    final working set however far a point lies, where interior-point and ADMM tolerances relative to
    ``|x|`` fail. Returns the merged start, the new ``good`` and the backends' names for the report.
    """
    from ..backends.defaults import EXACT_FALLBACK, _available
    from ..registry import get_backend

    xp = array_namespace(X)
    rest = xp.nonzero(~good)[0]
    name = _fallback_name(X, solver, "auto", int(rest.shape[0]))
    if name in (solver.name, other) and _on_cpu(X) and EXACT_FALLBACK not in (solver.name, other) \
            and _available(EXACT_FALLBACK, **_unified(solver.settings)):
        name = EXACT_FALLBACK  # samples two backends failed: exactness before speed, whatever their count
    if name in (solver.name, other):
        return again, good, f"backend {other!r}"
    sel = xp.take(idx, rest, axis=0)
    third = _projections(get_backend(name, **_unified(solver.settings)), xp.take(X, sel, axis=0), data.take(sel))
    ok = xp.asarray([s.ok for s in third.status], dtype=xp.bool, device=_device(X))
    fixed = _feasible(xp, data.take(sel), third.y, ok)
    if not bool(xp.any(fixed)):
        return again, good, f"backend {other!r}"
    again = _patch_start(xp, again, rest, third)
    return again, good | _index_mask(xp, xp.take(rest, xp.nonzero(fixed)[0], axis=0), int(good.shape[0])), \
        f"backends {other!r} and {name!r}"


def _take_start(xp, s: ProjectionStart, idx) -> ProjectionStart:
    keep = _host_ints(idx)
    return replace(s, y=xp.take(s.y, idx, axis=0), mult=xp.take(s.mult, idx, axis=0), mu=xp.take(s.mu, idx, axis=0),
                   status=tuple(s.status[i] for i in keep), solution=None)


def _patch_start(xp, start: ProjectionStart, idx, part: ProjectionStart) -> ProjectionStart:
    """``start`` with samples ``idx`` replaced by ``part``."""
    mask = _index_mask(xp, idx, start.y.shape[0])
    order = xp.argsort(idx)  # scatter_rows fills the mask's True rows in increasing order
    part = _take_start(xp, part, order)
    status = list(start.status)
    for k, i in enumerate(sorted(_host_ints(idx))):
        status[i] = part.status[k]
    return replace(start, y=scatter_rows(xp, start.y, mask, part.y), mult=scatter_rows(xp, start.mult, mask, part.mult),
                   mu=scatter_rows(xp, start.mu, mask, part.mu), status=tuple(status))
