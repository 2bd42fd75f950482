"""DIF engine: defects found by review (rule='finite' ambiguity on every path, damping='auto' under an
iteration cap, MINRES on a Hessian indefinite on the binding rows' null space, badly scaled constraints on
the matrix-free path, singular H on the Schur-complement paths, a non-finite test function)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from polyproj.adapters.dif import DIF, ConstrainedProblem, Constraint, Loss, solve  # noqa: E402
from polyproj.adapters.dif.kkt import KKTPoint  # noqa: E402
from polyproj.adapters.dif.krylov import IndefiniteHessianError, KrylovNotConvergedError  # noqa: E402
from polyproj.errors import PolyprojError, ProblemError  # noqa: E402


def _data(seed=0, N=120):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(N, 4, dtype=torch.float64, generator=g)
    w = torch.tensor([1.5, -2.0, 0.5, 1.0], dtype=torch.float64)
    y = (torch.sigmoid(X @ w) > torch.rand(N, dtype=torch.float64, generator=g)).double()
    return X, y


def logloss(th, b):
    xb, yb = b
    z = xb @ th
    return torch.nn.functional.softplus(z) - yb * z


def test_finite_rule_refuses_a_split_dependent_removal_on_every_path():
    """Two identical group constraints (LICQ fails): under rule='finite' a removal from one of them depends on
    how λ̄ is split; delta_theta refused it, influence (dense, matrix-free, executor) returned split-dependent
    numbers (-0.00735 against -0.00564 for two valid splits)."""
    from concurrent.futures import ThreadPoolExecutor

    X, y = _data()
    cons = [Constraint(lambda th: th.sum(), None, tau=0.5, name="sum", kind="eq"),
            Constraint(logloss, (X[:40], y[:40]), tau=0.46, name="g1"),
            Constraint(logloss, (X[:40], y[:40]), tau=0.46, name="g2")]
    prob = ConstrainedProblem(torch.zeros(4, dtype=torch.float64), objective=Loss(logloss, (X, y)), constraints=cons)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kkt = solve(prob)
        lam = kkt.lambdas.clone()
        kkt = KKTPoint.from_params(prob, kkt.theta, torch.tensor([lam[0], 0.3 * (lam[1] + lam[2]),
                                                                  0.7 * (lam[1] + lam[2])]), polish=False)
    rem = {"g1": [5]}

    def F(th):
        return logloss(th, (X[:10], y[:10])).mean()

    for method in ("dense", "matrix-free"):
        dif = DIF(prob, kkt, method=method, rule="finite")
        with pytest.raises(ProblemError, match="split"):
            dif.delta_theta(rem)
        with pytest.raises(ProblemError, match="split"):
            dif.influence(F, [rem])
        with ThreadPoolExecutor(2) as ex, pytest.raises(ProblemError, match="split"):
            dif.influence(F, [rem], executor=ex)
        if method == "dense":
            with pytest.raises(ProblemError, match="split"):
                dif.influence(None, [rem])
        # a removal from the objective alone does not touch the dependent rows: defined, and the same on both paths
        ok = float(dif.influence(F, [{"objective": [3]}])[0])
        assert np.isfinite(ok)


def _sum_and_group(sc=1.0):
    """Logistic regression, an equality (Σθ = 0.5) and a binding group risk multiplied by ``sc`` (τ too)."""
    X, y = _data()
    cons = [Constraint(lambda th: th.sum(), None, tau=0.5, name="sum", kind="eq"),
            Constraint(lambda th, b: sc * logloss(th, b), (X[:40], y[:40]), tau=0.46 * sc, name="group")]
    return ConstrainedProblem(torch.zeros(4, dtype=torch.float64), objective=Loss(logloss, (X, y)), constraints=cons)


def test_auto_damping_does_not_hide_an_iteration_cap():
    """damping='auto' conditions an H that stalls CG at rounding; a solve that merely ran out of iterations on a
    well-conditioned H is raised (the cap had 'auto' add a damping of the order of λ_max and flip the scores)."""
    prob = _sum_and_group()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kkt = solve(prob)
    with pytest.raises(KrylovNotConvergedError, match="raise maxiter"):
        DIF(prob, kkt, method="matrix-free", damping="auto", maxiter=1)
    dif = DIF(prob, kkt, method="matrix-free", damping="auto")  # uncapped: the floor, no more
    assert dif.damping <= 1e-8
    ref = DIF(prob, kkt, method="dense").delta_theta({"objective": [3]})
    np.testing.assert_allclose(dif.delta_theta({"objective": [3]}).numpy(), ref.numpy(), rtol=1e-8, atol=1e-12)


def _saddle_problems():
    g = torch.Generator().manual_seed(0)
    A = torch.randn(30, 3, dtype=torch.float64, generator=g)

    def f(th, b):  # H = diag(2, -1, -1)
        return (th[0] - b[:, 0]) ** 2 - 0.5 * (th[1] - b[:, 1]) ** 2 - 0.5 * (th[2] - b[:, 2]) ** 2

    def f2(th, b):  # H = diag(2, -1, 2)
        return (th[0] - b[:, 0]) ** 2 - 0.5 * (th[1] - b[:, 1]) ** 2 + (th[2] - b[:, 2]) ** 2

    fix1 = [Constraint(lambda th: th[1], None, tau=0.3, name="fix", kind="eq")]
    saddle = ConstrainedProblem(torch.zeros(3, dtype=torch.float64), Loss(f, A),
                                [Constraint(lambda th: th[0], None, tau=5.0, name="cap")])
    one_left = ConstrainedProblem(torch.zeros(3, dtype=torch.float64), Loss(f, A), fix1)  # e2 still negative
    defined = ConstrainedProblem(torch.zeros(3, dtype=torch.float64), Loss(f2, A), fix1)  # PD on null(e1)
    th = A.mean(0).clone()
    th1 = th.clone()
    th1[1] = 0.3
    return [(saddle, th, False), (one_left, th1, False), (defined, th1, True)]


@pytest.mark.parametrize("case", [0, 1, 2])
def test_minres_refuses_a_hessian_indefinite_on_the_binding_rows_null_space(case):
    """MINRES solves with any non-singular H; where H is not positive definite on null(C_B) the DIF is not
    defined (dense and CG refuse) and MINRES returned a saddle's step. Now IndefiniteHessianError (damping='auto'
    damps past it); where H is indefinite but positive definite on null(C_B), MINRES equals the dense path."""
    prob, th, defined = _saddle_problems()[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kkt = KKTPoint.from_params(prob, th)
    rem = {"objective": [0, 4]}
    if not defined:
        with pytest.raises(PolyprojError):
            DIF(prob, kkt, method="dense").delta_theta(rem)
        with pytest.raises(IndefiniteHessianError, match="not positive definite on the null space"):
            DIF(prob, kkt, method="matrix-free", krylov="minres").delta_theta(rem)
        damped = DIF(prob, kkt, method="matrix-free", krylov="minres", damping="auto")
        assert damped.damping > 1.0  # past the curvature -1
        assert np.all(np.isfinite(damped.delta_theta(rem).numpy()))
        return
    ref = DIF(prob, kkt, method="dense").delta_theta(rem)
    got = DIF(prob, kkt, method="matrix-free", krylov="minres").delta_theta(rem)
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("sc", [1e-7, 1e-8, 1e6])
def test_matrix_free_is_invariant_to_a_constraints_scale(sc):
    """A constraint multiplied by sc (τ too) changes neither θ̄ nor ω. The matrix-free dual's pseudo-inverse cut
    the small row off (a false 'LICQ fails' at 1e-7, ω off by 8e-2 at 1e-8); it is now equilibrated."""
    rem = {"objective": [3], "group": [3]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = _sum_and_group()
        ref = DIF(base, solve(base), method="dense").delta_theta(rem)
        prob = _sum_and_group(sc)
        kkt = solve(prob)
    assert kkt.classification["group"] == "binding"
    got = DIF(prob, kkt, method="matrix-free").delta_theta(rem)
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-7, atol=1e-10)


def test_singular_hessian_on_the_schur_paths_is_a_clear_error():
    """Two identical features tied by an equality: H singular, the DIF QP defined (dense influence works); the
    paths that need H⁻¹ itself (executor, order=2) raised numpy's LinAlgError, now a ProblemError saying why."""
    from concurrent.futures import ThreadPoolExecutor

    g = torch.Generator().manual_seed(0)
    Z = torch.randn(50, 2, dtype=torch.float64, generator=g)
    X = torch.stack([Z[:, 0], Z[:, 0], Z[:, 1]], 1)
    y = Z[:, 0] * 2 - Z[:, 1] + 0.1 * torch.randn(50, dtype=torch.float64, generator=g)

    def sq(th, b):
        return (b[0] @ th - b[1]) ** 2

    prob = ConstrainedProblem(torch.zeros(3, dtype=torch.float64), objective=Loss(sq, (X, y)),
                              constraints=[Constraint(lambda th: th[0] - th[1], None, tau=0.0, name="tie",
                                                      kind="eq")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kkt = solve(prob)
    dif = DIF(prob, kkt, method="dense")
    rems = [{"objective": [i]} for i in range(3)]

    def F(th):
        return sq(th, (X[:5], y[:5])).mean()

    assert np.all(np.isfinite(dif.influence(F, rems).numpy()))
    with ThreadPoolExecutor(2) as ex, pytest.raises(ProblemError, match="H is singular"):
        dif.influence(F, rems, executor=ex)
    with pytest.raises(ProblemError, match="H is singular"):
        dif.delta_theta(rems[0], order=2)


@pytest.mark.parametrize("method", ["dense", "matrix-free"])
def test_a_test_function_that_is_not_finite_is_named(method):
    """A NaN in the test data: dense returned NaN scores (and top_k arbitrary indices), matrix-free ran CG to its
    cap and blamed the conditioning; now a ProblemError naming the test function's gradient."""
    prob = _sum_and_group()
    X, y = _data()
    Xt = X[:10].clone()
    Xt[2, 1] = float("nan")

    def F(th):
        return logloss(th, (Xt, y[:10])).mean()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dif = DIF(prob, solve(prob), method=method)
    with pytest.raises(ProblemError, match="test_fn at θ̄ is not finite"):
        dif.influence(F, [{"objective": [0]}])
    with pytest.raises(ProblemError, match="test_fn at θ̄ is not finite"):
        dif.top_k(F, 2)
    with pytest.raises(ProblemError, match="not finite"):
        dif._inv.solve(np.full(4, np.nan), "b")


@pytest.mark.parametrize("binding", [False, True])
def test_minres_second_order_check_above_the_dense_limit(binding):
    """d = 250 (> REDUCED_DENSE_DIM): the check runs by Lanczos on P H P, whose rank(C_B) exact zeros read as a
    singular H and refused a strictly convex problem with a binding row (a review found it); they are shifted
    away. H = I − 2·11ᵀ/d (one negative direction, along 1): refused without a row removing it, equal to the
    dense path with the binding equality Σθ = 0.5 (H = I on its null space)."""
    d = 250
    g = torch.Generator().manual_seed(1)
    A = torch.randn(20, d, dtype=torch.float64, generator=g)

    def f(th, b):
        r = th - b
        return 0.5 * ((r ** 2).sum(dim=1) - 2.0 * r.sum(dim=1) ** 2 / d)

    cons = [Constraint(lambda th: th.sum(), None, tau=0.5, name="sum", kind="eq")] if binding else \
        [Constraint(lambda th: th[1], None, tau=50.0, name="cap")]
    prob = ConstrainedProblem(torch.zeros(d, dtype=torch.float64), Loss(f, A), cons)
    th = A.mean(0).clone()
    if binding:
        th += (0.5 - th.sum()) / d  # the minimiser on Σθ = 0.5 (H = I there)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kkt = KKTPoint.from_params(prob, th)
    rem = {"objective": [0, 3]}
    if not binding:
        with pytest.raises(IndefiniteHessianError, match="not positive definite on the null space"):
            DIF(prob, kkt, method="matrix-free", krylov="minres").delta_theta(rem)
        return
    ref = DIF(prob, kkt, method="dense").delta_theta(rem)
    got = DIF(prob, kkt, method="matrix-free", krylov="minres").delta_theta(rem)
    # 1e-8 relative to ω (the matrix-free path's promise at rtol 1e-10), not entry by entry
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=0, atol=1e-8 * float(ref.abs().max()))
