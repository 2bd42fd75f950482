"""Hypothesis strategies for polyhedra, degenerate points, segments and QPs.

All data are small integers, so every constructed point is *exact* in floating point (a row that
is meant to be active has slack exactly 0) and a shrunk falsifying example is short and readable.

Construction (docs/checking_a_backend.md)
------------------------
*Polyhedron with LICQ at y*.* Pick an integer point ``y*`` and ``k`` active inequality-form rows (rows of ``A`` or
variable bounds) plus ``p`` equality rows. Each active/equality row gets its own *pivot column* with entry
``±max(4, n)`` and entries in ``{-1, 0, 1}`` elsewhere (bounds are ``±e_j``), so the pivot sub-matrix is strictly
diagonally dominant (at most ``n − 1`` off-diagonal entries of size 1) and the active rows are linearly independent by
construction. Right-hand sides make them tight at ``y*``: ``a_i = A_i y*``, ``b = B y*``, ``lb_j = y*_j``. Inactive
rows get ``a_i = A_i y* + s_i`` with ``s_i >= 1``.

*Without LICQ.*  The same, plus redundant active rows: a duplicated row, a scaled row ``c·G_i``
(``c ∈ {2, 3}``), or the sum of two active (or active + equality) rows, all tight at ``y*``.

*Degenerate points.*  ``x* = y* + Σ_{i∈I} λ_i G_iᵀ + Bᵀμ`` with integer ``λ >= 0`` and at least
one ``λ_i = 0`` (a weakly active row), so ``Π_P(x*) = y*`` by the KKT conditions and several active
sets meet near ``x*``: the projection lies on a facet (``k = 1``), an edge (``k = n - p - 1``) or a
vertex (``k = n - p``).

*Feasible QPs* contain an integer point ``x0`` (``l <= C x0 <= u``) and are bounded (``P ≻ 0`` or
all variables boxed).  *Batches of feasible QPs* share ``P`` (never a multiple of ``I``) and ``C``;
each element has its own ``q``, ``l``, ``u``, ``lb``, ``ub`` and its own integer point, or (``subsets``) a
random non-empty subset of them batched, the others shared, around one integer point.  *Infeasible
QPs* carry a Farkas certificate in polyproj's sign convention: row multipliers ``y`` (``y_i > 0`` on
the upper side ``u_i``, ``< 0`` on the lower side ``l_i``) and bound multipliers ``y_box`` with
``Cᵀy + y_box = 0`` and support ``uᵀy⁺ − lᵀy⁻ + ubᵀy_box⁺ − lbᵀy_box⁻ < 0`` — a point ``x`` of the
constraints would give ``0 = (Cᵀy + y_box)ᵀx <= support < 0``.  The certificate may use upper or
lower sides, either side of two-sided rows (equalities included) and variable bounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..problem import QP, Polyhedron

__all__ = [
    "DegeneratePoint",
    "PolyhedronCase",
    "QPBatchCase",
    "QPCase",
    "SegmentCase",
    "degenerate_points",
    "feasible_qps",
    "infeasible_qps",
    "polyhedra",
    "polyhedron_cases",
    "projection_batches",
    "qp_batches",
    "segments",
]

_KINDS = ("facet", "edge", "vertex")


class _Pretty:
    """Hypothesis prints falsifying examples with its pretty printer: use our compact repr."""

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


def _fmt(v: Any) -> str:
    """Compact list repr of an array (integers without the trailing .0)."""
    arr = np.asarray(v, dtype=float)

    def num(x: float) -> str:
        if np.isinf(x):
            return "inf" if x > 0 else "-inf"
        return str(int(x)) if float(x).is_integer() else f"{x:.6g}"

    if arr.ndim == 1:
        return "[" + ", ".join(num(x) for x in arr) + "]"
    return "[" + ", ".join(_fmt(r) for r in arr) + "]"


# --------------------------------------------------------------------------- records
@dataclass(frozen=True, repr=False)
class PolyhedronCase(_Pretty):
    """A polyhedron with a known point ``y_star`` and the active mask there.

    Attributes
    ----------
    polyhedron : Polyhedron
    y_star : (n,) a point of the polyhedron
    active : (n_ineq,) bool, the inequality-form rows tight at ``y_star``
    licq : bool, whether the tight rows and the rows of B are linearly independent
    redundancy : str, how LICQ was broken ('' under LICQ; 'duplicate', 'scaled', 'dependent')
    """

    polyhedron: Polyhedron
    y_star: np.ndarray
    active: np.ndarray
    licq: bool
    redundancy: str = ""

    def __repr__(self) -> str:
        P = self.polyhedron
        parts = [f"A={_fmt(P.A_dense)}", f"a={_fmt(P.a)}"]
        if P.m_eq:
            parts += [f"B={_fmt(P.B_dense)}", f"b={_fmt(P.b)}"]
        if P.lb_idx.size:
            parts.append(f"lb={_fmt(P.lb)}")
        if P.ub_idx.size:
            parts.append(f"ub={_fmt(P.ub)}")
        parts.append(f"y_star={_fmt(self.y_star)}")
        if not self.licq:
            parts.append(f"LICQ fails ({self.redundancy})")
        return "PolyhedronCase(" + ", ".join(parts) + ")"


@dataclass(frozen=True, repr=False)
class DegeneratePoint(_Pretty):
    """A point ``x`` with known projection ``y = case.y_star`` and multipliers ``lam``, ``mu``.

    ``lam`` (inequality form, >= 0, zero off the active set) has at least one zero on an active
    row, so the active sets of nearby points differ.
    """

    case: PolyhedronCase
    x: np.ndarray
    lam: np.ndarray
    mu: np.ndarray
    kind: str = ""

    @property
    def polyhedron(self) -> Polyhedron:
        """The polyhedron."""
        return self.case.polyhedron

    @property
    def y(self) -> np.ndarray:
        """The exact projection of ``x``."""
        return self.case.y_star

    def __repr__(self) -> str:
        return (f"DegeneratePoint({self.kind}, x={_fmt(self.x)}, lambda={_fmt(self.lam)}, "
                f"mu={_fmt(self.mu)}, {self.case!r})")


@dataclass(frozen=True, repr=False)
class SegmentCase(_Pretty):
    """Segments ``x(t) = x0_j + t d_j``, ``t ∈ [0, 1]``, through a degenerate point at ``t = s_j``."""

    point: DegeneratePoint
    directions: np.ndarray  # (k, n)
    s: np.ndarray  # (k,)

    @property
    def x0(self) -> np.ndarray:
        """Start points (k, n)."""
        return self.point.x[None, :] - self.s[:, None] * self.directions

    def __repr__(self) -> str:
        return (f"SegmentCase(d={_fmt(self.directions)}, s={_fmt(self.s)}, "
                f"through {self.point!r})")


def _qp_parts(q: QP) -> list[str]:
    parts = [f"P={_fmt(q.P)}", f"q={_fmt(q.q)}"]
    if q.m:
        parts += [f"C={_fmt(q.C)}", f"l={_fmt(q.l)}", f"u={_fmt(q.u)}"]
    if np.isfinite(q.lb).any():
        parts.append(f"lb={_fmt(q.lb)}")
    if np.isfinite(q.ub).any():
        parts.append(f"ub={_fmt(q.ub)}")
    return parts


@dataclass(frozen=True, repr=False)
class QPCase(_Pretty):
    """A QP with a witness: a feasible point ``x_feasible`` or a Farkas certificate.

    The certificate of an infeasible QP is ``(certificate, certificate_box)`` = ``(y, y_box)`` in
    polyproj's sign convention (see the module docstring): ``qp.is_primal_infeasibility_certificate(y, y_box)``.
    """

    qp: QP
    feasible: bool
    x_feasible: np.ndarray | None = None
    certificate: np.ndarray | None = field(default=None)
    certificate_box: np.ndarray | None = field(default=None)

    def __repr__(self) -> str:
        parts = _qp_parts(self.qp.dense())
        if self.feasible:
            parts.append(f"feasible point={_fmt(self.x_feasible)}")
        else:
            yb = np.zeros(self.qp.n) if self.certificate_box is None else self.certificate_box
            parts.append(f"Farkas certificate y={_fmt(self.certificate)}, y_box={_fmt(yb)} (Cᵀy + y_box = 0, "
                         "uᵀy⁺ − lᵀy⁻ + ubᵀy_box⁺ − lbᵀy_box⁻ < 0)")
        return ("FeasibleQP(" if self.feasible else "InfeasibleQP(") + ", ".join(parts) + ")"


@dataclass(frozen=True, repr=False)
class QPBatchCase(_Pretty):
    """Feasible QPs sharing ``P`` and ``C`` (``qp``), with batched ``vectors`` (of ``q``, ``l``, ``u``, ``lb``, ``ub``).

    ``qp`` holds the vectors of element 0, and the shared ones (those not in ``vectors``) of every element; element
    ``i`` (:meth:`element`) contains the integer point ``x_feasible[i]``. ``strictly_convex``: ``P ≻ 0``, so each
    element's solution is unique.
    """

    qp: QP
    vectors: dict[str, np.ndarray]
    x_feasible: np.ndarray
    strictly_convex: bool

    @property
    def size(self) -> int:
        """Number of elements."""
        return int(self.x_feasible.shape[0])

    def element(self, i: int) -> QP:
        """Element ``i`` as a QP of its own."""
        return self.qp.with_vectors(**{k: v[i] for k, v in self.vectors.items()})

    def __repr__(self) -> str:
        q = self.qp.dense()
        parts = [f"P={_fmt(q.P)}"] + ([f"C={_fmt(q.C)}"] if q.m else [])
        parts += [f"{k}={_fmt(v)}" for k, v in self.vectors.items()]
        # the shared vectors too: a falsifying example that batches only u must show the q it shares
        shared = [k for k in ("q", "l", "u", "lb", "ub") if k not in self.vectors and (q.m or k not in ("l", "u"))]
        parts += [f"shared {k}={_fmt(getattr(q, k))}" for k in shared]
        parts.append(f"feasible points={_fmt(self.x_feasible)}")
        return "FeasibleQPBatch(" + ", ".join(parts) + ")"


# --------------------------------------------------------------------------- strategies
def _st():
    from hypothesis import strategies as st

    return st


def polyhedron_cases(min_n: int = 2, max_n: int = 4, licq: bool | None = True,
                     kinds: tuple[str, ...] = _KINDS, max_inactive: int = 3):
    """Polyhedra with a point ``y*`` on a facet, an edge or a vertex (see the module docstring).

    Parameters
    ----------
    min_n, max_n : int
        Range of the dimension, at most 5.
    licq : bool or None
        True: the tight rows at ``y*`` are linearly independent; False: redundant tight rows are
        added (duplicated, scaled or dependent); None: either.
    kinds : tuple of str
        Which faces ``y*`` may lie on: 'facet', 'edge', 'vertex'.
    max_inactive : int
        Extra rows of A that are not tight at ``y*``.
    """
    st = _st()
    if not 1 <= min_n <= max_n <= 5:
        raise ValueError("need 1 <= min_n <= max_n <= 5")

    @st.composite
    def build(draw):
        n = draw(st.integers(min_n, max_n))
        p = draw(st.integers(0, min(1, n - 1)))
        kind = draw(st.sampled_from(kinds))
        free = n - p
        k = {"facet": 1, "edge": max(1, free - 1), "vertex": free}[kind]
        y = np.array(draw(st.lists(st.integers(-2, 2), min_size=n, max_size=n)), dtype=float)
        pivots = list(draw(st.permutations(range(n))))[: k + p]
        lb = np.full(n, -np.inf)
        ub = np.full(n, np.inf)
        A_rows: list[np.ndarray] = []
        a_vals: list[float] = []
        tight: list[tuple[np.ndarray, float]] = []  # inequality-form rows (G_i, h_i) tight at y*

        def dominant_row(col: int) -> np.ndarray:
            row = np.array(draw(st.lists(st.integers(-1, 1), min_size=n, max_size=n)), dtype=float)
            # strictly dominant: n − 1 other entries of size <= 1 beside a pivot of max(4, n)
            row[col] = float(max(4, n)) * draw(st.sampled_from([1, -1]))
            return row

        for i in range(k):
            col = pivots[i]
            what = draw(st.sampled_from(["A", "A", "lb", "ub"]))
            if what == "A":
                row = dominant_row(col)
                A_rows.append(row)
                a_vals.append(float(row @ y))
                tight.append((row, float(row @ y)))
            elif what == "lb":
                lb[col] = y[col]
                e = np.zeros(n)
                e[col] = -1.0
                tight.append((e, -y[col]))
            else:
                ub[col] = y[col]
                e = np.zeros(n)
                e[col] = 1.0
                tight.append((e, y[col]))
        B_rows = [dominant_row(pivots[k + j]) for j in range(p)]
        redundancy = ""
        want_licq = draw(st.booleans()) if licq is None else licq
        if not want_licq:
            options = ["duplicate", "scaled"] + (["dependent"] if len(tight) + p >= 2 else [])
            redundancy = draw(st.sampled_from(options))
            i = draw(st.integers(0, len(tight) - 1))
            g, h = tight[i]
            if redundancy == "duplicate":
                new = (g.copy(), h)
            elif redundancy == "scaled":
                c = float(draw(st.sampled_from([2, 3])))
                new = (c * g, c * h)
            else:
                others = [t for j, t in enumerate(tight) if j != i] + [(r, float(r @ y)) for r in B_rows]
                g2, h2 = others[draw(st.integers(0, len(others) - 1))]
                new = (g + g2, h + h2)
            A_rows.append(new[0])
            a_vals.append(float(new[1]))
        for _ in range(draw(st.integers(0, max_inactive))):
            row = np.array(draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n)), dtype=float)
            A_rows.append(row)
            a_vals.append(float(row @ y) + draw(st.integers(1, 3)))
        for j in range(n):  # inactive bounds on some of the other coordinates
            if np.isinf(lb[j]) and np.isinf(ub[j]) and draw(st.booleans()):
                lb[j] = y[j] - draw(st.integers(1, 3))
                ub[j] = y[j] + draw(st.integers(1, 3))
        A = np.array(A_rows).reshape(-1, n)
        B = np.array(B_rows).reshape(-1, n)
        P = Polyhedron(A=A, a=np.array(a_vals), B=B if p else None, b=B @ y if p else None,
                       lb=lb, ub=ub, n=n)
        active = np.abs(P.ineq_slack(y)[0]) <= 1e-12
        return PolyhedronCase(P, y, active, licq=want_licq, redundancy=redundancy)

    return build()


def polyhedra(**kwargs: Any):
    """Polyhedra only (see :func:`polyhedron_cases` for the arguments)."""
    return polyhedron_cases(**kwargs).map(lambda c: c.polyhedron)


def _ineq_rows(P: Polyhedron) -> np.ndarray:
    n = P.n
    E = np.eye(n)
    return np.vstack([P.A_dense, -E[P.lb_idx], E[P.ub_idx]]).reshape(-1, n)


def degenerate_points(cases=None, *, weakly_active: int = 1, max_lambda: int = 2):
    """Points ``x*`` whose projection is ``y*`` with at least ``weakly_active`` zero multipliers.

    Parameters
    ----------
    cases : strategy of PolyhedronCase, optional
        Defaults to :func:`polyhedron_cases` with LICQ.
    weakly_active : int
        Minimum number of active rows with ``λ_i = 0`` (capped by the number of active rows).
    max_lambda : int
        Multipliers are integers in ``[0, max_lambda]``.
    """
    st = _st()
    cases = polyhedron_cases() if cases is None else cases

    @st.composite
    def build(draw):
        case = draw(cases)
        P = case.polyhedron
        idx = np.flatnonzero(case.active)
        lam_act = np.array(draw(st.lists(st.integers(0, max_lambda), min_size=idx.size, max_size=idx.size)),
                           dtype=float)
        zeros = draw(st.lists(st.integers(0, idx.size - 1), min_size=min(weakly_active, idx.size),
                              max_size=min(weakly_active, idx.size), unique=True))
        lam_act[zeros] = 0.0
        lam = np.zeros(P.n_ineq)
        lam[idx] = lam_act
        mu = np.array(draw(st.lists(st.integers(-2, 2), min_size=P.m_eq, max_size=P.m_eq)), dtype=float)
        x = case.y_star + _ineq_rows(P).T @ lam + (P.B_dense.T @ mu if P.m_eq else 0.0)
        # the face of y* is {y : G_I y = h_I, B y = b}, of dimension n − rank([G_I; B]): count independent rows,
        # not rows (a duplicated or scaled facet row, LICQ failing, was labelled an edge or a vertex)
        M = np.vstack([_ineq_rows(P)[idx], P.B_dense]) if P.m_eq else _ineq_rows(P)[idx]
        rank = int(np.linalg.matrix_rank(M)) if M.shape[0] else 0
        codim = rank - (int(np.linalg.matrix_rank(P.B_dense)) if P.m_eq else 0)  # tight rows beyond B's
        kind = "vertex" if rank >= P.n else "facet" if codim == 1 else "edge"  # a point first (n 2, B and a row)
        return DegeneratePoint(case, x, lam, mu, kind=kind)

    return build()


def segments(points=None, *, count: int = 8):
    """``count`` random segments through one degenerate point (directions of norm >= 0.5)."""
    st = _st()
    points = degenerate_points() if points is None else points

    @st.composite
    def build(draw):
        pt = draw(points)
        n = pt.polyhedron.n
        coords = st.floats(-3.0, 3.0, allow_nan=False, allow_infinity=False).map(lambda v: round(v, 3))
        D = np.array(draw(st.lists(st.lists(coords, min_size=n, max_size=n), min_size=count, max_size=count)))
        small = np.linalg.norm(D, axis=1) < 0.5
        D[small, 0] += 1.0
        s = np.array(draw(st.lists(st.floats(0.2, 0.8).map(lambda v: round(v, 3)),
                                   min_size=count, max_size=count)))
        return SegmentCase(pt, D, s)

    return build()


def projection_batches(cases=None, *, size: int = 6):
    """``(case, X)``: a polyhedron and ``size`` points around ``y*`` (integers and halves)."""
    st = _st()
    cases = polyhedron_cases(licq=None) if cases is None else cases

    @st.composite
    def build(draw):
        case = draw(cases)
        n = case.polyhedron.n
        vals = st.integers(-8, 8).map(lambda v: v / 2.0)
        X = np.array(draw(st.lists(st.lists(vals, min_size=n, max_size=n), min_size=size, max_size=size)))
        return case, case.y_star[None, :] + X

    return build()


def _row_sides(draw: Any, cx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sides of rows with values ``cx`` at a feasible point: upper, lower, two-sided or (one) equality; some tight."""
    st = _st()
    m = cx.size
    l = np.full(m, -np.inf)
    u = np.full(m, np.inf)
    has_eq = False
    for i in range(m):
        kind = draw(st.sampled_from(["upper", "lower", "both", "eq"]))
        if kind == "eq" and has_eq:
            kind = "both"
        s1, s2 = draw(st.integers(0, 2)), draw(st.integers(0, 2))
        if kind in ("upper", "both"):
            u[i] = cx[i] + s1
        if kind in ("lower", "both"):
            l[i] = cx[i] - s2
        if kind == "eq":
            l[i] = u[i] = cx[i]
            has_eq = True
    return l, u


def _box(draw: Any, x0: np.ndarray, boxed: bool) -> tuple[np.ndarray, np.ndarray]:
    """Bounds around the feasible point ``x0`` on some variables (on every one when ``boxed``)."""
    st = _st()
    n = x0.size
    lb = np.full(n, -np.inf)
    ub = np.full(n, np.inf)
    for j in range(n):
        if boxed or draw(st.booleans()):
            lb[j] = x0[j] - draw(st.integers(0, 2))
            ub[j] = x0[j] + draw(st.integers(0, 2))
    return lb, ub


def feasible_qps(min_n: int = 1, max_n: int = 5, max_m: int = 5, sparse: bool = False):
    """Feasible, bounded convex QPs with a known integer feasible point.

    ``P = LᵀL + c I`` (``c ∈ {0, 1}``; with ``c = 0`` every variable is boxed), rows of C of every
    kind (upper, lower, two-sided, at most one equality), some tight at the feasible point.
    """
    st = _st()

    @st.composite
    def build(draw):
        import scipy.sparse as sp

        n = draw(st.integers(min_n, max_n))
        m = draw(st.integers(0, max_m))
        x0 = np.array(draw(st.lists(st.integers(-2, 2), min_size=n, max_size=n)), dtype=float)
        r = draw(st.integers(1, n))
        L = np.array(draw(st.lists(st.lists(st.integers(-2, 2), min_size=n, max_size=n), min_size=r, max_size=r)),
                     dtype=float)
        c = draw(st.sampled_from([0.0, 1.0]))
        P = L.T @ L + c * np.eye(n)
        q = np.array(draw(st.lists(st.integers(-5, 5), min_size=n, max_size=n)), dtype=float)
        C = np.array(draw(st.lists(st.lists(st.integers(-3, 3), min_size=n, max_size=n), min_size=m, max_size=m)),
                     dtype=float).reshape(m, n)
        l, u = _row_sides(draw, C @ x0)
        lb, ub = _box(draw, x0, boxed=c == 0.0)
        Pm, Cm = (sp.csc_matrix(P), sp.csc_matrix(C)) if sparse else (P, C)
        qp = QP(P=Pm, q=q, C=Cm, l=l, u=u, lb=lb, ub=ub)
        return QPCase(qp, True, x_feasible=x0)

    return build()


def qp_batches(min_n: int = 1, max_n: int = 4, max_m: int = 4, min_size: int = 2, max_size: int = 4,
               subsets: bool = False):
    """Batches of feasible, bounded QPs that share a general ``P`` and ``C``, every vector (or some) batched.

    ``P = LᵀL + c I`` (``c ∈ {0, 1}``; every variable of every element is boxed unless ``P ≻ 0``); ``P`` is
    never a multiple of ``I`` (its first diagonal entry is raised if it is; for ``n = 1``: never ``[[1]]``),
    so a batch path that takes the problems for projections (``P = I``) gives other answers. Each element
    has its own integer point ``x0``, ``q``, row sides (upper, lower, two-sided, an equality) around ``C x0``
    and bounds around ``x0``: a batch path that ignores the batched ``l``, ``u``, ``lb`` or ``ub`` gives other
    answers too.

    ``subsets``: batch a random non-empty subset of ``q``, ``l``, ``u``, ``lb``, ``ub`` (``solve_batch`` allows
    any), the others shared by every element (those of ``qp``): a batch path that drops a shared vector (solves
    with ``q = 0`` when only ``u`` is batched) gives other answers. Where a constraint vector is shared, every
    element has the same integer point ``x0`` (the shared sides around ``C x0`` and the batched ones, drawn per
    element, all hold there), so the elements differ by their batched vectors only.
    """
    st = _st()

    @st.composite
    def build(draw):
        n = draw(st.integers(min_n, max_n))
        m = draw(st.integers(0, max_m))
        size = draw(st.integers(min_size, max_size))
        names = ("q", "l", "u", "lb", "ub") if m else ("q", "lb", "ub")
        batched = set(draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True))) \
            if subsets else set(names)
        own_points = batched >= set(names) - {"q"}  # every constraint vector batched: a point per element
        r = draw(st.integers(1, n))
        L = np.array(draw(st.lists(st.lists(st.integers(-2, 2), min_size=n, max_size=n), min_size=r, max_size=r)),
                     dtype=float)
        c = draw(st.sampled_from([0.0, 1.0]))
        P = L.T @ L + c * np.eye(n)
        if np.array_equal(P, P[0, 0] * np.eye(n)):  # a multiple of I (0 included): not a general P
            P[0, 0] += 2.0 if P[0, 0] == 0.0 else 1.0  # (n = 1: anything but [[1]])
        strictly = c == 1.0 or bool(np.linalg.eigvalsh(P).min() > 1e-9)
        C = np.array(draw(st.lists(st.lists(st.integers(-3, 3), min_size=n, max_size=n), min_size=m, max_size=m)),
                     dtype=float).reshape(m, n)
        rows: dict[str, list[np.ndarray]] = {k: [] for k in ("q", "l", "u", "lb", "ub")}
        X0 = []
        for i in range(size):
            if own_points or i == 0:
                x0 = np.array(draw(st.lists(st.integers(-2, 2), min_size=n, max_size=n)), dtype=float)
            q = np.array(draw(st.lists(st.integers(-5, 5), min_size=n, max_size=n)), dtype=float)
            l, u = _row_sides(draw, C @ x0)
            lb, ub = _box(draw, x0, boxed=not strictly)
            for k, v in zip(("q", "l", "u", "lb", "ub"), (q, l, u, lb, ub)):
                rows[k].append(v)
            X0.append(x0)
        every = {k: np.array(v, dtype=float).reshape(size, -1) for k, v in rows.items() if k in names}
        first = {k: v[0] for k, v in every.items()}  # element 0's, the shared ones every element's
        qp = QP(P=P, C=C if m else None, **first)
        vectors = {k: v for k, v in every.items() if k in batched}
        return QPBatchCase(qp, vectors, np.array(X0), strictly_convex=strictly)

    return build()


def infeasible_qps(min_n: int = 1, max_n: int = 4):
    """QPs whose constraints ``l <= Cx <= u``, ``lb <= x <= ub`` are infeasible, with a Farkas certificate.

    The certificate uses ``k`` rows (``k - 1`` random, ``>= 0``) and some variable bounds, each on a side drawn
    at random: ``y_i = s_i w_i`` (``w_i >= 1``; ``s_i = +1`` the upper side ``u_i``, ``-1`` the lower side
    ``l_i``) and ``y_box_j = t_j v_j`` on ``ub_j`` / ``lb_j``. The last row closes the certificate,
    ``c_k = -s_k (Σ_{i<k} y_i c_i + y_box)``, and its side is set so that the support
    ``Σ_i w_i s_i b_i + Σ_j v_j t_j β_j`` (``b_i``, ``β_j`` the sides used) is at most ``-1``. The other side of
    each row or bound is infinite, a finite value beyond it (a two-sided row or a box) or equal to it (an
    equality, a fixed variable). ``P = I``: only the constraints matter.
    """
    st = _st()

    @st.composite
    def build(draw):
        n = draw(st.integers(min_n, max_n))
        k1 = draw(st.integers(0, 3))  # rows of the certificate before the closing row
        nb = draw(st.integers(0 if k1 else 1, n))  # variable bounds in the certificate (>= 1 without rows)
        ints = st.integers(-3, 3)
        C1 = np.array(draw(st.lists(st.lists(ints, min_size=n, max_size=n), min_size=k1, max_size=k1)),
                      dtype=float).reshape(k1, n)
        sides = np.array(draw(st.lists(st.sampled_from([1.0, -1.0]), min_size=k1 + 1, max_size=k1 + 1)))
        w = np.array([*draw(st.lists(st.integers(1, 3), min_size=k1, max_size=k1)), 1], dtype=float)
        b1 = np.array(draw(st.lists(ints, min_size=k1, max_size=k1)), dtype=float)
        cols = draw(st.permutations(range(n)))[:nb]
        tb = np.array(draw(st.lists(st.sampled_from([1.0, -1.0]), min_size=nb, max_size=nb)))
        vb = np.array(draw(st.lists(st.integers(1, 3), min_size=nb, max_size=nb)), dtype=float)
        beta = np.array(draw(st.lists(ints, min_size=nb, max_size=nb)), dtype=float)
        y_box = np.zeros(n)
        y_box[list(cols)] = tb * vb
        y1 = sides[:k1] * w[:k1]
        c_last = -sides[-1] * (y1 @ C1 + y_box)
        # support so far, then the closing row's side b_k with s_k b_k = -(support) - gap
        support = float(w[:k1] @ (sides[:k1] * b1) + vb @ (tb * beta))
        gap = draw(st.integers(1, 3))
        b_last = sides[-1] * (-support - gap)
        C = np.vstack([C1, c_last[None, :]])
        used = np.concatenate([b1, [b_last]])
        l = np.where(sides > 0, -np.inf, used)
        u = np.where(sides > 0, used, np.inf)
        for i in range(k1 + 1):  # the other side: none, beyond the used one, or equal to it (an equality row)
            other = draw(st.sampled_from(["none", "beyond", "equal"]))
            if other != "none":
                d = 0 if other == "equal" else draw(st.integers(1, 3))
                if sides[i] > 0:
                    l[i] = used[i] - d
                else:
                    u[i] = used[i] + d
        lb = np.full(n, -np.inf)
        ub = np.full(n, np.inf)
        for j, t, val in zip(cols, tb, beta):
            (ub if t > 0 else lb)[j] = val
            other = draw(st.sampled_from(["none", "beyond", "equal"]))
            if other != "none":
                d = 0 if other == "equal" else draw(st.integers(1, 3))
                if t > 0:
                    lb[j] = val - d
                else:
                    ub[j] = val + d
        q = np.array(draw(st.lists(ints, min_size=n, max_size=n)), dtype=float)
        qp = QP(P=np.eye(n), q=q, C=C, l=l, u=u, lb=lb, ub=ub)
        y = np.concatenate([y1, [sides[-1]]])
        return QPCase(qp, False, certificate=y, certificate_box=y_box)

    return build()
