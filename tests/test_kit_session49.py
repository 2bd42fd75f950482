"""check_projector on sets whose active flags are wrong only in torch or float32, and on sets ~1e-7 across.

A set reporting no active row with torch (or float32) inputs passed every check: ``namespaces`` and ``float32``
compared only ``y``, and ``torch vjp`` skipped the points where the active sets differed, while the layer's
gradient was the identity. And on a set 1e-7 across no multiplier exceeded the absolute 1e-6 of the degenerate
points: conservativity was skipped (a skipped row passes) and a set that never reported its row active passed.
"""

from __future__ import annotations

import numpy as np
import pytest
from array_api_compat import array_namespace, device

import polyproj as pp
from polyproj.testing import check_projector


class HalfSpace(pp.Projector):
    """{y : wᵀy <= c} (docs/architecture.md's example), its active flags from ``_act``."""

    def __init__(self, w, c):
        self.w, self.c = np.asarray(w, dtype=float), float(c)

    @property
    def n(self):
        return self.w.size

    def _act(self, excess):
        return (excess >= 0)[:, None]

    def project_batch(self, X):
        xp = array_namespace(X)
        w = xp.asarray(self.w, dtype=X.dtype, device=device(X))
        excess = X @ w - self.c
        step = xp.where(excess > 0, excess, xp.zeros_like(excess)) / float(self.w @ self.w)
        active = self._act(excess)
        return self.result(X, X - step[:, None] * w[None, :], active=active, multipliers=step[:, None], face=active)

    def vjp(self, result, G):
        xp = array_namespace(G)
        w = xp.asarray(self.w, dtype=G.dtype, device=device(G))
        normal = w / float(self.w @ self.w) ** 0.5
        return xp.where(result.face, G - xp.sum(G * normal, axis=1, keepdims=True) * normal, G)

    def as_polyhedron(self):
        return pp.Polyhedron(A=self.w[None, :], a=[self.c])


class TorchNeverActive(HalfSpace):
    """Right points and multipliers everywhere; with torch inputs the row is never flagged active."""

    def _act(self, excess):
        act = (excess >= 0)[:, None]
        return act & False if type(excess).__module__.startswith("torch") else act


class Float32NeverActive(HalfSpace):
    """The row never flagged active for float32 inputs (NumPy and torch)."""

    def _act(self, excess):
        act = (excess >= 0)[:, None]
        return act & False if "float32" in str(excess.dtype) else act


class TorchStrictlyOutside(HalfSpace):
    """With torch inputs the row is active only beyond the hyperplane by 1e-12 (a point on it, or just
    inside, is weakly active at most: zero multiplier), a legitimate choice of HS element."""

    def _act(self, excess):
        if type(excess).__module__.startswith("torch"):
            return (excess > 1e-12)[:, None]
        return (excess >= 0)[:, None]


class NeverActive(HalfSpace):
    """Right points and multipliers; the row is never flagged active (its vjp is then the identity)."""

    def _act(self, excess):
        return (excess >= 0)[:, None] & False


def _layer_grad(S, x, dtype):
    import torch

    from polyproj.adapters.torch import project

    t = torch.tensor([x], dtype=dtype, requires_grad=True)
    project(t, S).sum().backward()
    return t.grad[0].double().numpy()


def test_torch_active_flags_must_match_numpy_where_strictly_complementary():
    torch = pytest.importorskip("torch")
    w, c = np.array([1.0, -2.0]), 0.5
    # the defect: the layer's gradient at x = (3, 0) (strictly outside) is 1ᵀ, not J 1 = 1 − n (nᵀ1)
    n = w / np.linalg.norm(w)
    assert np.allclose(_layer_grad(TorchNeverActive(w, c), [3.0, 0.0], torch.float64), [1.0, 1.0])
    np.testing.assert_allclose(_layer_grad(HalfSpace(w, c), [3.0, 0.0], torch.float64), 1 - n * n.sum(),
                               atol=1e-12)  # [1.2, 0.6]
    assert check_projector(HalfSpace(w, c), examples=20, seed=0).passed
    report = check_projector(TorchNeverActive(w, c), examples=20, seed=0)
    assert not report.passed
    assert report["namespaces"].status == "failed" and "torch inputs report other active rows" in \
        report["namespaces"].message, str(report)
    assert report["torch vjp"].status == "failed", str(report)  # no longer skips the points where flags differ
    assert report["float32"].status == "failed"  # torch float32 too
    for row in ("projection", "agreement", "vjp", "conservativity"):  # NumPy is right
        assert report[row].status == "passed", (row, str(report))


def test_float32_active_flags_must_match_float64_where_strictly_complementary():
    torch = pytest.importorskip("torch")
    w, c = np.array([1.0, -2.0]), 0.5
    assert np.allclose(_layer_grad(Float32NeverActive(w, c), [3.0, 0.0], torch.float32), [1.0, 1.0])  # the defect
    report = check_projector(Float32NeverActive(w, c), examples=20, seed=0)
    assert not report.passed
    assert report["float32"].status == "failed" and "float32 NumPy inputs report other active rows" in \
        report["float32"].message, str(report)
    assert report["namespaces"].status == "passed" and report["torch vjp"].status == "passed"


def test_a_weakly_active_row_may_take_either_flag_in_torch():
    """Points on the hyperplane (zero multiplier) may be flagged either way: no false failure; the torch vjp there
    is compared with the HS-Jacobian product of torch's own active set."""
    pytest.importorskip("torch")
    S = TorchStrictlyOutside([1.0, -2.0], 0.5)
    report = check_projector(S, examples=20, seed=0)
    assert report.passed, str(report)
    assert report["torch vjp"].counts["other_face"] > 0  # the points where the flags differ are compared
    assert report["namespaces"].counts["strictly_active_points"] > 0


def test_the_flags_check_needs_no_torch_for_float32_numpy():
    """float32 NumPy inputs alone catch the float32 defect (``make test-min`` has no torch)."""
    from polyproj.testing.projector import _float32

    S = Float32NeverActive([1.0, -2.0], 0.5)
    X = np.array([[3.0, 0.0], [0.0, 0.0], [1.0, 0.1]])  # outside (strictly), inside, outside
    with pytest.raises(AssertionError, match=r"float32 NumPy inputs report other active rows .* rows \[0\]"):
        _float32(S, X)
    assert _float32(HalfSpace([1.0, -2.0], 0.5), X) == {"points": 3}


@pytest.mark.parametrize("c", [1e-7, 1e-3])
def test_tiny_sets_get_their_conservativity_checked(c):
    S = HalfSpace([1.0, -2.0], c)
    report = check_projector(S, examples=20, seed=0)
    assert report.passed, str(report)
    assert report["conservativity"].status == "passed" and report["conservativity"].counts["segments"] > 0
    # the defect: a set that never flags its row has the identity for its Jacobian: d y0 / d x0 = 1, not 0.8
    J = pp.hs_jacobian(S.as_polyhedron(), [True])
    np.testing.assert_allclose(J[0], [0.8, 0.4], atol=1e-12)
    bad = check_projector(NeverActive([1.0, -2.0], c), examples=20, seed=0)
    assert not bad.passed
    assert bad["conservativity"].status == "failed" and "path integral fails" in bad["conservativity"].message


@pytest.mark.parametrize("make", [lambda: pp.sets.Simplex(4, total=1e-7),
                                  lambda: pp.sets.Box(-1e-6 * np.ones(4), 1e-6 * np.ones(4))],
                         ids=["simplex-1e-7", "box-1e-6"])
def test_tiny_builtin_sets_pass_with_conservativity_checked(make):
    report = check_projector(make(), examples=12, seed=3)
    assert report.passed, str(report)
    assert report["conservativity"].status == "passed" and report["conservativity"].counts["segments"] > 0
