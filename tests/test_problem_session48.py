"""QP input rules from the session-48 probe: right-hand sides read as "no bound" on rows scaled up as far,
large finite costs, and fixed variables whose rows are met only to the rounding of the substitution."""

from __future__ import annotations

import math

import numpy as np
import pytest

import polyproj as pp

#: CPU backends (cupy needs a GPU)
BACKENDS = [name for name in pp.available_backends() if name != "cupy"]


# --------------------------------------------------------------------------- 1. sides read as no bound
def test_a_qp_side_read_as_no_bound_on_a_row_scaled_up_as_far_is_refused():
    """``1e20 (x1 + x2) <= 1e20`` is ``x1 + x2 <= 1``: the QP read ``u = 1e20`` as +inf and dropped the row
    (every backend returned the unconstrained point (1, 1) as SOLVED; the answer is (0.5, 0.5)). Refused as a
    Polyhedron refuses it, naming the side and the row, with the hint to scale the row; the lower side and
    sides read as an infinity that side does not allow say the same, not "forbidden infinity"."""
    P, q = np.eye(2), [-1.0, -1.0]
    # the same set at a scale below the convention: solved at the projection's closed form (0.5, 0.5)
    sol = pp.solve_qp(pp.QP(P=P, q=q, C=[[1e19, 1e19]], l=[-np.inf], u=[1e19]), backend="daqp")
    np.testing.assert_allclose(sol.x, [0.5, 0.5], atol=1e-9)
    with pytest.raises(pp.ProblemError, match=r"u\[0\] = 1e\+20 reads as no bound.*would drop the upper side "
                                              r"of row 0 of C.*divide row 0 of C and l\[0\], u\[0\]"):
        pp.QP(P=P, q=q, C=[[1e20, 1e20]], l=[-np.inf], u=[1e20])
    with pytest.raises(pp.ProblemError, match=r"l\[0\] = -1e\+20 reads as no bound.*lower side of row 0 of C"):
        pp.QP(P=P, q=q, C=[[1e20, 1e20]], l=[-1e20], u=[np.inf])
    for side in (dict(l=[1e20], u=[1e20]), dict(l=[-np.inf], u=[-1e20])):  # +inf as l, -inf as u
        with pytest.raises(pp.ProblemError, match=r"reads as -?inf .*is a finite right-hand side of row 0 of C") \
                as err:
            pp.QP(P=P, q=q, C=[[1e20, 1e20]], **side)
        assert "forbidden infinity" not in str(err.value)
    with pytest.raises(pp.ProblemError, match=r"a\[0\] = -1e\+20, which reads as -inf.*finite right-hand side"):
        pp.Polyhedron(A=[[1e20, 1e20]], a=[-1e20])
    qp = pp.QP(P=P, q=q, C=[[1e20, 1e20]], l=[-np.inf], u=[1e19])
    with pytest.raises(pp.ProblemError, match=r"u\[0\] = 1e\+20 reads as no bound"):
        qp.with_vectors(u=[1e20])


def test_rows_and_sides_scaled_far_up_are_refused_not_dropped():
    """C and u scaled by 1e60 / 1e150 (the same set): u reached 1e20, read as +inf, the rows were dropped and
    every backend returned a point 9.6 % off as SOLVED. Refused; data files' "no bound" (1e20 on rows of
    entries up to 1e5, as Maros–Meszaros QSIERRA writes it) still reads as none."""
    rng = np.random.default_rng(3)
    M = rng.standard_normal((3, 3))
    P, q, C, u = M @ M.T + np.eye(3), 3 * rng.standard_normal(3), rng.standard_normal((2, 3)), np.array([0.2, 0.1])
    for c in (1e60, 1e150):
        with pytest.raises(pp.ProblemError, match=r"u\[0\] = .* reads as no bound.*row 0 of C"):
            pp.QP(P=P, q=q, C=C * c, l=[-np.inf] * 2, u=u * c)
    qp = pp.QP(P=P, q=q, C=[[1e5, 0.0, 1.0]], l=[-1e20], u=[1e20])
    assert np.isneginf(qp.l[0]) and np.isposinf(qp.u[0])
    assert np.isposinf(pp.QP(P=P, q=q, C=[[1.0, 1.0, 1.0]], u=[1e20]).u[0])


# --------------------------------------------------------------------------- 2. large costs
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_linear_cost_beyond_1e20_is_a_cost_not_an_infinity(backend):
    """``q = -1e20 e_1`` was refused as "a forbidden infinity (|v| >= 1e20 means no bound)": a cost is no
    bound. Kept as given and solved in normalised units: ``(s P, s q)`` has the answer of ``(P, q)``, here
    the closed form x = (0.5, 0.3) of ½x1² + x2² − 3x1 − x2 on x1 <= 0.5, x1 + x2 <= 0.8 (multipliers 2.1
    and 0.4 >= 0)."""
    P, q, C = np.diag([1.0, 2.0]), np.array([-3.0, -1.0]), [[1.0, 1.0]]
    assert pp.QP(P=np.eye(2), q=[-1e20, 0.0], ub=[0.5, 1.0]).q[0] == -1e20
    for s in (1e20, 1e150):
        qp = pp.QP(P=s * P, q=s * q, C=C, l=[-np.inf], u=[0.8], ub=[0.5, np.inf])
        assert np.array_equal(qp.q, s * q)
        sol = pp.solve_qp(qp, backend=backend)
        assert sol.status == pp.Status.SOLVED, (s, sol.status)
        np.testing.assert_allclose(sol.x, [0.5, 0.3], atol=1e-5)


def test_an_infinite_cost_is_still_refused():
    with pytest.raises(pp.ProblemError, match=r"q\[1\] = -inf is not allowed: a cost must be finite"):
        pp.QP(P=np.eye(2), q=[0.0, -np.inf])
    qp = pp.QP(P=np.eye(2), q=[0.0, 0.0])
    assert qp.with_vectors(q=[3e25, 0.0]).q[0] == 3e25
    with pytest.raises(pp.ProblemError, match="a cost must be finite"):
        qp.with_vectors(q=[np.inf, 0.0])


# --------------------------------------------------------------------------- 3. fixed variables
FIXED = [name for name in ("highs", "daqp") if name in BACKENDS]  # the backends that substitute them


@pytest.mark.parametrize("backend", FIXED)
def test_fixed_variables_meeting_their_rows_to_rounding_are_feasible(backend):
    """``3 x = 0.3`` with ``x`` fixed at 0.1 (``3 · 0.1 − 0.3 = 5.6e-17``): once every variable was substituted
    the rows were judged exactly, and HiGHS and DAQP called it infeasible (the six other backends: SOLVED
    x = 0.1). Judged at the rounding of the row's terms; a partially fixed problem whose row keeps only fixed
    variables likewise; a miss far above rounding stays PRIMAL_INFEASIBLE."""
    assert 3.0 * 0.1 - 0.3 != 0.0 and 0.1 + 0.2 != 0.3
    cases = [
        (pp.QP(P=[[1.0]], q=[0.0], C=[[3.0]], l=[0.3], u=[0.3], lb=[0.1], ub=[0.1]), [0.1]),
        (pp.QP(P=[[1.0]], q=[0.0], C=[[3.0]], l=[-np.inf], u=[0.3], lb=[0.1], ub=[0.1]), [0.1]),
        (pp.QP(P=np.eye(2), q=[0.0, 0.0], C=[[1.0, 1.0]], l=[0.3], u=[0.3], lb=[0.1, 0.2], ub=[0.1, 0.2]),
         [0.1, 0.2]),
    ]
    # three fixed variables and a free one: the first row sums the fixed ones to a right-hand side computed
    # exactly (fsum), which their rounded sum misses by 2.3e-10 at a magnitude of 1.5e6
    c = np.array([-324471.85628543916, -1221223.3497261363, 201910.00196010992])
    v = np.array([-0.03883503855807973, 1.066324553166257, -0.9216339244978112])
    # the exact sum (fsum), moved by whole ulps until no rounded evaluation of the row hits it: BLAS kernels
    # differ by machine (FMA, order), and on some c @ v is the exact sum itself
    rhs = exact = math.fsum(c * v)
    rounded = {float(c @ v), float(np.dot(c, v)), float((c * v).sum()), float(c[0] * v[0] + c[1] * v[1] + c[2] * v[2])}
    while rhs in rounded:
        rhs = float(np.nextafter(rhs, np.inf))
    assert rhs != c @ v and abs(rhs - exact) <= 8 * np.spacing(abs(exact))
    C = np.array([[*c, 0.0], [0.0, 0.0, 0.0, 1.0]])
    qp = pp.QP(P=np.eye(4), q=[0.0, 0.0, 0.0, -0.5], C=C, l=[rhs, -np.inf], u=[rhs, 2.0],
               lb=[*v, -1.0], ub=[*v, 1.0])
    cases.append((qp, [*v, 0.5]))  # x4 minimises ½x4² − ½x4 in [-1, 1]
    for qp, x in cases:
        sol = pp.solve_qp(qp, backend=backend)
        assert sol.status == pp.Status.SOLVED, (qp, sol.status, sol.info.get("validation"))
        np.testing.assert_allclose(sol.x, x, rtol=0, atol=1e-9)
        assert sol.dual_residual() <= 1e-9 * max(1.0, float(np.abs(c).max()))  # z_box_F takes the rows' force
    for qp in (pp.QP(P=[[1.0]], q=[0.0], C=[[3.0]], l=[0.4], u=[0.4], lb=[0.1], ub=[0.1]),
               pp.QP(P=[[1.0]], q=[0.0], C=[[3.0]], l=[-np.inf], u=[0.3 - 1e-9], lb=[0.1], ub=[0.1]),
               pp.QP(P=np.eye(2), q=[0.0, 0.0], C=[[3.0, 0.0], [1.0, 1.0]], l=[0.4, -np.inf], u=[0.4, 1.0],
                     lb=[0.1, -5.0], ub=[0.1, 5.0])):
        assert pp.solve_qp(qp, backend=backend).status == pp.Status.PRIMAL_INFEASIBLE


def test_a_batched_cost_beyond_1e20_is_a_cost_too():
    """``solve_batch`` reads a batched q as single solves do: finite at any size (it refused 1e20 as 'no bound')."""
    s = 1e20
    bs = pp.get_backend("daqp").solve_batch(pp.QP(P=s * np.eye(2), q=[0.0, 0.0], ub=[0.5, 1.0]),
                                            q=np.array([[-s, -0.3 * s], [0.0, 0.0]]))
    assert [st.name for st in bs.status] == ["SOLVED", "SOLVED"]
    np.testing.assert_allclose(bs.x[0], [0.5, 0.3], rtol=1e-9)
    np.testing.assert_allclose(bs.x[1], [0.0, 0.0], atol=1e-12)
