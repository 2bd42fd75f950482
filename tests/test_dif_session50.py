"""DIF, session 50: the absolute tolerances' scale (warnings, not new thresholds), argument checks of the baselines,
and bad inputs that reached torch or NumPy raw."""

from __future__ import annotations

import dataclasses
import re
import warnings

import numpy as np
import pytest
import torch

from polyproj.adapters.dif import DIF, ConstrainedProblem, Constraint, Loss, classic_if, penalty_if, retrain, solve
from polyproj.adapters.dif.baselines import if_scores
from polyproj.adapters.dif.krylov import solve_hessian
from polyproj.errors import PolyprojWarning, ProblemError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STRICT = "ignore:strict complementarity fails:polyproj.errors.PolyprojWarning"


def _data(n=40):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, 3, generator=g, dtype=torch.float64)
    y = X @ torch.tensor([1.0, 2.0, -1.0], dtype=torch.float64) + 0.3 * torch.randn(n, generator=g,
                                                                                   dtype=torch.float64)
    return X, y


def _sq(s=1.0):
    return lambda th, b: s * (b[0] @ th - b[1]) ** 2


def _capped(s=1.0, c=1.0, tau=1.0, j=1):
    """Least squares × s with the data-free cap c·θⱼ <= c·tau (θ₁ <= 1 binds with λ = 1.64 at s = c = 1)."""
    X, y = _data()
    return ConstrainedProblem(torch.zeros(3), Loss(_sq(s), (X, y)),
                              [Constraint(lambda th: c * th[j], None, tau=c * tau, name="cap")])


def _scale_warnings(record):
    return [str(w.message) for w in record if issubclass(w.category, PolyprojWarning)
            and "depends on the scale of the absolute tolerances" in str(w.message)]


def _suggested(message, name):
    return float(re.search(rf"{name}=([0-9.e+-]+)", message).group(1))


# ----------------------------------------------------------------------------- 1. scale of the classification
@pytest.mark.filterwarnings(STRICT)
def test_small_objective_binding_row_called_weak_warns_and_the_suggested_mult_tol_restores_omega():
    """f₀ × 1e-8: λ = 1.6e-8 < mult_tol calls the binding cap weakly active and the DIF frees θ₁ (−0.09 where
    retraining keeps it at 0). from_params now says so, naming the row and a mult_tol; that mult_tol gives the
    unit-scale problem's ω (the same problem: ω is invariant once the row is classified alike)."""
    rem = [{"objective": [14]}, {"objective": [3, 20]}]
    ref_k = solve(_capped())
    assert ref_k.status == ("binding",)
    ref = DIF(_capped(), ref_k).delta_theta(rem).numpy()
    P = _capped(s=1e-8)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        k = solve(P)
    assert k.status == ("weakly_active",)  # the default's classification is kept (a warning, not a new rule)
    msgs = _scale_warnings(rec)
    assert len(msgs) == 1 and "'cap'" in msgs[0] and "weakly active" in msgs[0] and "mult_tol" in msgs[0]
    assert np.abs(DIF(P, k).delta_theta(rem).numpy() - ref).max() > 1e-2  # what the warning is about
    mult_tol = _suggested(msgs[0], "mult_tol")
    assert mult_tol < float(k.lambdas[0])
    k2 = solve(P, mult_tol=mult_tol)  # no warning now (PolyprojWarning is an error here)
    assert k2.status == ("binding",)
    np.testing.assert_allclose(DIF(P, k2).delta_theta(rem).numpy(), ref, rtol=0, atol=1e-8)


@pytest.mark.filterwarnings(STRICT)
def test_small_constraint_inactive_row_counted_active_warns_and_the_suggested_active_tol_restores_omega():
    """A cap θ₀ <= θ̄₀ + 0.05 multiplied by 1e-8 has slack 5e-10 < active_tol: counted active, the DIF blocks θ₀
    (ω₀ = 0, retraining 0.0199). The warning names the row and an active_tol that makes it inactive again."""
    X, y = _data()
    t0 = float(solve(ConstrainedProblem(torch.zeros(3), Loss(_sq(), (X, y)))).theta[0])
    rem = [{"objective": [i]} for i in range(5)]
    ref_k = solve(_capped(tau=t0 + 0.05, j=0))
    assert ref_k.status == ("inactive",)
    ref = DIF(_capped(tau=t0 + 0.05, j=0), ref_k).delta_theta(rem).numpy()
    P = _capped(c=1e-8, tau=t0 + 0.05, j=0)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        k = solve(P)
    assert k.status == ("weakly_active",)
    msgs = _scale_warnings(rec)
    assert len(msgs) == 1 and "'cap'" in msgs[0] and "counted active" in msgs[0] and "active_tol" in msgs[0]
    active_tol = _suggested(msgs[0], "active_tol")
    assert active_tol < abs(k.g[0])
    k2 = solve(P, active_tol=active_tol)
    assert k2.status == ("inactive",)
    np.testing.assert_allclose(DIF(P, k2).delta_theta(rem).numpy(), ref, rtol=0, atol=1e-8)


@pytest.mark.filterwarnings(STRICT)
def test_no_scale_warning_at_unit_scale_weakly_active_or_binding():
    """The rule stays silent where the classification is clear at unit scale: a cap exactly at the unconstrained
    minimiser (weakly active, λ at rounding level) and a binding one (any scale warning is an error here)."""
    X, y = _data()
    th = solve(ConstrainedProblem(torch.zeros(3), Loss(_sq(), (X, y)))).theta
    k = solve(_capped(tau=float(th[1])))
    assert k.status == ("weakly_active",) and float(k.lambdas[0]) <= 1e-7
    assert solve(_capped()).status == ("binding",)


# ----------------------------------------------------------------------------- 2. tol absolute: an accepted start
def test_solve_and_retrain_warn_when_a_small_loss_accepts_its_start_and_the_suggested_tol_converges():
    """f₀ × 1e-11: the residual at θ0 = 0 (3.7e-12) is within tol = 1e-10 and solve returned θ0; warm-started
    retraining moved θ by exactly 0 (truth 0.155). Both warn now, and the suggested tol reaches the unit-scale
    solution and the unit-scale retraining's change."""
    rem = {"objective": list(range(10))}
    ref_k = solve(_capped())
    ref_move = (retrain(_capped(), rem, warm_start=ref_k).theta - ref_k.theta).numpy()
    assert np.abs(ref_move).max() > 0.1
    P = _capped(s=1e-11)
    with pytest.warns(PolyprojWarning, match=r"solve stopped at its start.*pass a smaller tol"):
        k = solve(P)
    assert torch.equal(k.theta, P.theta0)  # the result itself is unchanged: a warning only
    tol = k.info["accepted_start"]["suggested_tol"]
    assert tol < 1e-18
    k2 = solve(P, tol=tol, mult_tol=1e-18)
    np.testing.assert_allclose(k2.theta.numpy(), ref_k.theta.numpy(), rtol=0, atol=1e-9)
    with pytest.warns(PolyprojWarning, match=r"retrain: re-solve #0 stopped at its start.*1 of 1"):
        stuck = retrain(P, rem, warm_start=k2)
    assert torch.equal(stuck.theta, k2.theta)
    moved = (retrain(P, rem, warm_start=k2, tol=tol).theta - k2.theta).numpy()
    np.testing.assert_allclose(moved, ref_move, rtol=0, atol=1e-8)


def test_a_start_that_is_a_kkt_point_is_returned_without_warning():
    """Not every accepted start is suspect: re-solving from the KKT point (∇f₀ ≠ 0 at the binding cap) and
    retraining without data of a constraint that stays inactive return the start, silently, at unit scale."""
    X, y = _data()
    P = ConstrainedProblem(torch.zeros(3), Loss(_sq(), (X, y)),
                           [Constraint(lambda th: th[1], None, tau=1.0, name="cap"),
                            Constraint(_sq(), (X[:10], y[:10]), tau=100.0, name="risk")])
    k = solve(P)
    assert k.status == ("binding", "inactive")
    again = solve(P, theta0=k.theta, lambdas0=k.lambdas)
    assert torch.equal(again.theta, k.theta) and "accepted_start" not in again.info
    out = retrain(P, {"risk": [0, 1]}, warm_start=k)
    assert torch.equal(out.theta, k.theta) and "accepted_start" not in out.info


# ----------------------------------------------------------------------------- 3, 4. the baselines' arguments
@pytest.fixture(scope="module")
def base():
    P = _capped()
    return P, solve(P), [{"objective": [0]}, {"objective": [1]}]


def test_if_scores_penalty_typo_is_refused_not_hinge(base):
    P, k, rems = base
    with pytest.raises(ProblemError, match="penalty must be 'quadratic' or 'hinge', got 'quadratc'"):
        if_scores(P, k, lambda th: th.sum(), rems, kind="penalty", rho=10.0, penalty="quadratc")
    with pytest.raises(ProblemError, match="penalty must be"):
        penalty_if(P, k, rems[0], 10.0, penalty="quadratc")


@pytest.mark.parametrize(("call", "arg"), [
    (lambda P, k, r: penalty_if(P, k, r[0], "a"), "rho"),
    (lambda P, k, r: penalty_if(P, k, r[0], None), "rho"),
    (lambda P, k, r: penalty_if(P, k, r[0], np.array([1.0, 2.0])), "rho"),
    (lambda P, k, r: penalty_if(P, k, r[0], 0.0), "rho"),
    (lambda P, k, r: penalty_if(P, k, r[0], 10.0, damping=-1.0), "damping"),
    (lambda P, k, r: classic_if(P, k, r[0], damping=-1e9), "damping"),
    (lambda P, k, r: classic_if(P, k, r[0], damping="x"), "damping"),
    (lambda P, k, r: classic_if(P, k, r[0], damping="auto"), "damping"),
    (lambda P, k, r: if_scores(P, k, lambda th: th.sum(), r, kind="penalty", rho=-5.0), "rho"),
    (lambda P, k, r: if_scores(P, k, lambda th: th.sum(), r, damping=-1.0), "damping"),
    (lambda P, k, r: if_scores(P, k, lambda th: th.sum(), r, krylov="gmres"), "krylov"),
    (lambda P, k, r: if_scores(P, k, lambda th: th.sum(), r, rtol=2.0), "rtol"),
    (lambda P, k, r: if_scores(P, k, lambda th: th.sum(), r, maxiter=0), "maxiter"),
])
def test_baseline_arguments_are_problem_errors_naming_the_argument(base, call, arg):
    P, k, rems = base
    with pytest.raises(ProblemError, match=rf"^{arg} must be"):
        call(P, k, rems)


def test_valid_baseline_arguments_still_accepted(base):
    """0-d tensors count as their number (as in DIF); classic IF with damping equals (H + δI)⁻¹ by hand."""
    P, k, rems = base
    a = classic_if(P, k, rems, damping=torch.tensor(0.5)).numpy()
    X, y = _data()
    H = 2 * (X.T @ X).numpy() / 40
    c = -(2 * X[:2] * (X[:2] @ k.theta - y[:2])[:, None]).numpy() / 40
    np.testing.assert_allclose(a, -np.linalg.solve(H + 0.5 * np.eye(3), c.T).T, rtol=1e-10, atol=1e-14)
    q = penalty_if(P, k, rems, np.float64(10.0))
    np.testing.assert_allclose(penalty_if(P, k, rems, torch.tensor(10.0)).numpy(), q.numpy(), rtol=0, atol=0)


def test_solve_hessian_unknown_method_is_a_problem_error():
    class Eye:
        dim = 2

        def matvec(self, v):
            return v

    with pytest.raises(ProblemError, match="method must be one of"):
        solve_hessian(Eye(), np.ones(2), method="gmres")


# ----------------------------------------------------------------------------- 5. raw errors on bad inputs
def test_complex_loss_is_a_problem_error():
    X, y = _data(10)
    with pytest.raises(ProblemError, match="objective: fn returns complex values"):
        ConstrainedProblem(torch.zeros(3), Loss(lambda th, b: (b[0] @ th - b[1]).to(torch.complex128) ** 2, (X, y)))
    with pytest.raises(ProblemError, match="constraint 'c': fn returns complex values"):
        ConstrainedProblem(torch.zeros(3), Loss(_sq(), (X, y)),
                           [Constraint(lambda th: th[0].to(torch.complex128), None, tau=0.0, name="c")])


def test_retrain_warm_start_must_be_a_kkt_point(base):
    P, _, _ = base
    with pytest.raises(ProblemError, match="warm_start must be a KKTPoint"):
        retrain(P, {"objective": [1]}, warm_start="x")


@pytest.mark.parametrize(("change", "field"), [
    (lambda k: {"theta": k.theta.float()}, "kkt.theta"),
    (lambda k: {"lambdas": k.lambdas.numpy()}, "kkt.lambdas"),
    (lambda k: {"theta": k.theta[None]}, "kkt.theta"),
    (lambda k: {"lambdas": k.lambdas.float()}, "kkt.lambdas"),
])
def test_hand_made_kkt_point_fields_are_checked(base, change, field):
    P, k, rems = base
    bad = dataclasses.replace(k, **change(k))
    for call in (lambda: DIF(P, bad), lambda: classic_if(P, bad, rems[0]),
                 lambda: if_scores(P, bad, lambda th: th.sum(), rems)):
        with pytest.raises(ProblemError, match=rf"^{re.escape(field)} must be"):
            call()


def test_top_k_zero_selects_nothing_without_scoring(monkeypatch):
    """k = 0 is allowed: an empty selection and 0.0, also where one removal would empty the objective (N = 1)."""
    X, y = _data(1)
    P1 = ConstrainedProblem(torch.zeros(3), Loss(lambda th, b: _sq()(th, b) + (th ** 2).sum(), (X, y)))
    d = DIF(P1, solve(P1))
    idx, joint = d.top_k(lambda th: th.sum(), 0)
    assert idx.dtype == np.int64 and idx.shape == (0,) and joint == 0.0
    P = _capped()
    d = DIF(P, solve(P))
    monkeypatch.setattr(d, "influence", lambda *a, **kw: pytest.fail("k = 0 must not score"))
    idx, joint = d.top_k(lambda th: th.sum(), 0, candidates=[1, 2])
    assert idx.shape == (0,) and joint == 0.0
    with pytest.raises(ProblemError, match="k must be an integer"):
        d.top_k(lambda th: th.sum(), -1)
