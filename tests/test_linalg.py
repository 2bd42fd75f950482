"""Batched Cholesky factorisation and solves (polyproj.linalg): every fast path against a reference."""

import sys

import numpy as np
import pytest

from polyproj.linalg import cho_solve, cholesky, identity_where
from polyproj.runtime import set_torch_threads, small_blas

torch = pytest.importorskip("torch")
import array_api_compat.numpy as xnp  # noqa: E402
import array_api_compat.torch as xtorch  # noqa: E402


def _spd_batch(rng, b, n, bad=()):
    M = rng.standard_normal((b, n, n))
    K = M @ M.transpose(0, 2, 1) + n * np.eye(n)
    for i in bad:  # indefinite
        K[i] = -np.eye(n) + 0.1 * (M[i] + M[i].T)
    return K


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_numpy_batched_cholesky_flags_failures_per_element(rng, dtype):
    K = _spd_batch(rng, 40, 12, bad=(3, 17)).astype(dtype)
    L, ok = cholesky(xnp, K)
    assert ok.tolist() == [i not in (3, 17) for i in range(40)]
    tol = 1e-12 if dtype == np.float64 else 1e-4
    np.testing.assert_allclose(L[ok] @ L[ok].transpose(0, 2, 1), K[ok], rtol=tol, atol=tol * 12)
    np.testing.assert_array_equal(L[~ok], np.broadcast_to(np.eye(12, dtype=dtype), (2, 12, 12)))
    assert np.all(np.triu(L, 1) == 0)


def test_numpy_cholesky_reads_the_lower_triangle_and_fills_out(rng):
    K = _spd_batch(rng, 30, 9)
    garbage = K + np.triu(rng.standard_normal(K.shape) * 1e3, 1)  # the upper triangle is never read
    out = np.full_like(K, np.nan)
    L, ok = cholesky(xnp, garbage, out=out)
    assert L is out and ok.all()
    np.testing.assert_allclose(L, np.linalg.cholesky(K), rtol=0, atol=1e-12)


def test_torch_cholesky_stays_torch(rng, monkeypatch):
    K = torch.from_numpy(_spd_batch(rng, 25, 10, bad=(5,)))

    def forbidden(*_a, **_k):
        raise AssertionError("a torch tensor was converted to NumPy")

    monkeypatch.setattr(torch.Tensor, "numpy", forbidden)
    monkeypatch.setattr(torch.Tensor, "__array__", forbidden)
    L, ok = cholesky(xtorch, K)
    R = torch.randn(25, 10, 2, dtype=torch.float64)
    X = cho_solve(xtorch, L, R)
    monkeypatch.undo()
    assert isinstance(L, torch.Tensor) and ok.dtype == torch.bool and isinstance(X, torch.Tensor)
    assert ok.tolist() == [i != 5 for i in range(25)]
    torch.testing.assert_close(L[ok], torch.linalg.cholesky(K[ok]), rtol=0, atol=1e-12)
    torch.testing.assert_close(K[ok] @ X[ok], R[ok], rtol=0, atol=1e-10)


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_identity_where_overwrites_only_its_own_failed_factors(rng, lib):
    """Failed factors become the identity: in place on the caller's own array (only those written),
    a new array otherwise, and never in place on a tensor of an autograd graph."""
    L0 = rng.standard_normal((6, 4, 4))
    ok0 = np.array([True, False, True, True, False, True])
    xp, arr, okv = (xnp, L0.copy(), ok0) if lib == "numpy" else (xtorch, torch.from_numpy(L0.copy()),
                                                                 torch.from_numpy(ok0))
    want = np.where(ok0[:, None, None], L0, np.eye(4))
    kept = arr.copy() if lib == "numpy" else arr.clone()
    out = identity_where(xp, okv, arr)  # not own: a new array, the input unchanged
    np.testing.assert_array_equal(np.asarray(out), want)
    np.testing.assert_array_equal(np.asarray(arr), np.asarray(kept))
    out = identity_where(xp, okv, arr, own=True)  # own: the same array, written where it failed
    assert out is arr
    np.testing.assert_array_equal(np.asarray(arr), want)
    all_ok = okv | ~okv
    assert identity_where(xp, all_ok, arr, own=True) is arr
    if lib == "torch":  # a factor in a graph is never modified in place (its backward needs it)
        g = torch.from_numpy(L0.copy()).requires_grad_()
        out = identity_where(xp, okv, g * 1.0, own=True)
        out.sum().backward()
        np.testing.assert_array_equal(g.grad.numpy(), np.broadcast_to(ok0[:, None, None], L0.shape).astype(float))


@pytest.mark.parametrize("k", [None, 1, 3])
def test_numpy_solves_with_and_without_torch_kernels_agree(rng, monkeypatch, k):
    K = _spd_batch(rng, 64, 15)
    L, _ = cholesky(xnp, K)
    R = rng.standard_normal((64, 15) if k is None else (64, 15, k))
    with_torch = cho_solve(xnp, L, R)
    assert isinstance(with_torch, np.ndarray) and with_torch.shape == R.shape
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not loaded: the substitution
    substitution = cho_solve(xnp, L, R)
    np.testing.assert_allclose(with_torch, substitution, rtol=0, atol=1e-12)
    R3 = R[:, :, None] if k is None else R
    X3 = substitution[:, :, None] if k is None else substitution
    np.testing.assert_allclose(K @ X3, R3, rtol=0, atol=1e-10)


def test_shared_factor_broadcasts_over_right_hand_sides(rng):
    K = _spd_batch(rng, 1, 8)
    L, _ = cholesky(xnp, np.repeat(K, 10, axis=0))
    R = rng.standard_normal((10, 8, 2))
    X = cho_solve(xnp, L[:1], R)
    np.testing.assert_allclose(K @ X, R, rtol=0, atol=1e-10)


def test_small_blas_runs_torch_on_one_thread_and_restores_it():
    prev = torch.get_num_threads()
    set_torch_threads(2)
    try:
        with small_blas():
            assert torch.get_num_threads() == 1
            with small_blas():  # nested: a no-op that keeps the limits
                assert torch.get_num_threads() == 1
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
    finally:
        set_torch_threads(prev)


def test_small_blas_runs_blas_on_one_thread_and_restores_it():
    from polyproj.runtime import _blas_pools, _controller

    pools = _blas_pools(_controller())
    if not pools:
        pytest.skip("no BLAS thread pool found")
    before = [lc.get_num_threads() for lc in pools]
    try:
        for lc in pools:
            lc.set_num_threads(2)
        outside = [lc.get_num_threads() for lc in pools]  # a BLAS built for one core keeps 1
        with small_blas():
            assert all(lc.get_num_threads() == 1 for lc in pools)
        assert [lc.get_num_threads() for lc in pools] == outside
    finally:
        for lc, t in zip(pools, before, strict=True):
            lc.set_num_threads(t)


def test_read_only_inputs_are_solved_without_warnings(rng, recwarn):
    K = _spd_batch(rng, 20, 6)
    L, _ = cholesky(xnp, K)
    R = rng.standard_normal((20, 6, 1))
    L.flags.writeable = False
    R.flags.writeable = False
    X = cho_solve(xnp, L, R)
    np.testing.assert_allclose(K @ X, R, rtol=0, atol=1e-10)
    assert not [w for w in recwarn if "writable" in str(w.message)]


@pytest.mark.parametrize("xp", [xnp, xtorch], ids=["numpy", "torch"])
@pytest.mark.parametrize("n", [1, 3, 8])
def test_entrywise_cholesky_and_solve_match_the_per_matrix_kernels(rng, xp, n):
    from polyproj.linalg import small_cho_solve, small_cholesky

    K = _spd_batch(rng, 50, n, bad=(4, 31))
    if n == 1:
        K[4] = K[31] = -1.0
    K[7] = np.nan
    Kx = K if xp is xnp else torch.from_numpy(K)
    L, ok = small_cholesky(xp, Kx)
    L0, ok0 = cholesky(xp, Kx)
    assert np.asarray(ok).tolist() == np.asarray(ok0).tolist() == [i not in (4, 7, 31) for i in range(50)]
    L, L0 = np.asarray(L), np.asarray(L0)
    np.testing.assert_allclose(L, L0, rtol=0, atol=1e-12)  # failures: the identity in both
    R = rng.standard_normal((50, n))
    as_xp = (lambda a: a) if xp is xnp else torch.from_numpy
    X = np.asarray(small_cho_solve(xp, as_xp(L), as_xp(R)))
    np.testing.assert_allclose(X, np.asarray(cho_solve(xnp, L0, R[:, :, None]))[:, :, 0], rtol=0, atol=1e-12)


def test_batched_eigh_and_svd_in_chunks_equal_one_call(rng, monkeypatch):
    """cuSOLVER's batched eigensolver failed on 10^6 small matrices: eigh and the faces' SVD go in chunks."""
    import polyproj.linalg as la
    from polyproj.projection import faces

    M = rng.standard_normal((23, 5, 4))
    S = M @ np.swapaxes(M, 1, 2)
    lam0 = np.linalg.eigvalsh(S)
    U0, s0, V0 = np.linalg.svd(M, full_matrices=False)
    monkeypatch.setattr(la, "EIGH_CHUNK", 4)
    lam, Q = la.eigh(xnp, S)
    np.testing.assert_allclose(lam, lam0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(Q @ (lam[..., None] * np.swapaxes(Q, 1, 2)), S, rtol=0, atol=1e-12)
    U, s, V = faces._svd(xnp, M)
    np.testing.assert_allclose(s, s0, rtol=0, atol=1e-12)
    np.testing.assert_allclose((U * s[:, None, :]) @ V, M, rtol=0, atol=1e-12)
    assert U.shape == U0.shape and V.shape == V0.shape
