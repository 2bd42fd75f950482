"""Machine independence of the suite (session 53): results that the tests compare must not depend on which
CPU kernels (OpenBLAS core type, numpy SIMD, ATen capability, MKL instructions) the machine picks.

The tanh MLP of ``conftest.mlp`` has 2ᵏ·k! equivalent KKT points (a hidden unit's sign flip, the units'
order); with ATen's default kernels the float32 initial weights round differently in the last bit and
training lands on another copy. A start displaced from the KKT point must be given relative to the copy
(``test_dif_matfree._equivariant``), or the Newton test starts elsewhere on another machine.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.test_dif_matfree import _equivariant, _hidden_unit_symmetry  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore::polyproj.errors.PolyprojWarning"),
              pytest.mark.usefixtures("one_torch_thread", "quiet_polyproj_warnings")]

H, D = 6, 3  # the conftest MLP: Linear(3, 6), tanh, Linear(6, 1)


def _act(theta: np.ndarray, perm: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """The equivalent copy of θ whose hidden unit k is unit perm[k] of θ times signs[k]."""
    W1, b1 = theta[:H * D].reshape(H, D), theta[H * D:H * (D + 1)]
    w2 = theta[H * (D + 1):H * (D + 2)]
    return np.r_[(W1[perm] * signs[:, None]).ravel(), b1[perm] * signs, w2[perm] * signs, theta[H * (D + 2):]]


def _net(theta: np.ndarray, X: np.ndarray) -> np.ndarray:
    W1, b1 = theta[:H * D].reshape(H, D), theta[H * D:H * (D + 1)]
    w2, b2 = theta[H * (D + 1):H * (D + 2)], theta[-1]
    return np.tanh(X @ W1.T + b1) @ w2 + b2


def test_equivariant_start_is_the_same_point_of_every_equivalent_copy():
    """θ' = Tθ (a signed permutation of hidden units: the same network); the start θ' + shift(θ') is T applied
    to θ + shift(θ), so the network there, its loss and Newton's path are the same on either copy."""
    rng = np.random.default_rng(0)
    theta = rng.normal(size=H * (D + 2) + 1)
    v = rng.normal(size=theta.size)
    X = rng.normal(size=(40, D))
    for _ in range(5):
        perm, signs = rng.permutation(H), rng.choice([-1.0, 1.0], size=H)
        other = _act(theta, perm, signs)
        np.testing.assert_allclose(_net(other, X), _net(theta, X), rtol=0, atol=1e-14)  # the premise
        start, start_other = theta + 0.01 * _equivariant(theta, v), other + 0.01 * _equivariant(other, v)
        np.testing.assert_allclose(start_other, _act(start, perm, signs), rtol=0, atol=1e-15)
        np.testing.assert_allclose(_net(start_other, X), _net(start, X), rtol=0, atol=1e-14)
        # both copies have the same canonical form, and the shift is v in its coordinates
        o, s = _hidden_unit_symmetry(theta)
        o2, s2 = _hidden_unit_symmetry(other)
        np.testing.assert_array_equal(_act(theta, o, s[o]), _act(other, o2, s2[o2]))
        np.testing.assert_allclose(_act(start, o, s[o]) - _act(theta, o, s[o]), 0.01 * v, rtol=0, atol=1e-15)


def test_conftest_mlp_kkt_point_differs_only_by_the_symmetry(mlp):
    """Whatever copy training reached here, its canonical form is the one the Newton test's start is built on:
    positive output weights in increasing order, and a KKT residual at the solve's tolerance."""
    from polyproj.adapters.dif.newton import first_order, kkt_residuals

    prob, kkt, _, _ = mlp
    theta = kkt.theta.numpy()
    o, s = _hidden_unit_symmetry(theta)
    canon = _act(theta, o, s[o])
    w2 = canon[H * (D + 1):H * (D + 2)]
    assert np.all(w2 >= 0) and np.all(np.diff(w2) >= 0)
    _, gf, g, G = first_order(prob, torch.as_tensor(canon))
    assert max(kkt_residuals(gf, G, g, kkt.lambdas.numpy(), prob.eq_mask).values()) <= 1e-9


def test_a_far_point_is_polished_to_rounding_at_the_scale_of_y():
    """|x| = 1e21 onto a small polytope (a vertex, cond 12): the face point y = z − Mᵀλ carries eps |x| ~ 2e5 of
    cancellation, and the refinement judged "at rounding" against row terms taken at that unrefined y (~1e6), so
    it stopped one step early: rows missed by 1e-9 (AVX-512 OpenBLAS) or 3e-9 (Sandybridge, Nehalem kernels), above
    the 1e-9 a test asked. Terms at the refined y: the vertex to rounding (float64 reference by exact rationals)."""
    from fractions import Fraction

    import polyproj as pp

    rng = np.random.default_rng(12345)
    n, m = 6, 8
    x0 = rng.normal(size=n)
    A = rng.normal(size=(m, n))
    a = A @ x0 + rng.uniform(0.2, 1.0, size=m)
    B = rng.normal(size=(1, n))
    P = pp.Polyhedron(A=A, a=a, B=B, b=B @ x0, lb=x0 - 1.5, ub=x0 + 1.5)
    big = np.full((2, n), 1e21) * np.sign(rng.normal(size=(2, n)))
    for backend in ("daqp", "proxsuite", "ipm"):
        res = pp.project(big, P, backend=backend)
        assert res.polished.all()
        for i in range(2):
            y = res.y[i]
            # the exact vertex of the active rows (rationals), against which y is checked
            act = np.flatnonzero(res.active[i])
            rows = [A[k] if k < m else (-1.0 if k < m + n else 1.0) * np.eye(n)[(k - m) % n] for k in act]
            rhs = [a[k] if k < m else (-P.lb[k - m] if k < m + n else P.ub[k - m - n]) for k in act]
            M, c = np.vstack([*rows, B]), np.r_[rhs, B @ x0]
            assert M.shape == (n, n) and np.linalg.cond(M) < 1e3
            y_ref = _rational_solve(M, c, Fraction)
            scale = np.abs(M) @ np.abs(y_ref) + np.abs(c)
            assert np.all(np.abs(M @ y - c) <= 64 * np.finfo(float).eps * scale), (backend, i)
            np.testing.assert_allclose(y, y_ref, rtol=0, atol=1e3 * np.finfo(float).eps * np.abs(y_ref).max())
            assert P.violation(y) <= 64 * np.finfo(float).eps * float(scale.max())


def _rational_solve(M: np.ndarray, c: np.ndarray, Fraction) -> np.ndarray:
    """M⁻¹c in exact rationals (Gaussian elimination), rounded to float64."""
    k = M.shape[0]
    T = [[Fraction(float(v)) for v in row] + [Fraction(float(ci))] for row, ci in zip(M, c, strict=True)]
    for j in range(k):
        piv = next(r for r in range(j, k) if T[r][j] != 0)
        T[j], T[piv] = T[piv], T[j]
        for r in range(k):
            if r != j and T[r][j] != 0:
                f = T[r][j] / T[j][j]
                T[r] = [u - f * v for u, v in zip(T[r], T[j], strict=True)]
    return np.array([float(T[j][k] / T[j][j]) for j in range(k)])
