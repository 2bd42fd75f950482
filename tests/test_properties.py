"""The property kit itself: strategies keep their promises, the HS-set enumeration and the kink finder
are right on hand-checked cases, conservativity (>= 200 segments) and LICQ equivalence (>= 50
degenerate points) hold, the non-LICQ example, and the checks have teeth (a wrong Jacobian fails).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

import polyproj as pp
from polyproj.testing import properties as pr
from polyproj.testing import strategies as ps
from polyproj.testing.check import run_property

CPU_BACKENDS = [name for name in pp.available_backends() if name != "cupy"]


# ----------------------------------------------------------------------------- strategies
@pytest.mark.core
@given(case=ps.polyhedron_cases(licq=True))
def test_licq_cases_have_independent_active_rows(case):
    G, _ = pr.ineq_form(case.polyhedron)
    M = np.vstack([G[case.active], case.polyhedron.B_dense])
    assert case.active.any()
    assert np.linalg.matrix_rank(M) == M.shape[0]
    assert case.polyhedron.violation(case.y_star) == 0.0


@pytest.mark.core
@given(case=ps.polyhedron_cases(licq=False))
def test_nonlicq_cases_have_dependent_active_rows(case):
    G, _ = pr.ineq_form(case.polyhedron)
    M = np.vstack([G[case.active], case.polyhedron.B_dense])
    assert np.linalg.matrix_rank(M) < M.shape[0]
    assert case.redundancy in ("duplicate", "scaled", "dependent")


@given(pt=ps.degenerate_points(ps.polyhedron_cases(licq=None)))
def test_degenerate_points_project_to_y_star_with_a_weakly_active_row(pt):
    res = pp.project(pt.x, pt.polyhedron)
    np.testing.assert_allclose(res.y, pt.y, atol=1e-9)
    np.testing.assert_array_equal(res.active, pt.case.active)
    assert np.any(pt.case.active & (pt.lam == 0))  # several active sets meet near x
    assert np.all(pt.lam[~pt.case.active] == 0)


@pytest.mark.core
@given(case=ps.feasible_qps())
def test_feasible_qps_contain_their_witness(case):
    assert case.qp.primal_violation(case.x_feasible) == 0.0
    assert np.linalg.eigvalsh(case.qp.P).min() > 0.5 or np.all(np.isfinite(case.qp.lb) & np.isfinite(case.qp.ub))


@pytest.mark.core
@given(case=ps.infeasible_qps())
def test_infeasible_qps_carry_a_farkas_certificate(case):
    y, y_box, qp = case.certificate, case.certificate_box, case.qp
    np.testing.assert_array_equal(qp.C.T @ y + y_box, 0.0)  # small integers: exact
    # the support uses only finite sides, each on the side of its multiplier's sign, and is negative
    used = np.concatenate([np.where(y > 0, qp.u, np.where(y < 0, qp.l, 0.0)),
                           np.where(y_box > 0, qp.ub, np.where(y_box < 0, qp.lb, 0.0))])
    assert np.all(np.isfinite(used))
    assert used @ np.concatenate([y, y_box]) <= -1
    assert qp.is_primal_infeasibility_certificate(y, y_box)


@pytest.mark.core
def test_infeasible_qps_reach_every_kind_of_side():
    """The kit's infeasible QPs used upper sides only (l = -inf everywhere): ProxSuite's MAX_ITER on
    x <= -1, x >= 1 went unseen. Among 60 seeded draws each kind of side carries a certificate."""
    from hypothesis import seed, settings

    features = {
        "lower side": lambda c: np.any(c.certificate < 0),
        "two-sided row": lambda c: np.any(np.isfinite(c.qp.l) & np.isfinite(c.qp.u) & (c.qp.l < c.qp.u)),
        "equality row": lambda c: np.any(c.qp.l == c.qp.u),
        "variable bound": lambda c: np.any(c.certificate_box != 0),
        "one row and bounds": lambda c: c.qp.m == 1 and np.any(c.certificate_box != 0),
    }
    seen = dict.fromkeys(features, 0)

    @seed(0)
    @settings(max_examples=60, database=None, derandomize=False)
    @given(case=ps.infeasible_qps())
    def draw(case):
        for name, has in features.items():
            seen[name] += bool(has(case))

    draw()
    assert all(v >= 3 for v in seen.values()), seen


@pytest.mark.core
@given(case=ps.qp_batches())
def test_qp_batches_share_a_general_p_and_batch_every_vector(case):
    P = case.qp.dense().P
    assert not np.array_equal(P, np.eye(case.qp.n))  # not a projection's P
    assert case.qp.n == 1 or not np.array_equal(P, P[0, 0] * np.eye(case.qp.n))  # nor a multiple of I
    assert set(case.vectors) == ({"q", "l", "u", "lb", "ub"} if case.qp.m else {"q", "lb", "ub"})
    assert all(v.shape[0] == case.size >= 2 for v in case.vectors.values())
    for i in range(case.size):
        assert case.element(i).primal_violation(case.x_feasible[i]) == 0.0
    if not case.strictly_convex:  # bounded: every variable boxed
        assert np.all(np.isfinite(case.vectors["lb"]) & np.isfinite(case.vectors["ub"]))


@pytest.mark.core
def test_falsifying_examples_print_compactly():
    P = pp.Polyhedron(A=[[1.0, 0.0]], a=[1.0], lb=[0.0, 0.0])
    case = ps.PolyhedronCase(P, np.array([1.0, 0.0]), np.array([True, False, True]), licq=True)
    assert repr(case) == "PolyhedronCase(A=[[1, 0]], a=[1], lb=[0, 0], y_star=[1, 0])"


# ----------------------------------------------------------------------------- HS set and kinks, by hand
@pytest.mark.core
def test_hs_set_at_a_corner_of_the_orthant():
    # P = {y <= 0}, x = (1, 0): y = 0, both rows active, multiplier (1, 0): K ∈ {{0}, {0, 1}}
    P = pp.Polyhedron(ub=np.zeros(2))
    els = pr.hs_set(P, np.array([1.0, 0.0]), np.zeros(2), np.array([True, True]))
    assert sorted(e.K for e in els) == [(0,), (0, 1)]
    Js = {e.K: e.J for e in els}
    np.testing.assert_allclose(Js[(0,)], np.diag([0.0, 1.0]), atol=1e-12)
    np.testing.assert_allclose(Js[(0, 1)], np.zeros((2, 2)), atol=1e-12)


def test_hs_set_of_a_strictly_complementary_point_is_the_jacobian():
    P = pp.Polyhedron(A=[[1.0, 1.0]], a=[1.0])
    x = np.array([2.0, 1.0])
    res = pp.project(x, P)
    els = pr.hs_set(P, x, res.y, res.active)
    assert len(els) == 1
    np.testing.assert_allclose(els[0].J, pp.hs_jacobian(P, res.active), atol=1e-12)


def test_find_kinks_on_a_segment_through_an_interval():
    P = pp.Polyhedron(lb=[0.0], ub=[1.0])
    kinks = pr.find_kinks(P, np.array([[-1.0]]), np.array([[3.0]]), "proxsuite")
    np.testing.assert_allclose(kinks[0], [1.0 / 3.0, 2.0 / 3.0], atol=1e-10)


def test_find_kinks_through_a_vertex_where_two_rows_change_at_once():
    # the segment from (-1, -1) to (1, 1) crosses the corner of {y >= 0}: both bounds leave at t = 1/2
    P = pp.Polyhedron(lb=np.zeros(2))
    kinks = pr.find_kinks(P, np.array([[-1.0, -1.0]]), np.array([[2.0, 2.0]]), "proxsuite")
    np.testing.assert_allclose(kinks[0], [0.5], atol=1e-10)


# ----------------------------------------------------------------------------- the theorems
def test_conservativity_on_200_segments_through_degenerate_points():
    res = run_property("conservativity", "proxsuite", max_examples=25, seed=0)
    assert res.status == "passed", res.message + "\n" + res.falsifying
    assert res.counts["segments"] >= 200
    assert res.counts["kinks"] >= 100  # the segments do cross kinks
    assert res.counts["hs_elements"] > res.counts["pieces"] // 2
    # points within the polish's tolerance of a kink are not compared: they must stay rare
    assert res.counts["band_points"] <= res.counts["derivative_points"] // 20


def test_licq_equivalence_at_50_degenerate_points():
    res = run_property("licq_equivalence", "proxsuite", max_examples=50, seed=0)
    assert res.status == "passed", res.message + "\n" + res.falsifying
    assert res.counts["points"] >= 50
    # degenerate: more HS elements than points (several active sets near each point)
    assert res.counts["hs_elements"] >= 2 * res.counts["points"]
    assert res.counts["random_samples"] >= 16 * 45


def test_b_subdifferential_within_hs_set_without_licq():
    res = run_property("hs_contains_b", "proxsuite", max_examples=20, seed=1)
    assert res.status == "passed", res.message + "\n" + res.falsifying
    assert res.counts["points"] >= 10


@pytest.mark.core
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_conservativity_and_licq_on_every_backend(backend):
    for name in ("conservativity", "licq_equivalence"):
        res = run_property(name, backend, max_examples=3, seed=2)
        assert res.status == "passed", f"{name} on {backend}: {res.message}\n{res.falsifying}"


def test_nonlicq_example_hs_set_strictly_larger_than_b_subdifferential():
    P, x, doc = pr.nonlicq_example()
    res = pp.project(x, P)
    np.testing.assert_allclose(res.y, 0.0, atol=1e-12)
    assert res.active.all()  # three active rows in R^2: LICQ fails
    els = pr.hs_set(P, x, res.y, res.active)
    assert sorted(e.K for e in els)[0] == (0, 1) and len(els) == 2
    hs = sorted((e.J for e in els), key=lambda J: float(np.trace(J)))
    np.testing.assert_allclose(hs[0], np.zeros((2, 2)), atol=1e-12)
    np.testing.assert_allclose(hs[1], np.eye(2) - 0.5, atol=1e-12)
    Jb, discarded = pr.b_subdifferential_samples(P, x, "proxsuite", np.random.default_rng(0), n_random=32,
                                                 delta=1e-2)
    assert len(Jb) == 32 and discarded == 0
    assert all(np.abs(J).max() < 1e-8 for J in Jb)  # ∂_B Π(x) = {0}
    J_used = pp.hs_jacobian(P, res.active)
    np.testing.assert_allclose(J_used, 0.0, atol=1e-12)  # the element we use is in both sets
    assert "B-subdifferential" in doc


@pytest.mark.core
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@given(batch=ps.projection_batches())
def test_projection_properties(backend, batch):
    case, X = batch
    pr.check_projection(case.polyhedron, X, backend, feasible=case.y_star)


# ----------------------------------------------------------------------------- teeth
def _segment_case():
    P = pp.Polyhedron(A=[[1.0, 1.0]], a=[1.0], lb=np.zeros(2))
    case = ps.PolyhedronCase(P, np.array([1.0, 0.0]), np.array([True, False, True]), licq=True)
    pt = ps.DegeneratePoint(case, np.array([2.0, 1.0]), np.array([1.0, 0.0, 0.0]), np.zeros(0), "vertex")
    return ps.SegmentCase(pt, np.array([[0.3, 2.0], [-2.0, 1.0]]), np.array([0.5, 0.4])), pt


def test_conservativity_catches_a_wrong_jacobian(monkeypatch):
    seg, _ = _segment_case()
    assert pr.check_conservativity(seg, "proxsuite")["segments"] == 2
    # drop the last active row from the Jacobian: a plausible bug in an active-set implementation
    real = pr.hs_vjp

    def wrong(P, active, V):
        act = np.array(active, copy=True)
        act[..., -1] = False
        return real(P, act, V)

    monkeypatch.setattr(pr, "hs_vjp", wrong)
    with pytest.raises(AssertionError, match="path integral fails"):
        pr.check_conservativity(seg, "proxsuite")


def _slow_crossing_case():
    """Segments through a vertex where a bound and a row of A leave at rate 0.002 along segment 6 (a case
    hypothesis generated): within 1e-5 of t = s their slacks are below the polish's feasibility tolerance."""
    P = pp.Polyhedron(A=[[-1.0, -4.0, 0.0, -1.0]], a=[7.0], lb=[-np.inf, -np.inf, -3.0, 2.0],
                      ub=[-1.0, np.inf, 2.0, np.inf])
    y = np.array([-1.0, -2.0, 0.0, 2.0])
    case = ps.PolyhedronCase(P, y, np.array([True, False, True, True, False]), licq=True)
    pt = ps.DegeneratePoint(case, y, np.zeros(5), np.zeros(0), "edge")
    D = np.array([[0, 0, 0.12, 1.785], [1.89, 0.632, 2.866, 2.855], [-1.566, -1.031, 0, 0.2], [-1.839, 0, 0, 0],
                  [1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0.002], [1, 0, 0, 0]])
    return ps.SegmentCase(pt, D, np.array([0.48, 0.439, 0.782, 0.751, 0.2, 0.333, 0.368, 0.266])), P


def test_exact_certificate_tells_rounding_from_tolerance():
    seg, P = _slow_crossing_case()
    x = seg.x0[6] + 0.368000565 * seg.directions[6]  # x4 − lb4 = 1.13e-9: free, within the tolerance of its bound
    res = pp.project(x[None], P, backend="proxsuite")
    assert res.polished[0]
    exact_face = pr.exact_certificate(P, x, res.y[0], res.active[0])
    y_free = np.array([-1.0, -2.0, 0.0, x[3]])  # the exact projection: x1 at its upper bound, x4 free
    assert pr.exact_certificate(P, x, y_free, np.array([False, False, False, True, False]))
    # the polished answer is exact, or (at this tolerance) the neighbouring face: never called exact then
    assert exact_face == bool(np.abs(res.y[0] - y_free).max() <= 1e-12)
    assert not pr.exact_certificate(P, x, np.array([-1.0, -2.0, 0.0, 2.0]), np.array([True, False, True, True, False]))
    # dependent active rows (a duplicated row): non-negative multipliers exist, min-norm ones need not
    Q = pp.Polyhedron(A=[[1.0, 1.0], [2.0, 2.0], [1.0, 0.0]], a=[1.0, 2.0, 1.0])
    assert pr.exact_certificate(Q, np.array([1.0, 1.0]), np.array([0.5, 0.5]), np.array([True, True, False]))
    assert not pr.exact_certificate(Q, np.array([1.0, 1.0]), np.array([0.6, 0.6]), np.array([True, True, False]))


def test_conservativity_on_slowly_crossing_rows():
    """The backend's face within tolerance of a kink is not compared with a central difference; the rest is."""
    seg, _ = _slow_crossing_case()
    out = pr.check_conservativity(seg, "proxsuite")
    assert out["segments"] == 8 and out["kinks"] >= 8
    assert out["derivative_points"] - out["band_points"] >= 12 and out["hs_elements"] >= 12


def test_licq_equivalence_catches_a_wrong_element(monkeypatch):
    _, pt = _segment_case()
    assert pr.check_licq_equivalence(pt, "proxsuite")["hs_elements"] == 2
    monkeypatch.setattr(pr, "hs_jacobian", lambda P, active: np.eye(P.n))
    with pytest.raises(AssertionError, match="not in the HS set"):
        pr.check_licq_equivalence(pt, "proxsuite")
