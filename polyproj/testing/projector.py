"""``check_projector``: the projection and HS-Jacobian property suites on any :class:`~polyproj.sets.Projector`.

What runs on a set ``S`` (``P = S.as_polyhedron()`` gives the rows the checks use), on seeded random points at
several multiples of the set's scale (its extent: :func:`_center_scale`), points on the set, points with tied
coordinates, points just outside, just inside and on the boundary (1e-1 down to 1e-7 of the set's scale:
:func:`boundary_points`), far points (1e2 and 1e4 times the set's scale: :data:`FAR_SCALES`) and points whose
projection has a weakly active row (degenerate: several HS elements nearby):

=====================  ===========================================================================
property               what it checks
=====================  ===========================================================================
projection             KKT from scratch (stationarity, signs, complementarity, feasibility),
                       idempotence, firm non-expansiveness, the variational inequality
agreement              ``S.project`` equals the generic QP projection of ``P`` (``backend``, polished)
vjp                    ``S.vjp`` equals the HS-Jacobian of ``P`` at the reported active set
conservativity         along segments through degenerate points: the path integral of ``J d`` over
                       the kinks equals the chord, and ``d/dt Π(x(t)) = J d`` a.e., for every HS element
namespaces             torch (when installed) and ``array_api_strict`` give the NumPy answer (to
                       rounding where it is exact, to ``tol`` within the polish's tolerance of a face),
                       and its active flags on every row the NumPy answer decides (:func:`_decided`)
torch vjp              ``S.vjp`` of a torch result and cotangent (what the layer's backward calls) is a
                       tensor equal to the NumPy product where the two active sets agree, and to the
                       HS-Jacobian product of torch's own active set where they differ on undecided rows
                       (on a decided row the flags themselves fail)
float32                float32 inputs (NumPy, torch) give float32 answers within :data:`FLOAT32_TOL`
                       (relative to ``1 + |x| + |y|``) of the float64 ones, with the float64 active flags
                       on every row decided beyond that tolerance
=====================  ===========================================================================
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..linalg import to_host
from .check import CheckReport, PropertyResult, check_arguments
from .properties import finite_or_fail

__all__ = ["BOUNDARY_DISTANCES", "boundary_points", "check_projector", "projector_points"]


def _center_scale(S: Any, P: Any) -> tuple[np.ndarray, float]:
    """A point of the set (``y0 = Π(0)``) and the set's length scale: how far its boundary lies from ``y0``.

    The scale is the largest distance from ``y0`` of a row's hyperplane (``|h_i − G_i y0| / |G_i|`` over the
    finite rows of ``P``), at most the farthest corner of the box from ``y0`` where every coordinate has both
    bounds (a hyperplane beyond it does not meet the set). Where no row lies off ``y0`` (a cone with apex
    ``y0``, an affine space), ``1 + |y0|``. The samples, the boundary points and the tolerances' floor follow
    it: at ``1 + |Π(0)|`` a box of ±1e6 whose upper bound was never applied had no sample near its boundary, and
    a box of ±1e-6 whose answers were 1e-9 off passed tolerances of ~1e-9 absolute.
    """
    from .properties import ineq_form

    y0 = np.asarray(S.project(np.zeros(S.n)).y, dtype=float).reshape(-1)
    finite_or_fail(np.zeros((1, S.n)), y0[None, :])
    G, h = ineq_form(P)
    norm = np.linalg.norm(G, axis=1) if G.size else np.zeros(0)
    ok = np.isfinite(h) & (norm > 0)
    reach = float(np.max(np.abs(h[ok] - G[ok] @ y0) / norm[ok], initial=0.0))
    if P.n and np.all(np.isfinite(P.lb)) and np.all(np.isfinite(P.ub)):
        corner = float(np.linalg.norm(np.maximum(np.abs(P.ub - y0), np.abs(y0 - P.lb))))
        reach = min(reach, corner)
    if not (np.isfinite(reach) and reach > 0):
        reach = 1.0 + float(np.abs(y0).max(initial=0.0))
    return y0, reach


def _unit(sc: float) -> float:
    """The absolute floor of the checks' tolerances (``tol · (unit + |x|)``): 1, or the set's scale when smaller.

    A set of size 1e-6 held to ``tol · (1 + |x|)`` had a tolerance a million times its own rounding level.
    """
    return min(1.0, sc)


#: distances of the points near the boundary, relative to the set's scale (:func:`boundary_points`): down to
#: 1e-7, above the agreement check's tolerance (1e-9 relative), so that a set that leaves the points within a
#: band of the boundary unprojected (``excess > 1e-3``, or 1e-6) is seen
BOUNDARY_DISTANCES = (1e-1, 1e-3, 1e-5, 1e-7)


#: how far beyond the set's scale the far samples lie (:func:`_sampled`)
FAR_SCALES = (1e2, 1e4)


def boundary_points(S: Any, X: np.ndarray, sc: float, count: int, Y: np.ndarray | None = None) -> np.ndarray:
    """Points just outside, just inside and exactly on the boundary, at :data:`BOUNDARY_DISTANCES` × ``sc``.

    From up to ``count`` points ``x`` of ``X`` outside the set (``y = Π(x) ≠ x``, the set's own projection):
    ``y`` itself (on the boundary); ``y + t n`` with the unit normal ``n = (x − y) / |x − y|``, which projects
    to ``y`` again (``x − y`` lies in the normal cone at ``y``, and so does ``t n``): just outside at distance
    ``t``; and ``y + s (c − y)``, ``c`` the mean of the projections of ``X`` (a point of the convex set, so the
    segment from ``y`` lies in it), ``s = min(t / |c − y|, ½)``: just inside (or on the boundary where ``c``
    shares ``y``'s face). Random samples almost never come this close to a face: a set that leaves points
    within ``1e-3`` outside unprojected passed every check on them. ``Y``: the projections of ``X`` when known.
    """
    if Y is None:
        Y = np.asarray(S.project(X).y, dtype=float).reshape(X.shape)
    c = Y.mean(axis=0)
    off = np.linalg.norm(X - Y, axis=1)
    out = np.flatnonzero(off > 1e-3 * sc)[:count]
    pts = []
    for i in out:
        y, nrm = Y[i], (X[i] - Y[i]) / off[i]
        inward = c - y
        span = float(np.linalg.norm(inward))
        pts.append(y[None, :])
        for t in BOUNDARY_DISTANCES:
            pts.append((y + t * sc * nrm)[None, :])
            if span > 0:
                pts.append((y + min(t * sc / span, 0.5) * inward)[None, :])
    return np.vstack(pts).reshape(-1, S.n) if pts else np.zeros((0, S.n))


def _sampled(S: Any, rng: np.random.Generator, count: int, P: Any = None) -> tuple[np.ndarray, np.ndarray, float]:
    """The random points (several scales, on the set, tied coordinates), the points near the boundary, the scale."""
    y0, sc = _center_scale(S, S.as_polyhedron() if P is None else P)
    k = max(count // 4, 1)
    X = [y0 + sc * s * rng.standard_normal((k, S.n)) for s in (0.1, 1.0, 5.0)]
    outer = np.vstack(X[1:])
    Y_outer = np.asarray(S.project(outer).y, dtype=float).reshape(outer.shape)  # once, for both uses
    finite_or_fail(outer, Y_outer)
    ties = sc * np.round(X[1] / sc * 2) / 2  # multiples of half the scale: many equal coordinates
    near = boundary_points(S, outer, sc, max(count // 4, 2), Y=Y_outer)
    # far points (FAR_SCALES times the set's scale, along the unit-scale samples' directions, no new draws): a
    # set wrong only beyond |x| ~ 30 passed every check on samples that never left |x| < 16
    far = [y0 + s * (X[1][: max(k // 2, 1)] - y0) for s in FAR_SCALES]
    return np.vstack([*X, Y_outer[:k], ties]), np.vstack([near, *far]), sc


def projector_points(S: Any, rng: np.random.Generator, count: int) -> np.ndarray:
    """Random points for the checks: several scales around the set, points on it, tied coordinates.

    And points just outside, just inside and on the boundary (:func:`boundary_points`).
    """
    X, near, _ = _sampled(S, rng, count)
    return np.vstack([X, near])


def _degenerate(S: Any, P: Any, X: np.ndarray, rng: np.random.Generator, sc: float = 1.0) -> np.ndarray:
    """Points ``y + Gᵀλ' + Bᵀμ`` with one positive multiplier of an active row set to zero (weakly active).

    A multiplier is positive when its row's share of ``x − y`` (``λ_i |G_i|``, a distance) exceeds
    ``1e-6 (unit + |x|)``, the kit's rule for tolerances (:func:`_unit`): at ``λ > 1e-6`` absolute a set 1e-7
    across had none, its conservativity was skipped, and a set reporting no active row passed.
    """
    from .properties import ineq_form

    res = S.project(X)
    G, _ = ineq_form(P)
    norm = np.linalg.norm(G, axis=1)
    ni = P.n_ineq
    unit = _unit(sc)
    out = []
    for i in range(X.shape[0]):
        lam, mu = np.asarray(res.multipliers[i][:ni]), np.asarray(res.multipliers[i][ni:])
        pos = np.flatnonzero(lam * norm > 1e-6 * (unit + float(np.abs(X[i]).max(initial=0.0))))
        if pos.size == 0:
            continue
        lam2 = lam.copy()
        lam2[rng.choice(pos)] = 0.0
        out.append(np.asarray(res.y[i]) + G.T @ lam2 + (P.B_dense.T @ mu if P.m_eq else 0.0))
    return np.array(out).reshape(-1, S.n)


def _run(name: str, group: str, fn, *args) -> PropertyResult:
    t0 = time.perf_counter()
    try:
        counts = fn(*args)
    except AssertionError as exc:
        return PropertyResult(name, group, "failed", message=str(exc), seconds=time.perf_counter() - t0)
    except SystemExit as exc:  # a set's sys.exit() would end the check (status 0 possible): its error row
        from .check import _exited

        return PropertyResult(name, group, "error", message=_exited(exc), seconds=time.perf_counter() - t0)
    except Exception as exc:  # the check crashed: report, do not hide
        return PropertyResult(name, group, "error", message=f"{type(exc).__name__}: {exc}",
                              seconds=time.perf_counter() - t0)
    if isinstance(counts, str):
        return PropertyResult(name, group, "skipped", message=counts, seconds=time.perf_counter() - t0)
    return PropertyResult(name, group, "passed", examples=int(next(iter(counts.values()), 0)), counts=counts,
                          seconds=time.perf_counter() - t0)


def _setup(S: Any, rng: np.random.Generator, examples: int) -> dict[str, Any]:
    """The set's polyhedron and the checks' points; a set whose methods fail here fails the report."""
    from ..errors import ProblemError
    from ..problem import Polyhedron

    P = S.as_polyhedron()
    if not isinstance(P, Polyhedron):
        raise AssertionError(f"S.as_polyhedron() returned {type(P).__name__}, not a pp.Polyhedron")
    if P.n != S.n:
        raise ProblemError(f"S.as_polyhedron() has {P.n} variables but S.n is {S.n}")
    X, near, sc = _sampled(S, rng, examples, P)
    Xd = _degenerate(S, P, X.copy(), rng, sc)  # from the random points: conservativity's segments as before
    return {"points": X.shape[0] + near.shape[0], "_data": (P, X, near, Xd, sc)}


def _agreement(S: Any, P: Any, X: np.ndarray, backend: Any, tol: float, unit: float = 1.0) -> dict[str, int]:
    from ..api import project

    got = np.asarray(S.project(X).y, dtype=float).reshape(X.shape)
    finite_or_fail(X, got)
    ref = project(X, P, backend=backend, eps_abs=1e-10)
    scale = unit + np.abs(X).max(axis=1)
    err = np.abs(got - ref.y).max(axis=1) / scale
    err = np.where(np.isfinite(err), err, np.inf)  # NaN in the answer is a failure, not a pass
    if np.any(err > tol):
        i = int(np.argmax(err))
        raise AssertionError(f"S.project differs from the QP projection ({ref.backend}) by {err[i]:.3g} (relative) "
                             f"at x = {X[i].tolist()}: {got[i].tolist()} vs {ref.y[i].tolist()}")
    return {"points": X.shape[0]}


def _vjp(S: Any, P: Any, X: np.ndarray, rng: np.random.Generator, tol: float, near: np.ndarray | None = None,
         near_rng: np.random.Generator | None = None) -> dict[str, int]:
    from ..projection.hs_jacobian import hs_vjp

    G = rng.standard_normal(X.shape)
    if near is not None and near.shape[0]:  # their own stream: the conservativity's draws stay as they were
        X = np.vstack([X, near])
        G = np.vstack([G, near_rng.standard_normal(near.shape)])
    res = S.project_batch(X)
    given = G.copy()
    out = S.vjp(res, G)
    if not np.array_equal(G, given):  # the caller's cotangent (the torch layer hands over the user's gradient)
        raise AssertionError("S.vjp wrote into the cotangent G it was given; it must leave its input alone")
    got = np.asarray(out, dtype=float) if out is not None else None
    if got is None or got.shape != G.shape:
        raise AssertionError(f"S.vjp returned {'None' if got is None else f'shape {got.shape}'} for G of shape "
                             f"{G.shape}; expected an array of G's shape")
    ref = hs_vjp(P, np.asarray(res.active), G)
    err = np.abs(got - ref).max(axis=1)
    err = np.where(np.isfinite(err), err, np.inf)  # NaN in the product is a failure, not a pass
    if np.any(err > tol * (1.0 + np.abs(G).max(axis=1))):
        i = int(np.argmax(err))
        raise AssertionError(f"S.vjp differs from the HS-Jacobian of the active set by {err[i]:.3g} at x = "
                             f"{X[i].tolist()} (active {np.flatnonzero(np.asarray(res.active[i])).tolist()})")
    return {"points": X.shape[0]}


def _magnified(S: Any, P: Any, c: float) -> tuple[Any, Any]:
    """``S`` and ``P`` seen ``1/c`` times larger: ``Π(x) = Π_S(c x) / c`` onto ``P / c``.

    The same rows and active sets, the multipliers over ``c``, the HS-Jacobian at ``x`` that of ``S`` at ``c x``.
    """
    from dataclasses import replace

    from ..problem import Polyhedron
    from ..sets.base import Projector

    class Magnified(Projector):
        n = S.n

        def project_batch(self, X):
            r = S.project(X * c)
            return replace(r, y=r.y / c, multipliers=r.multipliers / c, violation=r.violation / c,
                           max_violation=r.max_violation / c, face=r)

        def vjp(self, result, G):
            return S.vjp(result.face, G)

        def as_polyhedron(self):
            return Pm

    Pm = Polyhedron(A=P.A, a=P.a / c, B=P.B, b=P.b / c, lb=P.lb / c, ub=P.ub / c, n=P.n,
                    allow_dependent_rows=True)
    return Magnified(), Pm


def _conservativity(S: Any, P: Any, Xd: np.ndarray, rng: np.random.Generator,
                    sc: float = 1.0) -> dict[str, int] | str:
    """Conservativity along segments through the degenerate points, of the set's length (``sc``).

    Segments of the set's scale cross its faces (unit segments never left a face of a box of ±1e6, and crossed
    dozens of a 50-dimensional simplex's). A set smaller than 1 is checked magnified to unit scale
    (:func:`_magnified`, the floor :func:`_unit`'s rule): the property's tolerances are absolute at unit scale
    (the path integral's ``1e-7 (1 + |d| + |x0|)``, the HS set's 1e-9), and on a set 1e-7 across the chord was
    within them whatever the Jacobian, while a row 1e-3 of a box of ±1e-6 from its kink was taken as weakly
    active.
    """
    from .properties import check_conservativity

    if Xd.shape[0] == 0:
        return ("NOT CHECKED (the HS-Jacobian's conservativity is untested): no sample had an active row with a "
                "positive multiplier")
    note = ""
    if sc < 1.0:
        S, P = _magnified(S, P, sc)
        note = f" (on the set magnified to unit scale: the points and values above are the set's divided by {sc:.3g})"
        Xd, sc = Xd / sc, 1.0
    total: dict[str, int] = {}
    for x in Xd[:4]:
        D = sc * rng.standard_normal((4, S.n))
        s = rng.uniform(0.2, 0.8, size=4)
        case = SimpleNamespace(point=SimpleNamespace(polyhedron=P), directions=D, s=s,
                               x0=x[None, :] - s[:, None] * D)
        try:
            part = check_conservativity(case, S, rng=rng)
        except AssertionError as exc:
            raise AssertionError(f"{exc}{note}") from None
        for k, v in part.items():
            total[k] = total.get(k, 0) + v
    return total


def _input_kept(S: Any, X: np.ndarray) -> dict[str, int]:
    """Projecting leaves the caller's array as it was (and the result does not alias it).

    The set's own ``project_batch`` (``project`` and the layer hand a third party's set a copy: this check is
    what tells its author).
    """
    mine = X.copy()
    res = S.project_batch(mine)
    if not np.array_equal(mine, X):
        raise AssertionError("project_batch() changed the array it was given")
    if np.shares_memory(np.asarray(res.y), mine):
        raise AssertionError("the projection's y aliases the caller's array")
    return {"points": int(X.shape[0])}


def _decided(P: Any, X: np.ndarray, Y: np.ndarray, A: np.ndarray, margin: np.ndarray) -> np.ndarray:
    """The rows whose active flag NumPy's float64 answer decides beyond ``margin`` (per point): (points, rows) bool.

    At an exact KKT point (:func:`~.properties.exact_certificate`), a row off the active set whose hyperplane
    lies farther than ``margin`` from ``y`` (``slack / |G_i|``) is inactive, and an active row whose multiplier
    is positive beyond ``margin`` is active: under LICQ (``M = [G_I; B]`` independent, the multiplier ``ν`` of
    ``x − y = Mᵀν`` unique) ``ν_k / √((M Mᵀ)⁻¹)_kk``, ``ν_k`` times the distance of row ``k`` from the others' span:
    how far ``x`` moves before ``ν_k`` reaches 0; else the residual of ``x − y`` on the cone of the other active
    rows and the equalities (non-negative least squares: ``ν_k > 0`` in every multiplier). Strictly
    complementary rows, which an input moved by less than ``margin`` (another namespace's rounding, float32's)
    does not flip, so every namespace and dtype must report them as NumPy does. The others (weakly active rows,
    a dependent row another can stand in for, an answer decided only at the polish's tolerance) are a choice
    among HS elements that a set may make either way.
    """
    from ..linalg import nnls
    from .properties import _independent_rows, _rank, exact_certificate, ineq_form

    G, h = ineq_form(P)
    Bm = P.B_dense.reshape(-1, P.n)
    Bi = _independent_rows(Bm)  # the same row space (a Birkhoff polytope's 2k sums have rank 2k − 1)
    norm = np.linalg.norm(G, axis=1)
    out = np.zeros(A.shape, dtype=bool)
    for i in range(X.shape[0]):
        act = A[i]
        if not exact_certificate(P, X[i], Y[i], act):
            continue
        with np.errstate(divide="ignore", invalid="ignore"):  # a zero row (norm 0) is never decided
            out[i] = ~act & (norm > 0) & ((h - G @ Y[i]) / norm > margin[i])
        rows, r = np.flatnonzero(act), X[i] - Y[i]
        M = np.vstack([G[rows], Bi])
        if _rank(M) == M.shape[0]:
            inv = np.linalg.inv(M @ M.T)
            out[i, rows] = (inv @ (M @ r))[: rows.size] / np.sqrt(np.diag(inv)[: rows.size]) > margin[i]
            continue
        for k in rows:
            M = np.vstack([G[rows[rows != k]], Bm, -Bm])  # μ = μ⁺ − μ⁻ for the equalities
            out[i, k] = (nnls(M.T, r)[1] if M.shape[0] else float(np.linalg.norm(r))) > margin[i]
    return out


def _flags_agree(what: str, X: np.ndarray, A: np.ndarray, other: Any, decided: np.ndarray) -> None:
    """``other`` (another namespace's or dtype's active flags) equals NumPy's ``A`` on the decided rows.

    A set whose torch branch flagged no row active passed every check (``y`` agreed) while the layer's gradient
    was the identity.
    """
    got = to_host(other).reshape(A.shape) != 0
    bad = decided & (got != A)
    if np.any(bad):
        pts = np.flatnonzero(bad.any(axis=1))
        i = int(pts[0])
        raise AssertionError(
            f"{what} inputs report other active rows than NumPy's float64 answer at {pts.size} point(s) where "
            f"it is strictly complementary: at x = {X[i].tolist()} rows {np.flatnonzero(bad[i]).tolist()} "
            f"(active with NumPy: {np.flatnonzero(A[i]).tolist()}, with {what}: {np.flatnonzero(got[i]).tolist()}); "
            f"points {X[pts[:5]].tolist()}")


def _namespaces(S: Any, P: Any, X: np.ndarray, tol: float, unit: float = 1.0) -> dict[str, int]:
    """Inputs of torch and ``array_api_strict`` give the NumPy answer: to rounding (1e-12) where it is exact.

    Where the NumPy answer is an exact KKT point of ``P`` to rounding (:func:`~.properties.exact_certificate`:
    a closed-form set's answers, the generic path's away from a face) every namespace must reproduce it to
    rounding. Within the polish's tolerance of a face (a point 1e-9 inside a row of a ``Polyhedral`` set) the
    generic path's answer is decided at that tolerance and may take the face in one namespace and not in the
    other: such points (``band_points``) are held to the agreement tolerance ``tol`` (relative). The active
    flags must be NumPy's on every row it decides beyond ``tol (unit + |x| + |y|)`` (:func:`_decided`).
    """
    from .properties import exact_certificate

    res = S.project(X)
    ref = np.asarray(res.y, dtype=float)
    finite_or_fail(X, ref)
    act = np.asarray(res.active, dtype=bool).reshape(X.shape[0], -1)
    exact = np.array([exact_certificate(P, X[i], ref[i], act[i]) for i in range(X.shape[0])], dtype=bool)
    allowed = np.where(exact, 1e-12, tol) * (unit + np.abs(X).max(axis=1))  # each point at its own scale
    decided = _decided(P, X, ref, act, tol * (unit + np.abs(X).max(axis=1) + np.abs(ref).max(axis=1, initial=0)))
    counts = {"namespaces": 0, "band_points": int((~exact).sum()),
              "strictly_active_points": int((decided & act).any(axis=1).sum())}

    def compare(what: str, y: np.ndarray, active: Any) -> None:
        err = np.abs(np.asarray(y, dtype=float) - ref).max(axis=1)
        if not np.all(err <= allowed):  # NaN fails
            i = int(np.argmax(np.where(err <= allowed, -np.inf, np.nan_to_num(err, nan=np.inf))))
            raise AssertionError(f"{what} and NumPy inputs differ by {err[i]:.3g} at x = {X[i].tolist()} "
                                 f"({'an exact' if exact[i] else 'a tolerance-level'} NumPy answer, "
                                 f"bound {allowed[i]:.3g})")
        _flags_agree(what, X, act, active, decided)
        counts["namespaces"] += 1

    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        r_t = S.project(torch.tensor(X))
        if not isinstance(r_t.y, torch.Tensor):
            raise AssertionError(f"a torch input gave {type(r_t.y).__name__}, not a tensor")
        compare("torch", r_t.y.numpy(), r_t.active)
    try:
        import array_api_strict as xps
    except ImportError:
        xps = None
    if xps is not None:
        r_s = S.project(xps.asarray(X))
        compare("array_api_strict", np.asarray(r_s.y), r_s.active)
    return counts


def _torch_vjp(S: Any, P: Any, X: np.ndarray, rng: np.random.Generator, tol: float,
               unit: float = 1.0) -> dict[str, int] | str:
    """``S.vjp`` on torch (what the layer's backward calls) is a tensor equal to the NumPy product.

    A NumPy-only check passed a set whose torch branch returned the cotangent unchanged (silently wrong gradients
    through the layer). Where the torch active set differs from NumPy's, it must do so on undecided rows only
    (:func:`_decided`: a set flagging no row active on torch passed, the points being skipped), and the product
    there is the HS-Jacobian product of torch's own active set (``other_face``), another element of the HS set.
    """
    from ..projection.hs_jacobian import hs_vjp

    try:
        import torch
    except ImportError:
        return "torch is not installed"
    G = rng.standard_normal(X.shape)
    res = S.project_batch(X)
    ref = np.array(S.vjp(res, G.copy()), dtype=float)  # a copy: other faces are written into it
    res_t = S.project_batch(torch.tensor(X))
    out = S.vjp(res_t, torch.tensor(G))
    if not isinstance(out, torch.Tensor):
        raise AssertionError(f"S.vjp returned {type(out).__name__} for a torch result and cotangent; expected a "
                             "tensor (the layer's backward calls it so)")
    if tuple(out.shape) != G.shape:
        raise AssertionError(f"S.vjp returned shape {tuple(out.shape)} for a torch cotangent of shape {G.shape}")
    act = np.asarray(res.active, dtype=bool).reshape(X.shape[0], -1)
    Y = np.asarray(res.y, dtype=float).reshape(X.shape)
    decided = _decided(P, X, Y, act, tol * (unit + np.abs(X).max(axis=1) + np.abs(Y).max(axis=1)))
    _flags_agree("torch", X, act, res_t.active, decided)
    act_t = to_host(res_t.active).reshape(act.shape) != 0
    same = np.all(act == act_t, axis=1)
    if not np.all(same):  # a weakly active (or dependent) row taken the other way: torch's own HS element
        ref[~same] = hs_vjp(P, act_t[~same], G[~same])
    err = np.abs(to_host(out) - ref).max(axis=1)
    bad = ~(err <= tol * (1.0 + np.abs(G).max(axis=1)))  # NaN fails
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        if same[i]:
            raise AssertionError(f"S.vjp on torch differs from S.vjp on NumPy by {err[i]:.3g} at x = {X[i].tolist()} "
                                 "(same active set)")
        raise AssertionError(f"S.vjp on torch differs from the HS-Jacobian product of its own active set "
                             f"{np.flatnonzero(act_t[i]).tolist()} by {err[i]:.3g} at x = {X[i].tolist()} (NumPy's "
                             f"active set {np.flatnonzero(act[i]).tolist()}: a weakly active row taken the other way)")
    return {"points": int(X.shape[0]), "other_face": int((~same).sum())}


#: relative agreement of float32 answers with the float64 ones (float32's eps is 1.2e-7)
FLOAT32_TOL = 1e-4


def _float32(S: Any, X: np.ndarray, unit: float = 1.0, P: Any = None) -> dict[str, int]:
    """float32 inputs give float32 answers, close to the float64 ones (relative to ``unit + |x| + |y|``).

    A set that computed in float64 and returned it, or was off only in float32, passed every float64 check.
    The answer's own size counts as the input's does: float32 rounds ``y`` to ``eps |y|`` whatever ``x`` is
    (``CappedSimplex(3, 1e6, 1e6)`` at ``x = 0`` is ``y = 333333.33``, float32 spacing 0.03 there, and a correct
    set failed a bound of ``1e-4 (1 + |x|)``); the same relative ``1e-4`` still fails an answer ``1e-3`` off.
    The active flags must be the float64 ones on every row decided beyond that bound (:func:`_decided`: a row
    float32's rounding cannot flip; a set that flagged no row active in float32 passed). ``P``: the set's
    polyhedron when known.
    """
    P = S.as_polyhedron() if P is None else P
    res = S.project(X)
    ref = np.asarray(res.y, dtype=float)
    finite_or_fail(X, ref)
    allowed = FLOAT32_TOL * (unit + np.abs(X).max(axis=1) + np.abs(ref).reshape(X.shape[0], -1).max(axis=1))
    act = np.asarray(res.active, dtype=bool).reshape(X.shape[0], -1)
    decided = _decided(P, X, ref.reshape(X.shape), act, allowed)
    inputs = [("NumPy", X.astype(np.float32))]
    try:
        import torch

        inputs.append(("torch", torch.tensor(X, dtype=torch.float32)))
    except ImportError:
        pass
    for what, x32 in inputs:
        r32 = S.project(x32)
        y = r32.y
        dtype = str(getattr(y, "dtype", type(y)))
        if "float32" not in dtype:
            raise AssertionError(f"a float32 {what} input gave {dtype}; expected float32 (the input's dtype)")
        err = np.abs(to_host(y) - ref).max(axis=1)
        if not np.all(err <= allowed):  # NaN fails
            i = int(np.argmax(np.nan_to_num(err - allowed, nan=np.inf)))
            raise AssertionError(f"a float32 {what} input's answer differs from the float64 one by {err[i]:.3g} at "
                                 f"x = {X[i].tolist()} (bound {allowed[i]:.3g})")
        _flags_agree(f"float32 {what}", X, act, r32.active, decided)
    return {"points": int(X.shape[0])}


def check_projector(S: Any, *, examples: int = 20, seed: int = 0, backend: Any = "proxsuite",
                    tol: float = 1e-9) -> CheckReport:
    """Run the property suites on a Projector (see the module docstring); never raises for a failure.

    Parameters
    ----------
    S : Projector
    examples : int
        Random points per property (about).
    seed : int
    backend : str or QPSolver
        The QP backend of the agreement check.
    tol : float
        Relative tolerance of the agreement and VJP checks.
    """
    from ..errors import ProblemError
    from ..problem import Polyhedron
    from ..sets.base import Projector
    from .properties import check_projection

    if isinstance(S, Polyhedron):  # the generic path of pp.project (its QP backend, then the exact polish)
        from ..backends.defaults import PROJECTION_DEFAULT
        from ..sets.polyhedral import Polyhedral

        S = Polyhedral(S, PROJECTION_DEFAULT)
    if not isinstance(S, Projector):
        raise ProblemError(f"check_projector takes a pp.Projector or a pp.Polyhedron, got {type(S).__name__}")
    check_arguments(examples=examples, seed=seed, tol=tol)
    rng = np.random.default_rng(seed)
    # the set's own methods run here too (its points come from its projections): a set that raises or
    # returns nonsense gets a report with that as its error, not a traceback
    setup = _run("set-up", "projection", _setup, S, rng, examples)
    if setup.status != "passed":
        return CheckReport(repr(S), (setup,), seed, examples)
    P, X, near, Xd, sc = setup.counts.pop("_data")
    unit = _unit(sc)
    X_all = np.vstack([X, near])
    results = (
        # first, and every check on copies: a set that writes into its input would spoil the points
        _run("input kept", "projection", _input_kept, S, X_all.copy()),
        _run("projection", "projection", check_projection, P, X_all.copy(), S, 1e-8, None, unit),
        _run("agreement", "projection", _agreement, S, P, X_all.copy(), backend, tol, unit),
        _run("vjp", "hs-jacobian", _vjp, S, P, np.vstack([X, Xd]), rng, tol, near.copy(),
             np.random.default_rng([seed, 1])),
        _run("conservativity", "hs-jacobian", _conservativity, S, P, Xd.copy(), rng, sc),
        _run("namespaces", "projection", _namespaces, S, P, X_all.copy(), tol, unit),
        _run("torch vjp", "hs-jacobian", _torch_vjp, S, P, np.vstack([X, Xd]), np.random.default_rng([seed, 2]),
             tol, unit),
        _run("float32", "projection", _float32, S, X.copy(), unit, P),
    )
    return CheckReport(repr(S), results, seed, examples)
