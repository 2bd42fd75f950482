"""DIF engine, from a probe of its matrix-free path (2026-12-07): the Krylov solve's scale, NumPy views with negative
strides, and the error of an inconsistent removal under LICQ failure on every path."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from polyproj.adapters.dif import DIF, ConstrainedProblem, Constraint, KKTPoint, Loss, solve  # noqa: E402
from polyproj.errors import ProblemError  # noqa: E402


def sq(th, b):
    return (b[0] @ th - b[1]) ** 2


def _data(N=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(N, 3, dtype=torch.float64, generator=g)
    y = X @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) + 0.3 * torch.randn(N, dtype=torch.float64, generator=g)
    return X, y


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("scale", [1e-200, 1e-160, 1e160])
def test_matrix_free_scores_do_not_depend_on_the_test_functions_scale(scale):
    """H⁻¹ is linear: a test function 1e-200 F has scores 1e-200 those of F. ‖∇F‖ underflowed to 0 below ~1e-154
    (s_test returned 0 as converged: scores 2.5x off, silently), and a NaN residual above ~1e154."""
    X, y = _data()
    p = ConstrainedProblem(torch.zeros(3), Loss(sq, (X, y)), [Constraint(lambda th: th[0], None, tau=0.5, name="cap")])
    k = solve(p)

    def F(th):
        return sq(th, (X[:5], y[:5])).mean()

    ref = DIF(p, k, method="dense").influence(F)
    got = DIF(p, k, method="matrix-free").influence(lambda th: scale * F(th)) / scale
    assert float((got - ref).norm() / ref.norm()) < 1e-9


def test_numpy_views_with_negative_strides_are_accepted():
    """Reversed views as data, params or weights raised torch's raw ValueError (or a misleading 'weights must be a
    1-D array'); they are the same problem as their contiguous copies."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 3))
    y = X @ np.array([1.0, 2.0, 3.0])
    w = np.linspace(1, 2, 30)
    a = ConstrainedProblem(np.arange(3.0)[::-1], Loss(sq, (X[::-1], y[::-1]), weights=w[::-1]),
                           Constraint(sq, (X[:, ::-1], y), tau=1e3, name="c"))
    b = ConstrainedProblem(np.arange(3.0)[::-1].copy(), Loss(sq, (X[::-1].copy(), y[::-1].copy()),
                                                            weights=w[::-1].copy()),
                           Constraint(sq, (X[:, ::-1].copy(), y), tau=1e3, name="c"))
    th = torch.tensor([0.3, -0.2, 0.1], dtype=torch.float64)
    assert float(a.objective_value(th)) == float(b.objective_value(th))
    assert torch.equal(a.theta0, b.theta0)
    assert torch.equal(a.theta0, torch.tensor([2.0, 1.0, 0.0], dtype=torch.float64))


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("method", ["dense", "matrix-free"])
def test_an_inconsistent_removal_under_licq_failure_is_a_problem_error_on_every_path(method):
    """A binding row and a weakly active copy of it (LICQ fails); removing a sample asks them to move apart. Dense
    delta_theta said so (ProblemError); the matrix-free path and influence on both paths raised a SolverError
    ('DUAL_INFEASIBLE ... add bounds or make P positive definite'): the multipliers' QP is unbounded exactly when
    the removal's QP has no point."""
    X, y = _data(80)
    p0 = ConstrainedProblem(torch.zeros(3), Loss(sq, (X, y)))
    tau = 0.97 * float(sq(solve(p0).theta, (X[:30], y[:30])).mean())
    grp = Constraint(sq, (X[:30], y[:30]), tau=tau, name="grp")
    k1 = solve(ConstrainedProblem(torch.zeros(3), Loss(sq, (X, y)), [grp]))
    copy = Constraint(sq, (X[:30], y[:30]), tau=tau, name="copy")
    p = ConstrainedProblem(torch.zeros(3), Loss(sq, (X, y)), [grp, copy])
    k = KKTPoint.from_params(p, k1.theta, [float(k1.lambdas[0]), 0.0], tol=1e-9, warn=False)
    i = int(sq(k.theta, (X[:30], y[:30])).argmax())
    with pytest.raises(ProblemError, match="not defined for this removal"):
        DIF(p, k, method=method).delta_theta({"grp": [i]})
    with pytest.raises(ProblemError, match="not defined for this removal"):
        DIF(p, k, method=method).influence(lambda th: th.sum(), [{"grp": [i]}])
