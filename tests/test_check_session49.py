"""The kit, session 49: ``projection_contract`` holds a backend's own ``solve_projections`` (the projection entry
array-API backends override) to the raw contract, and ``batch_qp_contract`` batches a random subset of the vectors
(``solve_batch`` allows any), so a native batch path that drops a shared vector is caught.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hseed

import polyproj as pp
from polyproj.backends.projection import ProjectionStart, solve_on_host
from polyproj.polydata import PolyData
from polyproj.testing import properties as pr
from polyproj.testing import strategies as ps
from polyproj.testing.check import _props, run_property

CPU_BACKENDS = [name for name in pp.available_backends() if name != "cupy"]
needs_proxsuite = pytest.mark.skipif("proxsuite" not in CPU_BACKENDS, reason="proxsuite not installed")

# {y : y1 + 2 y2 <= 0.5, y1 + y2 + y3 = 1, y >= 0}: both points project to (0.5, 0, 0.5). By hand, x − y =
# λ (1, 2, 0) + μ (1, 1, 1) − ν e2 with λ, ν >= 0: x = (0.9, 0.5, −1) gives μ = −1.5, λ = 1.9, ν = 1.8;
# x = (3, 0.1, 0.2) gives μ = −0.3, λ = 2.8, ν = 5.2
_S = pp.Polyhedron(A=[[1.0, 2.0, 0.0]], a=[0.5], B=np.ones((1, 3)), b=[1.0], lb=np.zeros(3))
_X = np.array([[0.9, 0.5, -1.0], [3.0, 0.1, 0.2]])
_Y = np.array([[0.5, 0.0, 0.5], [0.5, 0.0, 0.5]])


def _first_failure(name, solver, examples, seed=0):
    """``(case, AssertionError)`` of the first of ``examples`` draws of property ``name`` that fails, or None.

    The property as ``polyproj check`` runs it (its strategy and check, the backend's own tolerance) without
    hypothesis's shrinking, which takes tens of seconds on a failing batch.
    """
    spec = {s.name: s for s in _props()}[name]
    tol = pr.contract_tolerance(solver)
    found = []

    @hseed(seed)
    @settings(max_examples=examples, phases=[Phase.generate], database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(case=spec.strategy(solver))
    def prop(case):
        if not found:
            try:
                spec.check(case, solver, np.random.default_rng(seed), tol)
            except AssertionError as exc:
                found.append((case, exc))

    prop()
    return found[0] if found else None


def _proxsuite():
    from polyproj.backends.proxsuite import ProxSuiteSolver

    return ProxSuiteSolver


# ----------------------------------------------------------------------------- defect 1: solve_projections
def _projection_entry(change):
    """A ProxSuite whose ``solve_projections`` (the override point) returns ``change(start, X)``."""

    class Entry(_proxsuite()):
        name = f"entry_{change.__name__}"

        def solve_projections(self, X, data, *, rough=False):
            return change(solve_on_host(self, X, data, rough=rough), np.asarray(X, dtype=float))

    return Entry


def returns_the_points(start, X):  # the probe's backend: the points themselves, zero multipliers, SOLVED
    return ProjectionStart(X.copy(), 0 * start.mult, 0 * start.mu, start.status, start.accuracy)


def negates_the_multipliers(start, X):  # the right points, the multipliers of the wrong sign
    return dataclasses.replace(start, mult=-start.mult, mu=-start.mu)


def calls_the_set_empty(start, X):  # the right points, PRIMAL_INFEASIBLE on a set that holds them
    return dataclasses.replace(start, status=(pp.Status.PRIMAL_INFEASIBLE,) * len(start.status))


def drops_a_point(start, X):  # one answer fewer than points
    return dataclasses.replace(start, y=start.y[:-1], status=start.status[:-1])


@needs_proxsuite
def test_the_projection_contract_holds_the_raw_start_to_the_exact_projection():
    """ProxSuite's start is the hand-computed projection with its multipliers; broken entries are named."""
    solver = _proxsuite()()
    start = solver.solve_projections(_X, PolyData.from_polyhedron(_S), rough=False)
    np.testing.assert_allclose(start.y, _Y, atol=1e-5)
    np.testing.assert_allclose(start.mult[:, 0], [1.9, 2.8], atol=1e-4)  # the row of A
    np.testing.assert_allclose(start.mult[:, 1 + 1], [1.8, 5.2], atol=1e-4)  # the lower bound of y2
    np.testing.assert_allclose(start.mu[:, 0], [-1.5, -0.3], atol=1e-4)
    assert pr.check_projection_contract(_S, _X, solver) == {"points": 2}
    for change, phrase in ((returns_the_points, "violates the constraints"),
                           (negates_the_multipliers, "multipliers have the wrong sign"),
                           (calls_the_set_empty, "status PRIMAL_INFEASIBLE on a feasible, bounded QP"),
                           (drops_a_point, "solve_projections of 2 points returned shapes")):
        with pytest.raises(AssertionError, match=phrase) as caught:
            pr.check_projection_contract(_S, _X, _projection_entry(change)())
        assert "solve_projections" in str(caught.value)


@needs_proxsuite
def test_polyproj_check_fails_a_solve_projections_that_returns_the_points():
    """The probe's backend: pp.project repairs its start (right answers), the kit passed it; it fails now."""
    broken = _projection_entry(returns_the_points)()
    res = pp.project(_X, _S, backend=broken)
    np.testing.assert_allclose(res.y, _Y, atol=1e-9)  # the polish hides the broken entry from pp.project
    failure = _first_failure("projection_contract", broken, 5)
    assert failure is not None, "the broken projection entry passed projection_contract"
    case, exc = failure
    assert "solve_projections point" in str(exc) and "violates the constraints" in str(exc)
    assert repr(case[0]).startswith("PolyhedronCase(")
    assert _first_failure("batch_contract", broken, 5) is None  # solve_batch is ProxSuite's: blind to it


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_every_builtin_backend_meets_the_projection_contract(backend):
    """Its own solve_projections (daqp, ipm, admm) or the default host entry (the others)."""
    out = run_property("projection_contract", backend, max_examples=4, seed=0)
    assert out.status == "passed", out.message + "\n" + out.falsifying
    assert out.counts == {"points": 12}  # 2 examples of 6 points


# ----------------------------------------------------------------------------- defect 2: batch subsets
def _drops_shared(vector):
    """A native solve_batch that solves without the shared ``vector`` (its no-limit value) when it is not batched."""

    class Drops(_proxsuite()):
        name = f"drops_shared_{vector}"

        def solve_batch(self, qp, q=None, l=None, u=None, lb=None, ub=None, warm_start=None):
            given = {"q": q, "l": l, "u": u, "lb": lb, "ub": ub}
            size = next(np.shape(v)[0] for v in given.values() if v is not None)
            if given[vector] is None and (qp.m or vector not in ("l", "u")):
                width = qp.n if vector in ("q", "lb", "ub") else qp.m
                given[vector] = np.full((size, width), {"q": 0.0, "l": -np.inf, "lb": -np.inf}.get(vector, np.inf))
            return super().solve_batch(qp, warm_start=warm_start, **given)

    return Drops


@pytest.mark.core
def test_qp_batches_can_batch_any_non_empty_subset_of_the_vectors():
    seen = {"batched": set(), "shared": set(), "sizes": set()}

    @settings(max_examples=40, database=None, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(case=ps.qp_batches(subsets=True))
    def draw(case):
        names = {"q", "l", "u", "lb", "ub"} if case.qp.m else {"q", "lb", "ub"}
        assert case.vectors and set(case.vectors) <= names
        assert all(v.shape[0] == case.size >= 2 for v in case.vectors.values())
        for i in range(case.size):  # the shared vectors with the batched ones: feasible at the element's point
            assert case.element(i).primal_violation(case.x_feasible[i]) == 0.0
            shared = names - set(case.vectors)
            assert all(np.array_equal(getattr(case.element(i), k), getattr(case.qp, k)) for k in shared)
        if shared:
            assert "shared " + sorted(shared)[0] + "=" in repr(case)
        seen["batched"] |= set(case.vectors)
        seen["shared"] |= shared
        seen["sizes"].add(len(case.vectors))

    draw()
    assert seen["batched"] == seen["shared"] == {"q", "l", "u", "lb", "ub"}
    assert {1, 5} <= seen["sizes"]  # one vector alone, and all of them


@needs_proxsuite
def test_the_probes_batch_path_that_drops_the_shared_q_is_caught():
    """Only u batched (the probe's example): the batch path solves with q = 0; ProxSuite's own answers it."""
    qp = pp.QP(P=[[2.0, 1.0], [1.0, 2.0]], q=[-3.0, -3.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0])
    case = ps.QPBatchCase(qp, {"u": np.array([[1.0], [2.0]])}, np.zeros((2, 2)), strictly_convex=True)
    assert pr.check_qp_batch_contract(case, _proxsuite()()) == {"qps": 2, "batches": 2}
    assert "shared q=[-3, -3]" in repr(case)
    with pytest.raises(AssertionError, match="solve_batch element 0"):
        pr.check_qp_batch_contract(case, _drops_shared("q")())


@needs_proxsuite
@pytest.mark.parametrize("vector", ["q", "l", "u", "lb", "ub"])
def test_batch_qp_contract_fails_a_solve_batch_that_drops_a_shared_vector(vector):
    """Every vector was batched: such a backend passed `polyproj check`. The failing batch shares it."""
    failure = _first_failure("batch_qp_contract", _drops_shared(vector)(), 10)
    assert failure is not None, f"a solve_batch that drops the shared {vector} passed batch_qp_contract"
    case, exc = failure
    assert "solve_batch element" in str(exc)
    assert vector not in case.vectors and f"shared {vector}=" in repr(case)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_every_builtin_backend_meets_the_batch_qp_contract_with_shared_vectors(backend):
    out = run_property("batch_qp_contract", backend, max_examples=3, seed=0)
    assert out.status == "passed", out.message + "\n" + out.falsifying
    assert out.counts["batches"] == 6
