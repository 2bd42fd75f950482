"""What the probe of session 50 found in the PIQP and DAQP glue, each failing before its fix.

PIQP (the default of ``solve_qp``) ended MAX_ITER on unit-scale QPs whose inequality row had a big-M side standing
in for "no bound" (``l = −1e10`` under ``u = 1``): the far variable bounds were dropped and the QP solved again, the
rows' sides never. DAQP ignored ``eps_rel``: ``eps_abs = 0, eps_rel = 1e-6`` (an allowed setting) ran it at
``primal_tol = eta_prox = 0``, and its proximal iterations for a singular P never stopped (MAX_ITER, cycling).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import scipy.sparse as sp

import polyproj as pp


def _reference(qp: pp.QP) -> pp.Solution:
    """Clarabel's answer at a tight tolerance (an interior-point method independent of PIQP and DAQP)."""
    pytest.importorskip("clarabel")
    ref = pp.solve_qp(qp, backend="clarabel", eps_abs=1e-10)
    assert ref.status is pp.Status.SOLVED
    return ref


# ----------------------------------------------------------------------------- PIQP: big-M sides of rows
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize(("l", "u"), [(-1e10, 1.0), (-1e12, 1.0), (-1e19, 1.0), (-np.inf, 1e10), (-1e10, 1e10)])
def test_piqp_drops_big_m_row_sides(l, u, sparse):
    pytest.importorskip("piqp")
    P, C = np.array([[2.0, 0.5], [0.5, 1.0]]), np.array([[1.0, 1.0]])
    if sparse:
        P, C = sp.csc_matrix(P), sp.csc_matrix(C)
    qp = pp.QP(P=P, q=[-1.0, -2.0], C=C, l=[l], u=[u])
    sol = pp.solve_qp(qp)  # the default backend
    assert sol.backend == "piqp"
    assert sol.status is pp.Status.SOLVED, (sol.status, sol.info)
    # the same QP with its far sides made infinite, solved by two other backends
    near = pp.QP(P=P, q=qp.q, C=C, l=[-np.inf if abs(l) > 1e7 else l], u=[np.inf if abs(u) > 1e7 else u])
    refs = [_reference(near)]
    if "daqp" in pp.available_backends():
        refs.append(pp.solve_qp(near, backend="daqp", eps_abs=1e-10))
    for ref in refs:
        assert ref.status is pp.Status.SOLVED
        np.testing.assert_allclose(sol.x, ref.x, atol=1e-6)
        np.testing.assert_allclose(sol.z, ref.z, atol=1e-6)
    assert sol.info.get("far_bounds_dropped", 0) >= 1
    row = float(np.asarray(qp.C @ sol.x).reshape(-1)[0])
    assert (row >= l if abs(l) > 1e7 else row >= l - 1e-7) and (row <= u if abs(u) > 1e7 else row <= u + 1e-7)


def test_piqp_keeps_an_equality_row_and_a_side_x_meets():
    """A far side that x meets is no stand-in, and an equality row is never dropped."""
    pytest.importorskip("piqp")
    from polyproj.backends.piqp import _far_sides

    # row 0: l far below; row 1: an equality far from x (an unconverged point), never dropped; row 2: u = 2e8
    qp = pp.QP(P=np.eye(3), q=[-1.0, -1.0, 0.0], C=[[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [0.0, 0.0, 1.0]],
               l=[-1e10, 3e8, -np.inf], u=[1.0, 3e8, 2e8], lb=[-1e9, -np.inf, -np.inf])
    relaxed, (drop_lb, drop_ub, drop_l, drop_u) = _far_sides(qp, np.array([0.5, 0.5, 0.0]))
    assert drop_l.tolist() == [True, False, False] and drop_u.tolist() == [False, False, True]
    assert drop_lb.tolist() == [True, False, False] and not drop_ub.any()
    np.testing.assert_array_equal(relaxed.l, [-np.inf, 3e8, -np.inf])
    np.testing.assert_array_equal(relaxed.u, [1.0, 3e8, np.inf])
    np.testing.assert_array_equal(relaxed.lb, [-np.inf, -np.inf, -np.inf])
    # x₃ = 1.9e8 is near u = 2e8 (within half its size): kept
    _, (_, _, drop_l, drop_u) = _far_sides(qp, np.array([0.5, 0.5, 1.9e8]))
    assert drop_l.tolist() == [True, False, False] and not drop_u.any()
    # nothing far (sides below 1e7, or x on them): None
    assert _far_sides(qp, np.array([-1e9, -9e9, 2e8])) is None


def test_piqp_rejects_a_relaxed_answer_beyond_a_dropped_row_side():
    """A re-solve whose answer violates a dropped side is not the QP's answer: PIQP's first answer stands.

    PIQP's first answer is replaced by a MAX_ITER at the origin, far from ``u = 3e7``; without the row the minimiser
    is (4e7, 4e7), beyond it (the guard's normalisation is bypassed: the unguarded ``solve``).
    """
    pytest.importorskip("piqp")
    from polyproj.backends.piqp import PIQPSolver

    class StallsFirst(PIQPSolver):
        name = "piqp_stalls_first"
        calls = 0

        def _solve(self, qp):
            sol = super()._solve(qp)
            type(self).calls += 1
            if type(self).calls == 1:
                return dataclasses.replace(sol, status=pp.Status.MAX_ITER, x=np.zeros(qp.n))
            return sol

    qp = pp.QP(P=np.eye(2), q=[-4e7, -4e7], C=[[1.0, 1.0]], l=[-np.inf], u=[3e7])
    solver = StallsFirst()
    sol = PIQPSolver.solve.__wrapped__(solver, qp)
    assert StallsFirst.calls == 2  # the row's side was dropped and the QP solved again
    assert sol.status is pp.Status.MAX_ITER and "far_bounds_dropped" not in sol.info
    # where the relaxed answer meets the dropped side it stands
    StallsFirst.calls = 0
    ok = pp.QP(P=np.eye(2), q=[-1.0, -1.0], C=[[1.0, 1.0]], l=[-np.inf], u=[3e7])
    sol = PIQPSolver.solve.__wrapped__(solver, ok)
    assert sol.status is pp.Status.SOLVED and sol.info["far_bounds_dropped"] == 1 and sol.qp is ok
    np.testing.assert_allclose(sol.x, _reference(ok).x, atol=1e-6)


# ----------------------------------------------------------------------------- DAQP: eps_rel
def _objective(qp: pp.QP, x: np.ndarray) -> float:
    return float(0.5 * x @ (qp.P @ x) + qp.q @ x)


def test_daqp_eps_rel_alone_stops_on_a_singular_p():
    """P = diag(1, 0, 0): DAQP's proximal iterations stop at eta_prox, 0 before (an "unbounded" it could not back)."""
    pytest.importorskip("daqp")
    qp = pp.QP(P=np.diag([1.0, 0.0, 0.0]), q=[-1.0, -1.0, 0.5], C=[[1.0, 1.0, 1.0], [1.0, -1.0, 0.0]],
               l=[-np.inf, -1.0], u=[1.0, 1.0], lb=[0.0, 0.0, 0.0], ub=[3.0, 3.0, 3.0])
    sol = pp.solve_qp(qp, backend="daqp", eps_abs=0, eps_rel=1e-6)
    assert sol.status is pp.Status.SOLVED, (sol.status, sol.info)
    ref = _reference(qp)
    np.testing.assert_allclose(sol.x, ref.x, atol=1e-5)
    assert _objective(qp, sol.x) == pytest.approx(_objective(qp, ref.x), abs=1e-8)
    assert sol.primal_residual() <= 1e-6


def test_daqp_eps_rel_counts_relative_to_the_data():
    """primal_tol = eps_abs + eps_rel · σ: the same QP at 1e3 times the size has 1e3 times the tolerance."""
    pytest.importorskip("daqp")
    from polyproj.backends.daqp import DAQPSolver

    base = dict(P=np.eye(2), C=[[1.0, 1.0]], l=[-np.inf])
    small, big = pp.QP(q=[-1.0, -1.0], u=[1.0], **base), pp.QP(q=[-1e3, -1e3], u=[1e3], **base)
    rel = DAQPSolver(eps_abs=0, eps_rel=1e-6)
    t_small, t_big = rel._kwargs(small)["primal_tol"], rel._kwargs(big)["primal_tol"]
    assert t_small > 0 and t_big == pytest.approx(1e3 * t_small)
    assert rel._kwargs(small)["eta_prox"] == pytest.approx(1e-2 * t_small)
    # eps_rel = 0 (the default) leaves eps_abs as it was
    assert DAQPSolver(eps_abs=1e-7)._kwargs(big) == pytest.approx({"primal_tol": 1e-7, "eta_prox": 1e-9})
    # projections (one DAQP call per point on shared arrays) take the same rule
    rng = np.random.default_rng(5)
    poly = pp.Polyhedron(A=rng.standard_normal((12, 6)), a=rng.random(12), lb=-np.ones(6), ub=np.ones(6))
    X = 3 * rng.standard_normal((5, 6))
    got = pp.project(X, poly, backend="daqp", eps_abs=0, eps_rel=1e-6)
    pytest.importorskip("clarabel")
    want = pp.project(X, poly, backend="clarabel", eps_abs=1e-10)
    assert all(s is pp.Status.SOLVED for s in got.status)
    np.testing.assert_allclose(got.y, want.y, atol=1e-7)


@pytest.mark.parametrize("name", ["QAFIRO", "GENHS28", "QSC205"])
def test_daqp_eps_rel_alone_on_maros_meszaros(mm_dir, name):
    """eps_abs = 0, eps_rel = 1e-6 ended QAFIRO and QSC205 "cycling", GENHS28 at 10,000 iterations."""
    pytest.importorskip("daqp")
    from polyproj.maros_meszaros import load_problem

    qp = load_problem(os.path.join(mm_dir, name + ".mat")).qp
    sol = pp.solve_qp(qp, backend="daqp", eps_abs=0, eps_rel=1e-6)
    assert sol.status is pp.Status.SOLVED, (sol.status, sol.info)
    ref = _reference(qp)
    f, f_ref = _objective(qp, sol.x), _objective(qp, ref.x)
    assert f == pytest.approx(f_ref, rel=1e-5, abs=1e-6)
