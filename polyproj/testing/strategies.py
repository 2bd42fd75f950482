"""Hypothesis strategies for polyhedra, degenerate points, segments and QPs.

All data are small integers, so every constructed point is *exact* in floating point (a row that
is meant to be active has slack exactly 0) and a shrunk falsifying example is short and readable.

Construction (docs/checking_a_backend.md)
------------------------
*Polyhedron with LICQ at y*.*  Pick an integer point ``y*`` and ``k`` active inequality-form rows
(rows of ``A`` or variable bounds) plus ``p`` equality rows.  Each active/equality row gets its own
*pivot column* with entry ``±4`` and entries in ``{-1, 0, 1}`` elsewhere (bounds are ``±e_j``), so
the pivot sub-matrix is strictly diagonally dominant and the active rows are linearly independent
by construction.  Right-hand sides make them tight at ``y*``: ``a_i = A_i y*``, ``b = B y*``,
``lb_j = y*_j``.  Inactive rows get ``a_i = A_i y* + s_i`` with ``s_i >= 1``.

*Without LICQ.*  The same, plus redundant active rows: a duplicated row, a scaled row ``c·G_i``
(``c ∈ {2, 3}``), or the sum of two active (or active + equality) rows, all tight at ``y*``.

*Degenerate points.*  ``x* = y* + Σ_{i∈I} λ_i G_iᵀ + Bᵀμ`` with integer ``λ >= 0`` and at least
one ``λ_i = 0`` (a weakly active row), so ``Π_P(x*) = y*`` by the KKT conditions and several active
sets meet near ``x*``: the projection lies on a facet (``k = 1``), an edge (``k = n - p - 1``) or a
vertex (``k = n - p``).

*Feasible QPs* contain an integer point ``x0`` (``l <= C x0 <= u``) and are bounded (``P ≻ 0`` or
all variables boxed).  *Infeasible QPs* carry a Farkas certificate ``w >= 0`` with ``Cᵀw = 0`` and
``uᵀw < 0``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..problem import QP, Polyhedron

__all__ = [
    "DegeneratePoint",
    "PolyhedronCase",
    "QPCase",
    "SegmentCase",
    "degenerate_points",
    "feasible_qps",
    "infeasible_qps",
    "polyhedra",
    "polyhedron_cases",
    "projection_batches",
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


@dataclass(frozen=True, repr=False)
class QPCase(_Pretty):
    """A QP with a witness: a feasible point ``x_feasible`` or an infeasibility certificate ``w``."""

    qp: QP
    feasible: bool
    x_feasible: np.ndarray | None = None
    certificate: np.ndarray | None = field(default=None)

    def __repr__(self) -> str:
        q = self.qp.dense()
        parts = [f"P={_fmt(q.P)}", f"q={_fmt(q.q)}"]
        if q.m:
            parts += [f"C={_fmt(q.C)}", f"l={_fmt(q.l)}", f"u={_fmt(q.u)}"]
        if np.isfinite(q.lb).any():
            parts.append(f"lb={_fmt(q.lb)}")
        if np.isfinite(q.ub).any():
            parts.append(f"ub={_fmt(q.ub)}")
        if self.feasible:
            parts.append(f"feasible point={_fmt(self.x_feasible)}")
        else:
            parts.append(f"Farkas certificate w={_fmt(self.certificate)} (w >= 0, Cᵀw = 0, uᵀw < 0)")
        return ("FeasibleQP(" if self.feasible else "InfeasibleQP(") + ", ".join(parts) + ")"


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
        Range of the dimension (``max_n <= 5`` keeps the pivot construction valid).
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
            row[col] = 4.0 * draw(st.sampled_from([1, -1]))
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
        n_act = idx.size
        kind = "facet" if n_act == 1 else "vertex" if n_act + P.m_eq >= P.n else "edge"
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
        cx = C @ x0
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
        lb = np.full(n, -np.inf)
        ub = np.full(n, np.inf)
        for j in range(n):
            if c == 0.0 or draw(st.booleans()):
                lb[j] = x0[j] - draw(st.integers(0, 2))
                ub[j] = x0[j] + draw(st.integers(0, 2))
        Pm, Cm = (sp.csc_matrix(P), sp.csc_matrix(C)) if sparse else (P, C)
        qp = QP(P=Pm, q=q, C=Cm, l=l, u=u, lb=lb, ub=ub)
        return QPCase(qp, True, x_feasible=x0)

    return build()


def infeasible_qps(min_n: int = 1, max_n: int = 4):
    """QPs whose constraints ``C x <= u`` are infeasible, with a Farkas certificate.

    Rows ``c_1..c_{m-1}`` are random; ``c_m = -Σ w_i c_i`` (``w_i >= 1``) and
    ``u_m < -Σ w_i u_i``, so ``w = (w_1, ..., w_{m-1}, 1)`` satisfies ``Cᵀw = 0``, ``uᵀw < 0``.
    """
    st = _st()

    @st.composite
    def build(draw):
        n = draw(st.integers(min_n, max_n))
        m1 = draw(st.integers(1, 3))
        C1 = np.array(draw(st.lists(st.lists(st.integers(-3, 3), min_size=n, max_size=n), min_size=m1,
                                    max_size=m1)), dtype=float)
        w1 = np.array(draw(st.lists(st.integers(1, 3), min_size=m1, max_size=m1)), dtype=float)
        u1 = np.array(draw(st.lists(st.integers(-3, 3), min_size=m1, max_size=m1)), dtype=float)
        C = np.vstack([C1, -(w1 @ C1)[None, :]])
        u = np.concatenate([u1, [-(w1 @ u1) - draw(st.integers(1, 3))]])
        w = np.concatenate([w1, [1.0]])
        q = np.array(draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n)), dtype=float)
        qp = QP(P=np.eye(n), q=q, C=C, l=np.full(m1 + 1, -np.inf), u=u)
        return QPCase(qp, False, certificate=w)

    return build()
