"""check_projector on a third party's broken sets: far and tiny boundaries, multipliers, sys.exit, NaN answers,
result shapes, sets of dimension 20 to 50, and the LICQ strategy at n = 5 (a probe of the projector kit)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from array_api_compat import array_namespace

import polyproj as pp
from polyproj.testing import check_projector

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class _Box(pp.Projector):
    """[lo, hi]^n with switchable bugs."""

    def __init__(self, n, lo, hi, broken=""):
        self._n, self.lo, self.hi, self.broken = n, float(lo), float(hi), broken

    @property
    def n(self):
        return self._n

    def project_batch(self, X):
        xp = array_namespace(X)
        z = xp.zeros_like(X)
        lo, hi = X <= self.lo, X >= self.hi
        Y = xp.clip(X, self.lo, self.hi)
        mult = xp.concat([xp.where(lo, self.lo - X, z), xp.where(hi, X - self.hi, z)], axis=1)
        if self.broken == "no upper":  # the upper bound is never applied
            Y, hi = xp.where(lo, Y, X), xp.zeros_like(hi)
            mult = xp.concat([mult[:, :self._n], z], axis=1)
        if self.broken == "band":  # points within 1e-3 of the size outside are left unprojected
            keep = xp.abs(X) - self.hi < 1e-3 * self.hi
            Y = xp.where(keep, X, Y)
        if self.broken == "negated":
            mult = -mult
        if self.broken == "off":
            Y = Y + 1e-4 * (self.hi - self.lo)
        if self.broken == "f32 centre" and X.dtype == xp.float32:
            Y = z
        if self.broken == "exit" and float(xp.max(xp.abs(X))) > 1e2 * self.hi:
            sys.exit(0)
        if self.broken == "nan far":
            Y = xp.where(xp.max(xp.abs(X), axis=1, keepdims=True) > 1e2 * self.hi, xp.full_like(Y, float("nan")), Y)
        return self.result(X, Y, active=xp.concat([lo, hi], axis=1), multipliers=mult)

    def vjp(self, result, G):
        xp = array_namespace(G)
        act = result.active[:, :self._n] | result.active[:, self._n:]
        return xp.where(act, xp.zeros_like(G), G)

    def as_polyhedron(self):
        return pp.Polyhedron(lb=np.full(self._n, self.lo), ub=np.full(self._n, self.hi))


class _Orthant(pp.Projector):
    """y >= 0, the multipliers of the rows active by less than 0.5 left at 0."""

    @property
    def n(self):
        return 3

    def project_batch(self, X):
        xp = array_namespace(X)
        act = X <= 0
        mult = xp.where(X < -0.5, -X, xp.zeros_like(X))
        return self.result(X, xp.where(act, xp.zeros_like(X), X), active=act, multipliers=mult)

    def vjp(self, result, G):
        xp = array_namespace(G)
        return xp.where(result.active, xp.zeros_like(G), G)

    def as_polyhedron(self):
        return pp.Polyhedron(lb=np.zeros(3))


def _bad_rows(report):
    return {r.name: r.message for r in report.results if not r.ok}


# ----------------------------------------------------------------------------- 1: the set's scale is its extent
@pytest.mark.parametrize(("lo", "hi", "broken"), [(-1e6, 1e6, "no upper"), (-10.0, 10.0, "band"),
                                                  (-100.0, 100.0, "band")])
def test_a_boundary_far_from_the_projection_of_zero_is_sampled(lo, hi, broken):
    """Samples at 1 + |Π(0)| = 1 never came near a boundary at 10, 100 or 1e6: these broken boxes passed."""
    assert check_projector(_Box(3, lo, hi), examples=20, seed=0).passed
    report = check_projector(_Box(3, lo, hi, broken), examples=20, seed=0)
    assert not report.passed and "agreement" in _bad_rows(report), str(report)


def test_a_skipped_conservativity_row_says_it_checked_nothing():
    from polyproj.testing.projector import _conservativity

    msg = _conservativity(_Box(3, 0.0, 1.0), _Box(3, 0.0, 1.0).as_polyhedron(), np.zeros((0, 3)),
                          np.random.default_rng(0))
    assert isinstance(msg, str) and msg.startswith("NOT CHECKED")


def test_the_scale_is_the_distance_of_the_rows_from_the_projection_of_zero():
    from polyproj.testing.projector import _center_scale

    for lo, hi, want in ((-1e6, 1e6, 1e6), (1e6, 2e6, 1e6), (-1e-6, 1e-6, 1e-6)):
        S = _Box(3, lo, hi)
        assert _center_scale(S, S.as_polyhedron())[1] == pytest.approx(want)
    assert _center_scale(_Orthant(), _Orthant().as_polyhedron())[1] == 1.0  # a cone at Π(0): 1 + |Π(0)|


# ----------------------------------------------------------------------------- 2: multipliers per point
def test_wrong_multipliers_fail_the_projection_row_at_every_scale():
    """A bound of 1e-8 · (largest |x| of the batch)² let stationarity off by 0.5 pass, and every sign wrong at 1e6."""
    report = check_projector(_Orthant(), examples=20, seed=0)
    assert "stationarity" in _bad_rows(report).get("projection", ""), str(report)
    assert check_projector(_Box(3, 1e6, 2e6), examples=20, seed=0).passed
    report = check_projector(_Box(3, 1e6, 2e6, "negated"), examples=20, seed=0)
    assert "wrong sign" in _bad_rows(report).get("projection", ""), str(report)


# ----------------------------------------------------------------------------- 3: tiny sets
@pytest.mark.parametrize("broken", ["off", "f32 centre"])
def test_a_tiny_set_is_held_to_its_own_scale(broken):
    """Tolerances tol · (1 + |x|) were ~1e-9 absolute for a set of size 1e-6: both bugs passed."""
    assert check_projector(_Box(4, -1e-6, 1e-6), examples=20, seed=0).passed
    report = check_projector(_Box(4, -1e-6, 1e-6, broken), examples=20, seed=0)
    assert not report.passed, str(report)
    if broken == "f32 centre":
        assert "float32" in _bad_rows(report)


# ----------------------------------------------------------------------------- 4: sys.exit
def test_sys_exit_inside_a_set_is_an_error_row():
    report = check_projector(_Box(3, -1.0, 1.0, "exit"), examples=8, seed=0)
    assert not report.passed
    assert any("called sys.exit()" in m for m in _bad_rows(report).values()), str(report)


# ----------------------------------------------------------------------------- 5: dimension
@pytest.mark.parametrize("S", [pp.sets.Simplex(20), pp.sets.CappedSimplex(20, 2.0, 0.5), pp.sets.Simplex(50),
                               pp.sets.Box(-np.ones(20), np.ones(20))], ids=repr)
def test_correct_sets_of_moderate_dimension_pass(S):
    """'16 active rows: enumerating 2^16 subsets is too costly' and 'the active set flips too often' failed them."""
    report = check_projector(S, examples=8, seed=0)
    assert report.passed, str(report)
    assert report["conservativity"].status == "passed"


def test_hs_set_beyond_the_enumeration_limit_samples_index_sets():
    from polyproj.testing.properties import hs_set

    n = 20
    P = pp.sets.Simplex(n).as_polyhedron()
    x = np.r_[np.full(16, -1.0), 3.0, 3.1, 3.2, 3.3]  # θ = 2.9: the 16 bounds strongly active
    res = pp.project(x, pp.sets.Simplex(n))
    els = hs_set(P, x, res.y, res.active)  # LICQ, every active row strongly active: one element, K = I
    assert len(els) == 1 and els[0].K == tuple(np.flatnonzero(res.active))
    x[0] = 2.9  # x_0 − θ = 0: weakly active, two elements (without and with that row)
    res = pp.project(x, pp.sets.Simplex(n))
    els = hs_set(P, x, res.y, res.active, rng=np.random.default_rng(0))
    assert sorted(len(e.K) for e in els) == [15, 16]


# ----------------------------------------------------------------------------- 6: NaN answers
def test_a_nan_answer_is_named_not_a_crash_of_the_kit():
    report = check_projector(_Box(3, -1.0, 1.0, "nan far"), examples=8, seed=0)
    bad = _bad_rows(report)
    assert {"projection", "namespaces"} <= set(bad), str(report)
    for name in ("projection", "agreement", "namespaces"):
        assert "the set returned NaN" in bad[name], str(report)
    assert all(r.status != "error" for r in report.results), str(report)


# ----------------------------------------------------------------------------- 7: shapes of active, multipliers
def test_multipliers_of_the_wrong_shape_are_named():
    class NoEqualityMultiplier(_Box):
        def project_batch(self, X):
            res = super().project_batch(X)
            return self.result(X, res.y, active=res.active, multipliers=res.multipliers[:, :-1])

    S = NoEqualityMultiplier(3, -1.0, 1.0)
    with pytest.raises(pp.SolverError, match=r"multipliers of shape \(1, 5\) .* expected \(1, 6\)"):
        pp.project(np.zeros(3), S)
    report = check_projector(S, examples=8, seed=0)
    assert "expected (" in report["set-up"].message and "multipliers" in report["set-up"].message

    class ActiveOfBox(_Box):
        def project_batch(self, X):
            res = super().project_batch(X)
            return self.result(X, res.y, active=res.active[:, :self._n], multipliers=res.multipliers)

    with pytest.raises(pp.SolverError, match=r"active of shape \(2, 3\) .* expected \(2, 6\)"):
        pp.project(np.zeros((2, 3)), ActiveOfBox(3, -1.0, 1.0))


# ----------------------------------------------------------------------------- 8: the LICQ strategy at n = 5
def test_polyhedron_cases_with_licq_have_strictly_dominant_tight_rows():
    """The pivot 4 at n = 5 is only weakly dominant (4 other entries of size 1): 5I − J could be drawn."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from polyproj.testing.properties import ineq_form
    from polyproj.testing.strategies import polyhedron_cases

    @settings(max_examples=60, derandomize=True, deadline=None)
    @given(polyhedron_cases(min_n=5, max_n=5, licq=True, kinds=("vertex",)), st.just(None))
    def check(case, _):
        G, _h = ineq_form(case.polyhedron)
        rows = np.vstack([G[case.active], case.polyhedron.B_dense]).reshape(-1, 5)
        big = np.abs(rows).max(axis=1)
        assert np.all(big > np.abs(rows).sum(axis=1) - big), rows  # strictly dominant in the pivot
        assert np.linalg.matrix_rank(rows) == rows.shape[0]

    check()
