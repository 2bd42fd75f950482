"""DESIGN.md §2, §3 and §12 over the public entry points (probe of session 52).

Every shape read from user data goes through ``polyproj.problem._shape`` / ``_asarray``: a ragged nested list
is a ProblemError naming the argument (it was NumPy's bare ValueError), and the Polyhedron's evaluation
methods check their points' dtype and width like every other entry point.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import polyproj as pp
from polyproj.adapters.dif import DIF, ConstrainedProblem, Constraint, Loss, solve

RAGGED = [1.0, [2.0, 3.0]]


def _qp() -> pp.QP:
    return pp.QP(P=np.eye(2), q=[1.0, -1.0], C=[[1.0, 1.0]], l=[0.0], u=[1.0])


@pytest.mark.parametrize(("build", "name"), [
    (lambda: pp.QP(P=np.eye(2), q=RAGGED), "q"),
    (lambda: pp.Polyhedron(lb=RAGGED), "lb"),
    (lambda: pp.Polyhedron(ub=RAGGED), "ub"),
    (lambda: pp.Polyhedron(lb=np.zeros(2), a=RAGGED), "a"),
    (lambda: pp.Polyhedron(lb=np.zeros(2), b=RAGGED), "b"),
])
def test_ragged_vectors_are_problem_errors(build, name):
    with pytest.raises(pp.ProblemError, match=f"{name} is not a rectangular array") as info:
        build()
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("key", ["x", "z"])
def test_ragged_warm_start_is_a_problem_error(key):
    ws = {"x": [0.0, 0.0], "z": [0.0]}
    ws[key] = RAGGED
    with pytest.raises(pp.ProblemError, match=f"warm_start {key} is not a rectangular array"):
        pp.solve_qp(_qp(), backend="daqp", warm_start=ws)
    with pytest.raises(pp.ProblemError, match=f"warm_start {key}"):
        pp.get_backend("ipm").solve(_qp(), warm_start=ws)


def test_warm_start_shape_error_still_names_the_shape():
    with pytest.raises(pp.ProblemError, match=r"warm_start x must have shape \(2,\) for this problem, got \(3,\)"):
        pp.solve_qp(_qp(), backend="daqp", warm_start={"x": [0.0, 0.0, 0.0]})


def test_hand_built_solution_with_ragged_x():
    sol = pp.Solution(x=RAGGED, z=np.zeros(1), z_box=np.zeros(2), status=pp.Status.SOLVED, qp=_qp())
    with pytest.raises(pp.ProblemError, match="x is not a rectangular array"):
        sol.residuals()


def test_hand_built_solution_residuals_still_work():
    qp = _qp()
    ref = pp.solve_qp(qp, backend="daqp")
    sol = pp.Solution(x=ref.x, z=ref.z, z_box=ref.z_box, status=pp.Status.SOLVED, qp=qp)
    r = sol.residuals()
    x = ref.x
    assert r["primal"] == pytest.approx(max(0.0, float((qp.C @ x)[0] - 1.0), float(-(qp.C @ x)[0])), abs=1e-15)
    assert r["dual"] == pytest.approx(np.max(np.abs(x + qp.q + qp.C.T @ ref.z + ref.z_box)), abs=1e-15)


@pytest.fixture
def poly() -> pp.Polyhedron:
    return pp.Polyhedron(A=np.ones((1, 3)), a=[1.0], B=np.array([[1.0, -1.0, 0.0]]), b=[0.0], lb=np.zeros(3))


@pytest.mark.parametrize("method", ["violation", "ineq_slack", "projection_qp"])
@pytest.mark.parametrize(("bad", "match"), [
    (np.zeros(4), r"must have shape \(3,\)"),
    (np.zeros((1, 2, 3)), r"must have shape \(3,\)"),
    ("abc", "must hold real numbers"),
    (np.zeros(3) + 1j, "must hold real numbers"),
    (RAGGED, "is not a rectangular array"),
])
def test_polyhedron_methods_check_their_points(poly, method, bad, match):
    with pytest.raises(pp.ProblemError, match=match):
        getattr(poly, method)(bad)


def test_polyhedron_methods_values(poly):
    Y = np.array([[0.5, 0.5, 0.0], [1.0, 0.0, 2.0]])
    # row 1: A y = 3 misses a = 1 by 2; B y = 1 misses 0 by 1
    np.testing.assert_allclose(poly.violation(Y), [0.0, 2.0])
    assert poly.violation(Y[0]) == 0.0
    assert poly.violation(Y.tolist()).shape == (2,)
    np.testing.assert_allclose(poly.ineq_slack(Y[:1])[0, 0], 0.0)
    qp = poly.projection_qp([1, 2, 3])  # integers: real numbers
    np.testing.assert_array_equal(qp.q, [-1.0, -2.0, -3.0])


def test_dif_ragged_removal_is_a_problem_error():
    torch.manual_seed(0)
    X = torch.randn(20, 2, dtype=torch.float64)
    y = X @ torch.tensor([1.0, -1.0], dtype=torch.float64)

    def sq(theta, batch):
        xb, yb = batch
        return (xb @ theta - yb) ** 2

    problem = ConstrainedProblem(torch.zeros(2), objective=Loss(sq, (X, y)),
                                 constraints=[Constraint(lambda th: th[0], None, tau=0.5, name="cap")])
    dif = DIF(problem, solve(problem))
    with pytest.raises(pp.ProblemError, match=r"removal\['objective'\]: indices must be a 1-D list"):
        dif.delta_theta({"objective": [[1], [2, 3]]})
    omega = dif.delta_theta({"objective": [1, 2]})  # the well-formed removal still works
    assert omega.shape == (2,) and bool(torch.isfinite(omega).all())


@pytest.mark.parametrize("backend", ["daqp", "ipm", "admm"])
@pytest.mark.parametrize("scale", [1e-12, 1e12])
def test_scaled_problem_gives_the_scaled_answer(backend, scale):
    rng = np.random.default_rng(1)
    n, m = 5, 3
    M = rng.standard_normal((n, n))
    P, q, C = M @ M.T + np.eye(n), 3 * rng.standard_normal(n), rng.standard_normal((m, n))
    data = dict(P=P, q=q, C=C, l=-np.ones(m), u=0.5 * np.ones(m), lb=-np.ones(n), ub=np.ones(n))
    ref = pp.solve_qp(pp.QP(**data), backend="daqp").x
    scaled = {k: (v * scale if k != "P" and k != "C" else v) for k, v in data.items()}  # x* -> scale x*
    sol = pp.solve_qp(pp.QP(**scaled), backend=backend)
    assert sol.status is pp.Status.SOLVED
    np.testing.assert_allclose(sol.x / scale, ref, atol=1e-6 * np.max(np.abs(ref)))


def test_inputs_are_neither_mutated_nor_aliased():
    rng = np.random.default_rng(2)
    n = 4
    A, a = rng.standard_normal((3, n)), np.ones(3)
    A.flags.writeable = False  # read-only input accepted
    S = pp.Polyhedron(A=A, a=a, B=np.ones((1, n)), b=[1.0])
    X = np.asfortranarray(rng.standard_normal((5, n)) * 3)
    X0 = X.copy()
    res = pp.project(X, S, backend="daqp")
    y0 = res.y.copy()
    np.testing.assert_array_equal(X, X0)
    X[...] = 7.0
    a[...] = -1.0
    np.testing.assert_array_equal(res.y, y0)
    np.testing.assert_array_equal(pp.project(X0, S, backend="daqp").y, y0)


@pytest.mark.parametrize(("kw", "match"), [
    (dict(A="abc", a=[1.0]), "A must hold real numbers"),
    (dict(A=3.0, a=[1.0]), r"A must be a 2-D matrix, got shape \(\)"),
    (dict(B="x", b=[1.0]), "B must hold real numbers"),
])
def test_polyhedron_scalar_matrix_names_the_matrix(kw, match):
    # it read "cannot tell the number of variables", as if A and B had not been given
    with pytest.raises(pp.ProblemError, match=match):
        pp.Polyhedron(**kw)
