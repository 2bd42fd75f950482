"""The guard's LP (backends/feasibility.py) under a diagonal change of variables (probe s47).

A feasible QP with columns scaled 1e-8..1e8 and rows 1e-8..1e8 (a unit-scale problem, a known point 3 % inside
every row) was PRIMAL_INFEASIBLE by four backends: the LP measured its margin in x's own units, where a strictly
feasible point was 4e-10 inside, below the 1e-8 a refutation needs (HiGHS even returned t* = +4e-9). The LP now
works in equilibrated variables: its answer does not depend on the units of the variables or the rows.
"""

import numpy as np
import pytest

import polyproj as pp
from polyproj.backends import feasibility


def _unit_problem(rng, n=6, m=8):
    """A unit-scale feasible set (y0 inside every two-sided row by 0..1 and every box by 0..2) and its QP data."""
    L = rng.standard_normal((n, n))
    P0 = L @ L.T / n + 0.01 * np.eye(n)
    C0 = rng.standard_normal((m, n))
    y0 = rng.standard_normal(n)
    l0 = C0 @ y0 - rng.random(m)
    u0 = C0 @ y0 + rng.random(m)
    l0[::2] = -np.inf
    return P0, rng.standard_normal(n), C0, l0, u0, y0


def _scaled(P0, q0, C0, l0, u0, D, R, lb0=None, ub0=None):
    """The same problem in x = y / D with rows times R."""
    P = D[:, None] * P0 * D[None, :]
    kw = {} if lb0 is None else {"lb": lb0 / D, "ub": ub0 / D}
    return pp.QP(P=(P + P.T) / 2, q=D * q0, C=R[:, None] * C0 * D[None, :], l=R * l0, u=R * u0, **kw)


class _ClaimsInfeasible(pp.QPSolver):
    """A backend that passes on a bare PRIMAL_INFEASIBLE flag whatever the problem (as DAQP and PIQP can)."""

    name = "claims_infeasible"
    capabilities = pp.Capabilities(dense=True)

    def solve(self, qp, warm_start=None):
        return self._nan_solution(qp, pp.Status.PRIMAL_INFEASIBLE, self.name)


def test_a_false_infeasibility_claim_is_refuted_whatever_the_scaling_of_the_variables():
    """The probe's QP: columns and rows scaled 1e-8..1e8 around a unit-scale feasible set. The claim was kept (the
    LP's t* was +3.8e-9 in x's units); now the LP's point refutes it, and lies in the set (checked in float64)."""
    rng = np.random.default_rng(47)
    P0, q0, C0, l0, u0, y0 = _unit_problem(rng)
    D, R = 10.0 ** rng.uniform(-8, 8, 6), 10.0 ** rng.uniform(-8, 8, 8)
    qp = _scaled(P0, q0, C0, l0, u0, D, R)
    x0 = y0 / D
    slack = np.minimum(qp.C @ x0 - qp.l, qp.u - qp.C @ x0) / R  # relative to the unit-scale rows
    assert slack.min() > 1e-3  # x0 strictly inside every row: the set is feasible with an interior
    sol = _ClaimsInfeasible().solve(qp)
    assert sol.status is pp.Status.NUMERICAL_ERROR and "refuted" in sol.info["validation"]
    x = feasibility.interior_point(qp)
    assert x is not None and feasibility.refutes(qp, x)
    # the point is inside every row in the unit-scale problem's own terms, not just to rounding
    assert np.all(qp.C @ x - qp.l >= 0) and np.all(qp.u - qp.C @ x >= 0)
    # the IPM on the same problem: not PRIMAL_INFEASIBLE (SOLVED, or the refuted claim's NUMERICAL_ERROR)
    assert pp.solve_qp(qp, backend="ipm").status is not pp.Status.PRIMAL_INFEASIBLE


def test_the_lp_is_the_same_under_any_diagonal_scaling_of_variables_and_rows():
    """t* of the LP (its margin) for a unit-scale boxed problem and for the same problem with columns and rows
    scaled 1e-d..1e+d: equal to 1e-6 (it fell from 0.2 to 4e-4 at d = 8 in x's own units)."""
    rng = np.random.default_rng(3)
    P0, q0, C0, l0, u0, y0 = _unit_problem(rng)
    lb0, ub0 = y0 - 2 * rng.random(6), y0 + 2 * rng.random(6)
    lb0[::3] = -np.inf
    base = pp.QP(P=P0, q=q0, C=C0, l=l0, u=u0, lb=lb0, ub=ub0)
    _, t0, free = feasibility.least_violation(base)
    assert not free and t0 < -1e-2  # y0 is inside every row and bound by a unit-scale margin
    for d in (2, 4, 8):
        D, R = 10.0 ** rng.uniform(-d, d, 6), 10.0 ** rng.uniform(-d, d, 8)
        qp = _scaled(P0, q0, C0, l0, u0, D, R, lb0, ub0)
        x, t, _ = feasibility.least_violation(qp)
        assert t == pytest.approx(t0, rel=1e-6), d
        np.testing.assert_allclose(feasibility.column_scale(qp), feasibility.column_scale(base) / D, rtol=1e-6)
        assert feasibility.refutes(qp, x) and qp.primal_violation(x) <= 1e-12 * np.abs(x).max()


def test_empty_sets_and_sets_without_interior_keep_their_claims_when_scaled():
    """The existing guarantees hold in any units: a set empty by 0.02 in a box at 1e9 (columns scaled 1e-6 and
    1e6) and a set that is one hyperplane (two inequality rows, no interior) keep a claim of infeasibility."""
    inf = np.inf
    for S in (np.array([1.0, 1.0]), np.array([1e-6, 1e6])):  # x' = S x: C' = C / S, bounds S lb, S ub
        empty = pp.QP(P=np.eye(2), q=[0.0, 0.0], C=np.array([[1.0, -1.0], [-1.0, 1.0]]) / S, l=[-inf] * 2,
                      u=[-0.01] * 2, lb=S * 1e9, ub=S * 2e9)
        assert not feasibility.refutes(empty, feasibility.interior_point(empty))
        assert _ClaimsInfeasible().solve(empty).status is pp.Status.PRIMAL_INFEASIBLE
        flat = pp.QP(P=np.eye(2), q=[0.0, 0.0], C=np.array([[1.0, 1.0], [-1.0, -1.0]]) / S, l=[-inf] * 2,
                     u=[1.0, -1.0])
        assert feasibility.interior_point(flat) is None
        assert _ClaimsInfeasible().solve(flat).status is pp.Status.PRIMAL_INFEASIBLE
        assert feasibility.certainly_empty(flat) is None


def test_an_empty_set_is_certainly_empty_in_any_units():
    """``x <= 1``, ``x >= 2`` is empty by 1; in units where x' = 1e-12 x the LP's gap (0.5e-12 in x''s units) fell
    below EMPTY_GAP and certainly_empty said nothing, so a claim of unboundedness on it stood. Now the gap is
    measured in equilibrated variables: empty at every scale, and the claim becomes PRIMAL_INFEASIBLE."""

    class Unbounded(pp.QPSolver):
        name = "always_unbounded"
        capabilities = pp.Capabilities(dense=True)

        def solve(self, qp, warm_start=None):
            return self._nan_solution(qp, pp.Status.DUAL_INFEASIBLE, self.name)

    for s in (1.0, 1e-12, 1e12):
        qp = pp.QP(P=np.zeros((2, 2)), q=[0.0, -1.0], C=[[1.0 / s, 0.0], [1.0 / s, 0.0]], l=[-np.inf, 2.0],
                   u=[1.0, np.inf])
        assert feasibility.certainly_empty(qp) is not None, s
        assert Unbounded().solve(qp).status is pp.Status.PRIMAL_INFEASIBLE, s
    # a feasible set at any scale is never certainly empty
    for s in (1.0, 1e-12, 1e12):
        qp = pp.QP(P=np.zeros((2, 2)), q=[0.0, -1.0], C=[[1.0 / s, 0.0], [1.0 / s, 0.0]], l=[-np.inf, 1.0],
                   u=[2.0, np.inf])
        assert feasibility.certainly_empty(qp) is None, s


def test_ruiz_equilibrates_data_whose_entries_are_all_tiny():
    """Ruiz counted every row and column whose largest entry is below an absolute 1e-8 as 1: data at 1e-12 was
    left as it came (and the guard's normalised form of a column-scaled QP, C's columns near 3e-13 beside entries of
    1, was not equilibrated). The floor is eps times max(1, the element's largest entry): 1e-6 and 1e-12 times a
    unit-scale problem are equilibrated like the problem itself; entries at rounding (below eps) still count as 0."""
    from polyproj.solvers.ipm.scaling import ruiz

    rng = np.random.default_rng(5)
    P0, q0, C0, _, _, _ = _unit_problem(rng)
    for size in (1.0, 1e-6, 1e-12):
        r = ruiz(np, size * P0[None], size * C0[None], q0[None], 10)
        K = np.block([[r.Ps[0], r.Cs[0].T], [r.Cs[0], np.zeros((8, 8))]])
        # equilibrated: the largest entry of every row and column of [P Cᵀ; C 0] near 1 (it was 1e-12 at 1e-12)
        assert np.all(np.abs(np.abs(K).max(axis=0) - 1.0) < 0.05), size
        np.testing.assert_allclose(r.Ps[0], r.D[0][:, None] * size * P0 * r.D[0][None, :], rtol=1e-12)
    # a zero column stays 1 (nothing to equilibrate), an all-zero matrix too
    Z = ruiz(np, np.zeros((1, 2, 2)), np.array([[[1e-12, 0.0]]]), np.zeros((1, 2)), 10)
    assert Z.D[0, 1] == 1.0 and np.all(np.isfinite(Z.D))
    assert np.all(ruiz(np, np.zeros((1, 2, 2)), np.zeros((1, 1, 2)), np.zeros((1, 2)), 10).D == 1.0)
    # P = 1e-40 I (in a box the pass does not see): zero to rounding, left as it is (scaled up by 1e20, the IPM
    # ran to MAX_ITER)
    assert np.all(ruiz(np, 1e-40 * np.eye(2)[None], np.zeros((1, 0, 2)), np.ones((1, 2)), 10).D == 1.0)


def test_the_ipm_solves_the_column_scaled_qp():
    """With Ruiz's relative floor the IPM solves the probe's QP (it said PRIMAL_INFEASIBLE, NUMERICAL_ERROR once the
    guard refuted the claim): the objective of the unit-scale problem (the IPM on it at 1e-10) to 1e-5 relative,
    every row met to 1e-7 of its unit-scale terms."""
    rng = np.random.default_rng(47)
    P0, q0, C0, l0, u0, _ = _unit_problem(rng)
    D, R = 10.0 ** rng.uniform(-8, 8, 6), 10.0 ** rng.uniform(-8, 8, 8)
    qp = _scaled(P0, q0, C0, l0, u0, D, R)
    ref = pp.solve_qp(pp.QP(P=P0, q=q0, C=C0, l=l0, u=u0), backend="ipm", eps_abs=1e-10)
    assert ref.status is pp.Status.SOLVED
    sol = pp.solve_qp(qp, backend="ipm")
    assert sol.status is pp.Status.SOLVED, sol.info
    f_ref = 0.5 * ref.x @ P0 @ ref.x + q0 @ ref.x
    assert 0.5 * sol.x @ qp.P @ sol.x + qp.q @ sol.x == pytest.approx(f_ref, rel=1e-5)
    assert np.max(np.maximum(qp.C @ sol.x - qp.u, qp.l - qp.C @ sol.x) / R) <= 1e-7
