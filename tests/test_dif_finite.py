"""The finite-removal rule (``DIF(..., rule="finite")``): a binding row whose multiplier the removal uses
up is released, an inactive row the step reaches becomes active, and wherever no row changes status the
answer is the directional derivative's.

The truth is constrained retraining to a KKT residual of 1e-10; an inexact answer is never compared
with another at a tighter tolerance than its own.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from polyproj.adapters.dif import DIF, ConstrainedProblem, Constraint, KKTPoint, retrain, solve
from polyproj.adapters.dif.study import make_regression_study, pearson
from polyproj.errors import ProblemError

pytestmark = pytest.mark.usefixtures("one_torch_thread", "quiet_polyproj_warnings")


@pytest.fixture(scope="module")
def tiny():
    """The regression study with the group risk binding by a hair: λ̄_group ≈ 2.5e-3 (τ at 99.5 % of the
    way to the unconstrained risk), so that many single removals release it."""
    return make_regression_study(n=80, d=8, n_test=50, seed=0, tau_frac=0.995)


def _truth(study, removals):
    kk = [retrain(study.problem, r, warm_start=study.kkt, tol=1e-10) for r in removals]
    return np.array([(k.theta - study.kkt.theta).numpy() for k in kk]), kk


def test_rule_is_checked(study):
    with pytest.raises(ProblemError, match="rule must be one of"):
        DIF(study.problem, study.kkt, rule="exact")


@pytest.mark.parametrize("method", ["dense", "matrix-free"])
def test_equals_the_derivative_where_no_row_changes_status(study, method):
    """Equality, binding (large λ̄), weakly active and inactive rows: the regression study's single
    removals keep every status, so both rules give the same ω and μ."""
    d = DIF(study.problem, study.kkt, method=method, rtol=1e-13)
    f = DIF(study.problem, study.kkt, method=method, rule="finite", rtol=1e-13)
    lam = study.kkt.lambdas.numpy()
    for rem in study.removals[:12]:
        a, b = d.result(rem), f.result(rem)
        assert b.status.ok
        np.testing.assert_allclose(b.omega.numpy(), a.omega.numpy(), rtol=0, atol=1e-9 * float(a.omega.abs().max()))
        np.testing.assert_allclose(b.multipliers, a.multipliers, rtol=0, atol=1e-9 * (1 + np.abs(lam).max()))
        assert set(a.active) <= set(b.active) | {n for n, v in zip(study.kkt.names, lam + b.multipliers, strict=True)
                                                 if abs(v) < 1e-9}
        assert (lam + b.multipliers)[~study.problem.eq_mask].min() >= -1e-12


def test_matrix_free_equals_dense(tiny):
    dense = DIF(tiny.problem, tiny.kkt, method="dense", rule="finite")
    free = DIF(tiny.problem, tiny.kkt, method="matrix-free", rule="finite", rtol=1e-13)
    for rem in tiny.removals[:15]:
        a, b = dense.result(rem), free.result(rem)
        np.testing.assert_allclose(b.omega.numpy(), a.omega.numpy(), rtol=0, atol=1e-8 * float(a.omega.abs().max()))
        np.testing.assert_allclose(b.multipliers, a.multipliers, rtol=0, atol=1e-8)


def test_releases_a_binding_row_with_a_tiny_multiplier(tiny):
    """Where retraining leaves the group constraint (g < 0 after the removal), the derivative keeps it
    at equality with a multiplier λ̄ + μ < 0; the finite rule releases it and is closer to the truth."""
    prob, kkt = tiny.problem, tiny.kkt
    j = prob.names.index("group") - 1
    assert kkt.status[j] == "binding" and 1e-4 < float(kkt.lambdas[j]) < 1e-2
    rems = tiny.removals[:40]
    truth, kk = _truth(tiny, rems)
    released = np.array([float(k.residuals["feasibility"]) < 1e-8 and float(
        prob.remove(r).constraint_values(k.theta)[j]) < -1e-8 for r, k in zip(rems, kk, strict=True)])
    assert 5 <= released.sum() < len(rems)  # both kinds of removal occur
    der = DIF(prob, kkt, rule="derivative").delta_theta(rems).numpy()
    fin_res = [DIF(prob, kkt, rule="finite").result(r) for r in rems]
    fin = np.array([r.omega.numpy() for r in fin_res])
    err = lambda om: np.linalg.norm(om - truth, axis=1) / np.linalg.norm(truth, axis=1)  # noqa: E731
    e_der, e_fin = err(der), err(fin)
    # released: the derivative is wrong at first order, the finite rule is not (at the margin, where
    # retraining releases the row by a hair, the two coincide)
    assert np.all(e_fin[released] <= e_der[released] * (1 + 1e-6) + 1e-12), (e_fin[released], e_der[released])
    assert np.median(e_fin[released]) < 0.3 * np.median(e_der[released]), (e_fin[released], e_der[released])
    # kept: the two rules agree (the finite step equals the derivative)
    np.testing.assert_allclose(fin[~released & (e_der < 0.1)], der[~released & (e_der < 0.1)], rtol=0,
                               atol=1e-8 * np.abs(der).max())
    fin_released = np.array(["group" not in r.active for r in fin_res])
    for r, rel in zip(fin_res, fin_released, strict=True):
        new = float(kkt.lambdas[j]) + r.multipliers[j]
        assert new >= -1e-12 and r.constraint_change[j] <= 1e-12
        if rel:
            assert abs(new) <= 1e-12
    # the finite rule releases the row where retraining does, but at the margin
    assert (fin_released == released).sum() >= 0.9 * len(rems), (fin_released, released)
    F = tiny.test_loss
    actual = np.array([float(F(kkt.theta + torch.as_tensor(t)) - F(kkt.theta)) for t in truth])
    s_der = DIF(prob, kkt).influence(F, rems).numpy()
    s_fin = DIF(prob, kkt, rule="finite").influence(F, rems).numpy()
    assert pearson(s_fin, actual) > 0.97 and pearson(s_fin, actual) > pearson(s_der, actual) + 0.05


def test_an_inactive_row_the_step_reaches_becomes_active(study):
    """A cap 1e-3 above θ̄₆: removals that push θ₆ past it retrain onto it; the derivative ignores it."""
    base = study.problem
    cap = float(study.kkt.theta[6]) + 2e-3
    e6 = torch.zeros(base.dim, dtype=torch.float64)
    e6[6] = 1.0
    cons = [*base.constraints[:-1], Constraint(lambda th: e6 @ th, None, tau=cap, name="near")]
    prob = ConstrainedProblem(study.kkt.theta, base.objective, cons)
    kkt = solve(prob, theta0=study.kkt.theta, lambdas0=study.kkt.lambdas, tol=1e-11, warn=False)
    assert kkt.classification["near"] == "inactive"
    j = prob.names.index("near") - 1
    dif_d, dif_f = DIF(prob, kkt), DIF(prob, kkt, rule="finite")
    rems = study.removals[:40]
    om_d = dif_d.delta_theta(rems).numpy()
    reach = np.flatnonzero(kkt.theta[6].item() + om_d[:, 6] > cap + 1e-6)
    assert reach.size >= 2
    chosen = [rems[i] for i in reach[:6]]
    truth, kk = _truth(type(study)(prob, kkt, study.test_loss, chosen, study.group), chosen)
    for i, (rem, t) in enumerate(zip(chosen, truth, strict=True)):
        r = dif_f.result(rem)
        assert "near" in r.active and r.multipliers[j] > 0
        assert float(kkt.theta[6]) + float(r.omega[6]) == pytest.approx(cap, abs=1e-12)
        assert np.linalg.norm(r.omega.numpy() - t) < 0.5 * np.linalg.norm(om_d[reach[i]] - t)
        assert abs(float(kk[i].theta[6]) - cap) < 1e-9  # retraining sits on the cap too


@pytest.mark.parametrize("method", ["dense", "matrix-free"])
def test_scores_equal_the_removals_own_answers(tiny, method):
    dif = DIF(tiny.problem, tiny.kkt, method=method, rule="finite", rtol=1e-13, chunk_size=7)
    rems = [*tiny.removals[:20], {"objective": np.arange(20, 28)}]
    F = tiny.test_loss
    gF = torch.func.grad(F)(tiny.kkt.theta)
    want = (dif.delta_theta(rems) @ gF).numpy()
    np.testing.assert_allclose(dif.influence(F, rems).numpy(), want, rtol=0, atol=1e-9 * np.abs(want).max())
    if method == "dense":  # all single removals' ω in one batch of QPs
        om = dif.delta_theta([{"objective": [i]} for i in range(10)])
        np.testing.assert_allclose(dif.influence()[:10].numpy(), om.numpy(), rtol=0, atol=1e-12)
    with ThreadPoolExecutor(2) as ex:
        np.testing.assert_allclose(dif.influence(F, rems, executor=ex).numpy(), want, rtol=0,
                                   atol=1e-9 * np.abs(want).max())


def test_needs_no_multiplier_threshold(tiny):
    """Under the finite rule a row with a small multiplier is the same whether the KKT point calls it
    binding or weakly active: only λ̄ matters."""
    prob, kkt = tiny.problem, tiny.kkt
    loose = KKTPoint.from_params(prob, kkt.theta, kkt.lambdas, tol=1e-8, mult_tol=1e-1, warn=False)
    assert kkt.classification["group"] == "binding" and loose.classification["group"] == "weakly_active"
    a = DIF(prob, kkt, rule="finite").delta_theta(tiny.removals[:15])
    b = DIF(prob, loose, rule="finite").delta_theta(tiny.removals[:15])
    np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=0, atol=1e-10 * float(a.abs().max()))
    # the derivative rule, by contrast, depends on the threshold
    c = DIF(prob, kkt).delta_theta(tiny.removals[:15])
    dd = DIF(prob, loose).delta_theta(tiny.removals[:15])
    assert float((c - dd).abs().max()) > 1e-3 * float(c.abs().max())


@pytest.mark.parametrize("method", ["dense", "matrix-free"])
def test_second_order_on_the_finite_rule(tiny, method):
    prob, kkt = tiny.problem, tiny.kkt
    dif = DIF(prob, kkt, method=method, rule="finite", rtol=1e-13)
    rems = tiny.removals[:10]
    truth, _ = _truth(tiny, rems)
    o1 = dif.delta_theta(rems).numpy()
    o2 = dif.delta_theta(rems, order=2).numpy()
    e1 = np.linalg.norm(o1 - truth, axis=1)
    e2 = np.linalg.norm(o2 - truth, axis=1)
    assert np.median(e2) < 0.5 * np.median(e1), (e1, e2)
