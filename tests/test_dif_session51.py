"""DIF, session 51: from_params' multipliers for a binding row left slightly inside, order 2 at an approximately
stationary point, tracin_scores' chunk_size and weights, and flag arguments checked alike everywhere."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch

from polyproj.adapters.dif import DIF, ConstrainedProblem, Constraint, KKTPoint, Loss, retrain, solve
from polyproj.adapters.dif.baselines import if_scores, penalty_if, tracin_scores
from polyproj.adapters.dif.scores import ProjectedGradients
from polyproj.errors import PolyprojWarning, ProblemError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _logl(th, b):
    z = b[0] @ th
    return torch.nn.functional.softplus(z) - b[1] * z + 0.05 * (th ** 2).sum()


@pytest.fixture(scope="module")
def logistic():
    """A logistic model whose group-risk row binds (λ ≈ 0.2), and its exact KKT point."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(120, 5, generator=g, dtype=torch.float64)
    y = (X @ torch.randn(5, generator=g, dtype=torch.float64) + 0.5 * torch.randn(120, generator=g,
                                                                                dtype=torch.float64) > 0).double()
    free = solve(ConstrainedProblem(torch.zeros(5), Loss(_logl, (X, y))))
    r0 = float(_logl(free.theta, (X[:40], y[:40])).mean())
    P = ConstrainedProblem(torch.zeros(5), Loss(_logl, (X, y)),
                           [Constraint(_logl, (X[:40], y[:40]), tau=r0 - 0.005, name="grp")])
    k = solve(P)
    assert k.status == ("binding",) and float(k.lambdas[0]) > 0.1
    return P, k


def _grad_g(P, th):
    t = th.clone().requires_grad_(True)
    return torch.autograd.grad(P.constraint_values(t)[0], t)[0].detach()


def _inside(P, k, slack):
    """θ̄ moved along −∇g until g = −slack (to first order): a model trained to ~slack, the row slightly inside."""
    G = _grad_g(P, k.theta)
    return k.theta - slack * G / (G @ G)


REM = {"objective": [3], "grp": [3]}


# ----------------------------------------------------------------------------- 1. from_params without multipliers
def test_from_params_without_multipliers_keeps_a_binding_row_left_inside(logistic):
    """2e-5 inside (beyond active_tol = 1e-6): the NNLS over the rows within active_tol left stationarity at 1.4e-2
    and the point was refused "even with the best non-negative multipliers", though λ ≈ 0.2 gives 7e-5. The row's
    multiplier meets complementarity to tol (λ|g| = 4e-6), so it is a candidate: binding, as with λ given."""
    P, k = logistic
    th = _inside(P, k, 2e-5)
    g = float(P.constraint_values(th)[0])
    assert -3e-5 < g < -1e-5
    given = KKTPoint.from_params(P, th, k.lambdas, tol=1e-3)
    kp = KKTPoint.from_params(P, th, tol=1e-3)
    assert kp.classification == given.classification == {"grp": "binding"}
    assert kp.residual <= 1e-3 and kp.info["polished_multipliers"]
    # the multiplier minimising ‖∇f₀ + λ∇g‖₂ (one row: a 1-D least squares), independently
    t = th.clone().requires_grad_(True)
    gf = torch.autograd.grad(P.objective_value(t), t)[0].detach()
    G = _grad_g(P, th)
    lam_ref = max(0.0, -float(gf @ G) / float(G @ G))
    np.testing.assert_allclose(kp.lambdas.numpy(), [lam_ref], rtol=1e-8)
    np.testing.assert_allclose(kp.lambdas.numpy(), k.lambdas.numpy(), rtol=1e-2)
    # the DIF at that point is the exact point's (it was the classic IF, 105 % off, where the row was inactive)
    w_ex = DIF(P, k).delta_theta(REM)
    w = DIF(P, kp, damping="auto").delta_theta(REM)
    assert float((w - w_ex).norm() / w_ex.norm()) < 1e-2


def test_from_params_loose_tol_warns_when_it_calls_a_binding_row_inactive(logistic):
    """At tol = 0.1 the rows within active_tol meet tol with λ = 0 (stationarity 1.4e-2): accepted with the row
    inactive (the DIF then the classic IF along it), silently. It now warns, naming the row, and the active_tol
    the message suggests makes it binding."""
    P, k = logistic
    th = _inside(P, k, 2e-5)
    with pytest.warns(PolyprojWarning, match=r"'grp' \(g = -2e-05.*called inactive") as rec:
        kp = KKTPoint.from_params(P, th, tol=0.1)
    assert kp.classification == {"grp": "inactive"}
    msg = next(str(w.message) for w in rec if "called inactive" in str(w.message))
    suggested = float(re.search(r"active_tol=([0-9.e+-]+)", msg).group(1))
    assert suggested > 2e-5
    kb = KKTPoint.from_params(P, th, tol=0.1, active_tol=suggested)
    assert kb.classification == {"grp": "binding"}
    np.testing.assert_allclose(kb.lambdas.numpy(), k.lambdas.numpy(), rtol=1e-2)


def test_from_params_refusal_names_the_best_residual_and_the_ways_out(logistic):
    """A point off stationarity whatever the multipliers (moved across ∇g): the refusal names the best KKT
    residual found (here the 1-D least squares' stationarity) and mentions active_tol and the multipliers."""
    P, k = logistic
    G = _grad_g(P, k.theta)
    v = torch.randn(5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    v = v - (v @ G) / (G @ G) * G
    th = k.theta + 1e-2 * v / v.norm() - 2e-5 * G / (G @ G)
    with pytest.raises(ProblemError, match="not a KKT point") as err:
        KKTPoint.from_params(P, th, tol=1e-5)  # the row's λ|g| = 4e-6 meets complementarity: a candidate
    msg = str(err.value)
    assert "active_tol" in msg and "lambdas" in msg and "tol" in msg
    t = th.clone().requires_grad_(True)
    gf = torch.autograd.grad(P.objective_value(t), t)[0].detach()
    Gt = _grad_g(P, th)
    lam = max(0.0, -float(gf @ Gt) / float(Gt @ Gt))
    best = max(float((gf + lam * Gt).abs().max()), lam * abs(float(P.constraint_values(th)[0])))
    found = float(re.search(r"best non-negative multipliers found \(KKT residual ([0-9.e+-]+)\)", msg).group(1))
    np.testing.assert_allclose(found, best, rtol=1e-3)


def test_from_cooper_polishes_onto_a_binding_row_left_inside(logistic):
    """from_cooper goes through from_params: a Cooper multiplier still at 0 for a row the model left 2e-5 inside is
    polished to the binding one (it was refused)."""
    cooper = pytest.importorskip("cooper")
    P, k = logistic

    class CMP(cooper.ConstrainedMinimizationProblem):
        def __init__(self):
            super().__init__()
            mult = cooper.multipliers.DenseMultiplier(init=torch.zeros(1, dtype=torch.float64))
            self.grp = cooper.Constraint(cooper.ConstraintType.INEQUALITY, multiplier=mult)

        def compute_cmp_state(self):  # pragma: no cover - not trained here
            pass

    kc = KKTPoint.from_cooper(P, CMP(), _inside(P, k, 2e-5), tol=1e-3)
    assert kc.classification == {"grp": "binding"}
    np.testing.assert_allclose(kc.lambdas.numpy(), k.lambdas.numpy(), rtol=1e-2)
    with pytest.raises(ProblemError, match="polish must be True, False or None, got 1"):
        KKTPoint.from_cooper(P, CMP(), k.theta, refine=True, polish=1)


# ----------------------------------------------------------------------------- 2. order 2 at an approximate point
def _sum_constrained():
    rng = np.random.default_rng(3)
    X = torch.as_tensor(rng.normal(size=(100, 5)))
    y = X @ torch.as_tensor(rng.normal(size=5)) + 0.3 * torch.as_tensor(rng.normal(size=100))
    P = ConstrainedProblem(torch.zeros(5), Loss(lambda th, b: (b[0] @ th - b[1]) ** 2, (X, y)),
                           [Constraint(lambda th: th.sum(), None, tau=1.0, name="s", kind="eq")])
    v = torch.as_tensor(rng.normal(size=5))
    return P, solve(P), v - v.mean()


def test_order2_at_an_approximate_point_warns_and_the_empty_removal_is_its_offset():
    """At KKT residual 3e-3 order 2 adds θ̄'s own move to stationarity to every answer (the empty removal's
    ω₂ is 1.9e-3): it now warns; the difference from the empty removal's prediction is the exact point's
    order-2 answer (to the point's accuracy), and the exact point does not warn."""
    P, k, v = _sum_constrained()
    ka = KKTPoint.from_params(P, k.theta + 1e-3 * v, k.lambdas, tol=1e-2)
    assert ka.residual > 1e-3
    F = lambda th: th[0]  # noqa: E731
    rems = [{}, {"objective": [2]}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # at the exact point: no warning
        exact = DIF(P, k).influence(F, rems, order=2).numpy()
        w_exact = DIF(P, k).delta_theta(rems[1], order=2)
    assert exact[0] == 0.0 and abs(exact[1]) > 1e-3
    dif = DIF(P, ka)
    with pytest.warns(PolyprojWarning, match="every order-2 answer includes that move"):
        s = dif.influence(F, rems, order=2).numpy()
    with pytest.warns(PolyprojWarning, match="every order-2 answer includes that move"):
        w0 = dif.delta_theta({}, order=2)
    with pytest.warns(PolyprojWarning, match="every order-2 answer includes that move"):
        w = dif.result(rems[1], order=2).omega
    assert float(w0.norm()) > 1e-3
    np.testing.assert_allclose(s[0], float(w0[0]), rtol=1e-12)
    assert abs((s[1] - s[0]) - exact[1]) < 1e-2 * abs(exact[1])  # first order at ka: 0.8 % off, raw order 2: 12 %
    assert float((w - w0 - w_exact).norm()) < 1e-2 * float(w_exact.norm())


# ----------------------------------------------------------------------------- 3. tracin_scores' arguments
def _capped():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(40, 3, generator=g, dtype=torch.float64)
    y = X @ torch.tensor([1.0, 2.0, -1.0], dtype=torch.float64) + 0.3 * torch.randn(40, generator=g,
                                                                                   dtype=torch.float64)
    sq = lambda th, b: (b[0] @ th - b[1]) ** 2  # noqa: E731
    r0 = float(sq(solve(ConstrainedProblem(torch.zeros(3), Loss(sq, (X, y)))).theta, (X[:10], y[:10])).mean())
    P = ConstrainedProblem(torch.zeros(3), Loss(sq, (X, y)), [Constraint(sq, (X[:10], y[:10]), tau=0.97 * r0,
                                                                         name="grp")])
    return P, solve(P), X, y


def test_tracin_scores_checks_chunk_size_and_weights():
    """chunk_size=-1 returned zeros (np.empty never written), 0 a raw ValueError of range(), weights='a' a raw
    NumPy ValueError: now ProblemErrors naming the argument; chunk_size=1 gives the per-sample reference."""
    P, k, X, y = _capped()
    F = lambda th: th.sum()  # noqa: E731
    for bad in (-1, 0, 2.5, True):
        with pytest.raises(ProblemError, match=f"chunk_size must be a positive integer, got {bad!r}"):
            tracin_scores(P, [k], F, chunk_size=bad)
    with pytest.raises(ProblemError, match="weights: one finite learning rate per checkpoint"):
        tracin_scores(P, [k], F, weights="a")
    with pytest.raises(ProblemError, match="chunk_size must be a positive integer, got 0"):
        ProjectedGradients(P, k.theta, np.zeros((3, 1)), np.zeros(1), np.zeros((1, 1)), 0)
    # the reference: ∇F(θ)ᵀ∇ℓ₀(zᵢ)/N for {"objective": [i]} (∇F = 1), by hand
    ref = (2.0 * (X @ k.theta - y)[:, None] * X).sum(1).numpy() / 40
    np.testing.assert_allclose(tracin_scores(P, [k], F, chunk_size=1), ref, rtol=1e-10)
    np.testing.assert_allclose(tracin_scores(P, [k], F, weights=[0.5]), 0.5 * ref, rtol=1e-10)


# ----------------------------------------------------------------------------- 4. flag arguments
def test_flag_arguments_are_bools_everywhere():
    """renormalize='no' acted as True in penalty_if and if_scores, polish=1 neither forced nor autoed the polish,
    retrain(progress='no') and result(warn='no') were accepted; now each is a ProblemError as DIF(renormalize=...)
    and influence(progress=...) give, and a NumPy bool counts as its bool."""
    P, k, _, _ = _capped()
    g = {"objective": [5], "grp": [5]}
    F = lambda th: th.sum()  # noqa: E731
    with pytest.raises(ProblemError, match="renormalize must be True or False, got 'no'"):
        penalty_if(P, k, g, 10.0, renormalize="no")
    with pytest.raises(ProblemError, match="renormalize must be True or False, got 'no'"):
        if_scores(P, k, F, [g], kind="penalty", renormalize="no")
    assert torch.equal(penalty_if(P, k, g, 10.0, renormalize=np.bool_(False)),
                       penalty_if(P, k, g, 10.0, renormalize=False))
    assert not torch.equal(penalty_if(P, k, g, 10.0, renormalize=False), penalty_if(P, k, g, 10.0))
    with pytest.raises(ProblemError, match="polish must be True, False or None, got 1"):
        KKTPoint.from_params(P, k.theta, k.lambdas * 1.01, polish=1)
    with pytest.raises(ProblemError, match="polish=False .* pass lambdas"):
        KKTPoint.from_params(P, k.theta, polish=False)
    forced = KKTPoint.from_params(P, k.theta, k.lambdas * 1.01, polish=np.bool_(True))
    assert forced.info["polished_multipliers"]
    np.testing.assert_allclose(forced.lambdas.numpy(), k.lambdas.numpy(), rtol=1e-8)
    with pytest.raises(ProblemError, match="progress must be True, False or None, got 'no'"):
        retrain(P, [{"objective": [20]}], warm_start=k, progress="no")
    with pytest.raises(ProblemError, match="warn must be True or False, got 'no'"):
        DIF(P, k).result({"objective": [20]}, warn="no")
    with pytest.raises(ProblemError, match="warn must be True or False, got 0"):
        KKTPoint.from_params(P, k.theta, k.lambdas, warn=0)
