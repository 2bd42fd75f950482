"""Second-order DIF (``order=2``): one chord-Newton correction on the removed problem's exact KKT residual.

Compared with constrained retraining to a KKT residual of 1e-10 (the truth), never with another
inexact answer: the first-order error is O(ε²) and the corrected one O(ε³) in the removal's size ε.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("torch")

import torch

from polyproj.adapters.dif import DIF, retrain
from polyproj.errors import PolyprojWarning, ProblemError

pytestmark = [pytest.mark.filterwarnings("ignore::polyproj.errors.PolyprojWarning"),
              pytest.mark.usefixtures("one_torch_thread", "quiet_polyproj_warnings")]


def _group(study, idx):
    pos = {int(i): k for k, i in enumerate(study.group)}
    rem = {"objective": np.sort(np.asarray(idx))}
    gi = sorted(pos[int(i)] for i in idx if int(i) in pos)
    if gi:
        rem["group"] = gi
    return rem


def _errors(dif, prob, kkt, removals):
    e1, e2 = [], []
    for rem in removals:
        truth = (retrain(prob, rem, warm_start=kkt, tol=1e-10).theta - kkt.theta).numpy()
        scale = float(np.linalg.norm(truth))
        e1.append(np.linalg.norm(dif.delta_theta(rem).numpy() - truth) / scale)
        e2.append(np.linalg.norm(dif.delta_theta(rem, order=2).numpy() - truth) / scale)
    return np.array(e1), np.array(e2)


@pytest.mark.parametrize("method", ["dense", "matrix-free"])
def test_second_order_is_closer_to_retraining(study, method):
    """Singles and groups of 4 and 8 in every regime (equality, binding, weakly active, inactive)."""
    prob, kkt = study.problem, study.kkt
    dif = DIF(prob, kkt, method=method, rtol=1e-13)
    rng = np.random.default_rng(1)
    # O(ε³) against O(ε²) while the removal keeps the active set; a group of 8 of the 80 points
    # (10 %) moves weakly active rows, where the second step is a chord step across a kink
    for size, ratio in ((1, 0.25), (4, 0.25), (8, 0.5)):
        rems = [_group(study, rng.choice(prob.objective.n_samples, size, replace=False)) for _ in range(5)]
        e1, e2 = _errors(dif, prob, kkt, rems)
        assert np.median(e2) < ratio * np.median(e1), (size, e1, e2)
        assert np.all(e2 < e1), (size, e1, e2)


def test_matrix_free_second_order_equals_dense(study):
    prob, kkt = study.problem, study.kkt
    dense, free = DIF(prob, kkt, method="dense"), DIF(prob, kkt, method="matrix-free", rtol=1e-13)
    rng = np.random.default_rng(2)
    for size in (1, 6):
        rem = _group(study, rng.choice(prob.objective.n_samples, size, replace=False))
        a, b = dense.result(rem, order=2), free.result(rem, order=2)
        assert a.order == b.order == 2
        np.testing.assert_allclose(b.omega.numpy(), a.omega.numpy(), rtol=0, atol=1e-8 * float(a.omega.abs().max()))
        np.testing.assert_allclose(b.multipliers, a.multipliers, rtol=0, atol=1e-8 * (1 + np.abs(a.multipliers).max()))
        lam = {n: v for n, v in zip(kkt.names, kkt.lambdas.numpy() + a.multipliers, strict=True)}
        for name in set(a.active) ^ set(b.active):  # only rows whose new multiplier is zero may differ
            assert abs(lam[name]) <= 1e-8 * (1 + max(abs(v) for v in lam.values())), (name, a.active, b.active)


def test_second_order_scores_are_the_test_function_at_the_prediction(study):
    prob, kkt, F = study.problem, study.kkt, study.test_loss
    dif = DIF(prob, kkt, method="matrix-free", rtol=1e-12)
    rems = [*study.removals[:6], _group(study, np.arange(10, 22))]
    s2 = dif.influence(F, rems, order=2).numpy()
    om = dif.delta_theta(rems, order=2)
    want = np.array([float(F(kkt.theta + w) - F(kkt.theta)) for w in om])
    np.testing.assert_allclose(s2, want, rtol=1e-12, atol=1e-15)
    truth = np.array([float(F(retrain(prob, r, warm_start=kkt).theta) - F(kkt.theta)) for r in rems])
    s1 = dif.influence(F, rems).numpy()
    assert np.abs(s2 - truth).sum() < 0.25 * np.abs(s1 - truth).sum()


def test_second_order_on_mlp(mlp):
    """A non-convex net (60 samples: one removal is far from infinitesimal) with a binding group risk
    and a weakly active cap that some removals switch on: the correction helps most removals."""
    prob, kkt, removals, _ = mlp
    dif = DIF(prob, kkt, method="matrix-free", rtol=1e-12)
    e1, e2 = _errors(dif, prob, kkt, removals[:12])
    assert np.median(e2) < 0.75 * np.median(e1), (e1, e2)
    assert np.sum(e2 < e1) >= 9, (e1, e2)


def test_order_is_checked(study):
    dif = DIF(study.problem, study.kkt, method="dense")
    for bad in (0, 3, 1.5, True, "2"):
        with pytest.raises(ProblemError, match="order must be 1"):
            dif.result(study.removals[0], order=bad)
    with pytest.raises(ProblemError, match="in process"), ThreadPoolExecutor(1) as ex:
        dif.influence(study.test_loss, study.removals[:2], order=2, executor=ex)
    assert dif.influence(study.test_loss, [], order=2).shape == (0,)


def test_full_correction_beyond_ratio_one(study):
    """Removing half the data of the convex regression study: the correction is larger than the step
    (‖δ‖/‖ω₁‖ > 1) yet the full step lowers the removed problem's KKT residual, so it is taken, and it
    cuts the error against retraining by more than half."""
    prob, kkt = study.problem, study.kkt
    dif = DIF(prob, kkt, method="dense")
    for k in (40, 60):
        rem = {"objective": np.arange(k)}
        first, second = dif.result(rem), dif.result(rem, order=2)
        assert second.correction_ratio > 1.0 and second.step_length == 1.0 and second.order == 2
        assert dif.second_order_log[-1] == (second.correction_ratio, 1.0)
        truth = (retrain(prob, rem, warm_start=kkt, tol=1e-10).theta - kkt.theta).numpy()
        e1, e2 = (np.linalg.norm(r.omega.numpy() - truth) for r in (first, second))
        assert e2 < 0.5 * e1, (k, e1, e2)


def _removed_residual(prob, rem, kkt, omega, dlam):
    from polyproj.adapters.dif.newton import first_order, kkt_residuals

    removed = prob.remove(rem)
    _, gf, g, G = first_order(removed, kkt.theta + torch.as_tensor(omega))
    return max(kkt_residuals(gf, G, g, kkt.lambdas.numpy() + dlam, prob.eq_mask).values())


def _mlp_groups(removals):
    """Groups of 1 to 30 of the tanh MLP's 60 points (three of each size), as removals."""
    rng = np.random.default_rng(0)
    out = []
    for size in (1, 3, 6, 10, 15, 20, 30):
        for _ in range(3):
            idx = sorted(int(i) for i in rng.choice(60, size, replace=False))
            rem = {"objective": idx}
            grp = sorted(removals[i]["group"][0] for i in idx if "group" in removals[i])
            if grp:
                rem["group"] = grp
            out.append(rem)
    return out


def test_step_length_lowers_the_removed_kkt_residual(mlp):
    """Groups of the tanh MLP up to half its points: the step taken is the largest of 1, ½, … that lowers the
    removed problem's KKT residual below that of the first-order point; where none does, the first-order
    answer is returned (order 1)."""
    prob, kkt, removals, _ = mlp
    dif = DIF(prob, kkt, method="dense")
    seen = set()
    for rem in _mlp_groups(removals):
        first, second = dif.result(rem), dif.result(rem, order=2, warn=False)
        t = second.step_length
        r1 = _removed_residual(prob, rem, kkt, first.omega.numpy(), first.multipliers)
        if t == 0.0:
            seen.add("not applied")
            assert second.order == 1
            np.testing.assert_array_equal(second.omega.numpy(), first.omega.numpy())
            continue
        assert second.order == 2 and t in (1.0, 0.5, 0.25, 0.125, 0.0625)
        r2 = _removed_residual(prob, rem, kkt, second.omega.numpy(), second.multipliers)
        assert r2 < r1, (rem, t, r1, r2)
        if t < 1.0:  # the longer step (2t) did not lower the residual
            seen.add("shortened")
            w2 = first.omega.numpy() + 2 * (second.omega.numpy() - first.omega.numpy())
            mu2 = first.multipliers + 2 * (second.multipliers - first.multipliers)
            assert not _removed_residual(prob, rem, kkt, w2, mu2) < r1
        else:
            seen.add("full")
    assert seen == {"full", "shortened", "not applied"}, seen


def test_not_applied_correction_is_said(mlp):
    prob, kkt, removals, _ = mlp
    dif = DIF(prob, kkt, method="dense")
    rem = next(r for r in _mlp_groups(removals) if dif.result(r, order=2, warn=False).step_length == 0.0)
    F = lambda m: m(torch.zeros(1, 3, dtype=torch.float64)).sum()  # noqa: E731
    with pytest.warns(PolyprojWarning, match="1 of 2 removals: the second-order correction lowers"):
        s = dif.influence(F, [rem, removals[0]], order=2).numpy()
    np.testing.assert_allclose(s[0], float(dif.influence(F, [rem])[0]), rtol=1e-12)
    with pytest.warns(PolyprojWarning, match="at no step length down to 1/16"):
        dif.result(rem, order=2)


@pytest.mark.parametrize("method", ["dense", "matrix-free"])
@pytest.mark.parametrize(("kind", "truth", "active"), [("linear", [0.75, 0.0], ("cap",)),
                                                        ("curved", [1.0, 0.0], ())])
def test_second_order_holds_a_constraint_its_step_would_cross(method, kind, truth, active):
    """Mean of ½‖θ − zᵢ‖² (H = I); removing half the samples (mean −1 in θ₀) moves θ₀ from θ̄ = 0 to 0.5 to
    first order and to 1.0 unconstrained. Linear: θ₀ <= 0.75, inactive at θ̄ and at 0.5; retraining stops at
    0.75. The correction's QP held only the active and the violated rows, and its full step went to 1.0,
    0.25 past the constraint (it lowered the removed problem's residual: accepted); with the inequalities
    the step crosses in the QP it is the exact solution. Curved: θ₀ − 0.3θ₀² <= 0.8, whose linearisation at
    θ̄ the step crosses but the constraint itself does not (0.7 at θ₀ = 1): retraining reaches 1.0, and a
    row added on its linearisation alone stopped the step at 0.875 and called the constraint active."""
    from polyproj.adapters.dif import ConstrainedProblem, Constraint, Loss, solve

    Z = torch.tensor([[-1.0, 0.5], [-1.0, -0.5], [-1.0, 0.2], [-1.0, -0.2], [-1.0, 0.0],
                      [1.0, 0.3], [1.0, -0.3], [1.0, 0.1], [1.0, -0.1], [1.0, 0.0]], dtype=torch.float64)
    cons = Constraint(lambda th: th[0], None, tau=0.75, name="cap") if kind == "linear" else \
        Constraint(lambda th: th[0] - 0.3 * th[0] ** 2, None, tau=0.8, name="cap")
    problem = ConstrainedProblem(torch.zeros(2, dtype=torch.float64),
                                 Loss(lambda th, b: 0.5 * ((th - b[0]) ** 2).sum(-1), (Z,)), [cons])
    kkt = solve(problem)
    rem = {"objective": [0, 1, 2, 3, 4]}
    retrained = (retrain(problem, rem, warm_start=kkt, tol=1e-12).theta - kkt.theta).numpy()
    np.testing.assert_allclose(retrained, truth, atol=1e-10)
    dif = DIF(problem, kkt, method=method)
    first, second = dif.result(rem), dif.result(rem, order=2)
    np.testing.assert_allclose(first.omega.numpy(), [0.5, 0.0], atol=1e-10)
    assert second.step_length == 1.0
    np.testing.assert_allclose(second.omega.numpy(), retrained, atol=1e-8)
    assert second.active == active


def test_second_order_answers_use_one_damping_after_a_re_damping(study, monkeypatch):
    """damping="auto", matrix-free: a solve inside the second-order step (here H⁻¹q of the second removal, made
    to meet negative curvature) raises the damping. Every answer of the call is then computed again at it:
    equal to a DIF built with the final damping, for both removals (the first was computed before the raise),
    with one ``second_order_log`` entry per removal. The step's H⁻¹q raised an IndefiniteHessianError out of
    ``delta_theta`` before (it bypassed the re-damping), and answers computed before a raise kept the old one."""
    from polyproj.adapters.dif import matfree
    from polyproj.adapters.dif.krylov import IndefiniteHessianError

    prob, kkt = study.problem, study.kkt
    rng = np.random.default_rng(4)
    rems = [_group(study, rng.choice(prob.objective.n_samples, 6, replace=False)) for _ in range(2)]
    auto = DIF(prob, kkt, method="matrix-free", damping="auto", rtol=1e-12)
    floor = auto.damping
    solve, calls = matfree.KrylovInverse.solve, []

    def meets_curvature_once(self, b, what):
        if what.startswith("second order"):
            calls.append(what)
            if len(calls) == 2:  # the second removal's H⁻¹q, after the first removal's answer
                raise IndefiniteHessianError("negative curvature (test)", -1e-3, 1.0)
        return solve(self, b, what)

    monkeypatch.setattr(matfree.KrylovInverse, "solve", meets_curvature_once)
    got = auto.delta_theta(rems, order=2).numpy()
    monkeypatch.setattr(matfree.KrylovInverse, "solve", solve)
    assert auto.damping > floor + 1e-3
    assert len(auto.second_order_log) == 2
    fixed = DIF(prob, kkt, method="matrix-free", damping=auto.damping, rtol=1e-12)
    want = fixed.delta_theta(rems, order=2).numpy()
    assert np.abs(got - want).max() <= 1e-9 * np.abs(want).max(), np.abs(got - want).max()
    assert auto.second_order_log == fixed.second_order_log


def test_second_order_dual_qps_kept_are_bounded(study):
    """The dual QPs of second-order steps are kept per (rows, free rows) for reuse, at most STEP_DUALS_KEPT of
    them (least recently used dropped): a long run of removals with ever new row sets does not grow memory."""
    import itertools

    from polyproj.adapters.dif.engine import STEP_DUALS_KEPT

    prob, kkt = study.problem, study.kkt
    dif = DIF(prob, kkt, method="matrix-free", rtol=1e-12)
    m = prob.m
    combos = [(np.array(rows), np.array(eq)) for k in range(1, m + 1) for rows in itertools.combinations(range(m), k)
              for eq in itertools.product((False, True), repeat=k)]
    assert len(combos) > STEP_DUALS_KEPT
    first_rows, first_eq = combos[0]
    rhs = np.ones(first_rows.size)
    want = dif.constraint_solves(first_rows, first_eq)[1].solve(rhs)
    for rows, eq in combos:
        dif.constraint_solves(rows, eq)
    assert len(dif._step_duals) == STEP_DUALS_KEPT
    again = dif.constraint_solves(first_rows, first_eq)[1]  # dropped and built again: the same QP
    assert np.allclose(again.solve(rhs), want, rtol=1e-12, atol=1e-14)


def _sq(th, b):
    return (b[0] @ th - b[1]) ** 2


def test_second_order_moves_a_removal_whose_first_order_step_is_zero():
    """Data of a constraint inactive at θ̄ only: ω₁ = 0 exactly, yet the removal violates the constraint (its
    smallest loss removed, the group's mean risk rises past τ), so retraining moves θ. The correction holds the
    violated row and moves towards retraining; ‖δ‖/‖ω₁‖ is infinite (it raised ZeroDivisionError)."""
    from polyproj.adapters.dif import ConstrainedProblem, Constraint, Loss, solve

    gen = torch.Generator().manual_seed(0)
    X = torch.randn(50, 3, generator=gen, dtype=torch.float64)
    y = X @ torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64) + 0.5 * torch.randn(50, generator=gen,
                                                                                   dtype=torch.float64)
    theta = torch.linalg.lstsq(X, y).solution
    r2 = (X[:10] @ theta - y[:10]) ** 2
    k = int(torch.argmin(r2))
    risk, risk_after = float(r2.mean()), float((r2.sum() - r2[k]) / 9)
    tau = risk + 0.3 * (risk_after - risk)
    prob = ConstrainedProblem(torch.zeros(3), Loss(_sq, (X, y)),
                              [Constraint(_sq, (X[:10], y[:10]), tau=tau, name="grp")])
    kkt = solve(prob, tol=1e-12)
    assert kkt.classification == {"grp": "inactive"}
    rem = {"grp": [k]}
    dif = DIF(prob, kkt)
    first, second = dif.result(rem), dif.result(rem, order=2)
    truth = (retrain(prob, rem, warm_start=kkt, tol=1e-12).theta - kkt.theta).numpy()
    assert float(first.omega.abs().max()) == 0.0 and np.linalg.norm(truth) > 1e-3
    assert second.correction_ratio == np.inf and second.step_length > 0
    assert np.linalg.norm(second.omega.numpy() - truth) < 0.1 * np.linalg.norm(truth)
