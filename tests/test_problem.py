"""Problem model validation: each bad input its own test, with a clear ProblemError."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import polyproj as pp

pytestmark = pytest.mark.core  # needs only the core dependencies (make test-min)


def test_qp_shapes_and_defaults():
    qp = pp.QP(P=np.eye(3), q=np.zeros(3))
    assert (qp.n, qp.m) == (3, 0)
    assert np.all(np.isneginf(qp.lb)) and np.all(np.isposinf(qp.ub))
    assert "QP(n=3" in repr(qp)


def test_qp_infinite_bounds_written_as_1e20_are_infinite():
    qp = pp.QP(P=np.eye(2), q=np.zeros(2), C=np.eye(2), l=[-1e20, 0.0], u=[1e20, 1.0])
    assert np.isneginf(qp.l[0]) and np.isposinf(qp.u[0])


def test_qp_copies_user_data():
    P = np.eye(2)
    qp = pp.QP(P=P, q=np.zeros(2))
    P[0, 0] = -5.0
    assert qp.P[0, 0] == 1.0


def test_nan_in_q_rejected():
    with pytest.raises(pp.ProblemError, match=r"q contains NaN"):
        pp.QP(P=np.eye(2), q=[0.0, np.nan])


def test_inf_in_q_rejected():
    with pytest.raises(pp.ProblemError, match=r"q\[1\]"):
        pp.QP(P=np.eye(2), q=[0.0, np.inf])


def test_nan_in_A_rejected():
    with pytest.raises(pp.ProblemError, match=r"A contains NaN or inf \(first at row 1, column 0\)"):
        pp.Polyhedron(A=[[1.0, 0.0], [np.nan, 1.0]], a=[1.0, 1.0])


def test_inf_in_A_rejected():
    with pytest.raises(pp.ProblemError, match="A contains NaN or inf"):
        pp.Polyhedron(A=[[1.0, np.inf]], a=[1.0])


def test_nan_in_a_rejected():
    with pytest.raises(pp.ProblemError, match="a contains NaN"):
        pp.Polyhedron(A=np.eye(2), a=[1.0, np.nan])


def test_minus_inf_in_a_rejected():
    with pytest.raises(pp.ProblemError, match=r"a\[0\] = -inf is not allowed"):
        pp.Polyhedron(A=np.eye(2), a=[-np.inf, 1.0])


def test_nan_in_sparse_matrix_rejected():
    C = sp.csr_matrix(np.array([[1.0, np.nan]]))
    with pytest.raises(pp.ProblemError, match="C contains NaN"):
        pp.QP(P=np.eye(2), q=np.zeros(2), C=C, l=[0.0], u=[1.0])


def test_shape_mismatch_P_q():
    with pytest.raises(pp.ProblemError, match="P has 2 columns, expected 3"):
        pp.QP(P=np.eye(2), q=np.zeros(3))


def test_shape_mismatch_C_columns():
    with pytest.raises(pp.ProblemError, match="C has 3 columns, expected 2"):
        pp.QP(P=np.eye(2), q=np.zeros(2), C=np.ones((1, 3)), l=[0.0], u=[1.0])


def test_shape_mismatch_bounds():
    with pytest.raises(pp.ProblemError, match=r"u must have shape \(2,\)"):
        pp.QP(P=np.eye(2), q=np.zeros(2), C=np.eye(2), l=[0.0, 0.0], u=[1.0])


def test_shape_mismatch_polyhedron_rhs():
    with pytest.raises(pp.ProblemError, match=r"a must have shape \(2,\)"):
        pp.Polyhedron(A=np.eye(2), a=[1.0, 2.0, 3.0])


def test_shape_mismatch_A_B_columns():
    with pytest.raises(pp.ProblemError, match="B has 3 columns, expected 2"):
        pp.Polyhedron(A=np.eye(2), a=[1.0, 1.0], B=np.ones((1, 3)), b=[1.0])


def test_non_symmetric_P_rejected():
    with pytest.raises(pp.ProblemError, match="P is not symmetric"):
        pp.QP(P=[[1.0, 2.0], [0.0, 1.0]], q=np.zeros(2))


def test_non_symmetric_P_rejected_without_the_psd_check():
    """Solvers read one triangle or the other: with check_psd=False four backends gave four answers."""
    with pytest.raises(pp.ProblemError, match="P is not symmetric"):
        pp.QP(P=[[2.0, 1.0], [0.0, 2.0]], q=np.zeros(2), check_psd=False)
    pp.QP(P=[[2.0, 1.0], [1.0 + 1e-12, 2.0]], q=np.zeros(2), check_psd=False)  # rounding is not asymmetry


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "dok", "lil", "bsr", "dia"])
def test_every_sparse_format_is_accepted(fmt):
    P = sp.random(4, 4, density=0.5, random_state=0)
    P = (P @ P.T + sp.identity(4)).asformat(fmt)
    C = sp.csr_matrix(np.ones((1, 4))).asformat(fmt)
    qp = pp.QP(P=P, q=np.ones(4), C=C, l=[-1.0], u=[1.0])
    assert sp.issparse(qp.P) and qp.P.format == "csc" and qp.C.format == "csc"
    poly = pp.Polyhedron(A=C, a=[1.0], B=sp.identity(4, format="csr")[:1].asformat(fmt), b=[0.0])
    assert poly.A.format == "csc"
    with pytest.raises(pp.ProblemError, match="real numbers, got dtype complex"):
        pp.QP(P=sp.identity(2, dtype=complex, format=fmt), q=np.zeros(2))


@pytest.mark.parametrize("n", [2.5, "3", True, 2.0])
def test_polyhedron_n_must_be_an_integer(n):
    with pytest.raises(pp.ProblemError, match="n must be a positive integer"):
        pp.Polyhedron(n=n)
    assert pp.Polyhedron(n=np.int64(3)).n == 3


def test_indefinite_P_rejected():
    with pytest.raises(pp.ProblemError, match="not positive semidefinite"):
        pp.QP(P=[[1.0, 2.0], [2.0, 1.0]], q=np.zeros(2))


def test_negative_diagonal_P_rejected():
    with pytest.raises(pp.ProblemError, match=r"P\[1,1\]"):
        pp.QP(P=np.diag([1.0, -1.0]), q=np.zeros(2))


def test_dependent_rows_of_B_named():
    B = [[1.0, 1.0, 0.0], [0.0, 0.0, 1.0], [2.0, 2.0, 1.0]]
    with pytest.raises(pp.ProblemError, match=r"rows \[\d\] of B are linearly dependent"):
        pp.Polyhedron(B=B, b=[1.0, 0.0, 2.0])


def test_zero_row_of_B_named():
    with pytest.raises(pp.ProblemError, match=r"rows \[1\] of B"):
        pp.Polyhedron(B=[[1.0, 0.0], [0.0, 0.0]], b=[1.0, 0.0])


def test_crossing_bounds_rejected():
    with pytest.raises(pp.ProblemError, match=r"lb\[1\] = 2 > ub\[1\] = 1"):
        pp.Polyhedron(lb=[0.0, 2.0], ub=[1.0, 1.0])


def test_non_numeric_rejected():
    with pytest.raises(pp.ProblemError, match="real numbers"):
        pp.QP(P=np.eye(2), q=["a", "b"])
    with pytest.raises(pp.ProblemError, match="real numbers"):
        pp.Polyhedron(A=np.array([[1 + 1j, 0]]), a=[1.0])


def test_polyhedron_needs_a_dimension():
    with pytest.raises(pp.ProblemError, match="number of variables"):
        pp.Polyhedron()


def test_tensor_data_gives_the_dimension():
    """The dimension is read from a tensor's shape (``np.size`` would call a torch tensor's ``.size()``)."""
    torch = pytest.importorskip("torch")
    box = pp.sets.Box(torch.zeros(3), torch.ones(3))
    assert box.n == 3 and box.lb.dtype == np.float64
    P = pp.Polyhedron(A=torch.ones(1, 2), a=torch.ones(1), lb=torch.zeros(2))
    assert (P.n, P.n_ineq) == (2, 3)
    assert pp.QP(P=np.eye(2), q=torch.ones(2)).n == 2
    with pytest.raises(pp.ProblemError, match="a given without A"):
        pp.Polyhedron(a=torch.ones(3), n=2)


def test_scalar_bounds_apply_to_every_variable():
    P = pp.Polyhedron(A=np.ones((1, 3)), a=[1.0], lb=0, ub=0.75)
    np.testing.assert_array_equal(P.lb, np.zeros(3))
    np.testing.assert_array_equal(P.ub, np.full(3, 0.75))
    np.testing.assert_array_equal(pp.QP(P=np.eye(2), q=np.ones(2), lb=-1.0).lb, [-1.0, -1.0])
    with pytest.raises(pp.ProblemError, match="number of variables"):
        pp.Polyhedron(lb=0.0)  # a scalar bound does not tell n
    with pytest.raises(pp.ProblemError, match="lb must have shape"):
        pp.Polyhedron(A=np.ones((1, 3)), a=[1.0], lb=[0.0, 0.0])


def test_polyhedron_constraint_form_and_projection_qp(rng):
    A, B = rng.normal(size=(3, 4)), rng.normal(size=(1, 4))
    P = pp.Polyhedron(A=A, a=np.ones(3), B=B, b=[0.5], lb=-np.ones(4))
    C, l, u, _, _ = P.constraint_form()
    np.testing.assert_array_equal(C, np.vstack([A, B]))
    np.testing.assert_array_equal(l, [-np.inf, -np.inf, -np.inf, 0.5])
    np.testing.assert_array_equal(u, [1.0, 1.0, 1.0, 0.5])
    qp = P.projection_qp(np.arange(4.0))
    np.testing.assert_array_equal(qp.q, -np.arange(4.0))
    assert P.n_ineq == 3 + 4 and P.lb_idx.tolist() == [0, 1, 2, 3] and P.ub_idx.size == 0


def test_polyhedron_violation_batched(rng):
    P = pp.Polyhedron(A=[[1.0, 1.0]], a=[1.0], lb=[0.0, 0.0])
    v = P.violation(np.array([[0.5, 0.5], [2.0, 0.0], [-1.0, 0.0]]))
    np.testing.assert_allclose(v, [0.0, 1.0, 1.0])
    assert P.violation(np.array([np.nan, 0.0])) == np.inf


def test_with_vectors_validates():
    qp = pp.QP(P=np.eye(2), q=np.zeros(2))
    with pytest.raises(pp.ProblemError, match="q contains NaN"):
        qp.with_vectors(q=[np.nan, 0.0])
    with pytest.raises(pp.ProblemError, match="takes q, l, u, lb, ub"):
        qp.with_vectors(P=np.eye(2))


def test_dual_infeasibility_certificate():
    # min -x1 s.t. x2 in [0, 1]: d = e1 is a recession direction with qᵀd < 0
    qp = pp.QP(P=np.zeros((2, 2)), q=[-1.0, 0.0], C=[[0.0, 1.0]], l=[0.0], u=[1.0])
    assert qp.is_dual_infeasibility_certificate(np.array([1e6, 0.0]))
    assert not qp.is_dual_infeasibility_certificate(np.array([-1.0, 0.0]))  # ascent direction
    assert not qp.is_dual_infeasibility_certificate(np.array([1.0, 1.0]))  # leaves the constraint
    assert not qp.is_dual_infeasibility_certificate(np.zeros(2))
    strongly_convex = pp.QP(P=np.eye(2), q=[-1.0, 0.0])
    assert not strongly_convex.is_dual_infeasibility_certificate(np.array([1.0, 0.0]))


def test_primal_infeasibility_certificate():
    # x1 >= 1 and x1 <= 0: y = (-1, 1) gives Cᵀy = 0 and uᵀy⁺ − lᵀy⁻ = 0 − 1 < 0
    qp = pp.QP(P=np.eye(2), q=np.zeros(2), C=[[1.0, 0.0], [1.0, 0.0]], l=[1.0, -np.inf], u=[np.inf, 0.0])
    assert qp.is_primal_infeasibility_certificate(np.array([-1.0, 1.0]), np.zeros(2))
    assert not qp.is_primal_infeasibility_certificate(np.array([1.0, -1.0]), np.zeros(2))  # weight on infinite sides
    feasible = pp.QP(P=np.eye(2), q=np.zeros(2), C=[[1.0, 0.0], [1.0, 0.0]], l=[0.0, -np.inf], u=[np.inf, 1.0])
    assert not feasible.is_primal_infeasibility_certificate(np.array([-1.0, 1.0]), np.zeros(2))


def test_polyhedron_refuses_rows_too_small_to_square():
    """A row whose entries are all below 1e-100 has a squared norm that underflows: every backend and the
    polish took [1e-200, 0, 0, 0] y <= 0 for a zero row and returned y0 = 2.5 for x = (3, 0, 0, 0). Refused,
    naming the row; rows at 1e-90 and zero rows stay accepted and are projected onto exactly."""
    A = np.array([[1e-200, 0, 0, 0], [1.0, 1, 1, 1]])
    for M in (A, sp.csr_matrix(A)):
        with pytest.raises(pp.ProblemError, match=r"rows \[0\] of A .* 1e-200"):
            pp.Polyhedron(A=M, a=[0.0, 1.0])
    with pytest.raises(pp.ProblemError, match=r"rows \[1\] of B"):
        pp.Polyhedron(B=np.array([[1.0, 0, 0, 0], [0, 1e-120, 0, 0]]), b=[0.0, 0.0])
    for s in (1e-90, 1e-6):
        P = pp.Polyhedron(A=np.array([[s, 0, 0, 0], [1.0, 1, 1, 1], [0, 0, 0, 0]]), a=[0.0, 1.0, 0.0])
        np.testing.assert_allclose(pp.project(np.array([3.0, 0, 0, 0]), P).y, 0.0, atol=1e-12)


def test_solution_residuals_name_a_solution_that_does_not_fit():
    """sol.dual_residual(another_qp) raised a bare ValueError from a matrix product, a Solution without
    multipliers a bare TypeError: a ProblemError that names the parts."""
    qp = pp.QP(P=np.eye(2), q=[-1.0, -2.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0])
    sol = pp.Solution(x=np.array([0.0, 1.0]), z=np.array([1.0]), z_box=np.zeros(2), status=pp.Status.SOLVED, qp=qp)
    assert sol.dual_residual() == 0.0
    with pytest.raises(pp.ProblemError, match=r"x \(2,\) \(the problem's: \(3,\)\)"):
        sol.dual_residual(pp.QP(P=np.eye(3), q=np.zeros(3)))
    bare = pp.Solution(x=np.zeros(2), z=None, z_box=None, status=pp.Status.SOLVED)
    with pytest.raises(pp.ProblemError, match="z missing"):
        bare.duality_gap(qp)
    assert bare.primal_residual(qp) == 0.0


def test_right_hand_sides_read_as_no_bound():
    """|v| >= 1e20 means no bound; on a row scaled up as far (1e20 (y1 + y2) <= 1e20 is y1 + y2 <= 1) that would
    drop the row silently: refused, naming it. Where the convention does not apply (b, bounds) the message
    names the value given, not the inf it was read as."""
    import scipy.sparse as sp

    assert np.isinf(pp.Polyhedron(A=[[1.0, 1.0]], a=[1e20]).a[0])  # data files' "no bound"
    assert pp.Polyhedron(A=[[1e19, 1e19]], a=[1e19]).a[0] == 1e19
    for A in ([[1e20, 1e20]], sp.csr_matrix(np.array([[1e19, 0.0]]))):
        with pytest.raises(pp.ProblemError, match=r"a\[0\] = 1e\+20 reads as no bound.*would drop row 0"):
            pp.Polyhedron(A=A, a=[1e20])
    with pytest.raises(pp.ProblemError, match=r"b\[0\] = 1e\+25, which reads as inf"):
        pp.Polyhedron(B=[[1e25, 1e25]], b=[1e25])
    with pytest.raises(pp.ProblemError, match=r"lb\[0\] = 1e\+25, which reads as inf"):
        pp.Polyhedron(lb=[1e25, 0.0])


def test_batch_positions_and_result_objects():
    """BatchSolution.take read a boolean mask as the indices 0/1 (wrong elements); out-of-range positions and a
    put of the wrong length were raw IndexErrors (the latter after broadcasting one row into both); results
    with lazy degeneracy reports could not be pickled; == raised NumPy's ambiguous truth value; single() on a
    single point or a batch of 4 failed or dropped three points silently."""
    import pickle

    s = [pp.Solution(x=np.array([v, v]), z=np.zeros(1), z_box=np.zeros(2), status=st)
         for v, st in ((1.0, pp.Status.SOLVED), (2.0, pp.Status.MAX_ITER), (3.0, pp.Status.SOLVED))]
    b = pp.BatchSolution.stack(s)
    t = b.take(np.array([False, True, False]))
    assert t.x.tolist() == [[2.0, 2.0]] and t.status == (pp.Status.MAX_ITER,)
    assert b.take([-1]).x.tolist() == [[3.0, 3.0]]
    with pytest.raises(pp.ProblemError, match="out of range"):
        b.take([5])
    with pytest.raises(pp.ProblemError, match="2 positions but 1 elements"):
        b.put([0, 1], b.take([1]))
    assert (b == b) and not (b == pickle.loads(pickle.dumps(b)))  # identity, not an elementwise comparison
    P = pp.Polyhedron(A=[[1.0, 1.0]], a=[1.0], lb=[0.0, 0.0])
    X = np.array([[2.0, 2.0], [3.0, -1.0]])
    res = pp.project(X, P, backend="ipm")  # its degeneracy report is lazy
    again = pickle.loads(pickle.dumps(res))
    np.testing.assert_array_equal(again.y, res.y)
    np.testing.assert_array_equal(again.degenerate.dependent, res.degenerate.dependent)
    one = pickle.loads(pickle.dumps(pp.project(X[0], P, backend="ipm")))
    assert one.status is pp.Status.SOLVED and one.degenerate.dependent in (True, False)
    with pytest.raises(pp.PolyprojError, match="batch of one, not of 2"):
        res.single()
    with pytest.raises(pp.PolyprojError, match="already a single point"):
        pp.project(X[0], P, backend="ipm").single()


def test_flags_must_be_booleans_and_n_positive():
    """A string flag is truthy: polish="no" polished and allow_dependent_rows="no" allowed dependent rows
    silently; n = -1 was reported as "cannot tell the number of variables"."""
    S = pp.Polyhedron(B=np.ones((1, 2)), b=[1.0], lb=np.zeros(2))
    x = np.array([0.9, 0.5])
    for kw in ({"polish": "no"}, {"polish": "False"}, {"structured": "no"}, {"polish": None}):
        with pytest.raises(pp.ProblemError, match=f"{next(iter(kw))} must be True or False"):
            pp.project(x, S, **kw)
    with pytest.raises(pp.ProblemError, match="polish must be True or False"):
        pp.sets.Polyhedral(S, "proxsuite", polish="no")
    with pytest.raises(pp.ProblemError, match="allow_dependent_rows must be True or False"):
        pp.Polyhedron(B=[[1.0, 1.0], [1.0, 1.0]], b=[1.0, 1.0], allow_dependent_rows="no")
    for n in (-1, 0):
        with pytest.raises(pp.ProblemError, match="n must be a positive integer"):
            pp.Polyhedron(lb=0.0, n=n)
    assert pp.project(x, S, polish=np.bool_(False)).y.shape == (2,)


def test_input_formats_read_as_their_values_or_refused_by_name():
    """A probe's raw exceptions and silent readings of formats a user may pass (each its own line)."""
    # a 1-D sparse array is one row, as a dense 1-D array is; a 3-D one is refused by name
    for A in (sp.coo_array(np.array([1.0, 1.0, 0.0])), sp.dok_array(np.array([1.0, 1.0, 0.0]))):
        P = pp.Polyhedron(A=A, a=[1.0])
        np.testing.assert_array_equal(P.A.toarray() if sp.issparse(P.A) else P.A, [[1.0, 1.0, 0.0]])
    qp = pp.QP(P=np.eye(3), q=np.zeros(3), C=sp.coo_array(np.array([1.0, 1.0, 0.0])), l=[0.0], u=[1.0])
    assert qp.m == 1
    with pytest.raises(pp.ProblemError, match="P must be a 2-D matrix"):
        pp.QP(P=sp.coo_array(np.array([1.0, 1.0])), q=[1.0, 1.0])
    with pytest.raises(pp.ProblemError, match=r"P must be a 2-D matrix, got shape \(2,\)"):
        pp.QP(P=[2.0, 1.0], q=[1.0, 1.0])  # was reshaped to one row, then "must have shape (2, 2), got (1, 2)"
    # a sparse q is its values (here of the wrong shape); a Python integer beyond int64 is a real number
    assert pp.QP(P=np.eye(2), q=[3 * 10**19, 1]).q[0] == 3e19
    with pytest.raises(pp.ProblemError, match="q must have shape"):
        pp.QP(P=np.eye(2), q=sp.csr_matrix([[1.0, 1.0]]))
    # masked entries are refused, an unmasked masked array is its data
    with pytest.raises(pp.ProblemError, match="masked array with masked entries"):
        pp.QP(P=np.eye(2), q=np.ma.masked_array([1.0, 1.0], mask=[True, False]))
    np.testing.assert_array_equal(pp.QP(P=np.eye(2), q=np.ma.masked_array([1.0, 2.0])).q, [1.0, 2.0])
    # check_psd is a flag: None skipped the check
    for bad in (None, "", 2, 0.5):
        with pytest.raises(pp.ProblemError, match="check_psd must be True or False"):
            pp.QP(P=np.eye(2), q=[1.0, 1.0], check_psd=bad)
    assert pp.QP(P=np.eye(2), q=[1.0, 1.0], check_psd=0).n == 2  # 0 and 1 are flags
    np.testing.assert_array_equal(pp.QP(P=[2.0], q=[1.0]).P, [[2.0]])  # one variable: its 1 x 1 P
    # a scalar bound in with_vectors, as in QP(lb=0)
    qp = pp.QP(P=np.eye(2), q=[1.0, 1.0], lb=0.0)
    np.testing.assert_array_equal(qp.with_vectors(lb=-1.0, ub=2.0).ub, [2.0, 2.0])
    # the evaluation methods check the point's size
    with pytest.raises(pp.ProblemError, match=r"x must have shape \(2,\)"):
        qp.objective([1.0, 2.0, 3.0])
    with pytest.raises(pp.ProblemError, match=r"x must have shape \(2,\)"):
        qp.primal_violation([1.0, 2.0, 3.0])
    assert qp.objective([1.0, 1.0]) == pytest.approx(3.0)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support")
def test_torch_inputs_sparse_and_meta():
    torch = pytest.importorskip("torch")
    qp = pp.QP(P=torch.eye(2, dtype=torch.float64).to_sparse(), q=[1.0, 1.0])
    np.testing.assert_array_equal(qp.P, np.eye(2))
    P = pp.Polyhedron(A=torch.tensor([[1.0, 1.0]]).to_sparse_csr(), a=[1.0])
    np.testing.assert_array_equal(P.A, [[1.0, 1.0]])
    with pytest.raises(pp.ProblemError, match="'meta' device"):
        pp.QP(P=np.eye(2), q=torch.zeros(2, device="meta"))


def test_solution_records_misuse_is_a_problem_error():
    qp = pp.QP(P=np.eye(2), q=[-1.0, -1.0], lb=0.0, ub=1.0)
    sol = pp.solve_qp(qp, backend="ipm")
    with pytest.raises(pp.ProblemError, match="qp must be a polyproj.QP, got str"):
        sol.residuals("x")
    by_hand = pp.Solution(x=[1.0, 1.0], z=[], z_box=[0.0, 0.0], status=pp.Status.SOLVED, qp=qp)
    with pytest.raises(pp.ProblemError, match="x is a list, not a NumPy array"):
        by_hand.residuals()
    with pytest.raises(pp.ProblemError, match="needs at least one Solution"):
        pp.BatchSolution.stack([])
    with pytest.raises(pp.ProblemError, match=r"batched lb\[0, 0\] = 2 > the problem's ub"):
        pp.get_backend("ipm").solve_batch(qp, lb=2.0 * np.ones((2, 2)))


def test_close_matches_ignore_case_and_name_the_backend_argument():
    with pytest.raises(pp.BackendNotFound, match="Did you mean 'osqp'"):
        pp.get_backend("OSQP")
    qp = pp.QP(P=np.eye(2), q=[-1.0, -1.0])
    with pytest.raises(pp.SettingsError, match="Did you mean 'backend'"):
        pp.solve_qp(qp, backend="ipm", backnd="ipm")  # (ipm: the default backend may be missing in make test-min)


def test_symmetry_is_checked_per_entry_and_named_on_sparse_data():
    """Against max|P| alone a block at 1e-3 beside a diagonal at 1e6 passed 55 % apart between its triangles (ipm
    and admm answered SOLVED, 10 % off the optimum); the entry was found on a dense copy (6.7 GiB at n 30,000);
    a one-triangle P was told to pass (P + P.T) / 2, which halves its off-diagonal (a probe)."""
    import scipy.sparse as sp

    P = np.array([[1e6, 0, 0], [0, 1e-3, 9e-4], [0, 4e-4, 1e-3]])
    for M in (P, sp.csc_matrix(P)):
        with pytest.raises(pp.ProblemError, match=r"P\[(1,2|2,1)\]"):
            pp.QP(M, [0.0, 1e-3, -1e-3])
    with pytest.raises(pp.ProblemError, match="one triangle only: pass P \\+ P.T - diag"):
        pp.QP(sp.triu(sp.csc_matrix([[2.0, 1.0], [1.0, 2.0]])), [1.0, -1.0])
    L = np.random.default_rng(0).standard_normal((40, 40))
    pp.QP(L @ L.T / 40 + np.diag(np.logspace(-6, 6, 40)), np.zeros(40))  # symmetric to rounding: accepted
    n = 3_000
    T = sp.triu(sp.random(n, n, density=1e-4, format="csc", random_state=1) + sp.eye(n), format="csc")
    with pytest.raises(pp.ProblemError, match="one triangle only"):
        pp.QP(T, np.zeros(n))
    C = sp.eye(n, format="csc")
    C.data[7] = np.nan
    with pytest.raises(pp.ProblemError, match="first at row 7, column 7"):
        pp.QP(sp.eye(n, format="csc"), np.zeros(n), C, -np.ones(n), np.ones(n))
    pp.QP(sp.identity(3, dtype=np.float16, format="dia"), np.ones(3))  # csc_matrix(dtype=) refused float16 DIA
