"""hs_jacobian / hs_vjp arguments (a probe, session 49): an index list of 0s and 1s was read as a mask, a meta
tensor and a non-Polyhedron gave raw errors, and V's float32 came back as float64."""

from __future__ import annotations

import numpy as np
import pytest

import polyproj as pp


def _null_projector(H):
    """I − H H⁺ for the rows H (independent reference: SVD of H)."""
    n = H.shape[1]
    if H.size == 0:
        return np.eye(n)
    _, s, Vt = np.linalg.svd(H)
    rank = int((s > 1e-12 * s.max()).sum())
    return np.eye(n) - Vt[:rank].T @ Vt[:rank]


@pytest.mark.parametrize("index_form", [[0], [1, 0], np.array([1, 0]), np.array([0, 1], dtype=np.uint8)])
def test_an_integer_active_argument_is_refused_not_read_as_a_mask(index_form):
    """[0] ("row 0 is active") gave J = I, the mask [False]; [1, 0] on two rows gave the mask (True, False)."""
    k = len(index_form)
    P = pp.Polyhedron(A=np.eye(2)[:k] if k == 2 else [[1.0, 1.0]], a=np.zeros(k))
    with pytest.raises(pp.ProblemError, match=r"active must be a boolean mask.*astype\(bool\).*row indices"):
        pp.hs_jacobian(P, index_form)
    with pytest.raises(pp.ProblemError, match=r"active must be a boolean mask.*astype\(bool\).*row indices"):
        pp.hs_vjp(P, index_form, np.ones(2))
    # the two ways out give the documented answers: rows given by index, and 0/1 flags converted
    mask = np.zeros(P.n_ineq, bool)
    mask[np.asarray(index_form)] = True
    np.testing.assert_allclose(pp.hs_jacobian(P, mask), _null_projector(P.A_dense[mask]), atol=1e-14)
    flags = np.asarray(index_form).astype(bool)
    np.testing.assert_allclose(pp.hs_jacobian(P, flags), _null_projector(P.A_dense[flags]), atol=1e-14)


def test_boolean_masks_of_every_kind_are_accepted():
    Q = pp.Polyhedron(A=[[1.0, 0.0], [0.0, 1.0]], a=[0.0, 0.0])
    ref = np.diag([0.0, 1.0])  # row 0 active: its normal removed
    for act in ([True, False], np.array([True, False]), [np.True_, np.False_]):
        np.testing.assert_array_equal(pp.hs_jacobian(Q, act), ref)
    torch = pytest.importorskip("torch")
    np.testing.assert_array_equal(pp.hs_jacobian(Q, torch.tensor([True, False])), ref)
    np.testing.assert_array_equal(pp.hs_vjp(Q, torch.tensor([True, False]), np.array([3.0, 4.0])), [0.0, 4.0])
    with pytest.raises(pp.ProblemError, match="boolean mask.*row indices"):
        pp.hs_jacobian(Q, torch.tensor([1, 0]))


def test_a_meta_tensor_is_a_problem_error():
    """A 'meta' tensor (no values) as active or V raised torch's raw NotImplementedError."""
    torch = pytest.importorskip("torch")
    P = pp.Polyhedron(A=[[1.0, 1.0]], a=[1.0])
    with pytest.raises(pp.ProblemError, match="active is a tensor on the 'meta' device"):
        pp.hs_jacobian(P, torch.zeros(1, dtype=torch.bool, device="meta"))
    with pytest.raises(pp.ProblemError, match="active is a tensor on the 'meta' device"):
        pp.hs_vjp(P, torch.zeros(1, dtype=torch.bool, device="meta"), np.ones(2))
    with pytest.raises(pp.ProblemError, match="V is a tensor on the 'meta' device"):
        pp.hs_vjp(P, np.array([True]), torch.ones(2, device="meta"))


def test_hs_vjp_of_a_non_polyhedron_is_the_same_problem_error_as_hs_jacobian():
    """hs_vjp read polyhedron.n before the type check: AttributeError for an ndarray."""
    for bad in (np.eye(2), pp.sets.Simplex(2)):
        with pytest.raises(pp.ProblemError, match="take a Polyhedron") as e_jac:
            pp.hs_jacobian(bad, [True])
        with pytest.raises(pp.ProblemError, match="take a Polyhedron") as e_vjp:
            pp.hs_vjp(bad, [True], np.ones(2))
        assert str(e_vjp.value) == str(e_jac.value)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_hs_vjp_keeps_a_floating_v_dtype(dtype):
    """float32 V came back float64; the product is computed in float64 and rounded once to V's dtype."""
    rng = np.random.default_rng(49)
    A = rng.normal(size=(3, 4))
    P = pp.Polyhedron(A=A, a=np.ones(3))
    act = np.array([[True, False, True], [False, True, False]])
    V = rng.normal(size=(2, 4)).astype(dtype)
    out = pp.hs_vjp(P, act, V)
    assert out.dtype == dtype and out.shape == V.shape
    ref = np.stack([_null_projector(A[a]) @ v for a, v in zip(act, V.astype(np.float64))])
    eps = np.finfo(dtype).eps  # one rounding of the float64 product (float64: the two SVDs' rounding)
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=eps, atol=max(eps, 1e-13) * np.abs(ref).max())
    assert pp.hs_vjp(P, act, np.ones((2, 4), dtype=np.int64)).dtype == np.float64  # integers: float64


def test_hs_vjp_of_a_torch_v_is_an_ndarray_of_its_dtype():
    torch = pytest.importorskip("torch")
    P = pp.Polyhedron(A=[[1.0, 1.0]], a=[1.0])
    ref = np.eye(2) - 0.5 * np.ones((2, 2))
    for dt, npdt in ((torch.float32, np.float32), (torch.float64, np.float64), (torch.bfloat16, np.float64)):
        V = torch.tensor([[1.0, 3.0], [2.0, 0.0]], dtype=dt)
        out = pp.hs_vjp(P, np.ones((2, 1), bool), V)
        assert isinstance(out, np.ndarray) and out.dtype == npdt
        np.testing.assert_allclose(out, V.double().numpy() @ ref, atol=1e-6)
