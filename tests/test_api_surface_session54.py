"""The public objects users hold and pass around: what they share, and what bad use of them raises.

Each test pins one rule: cached arrays of a frozen problem are read-only (an edit in place changed later
projections silently); a projection result's face (what its vjp reads) is not one of the arrays the user
holds; a batch record refuses bad positions and mismatched elements with a ProblemError naming them; backend
capabilities are flags; ``pp.project(backend=None)`` is the projection default.
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import scipy.sparse as sp

import polyproj as pp


def _batch(n: int = 2, size: int = 4) -> pp.BatchSolution:
    qp = pp.QP(P=np.eye(n), q=np.zeros(n), C=np.ones((1, n)), l=[-np.inf], u=[1.0])
    Q = np.random.default_rng(0).normal(size=(size, n))
    return pp.get_backend("osqp").solve_batch(qp, q=Q)


# ------------------------------------------------------------------ frozen problems: cached arrays read-only
def test_sparse_polyhedron_dense_view_is_read_only_and_projection_unchanged():
    S = pp.Polyhedron(A=sp.csr_matrix([[1.0, 1.0, 1.0]]), a=[1.0], lb=np.zeros(3))
    x = np.array([2.0, 1.0, 0.5])
    before = pp.project(x, S, backend="proxsuite").y
    with pytest.raises(ValueError, match="read-only"):
        S.A_dense[0, 0] = 5.0  # changed every later projection onto S before
    np.testing.assert_allclose(pp.project(x, S, backend="proxsuite").y, before, atol=1e-12)
    assert not S.B_dense.flags.writeable


@pytest.mark.parametrize("name", ["lb_idx", "ub_idx"])
def test_polyhedron_bound_indices_are_read_only(name):
    S = pp.Polyhedron(A=[[1.0, 1.0, 1.0]], a=[1.0], lb=np.zeros(3), ub=np.ones(3))
    idx = getattr(S, name)
    assert not idx.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        idx[:] = 0  # renumbered the inequality rows of every later result
    assert not getattr(pickle.loads(pickle.dumps(S)), name).flags.writeable
    assert not getattr(copy.deepcopy(S), name).flags.writeable


def test_qp_cached_masks_and_dense_copy_are_read_only():
    qp = pp.QP(P=sp.eye(2, format="csr"), q=[1.0, 1.0], C=sp.csr_matrix([[1.0, 1.0]]), l=[0.0], u=[0.0],
               lb=[0.0, -np.inf])
    assert not qp.eq_mask.flags.writeable
    assert not qp.bounded.flags.writeable
    d = qp.dense()
    assert not d.P.flags.writeable and not d.C.flags.writeable
    np.testing.assert_array_equal(d.P, np.eye(2))


def test_projection_qp_names_x_for_nan():
    S = pp.Polyhedron(A=[[1.0, 1.0]], a=[1.0])
    with pytest.raises(pp.ProblemError, match=r"^x contains NaN or inf \(first at index 1\)"):
        S.projection_qp([0.0, np.nan])
    np.testing.assert_array_equal(S.projection_qp([1.0, 2.0]).q, [-1.0, -2.0])


def test_qp_empty_sides_without_c_are_accepted_as_in_polyhedron():
    qp = pp.QP(P=np.eye(2), q=[1.0, 1.0], l=[], u=np.zeros(0))  # a Polyhedron takes a=[] without A
    assert qp.m == 0 and qp.l.shape == (0,) and qp.u.shape == (0,)
    for side in ("l", "u"):
        with pytest.raises(pp.ProblemError, match="l/u given without C"):
            pp.QP(P=np.eye(2), q=[1.0, 1.0], **{side: [0.0]})
        with pytest.raises(pp.ProblemError, match="l/u given without C"):
            pp.QP(P=np.eye(2), q=[1.0, 1.0], **{side: 0.0})


# ------------------------------------------------------------------ ProjectionResult: the face is its own
@pytest.mark.parametrize("make", [lambda: pp.sets.Simplex(3), lambda: pp.sets.CappedSimplex(3, 2.0)],
                         ids=["simplex", "capped"])
def test_editing_result_active_leaves_vjp_unchanged(make):
    S = make()
    rng = np.random.default_rng(0)
    X, G = rng.normal(size=(4, 3)) * 3, rng.normal(size=(4, 3))
    res = S.project(X)
    want = np.array(S.vjp(res, G))
    res.active[...] = ~res.active  # the face was this very array: J g changed
    np.testing.assert_allclose(S.vjp(res, G), want)
    one = S.project(X[0])  # a single point's active is a view of its batch of one's
    want1 = np.array(S.vjp(one, G[0]))
    one.active[...] = ~one.active
    np.testing.assert_allclose(S.vjp(one, G[0]), want1)
    back = pickle.loads(pickle.dumps(S.project(X)))
    assert back.face is not back.active
    np.testing.assert_allclose(S.vjp(back, G), want)


def test_editing_torch_result_active_leaves_vjp_unchanged():
    torch = pytest.importorskip("torch")
    S = pp.sets.Simplex(3)
    X = torch.tensor(np.random.default_rng(1).normal(size=(3, 3)) * 3)
    G = torch.ones(3, 3, dtype=torch.float64)
    G[:, 0] = 2.0
    res = S.project(X)
    assert res.face is not res.active
    want = S.vjp(res, G).clone()
    res.active.logical_not_()
    torch.testing.assert_close(S.vjp(res, G), want)


# ------------------------------------------------------------------ BatchSolution: positions and elements
def test_batch_solution_position_errors_name_the_position():
    bs = _batch()
    np.testing.assert_array_equal(bs.solution(-1).x, bs.x[3])
    np.testing.assert_array_equal(bs.solution(np.int64(2)).x, bs.x[2])
    for bad, msg in [(4, "out of range for a batch of 4"), (-5, "out of range"), (1.0, "integer position"),
                     (True, "integer position"), ([0, 1], "take")]:
        with pytest.raises(pp.ProblemError, match=msg):
            bs.solution(bad)


def test_batch_solution_put_and_stack_refuse_mismatched_elements():
    bs, other = _batch(2), _batch(3, 1)
    with pytest.raises(pp.ProblemError, match=r"x have shape \(3,\), this batch's \(2,\)"):
        bs.put([0], other)
    with pytest.raises(pp.ProblemError, match="takes a BatchSolution"):
        bs.put([0], bs.solution(1))
    with pytest.raises(pp.ProblemError, match=r"solution 1's x has shape \(3,\)"):
        pp.BatchSolution.stack([bs.solution(0), other.solution(0)])
    with pytest.raises(pp.ProblemError, match="element 1 is a int"):
        pp.BatchSolution.stack([bs.solution(0), 3])
    put = bs.put([0], bs.take([1]))  # what fits still works
    np.testing.assert_array_equal(put.x[0], bs.x[1])
    assert len(pp.BatchSolution.stack([bs.solution(0), bs.solution(2)])) == 2


def test_batch_take_and_put_carry_each_elements_info_and_problem():
    qp = pp.QP(P=np.eye(2), q=[-1.0, -1.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0])
    Q = np.array([[0.0, 0.0], [-10.0, -10.0], [5.0, -3.0]])
    bs = pp.get_backend("proxsuite").solve_batch(qp, q=Q)  # per-element info: info["elements"]
    elements = bs.info["elements"]
    perm = bs.take([1, 0, 2])  # the info of element 0 went with element 1's x before
    for k, i in enumerate([1, 0, 2]):
        assert perm.solution(k).info == elements[i]
        np.testing.assert_array_equal(perm.solution(k).x, bs.x[i])
    assert bs.take([2]).solution(0).info == elements[2]  # (a shorter batch lost it)
    other = pp.get_backend("osqp").solve_batch(qp, q=np.array([[7.0, 7.0]]))
    put = bs.put([0], other)
    assert put.solution(0).info == {}  # the old element's info was kept with the new x
    np.testing.assert_array_equal(put.solution(0).qp.q, [7.0, 7.0])  # (its residuals read the old problem)
    np.testing.assert_array_equal(put.solution(1).qp.q, Q[1])
    assert put.solution(0).primal_residual() <= 1e-9 and len(put.qps) == 3
    back = pickle.loads(pickle.dumps(put))
    np.testing.assert_array_equal(back.solution(0).qp.q, [7.0, 7.0])
    again = bs.put([1], bs.take([0]))
    assert again.solution(1).info == elements[0] and again.solution(0).info == elements[0]


# ------------------------------------------------------------------ registry and api
def test_capabilities_must_be_flags():
    class NotAFlag(pp.QPSolver):
        name = "not_a_flag"
        capabilities = pp.Capabilities(sparse="no")  # truthy: sparse problems were sent to it

        def solve(self, qp, warm_start=None):  # pragma: no cover - never constructed
            raise AssertionError

    with pytest.raises(pp.PolyprojError, match="sparse='no'"):
        pp.register_backend("not_a_flag", NotAFlag)
    with pytest.raises(pp.PolyprojError, match="not True or False"):
        pp.get_backend(NotAFlag)
    assert "not_a_flag" not in pp.available_backends()


def test_project_backend_none_is_the_projection_default():
    S = pp.Polyhedron(A=[[1.0, 1.0]], a=[1.0])
    X = np.random.default_rng(2).normal(size=(3, 2)) * 3
    assert pp.project(X, S, backend=None).backend == pp.project(X, S).backend
    assert pp.project(X[0], S, backend=None).backend == pp.project(X[0], S).backend


def test_a_backends_settings_are_read_not_edited():
    # an edit of solver.settings changed the solver and skipped the checks its constructor makes (eps_abs = -1
    # was taken): the settings are fixed when the backend is made; a copy or a pickle keeps them, read-only
    import copy
    import pickle

    s = pp.get_backend("ipm", eps_abs=1e-7)
    assert s.settings["eps_abs"] == 1e-7 and dict(s.settings)["eps_abs"] == 1e-7
    for edit in (lambda d: d.__setitem__("eps_abs", -1.0), lambda d: d.update(eps_abs=-1.0),
                 lambda d: d.pop("eps_abs"), lambda d: d.clear(), lambda d: d.setdefault("x", 1)):
        with pytest.raises(pp.SettingsError, match="fixed"):
            edit(s.settings)
    with pytest.raises(pp.SettingsError, match="fixed"):
        s.backend_options["namespace"] = "torch"
    assert s.settings["eps_abs"] == 1e-7
    for t in (pickle.loads(pickle.dumps(s)), copy.deepcopy(s)):
        assert dict(t.settings) == dict(s.settings)
        with pytest.raises(pp.SettingsError):
            t.settings["eps_abs"] = 1.0
