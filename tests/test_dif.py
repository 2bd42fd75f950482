"""DIF engine: agreement with classic IF, finite differences of re-solved problems, feasibility to
first order, subset removals with weakly active constraints, removal semantics, backends."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from polyproj.adapters.dif import (
    DIF,
    ConstrainedProblem,
    Constraint,
    Loss,
    classic_if,
    penalty_if,
    retrain,
    solve,
)
from polyproj.adapters.dif.study import pearson
from polyproj.errors import ProblemError

pytestmark = pytest.mark.usefixtures("one_torch_thread", "quiet_polyproj_warnings")


def _sq(th, b):
    return (b[0] @ th - b[1]) ** 2


def _fd(problem, kkt, removal, t=1e-6, renormalize=True):
    """(θ(t) − θ̄)/t for the PCL problem re-solved to 1e-12."""
    k = solve(problem.perturbed(removal, t, renormalize=renormalize), theta0=kkt.theta, lambdas0=kkt.lambdas,
              tol=1e-12, warn=False)
    return (k.theta - kkt.theta).numpy() / t


def _ls_problem(seed: int, n: int = 30, d: int = 4, cons=()):
    rng = np.random.default_rng(seed)
    X = torch.as_tensor(rng.normal(size=(n, d)))
    y = torch.as_tensor(rng.normal(size=n))
    return ConstrainedProblem(torch.zeros(d), Loss(_sq, (X, y)), list(cons))


# ----------------------------------------------------------------------------- classic IF limit
@settings(max_examples=8)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 4))
def test_no_active_constraint_equals_classic_if(seed, k):
    rng = np.random.default_rng(seed)
    loose = Constraint(lambda th: th.sum(), None, tau=1e3, name="loose")
    gdata = (torch.as_tensor(rng.normal(size=(10, 4))), torch.as_tensor(rng.normal(size=10)))
    group = Constraint(_sq, gdata, tau=1e3, name="group")
    prob = _ls_problem(seed, cons=[loose, group])
    kkt = solve(prob)
    assert kkt.status == ("inactive", "inactive")
    idx = rng.choice(30, size=k, replace=False)
    removal = {"objective": idx, "group": [0]}
    dif = DIF(prob, kkt).delta_theta(removal)
    ref = classic_if(prob, kkt, removal)
    # independent reference: -H^{-1} c with H = 2 XᵀX / N
    X, y = prob.objective.data
    H = 2 * X.T @ X / 30
    c = -(2 * (X[idx] @ kkt.theta - y[idx])[:, None] * X[idx]).sum(0) / 30
    np.testing.assert_allclose(dif.numpy(), ref.numpy(), atol=1e-10, rtol=0)
    np.testing.assert_allclose(dif.numpy(), -np.linalg.solve(H.numpy(), c.numpy()), atol=1e-10, rtol=0)


def test_no_constraints_influence_matches_delta_theta():
    prob = _ls_problem(1)
    kkt = solve(prob)
    dif = DIF(prob, kkt)
    Xt = torch.randn(7, 4, dtype=torch.float64)

    def test_fn(th):
        return (Xt @ th).pow(2).mean()

    scores = dif.influence(test_fn)
    grad = torch.func.grad(test_fn)(kkt.theta)
    om = dif.delta_theta([{"objective": [i]} for i in range(30)])
    np.testing.assert_allclose(scores.numpy(), (om @ grad).numpy(), atol=1e-12)
    np.testing.assert_allclose(om.numpy(), classic_if(prob, kkt, [{"objective": [i]} for i in range(30)]).numpy(),
                               atol=1e-10)


# ----------------------------------------------------------------------------- finite differences
def test_study_has_every_regime(study):
    assert study.kkt.classification == {"sum3": "equality", "cap3": "binding", "group": "binding",
                                        "weak5": "weakly_active", "weak7": "weakly_active", "loose": "inactive"}
    assert study.kkt.residual < 1e-10


def test_matches_finite_differences_all_regimes(study):
    """Binding, weakly active (both sides) and inactive: DIF = (θ(ε) − θ̄)/ε of the re-solved problem."""
    dif = DIF(study.problem, study.kkt)
    seen_weak_on, seen_weak_off, seen_group = False, False, False
    for removal in study.removals[:12]:
        res = dif.result(removal)
        fd = _fd(study.problem, study.kkt, removal)
        scale = np.max(np.abs(fd))
        np.testing.assert_allclose(res.omega.numpy(), fd, atol=1e-4 * scale)
        seen_weak_on |= "weak5" in res.active
        seen_weak_off |= "weak5" not in res.active
        seen_group |= "group" in removal
        # inactive constraint stays inactive; binding stay binding; weak ones kept feasible
        assert res.constraint_change[study.problem.names.index("weak5") - 1] <= 1e-12
    assert seen_weak_on and seen_weak_off and seen_group


def test_first_order_feasibility_vs_classic_if(study):
    """θ̄ + ω keeps the binding constraints to first order (exactly when linear); classic IF does not."""
    prob, kkt = study.problem, study.kkt
    dif = DIF(prob, kkt)
    for removal in study.removals[:10]:
        om = dif.delta_theta(removal)
        om_if = classic_if(prob, kkt, removal)
        new = prob.remove(removal)
        g_dif = new.constraint_values(kkt.theta + om).numpy()
        g_if = new.constraint_values(kkt.theta + om_if).numpy()
        # linear binding constraints (sum3 equality, cap3 inequality): exactly, up to rounding
        assert np.max(np.abs(g_dif[:2])) < 1e-12
        assert np.max(np.abs(g_if[:2])) > 1e-4
        # nonlinear binding constraint (group risk): O(|ω|²); weakly active ones stay feasible
        assert abs(g_dif[2]) <= 10 * float(om.norm()) ** 2
        assert np.all(g_dif[3:] <= 1e-12)
    # along the PCL path ε = tΔε: the violation of DIF is O(t²), that of classic IF is Θ(t)
    removal = next(r for r in study.removals if "group" in r)
    om, om_if = dif.delta_theta(removal), classic_if(prob, kkt, removal)
    v_dif, v_if = [], []
    for t in (1e-2, 1e-3):
        g = prob.perturbed(removal, t).constraint_values
        v_dif.append(float(np.max(np.abs(g(kkt.theta + t * om).numpy()[:3]))))
        v_if.append(float(np.max(np.abs(g(kkt.theta + t * om_if).numpy()[:3]))))
    assert v_dif[1] < 2e-2 * v_dif[0] + 1e-14  # quadratic decay
    assert v_if[1] > 5e-2 * v_if[0]  # linear decay
    assert v_dif[1] < 1e-3 * v_if[1]


def test_subset_with_weak_constraint_is_not_sum_of_singles(study):
    prob, kkt = study.problem, study.kkt
    dif = DIF(prob, kkt)
    single = [dif.result({"objective": [i]}) for i in range(40)]
    on = [i for i, r in enumerate(single) if "weak5" in r.active]
    off = [i for i, r in enumerate(single) if "weak5" not in r.active
           and r.constraint_change[3] < -1e-6]
    assert on and off
    ch5 = np.array([r.constraint_change[3] for r in single])
    # a pair whose first-order pushes on weak5 have opposite signs, so the clip matters
    i, j = on[0], off[int(np.argmin(ch5[off]))]
    removal = {"objective": [i, j]}
    joint = dif.delta_theta(removal).numpy()
    summed = (single[i].omega + single[j].omega).numpy()
    fd = _fd(prob, kkt, removal)
    scale = np.max(np.abs(fd))
    np.testing.assert_allclose(joint, fd, atol=1e-4 * scale)
    assert np.max(np.abs(summed - fd)) > 1e-2 * scale


def test_renormalised_semantics_match_retraining_plain_does_not(study):
    prob, kkt = study.problem, study.kkt
    removal = next(r for r in study.removals if "group" in r)
    default = DIF(prob, kkt).delta_theta(removal).numpy()
    plain = DIF(prob, kkt, renormalize=False).delta_theta(removal).numpy()
    fd = _fd(prob, kkt, removal)  # retraining semantics: means over what remains
    scale = np.max(np.abs(fd))
    np.testing.assert_allclose(default, fd, atol=1e-4 * scale)
    assert np.max(np.abs(plain - fd)) > 0.05 * scale
    # the plain form is the derivative of the τ-shifted problem
    np.testing.assert_allclose(plain, _fd(prob, kkt, removal, renormalize=False), atol=1e-4 * scale)
    # and the actual retrained change agrees with the default to second order, not with the plain one
    actual = (retrain(prob, removal, warm_start=kkt).theta - kkt.theta).numpy()
    assert np.max(np.abs(actual - default)) < 0.5 * np.max(np.abs(actual - plain))


def test_study_correlation_small(study):
    """All-point DIF scores correlate with leave-one-out retraining better than the baselines."""
    prob, kkt = study.problem, study.kkt
    R = study.removals[:30]
    om = DIF(prob, kkt).influence(None, R).numpy()
    loo = retrain(prob, R, warm_start=kkt)
    act = np.array([(k.theta - kkt.theta).numpy() for k in loo])
    assert all(k.residual <= 1e-10 for k in loo)
    r_dif = pearson(om, act)
    r_if = pearson(classic_if(prob, kkt, R).numpy(), act)
    r_pen = max(pearson(penalty_if(prob, kkt, R, rho).numpy(), act) for rho in (1.0, 100.0))
    assert r_dif > 0.98
    assert r_dif > r_if and r_dif > r_pen
    tg = torch.func.grad(study.test_loss)(kkt.theta).numpy()
    np.testing.assert_allclose(DIF(prob, kkt).influence(study.test_loss, R).numpy(), om @ tg, atol=1e-12)


# ----------------------------------------------------------------------------- backends, module params
def test_backends_agree(study, backend):
    removal = study.removals[1]
    ref = DIF(study.problem, study.kkt).delta_theta(removal).numpy()
    got = DIF(study.problem, study.kkt, backend=backend).delta_theta(removal).numpy()
    np.testing.assert_allclose(got, ref, atol=1e-10 * max(1.0, np.max(np.abs(ref))))


def test_module_params_match_finite_differences():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    X = torch.as_tensor(rng.normal(size=(40, 3)))
    y = torch.as_tensor(rng.normal(size=40) + 2.0)
    model = torch.nn.Linear(3, 1)

    def loss(m, b):
        return (m(b[0]).squeeze(-1) - b[1]) ** 2

    def bias_cap(m):
        return m.bias.sum()

    prob = ConstrainedProblem(model, Loss(loss, (X, y)), [Constraint(bias_cap, None, tau=1.0, name="bias")])
    kkt = solve(prob)
    assert prob.dim == 4 and kkt.classification == {"bias": "binding"}
    removal = {"objective": [0, 5]}
    om = DIF(prob, kkt).delta_theta(removal).numpy()
    fd = _fd(prob, kkt, removal)
    np.testing.assert_allclose(om, fd, atol=1e-4 * np.max(np.abs(fd)))
    assert abs(om[-1]) < 1e-12  # the bias stays on its cap


def test_penalty_if_without_active_constraints_is_classic():
    prob = _ls_problem(2, cons=[Constraint(lambda th: th[0], None, tau=1e3, name="loose")])
    kkt = solve(prob)
    R = [{"objective": [i]} for i in range(5)]
    for pen in ("quadratic", "hinge"):
        np.testing.assert_allclose(penalty_if(prob, kkt, R, 10.0, penalty=pen).numpy(),
                                   classic_if(prob, kkt, R).numpy(), atol=1e-12)


def test_dense_all_point_scores_in_bounded_batches(study, monkeypatch):
    """The dense path's all-point scores go to the backend in chunks of dense_batch_size(d) QPs (a backend's
    batch holds a d × d matrix or more per element: d = 1,921 and N = 200 in one batch ran out of 24 GB); the
    chunked scores equal the one-batch ones (each QP is polished exactly either way)."""
    import polyproj.adapters.dif.engine as engine

    dif = DIF(study.problem, study.kkt, method="dense")
    whole = dif.influence(study.test_loss).numpy()
    assert engine.dense_batch_size(study.problem.dim) >= len(whole)  # one batch at this size
    assert engine.dense_batch_size(1921) == 2 and engine.dense_batch_size(10**5) == 1
    monkeypatch.setattr(engine, "DENSE_BATCH_BYTES", 64 * study.problem.dim ** 2 * 7)  # 7 QPs a batch
    assert engine.dense_batch_size(study.problem.dim) == 7
    np.testing.assert_allclose(dif.influence(study.test_loss).numpy(), whole, rtol=1e-9, atol=1e-12)


# ----------------------------------------------------------------------------- weighted losses
def _weighted_binding(renormalize: bool):
    """Least squares with a binding weighted group risk (weights 2, or random), either normaliser."""
    rng = np.random.default_rng(7)
    X = torch.as_tensor(rng.normal(size=(40, 3)))
    y = torch.as_tensor(rng.normal(size=40))
    w0 = torch.as_tensor(rng.uniform(0.5, 1.5, size=40))
    wg = torch.full((15,), 2.0, dtype=torch.float64)
    free = solve(ConstrainedProblem(torch.zeros(3), Loss(_sq, (X, y), weights=w0, renormalize=renormalize)))
    base = float(ConstrainedProblem(torch.zeros(3), Loss(_sq, (X[:15], y[:15]), weights=wg,
                                                         renormalize=renormalize)).objective_value(free.theta))
    cons = [Constraint(_sq, (X[:15], y[:15]), tau=0.95 * base, name="grp", weights=wg, renormalize=renormalize)]
    prob = ConstrainedProblem(torch.zeros(3), Loss(_sq, (X, y), weights=w0, renormalize=renormalize), cons)
    return prob, solve(prob, tol=1e-12)


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("removal", [{"objective": [4]}, {"grp": [3]}, {"objective": [3], "grp": [3]}])
def test_weighted_losses_match_finite_differences_with_either_normaliser(renormalize, removal):
    """Each loss is Σwℓ / W with W = Σw, or W = N under ``renormalize=False``. Removing samples lowers W by their
    weights, or by their count: the renormalisation term used Σ_Z w / W for both, so with weights 2 on a
    ``renormalize=False`` group risk the DIF was 2× off (and ``perturbed`` turned such a loss into one with W = Σw,
    another problem at t = 0)."""
    prob, kkt = _weighted_binding(renormalize)
    assert kkt.classification == {"grp": "binding"}
    for t in (0.0, 0.3):  # perturbed: this problem at t = 0, the loss's own normaliser in between
        moved = prob.perturbed(removal, t)
        for name in removal:
            loss, new = prob.loss(name), moved.loss(name)
            keep = np.ones(loss.n_samples)
            keep[removal[name]] = 1.0 - t
            w = loss.weights.numpy() * keep
            norm = w.sum() if renormalize else loss.n_samples - t * len(removal[name])
            vals = prob.per_sample(loss, kkt.theta).detach().numpy()
            assert float(moved.mean(new, kkt.theta)) == pytest.approx(float(w @ vals / norm), rel=1e-13)
    fd = _fd(prob, kkt, removal, t=1e-6)
    for method in ("dense", "matrix-free"):
        omega = DIF(prob, kkt, method=method, rtol=1e-13).delta_theta(removal).numpy()
        assert np.linalg.norm(omega - fd) <= 1e-5 * np.linalg.norm(fd), (method, omega, fd)


def test_removing_every_sample_of_nonzero_weight_is_refused():
    """A renormalised weighted mean over samples whose weights sum to 0 is undefined: refused as a removal (DIF
    returned ω ≈ 0 while retrain raised)."""
    prob, _ = _weighted_binding(True)
    # weights whose sum less the removed ones' is not 0.0 in floating point (8.9e-16): the test reads the kept ones
    w = torch.tensor([0.75, 0, 0, 0, 0.51, 0.26, 0.51, 0, 0, 0.84, 0, 0.33, 0, 0.12, 0.9], dtype=torch.float64)
    nonzero = [0, 4, 5, 6, 9, 11, 13, 14]
    assert float(w.sum() - w[nonzero].sum()) != 0.0
    cons = [Constraint(_sq, prob.constraints[0].data, tau=10 * prob.constraints[0].tau, name="grp", weights=w)]
    prob = ConstrainedProblem(torch.zeros(3), prob.objective, cons)
    dif = DIF(prob, solve(prob, tol=1e-12))
    with pytest.raises(ProblemError, match="every sample of nonzero weight"):
        dif.delta_theta({"grp": nonzero})
    assert dif.delta_theta({"grp": nonzero[1:]}).shape == (3,)  # one weighted sample left: defined
