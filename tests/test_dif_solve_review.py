"""Review of dif.solve and KKTPoint's constructors: SQP stalls and divergence, the auto fallback, argument checks."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

import torch

import polyproj as pp
from polyproj.adapters.dif import ConstrainedProblem, Constraint, KKTPoint, Loss, retrain, solve
from polyproj.adapters.dif import kkt as kkt_module
from polyproj.adapters.dif.hvp import DEFAULT_CHUNK, HessianOperator, LossPieces

# one torch thread by polyproj's own rule (runtime.set_torch_threads): torch.set_num_threads would set MKL's
# count too, after which torch's batched LU returns wrong pivots in later tests of the process
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _lin_sq(th, b):
    return (b[0] @ th - b[1]) ** 2


def _net_sq(m, b):
    return (m(b[0]).squeeze(-1) - b[1]) ** 2


def _net_sq_wd(m, b):
    return _net_sq(m, b) + 1e-2 * sum((p ** 2).sum() for p in m.parameters())


@pytest.fixture(scope="module")
def linear():
    """Least squares (d = 4) with a binding cap θ₀ <= −0.1, and its KKT point."""
    rng = np.random.default_rng(0)
    X, y = torch.as_tensor(rng.normal(size=(50, 4))), torch.as_tensor(rng.normal(size=50))
    prob = ConstrainedProblem(torch.zeros(4), Loss(_lin_sq, (X, y)),
                              [Constraint(lambda th: th[0], None, tau=-0.1, name="cap")])
    return prob, solve(prob)


def _tanh_net(group_tau: float, *, frozen_first_layer: bool, bias_eq: bool):
    """A tanh net 3 → 6 → 1 on 60 samples with a group-risk constraint on the first 20 (the probes' problems)."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    X = torch.as_tensor(rng.normal(size=(60, 3)))
    y = torch.as_tensor(np.sin(X.numpy() @ np.array([1.0, -1.0, 0.5])) + 0.1 * rng.normal(size=60))
    net = torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1)).double()
    if frozen_first_layer:
        net[0].weight.requires_grad_(False)
    cons = [Constraint(_net_sq, (X[:20], y[:20]), tau=group_tau, name="group")]
    if bias_eq:
        cons.append(Constraint(lambda m: m[2].bias.sum(), None, tau=0.1, name="beq", kind="eq"))
    return ConstrainedProblem(net, Loss(_net_sq_wd, (X, y)), cons)


# ----------------------------------------------------------------------------- defect 1: SQP divergence / stall
def test_sqp_divergence_is_a_solver_error_and_auto_falls_back_on_the_augmented_lagrangian():
    """A feasible net problem (d = 13; the group risk can reach 0.022 < τ = 0.03 under the bias equality) on which
    the SQP's multipliers run away: before, 100 iterations ended at residual ~1e300 with "raise max_iter" and 300 in
    a raw LinAlgError from eigvalsh."""
    prob = _tanh_net(0.03, frozen_first_layer=True, bias_eq=True)
    with pytest.raises(pp.SolverError) as err:
        solve(prob, method="sqp")
    msg = str(err.value)
    assert "diverged" in msg and "method='auglag'" in msg and "no common feasible point" in msg
    assert "raise max_iter" not in msg
    # method="auto" (the default): the augmented Lagrangian from the same start, then the SQP from its point
    with pytest.warns(pp.PolyprojWarning, match="fell back on the augmented Lagrangian"):
        k = solve(prob)
    assert k.residual <= 1e-10 and k.info["method"] == "auglag+sqp" and "diverged" in k.info["sqp_failure"]
    assert k.classification == {"group": "binding", "beq": "equality"}
    again = KKTPoint.from_params(prob, k.theta, k.lambdas, tol=1e-10, polish=False)  # a KKT point of prob
    assert again.residual <= 1e-10


def test_sqp_line_search_without_descent_takes_no_step(linear, monkeypatch):
    """A direction along which the merit never decreases is not taken: the shift rises to its cap, then a
    SolverError says the SQP stalled (before: the step was taken at α = 2⁻⁴⁰, 100 times, then "raise max_iter")."""
    prob, _ = linear
    start = prob.theta0.clone()
    calls = []

    def rising_merit(problem, th, nu, eq):  # every trial point is worse than the last: no descent anywhere
        calls.append(th.clone())
        return float(len(calls))

    monkeypatch.setattr(kkt_module, "_merit", rising_merit)
    with pytest.raises(pp.SolverError, match="stalled") as err:
        solve(prob, method="sqp")
    msg = str(err.value)
    assert "method='auglag'" in msg and "no common feasible point" in msg
    # each retry starts its line search at the same θ: no step was taken
    first_points = [c for c in calls if torch.equal(c, start)]
    assert len(first_points) == 1 + 8  # shift 1e-4 -> 1e4 (the cap): nine QPs at the start, then the stall


def test_sqp_non_finite_hessian_is_a_solver_error(linear, monkeypatch):
    """A non-finite Hessian of the Lagrangian (an iteration that diverged) is a SolverError, not numpy's
    LinAlgError from eigvalsh."""
    prob, _ = linear
    monkeypatch.setattr(kkt_module, "lagrangian_hessian", lambda problem, th, lam: np.full((4, 4), np.nan))
    with pytest.raises(pp.SolverError, match="Hessian of the Lagrangian is not finite"):
        solve(prob, method="sqp")


# ----------------------------------------------------------------------------- defect 2: from_cooper(refine=True)
def test_from_cooper_refine_honours_and_checks_the_from_params_options():
    cooper = pytest.importorskip("cooper")
    torch.manual_seed(0)
    rng = np.random.default_rng(4)
    X = torch.as_tensor(rng.normal(size=(80, 4)))
    y = torch.as_tensor(X.numpy() @ np.array([1.0, -2.0, 0.5, 1.0]))
    y[:25] += 1.5
    model = torch.nn.Linear(4, 1).double()
    prob = ConstrainedProblem(model, Loss(_net_sq, (X, y)),
                              [Constraint(_net_sq, (X[:25], y[:25]), tau=0.7, name="group")])

    class CMP(cooper.ConstrainedMinimizationProblem):
        def __init__(self):
            super().__init__()
            mult = cooper.multipliers.DenseMultiplier(num_constraints=1, dtype=torch.float64)
            self.group = cooper.Constraint(constraint_type=cooper.ConstraintType.INEQUALITY, multiplier=mult)

        def compute_cmp_state(self, model, X, y):
            viol = _net_sq(model, (X[:25], y[:25])).mean() - 0.7
            return cooper.CMPState(loss=_net_sq(model, (X, y)).mean(),
                                   observed_constraints={self.group: cooper.ConstraintState(violation=viol)})

    cmp = CMP()
    opt = cooper.optim.SimultaneousOptimizer(
        cmp=cmp, primal_optimizers=torch.optim.SGD(model.parameters(), lr=0.05),
        dual_optimizers=torch.optim.SGD(cmp.dual_parameters(), lr=0.05, maximize=True))
    for _ in range(300):  # roughly trained: refine=True re-solves from here
        opt.roll(compute_cmp_state_kwargs={"model": model, "X": X, "y": y})
    ref = solve(prob)
    assert ref.classification == {"group": "binding"} and 0.05 < float(ref.lambdas[0]) < 1.0
    # mult_tol above λ̄: weakly active, as from_params classifies it (before: ignored, "binding", mult_tol 1e-7)
    with pytest.warns(pp.PolyprojWarning, match="strict complementarity"):
        k = KKTPoint.from_cooper(prob, cmp, model, tol=1e-10, refine=True, mult_tol=10.0)
    assert k.classification == {"group": "weakly_active"} and k.mult_tol == 10.0 and k.residual <= 1e-10
    k = KKTPoint.from_cooper(prob, cmp, model, tol=1e-10, refine=True, active_tol=1e-4, polish=True)
    assert k.active_tol == 1e-4 and k.info["polished_multipliers"] and k.info["from_cooper"]["refined"]
    np.testing.assert_allclose(k.lambdas.numpy(), ref.lambdas.numpy(), rtol=1e-8)
    with pytest.raises(pp.ProblemError, match="active_tol must be a positive finite number"):
        KKTPoint.from_cooper(prob, cmp, model, tol=1e-10, refine=True, active_tol=-1.0)
    for refine in (True, False):  # a misspelt option is refused either way (before: ignored / a raw TypeError)
        with pytest.raises(pp.ProblemError, match="unknown keyword.*Did you mean 'mult_tol'"):
            KKTPoint.from_cooper(prob, cmp, model, tol=1e-10, refine=refine, mult_tol_typo=5)


# ----------------------------------------------------------------------------- defect 3: backend and settings
@pytest.mark.parametrize("method", ["sqp", "auglag", "auto"])
def test_solve_checks_backend_and_settings_whatever_the_method(linear, method):
    prob, k = linear
    with pytest.raises(pp.BackendNotFound, match="no_such_backend"):
        solve(prob, method=method, backend="no_such_backend")
    with pytest.raises(pp.SettingsError, match="eps_abss"):
        solve(prob, method=method, eps_abss=1e-12)
    # from a converged start no QP is solved: the names are checked all the same
    with pytest.raises(pp.BackendNotFound):
        solve(prob, k.theta, k.lambdas, method=method, backend="no_such_backend")
    assert solve(prob, k.theta, k.lambdas, method=method, eps_abs=1e-9).residual <= 1e-10  # valid settings pass


def test_solve_checks_backend_above_the_sqp_dimension_and_in_retrain(linear):
    prob, k = linear
    rng = np.random.default_rng(1)
    big = ConstrainedProblem(torch.zeros(600), Loss(_lin_sq, (torch.as_tensor(rng.normal(size=(30, 600))),
                                                              torch.as_tensor(rng.normal(size=30)))))
    with pytest.raises(pp.BackendNotFound):  # method="auto" takes the augmented Lagrangian at d = 600
        solve(big, backend="no_such_backend")
    with pytest.raises(pp.SettingsError, match="foo"):
        retrain(prob, {"objective": [0]}, warm_start=k, method="auglag", foo=1)


# ----------------------------------------------------------------------------- defect 4: max_iter, chunk_size
@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "10"])
def test_solve_max_iter_must_be_a_positive_integer(linear, bad):
    prob, k = linear
    with pytest.raises(pp.ProblemError, match="max_iter must be a positive integer"):
        solve(prob, k.theta, k.lambdas, max_iter=bad)


def test_solve_from_a_converged_start_with_one_iteration(linear):
    prob, k = linear
    again = solve(prob, k.theta, k.lambdas, max_iter=np.int64(1))
    assert again.info["iterations"] == 1 and torch.equal(again.theta, k.theta)


@pytest.mark.parametrize("bad", [0, -5, 2.5, True])
def test_chunk_size_is_checked_as_dif_checks_it(linear, bad):
    prob, k = linear
    for method in ("auglag", "sqp"):
        with pytest.raises(pp.ProblemError, match="chunk_size must be a positive integer"):
            solve(prob, k.theta, k.lambdas, method=method, chunk_size=bad)
    with pytest.raises(pp.ProblemError, match="chunk_size must be a positive integer"):
        LossPieces(prob, [1.0], chunk_size=bad)
    with pytest.raises(pp.ProblemError, match="chunk_size must be a positive integer"):
        HessianOperator(prob, k.theta, k.lambdas, chunk_size=bad)


def test_chunk_size_none_is_the_default(linear):
    prob, k = linear
    assert LossPieces(prob, [1.0], chunk_size=None).chunk_size == DEFAULT_CHUNK
    assert LossPieces(prob, [1.0], chunk_size=np.int64(7)).chunk_size == 7
    assert solve(prob, k.theta, k.lambdas, method="auglag", chunk_size=7).residual <= 1e-10


# ----------------------------------------------------------------------------- defect 5: messages
def test_from_params_tells_non_finite_multipliers_from_a_wrong_shape(linear):
    prob, k = linear
    with pytest.raises(pp.ProblemError, match=r"lambdas must be finite: lambdas\[0\] \(constraint 'cap'\) is nan"):
        KKTPoint.from_params(prob, k.theta, lambdas=[np.nan])
    with pytest.raises(pp.ProblemError, match=r"lambdas must be 1 numbers \(one per constraint\), got 2"):
        KKTPoint.from_params(prob, k.theta, lambdas=[1.0, 2.0])
    with pytest.raises(pp.ProblemError, match="lambdas0 must be 1 numbers"):
        solve(prob, k.theta, lambdas0=["a"])
    with pytest.raises(pp.ProblemError, match="lambdas0 must be finite"):
        solve(prob, k.theta, lambdas0=torch.tensor([float("inf")]))


def test_infeasible_constraint_under_the_sqp_ends_with_the_infeasibility_hint():
    """A group risk (a mean of squares) capped at −1: the SQP diverged to residual ~1e172 with "raise max_iter"
    (50 iterations) or a raw LinAlgError (100)."""
    prob = _tanh_net(-1.0, frozen_first_layer=False, bias_eq=False)
    hint = r"violated by 1\.\d+e\+00 \(constraint 'group'\): they may have no common feasible point"
    with pytest.raises(pp.SolverError, match=hint) as err:
        solve(prob, method="sqp")
    assert "raise max_iter" not in str(err.value)
    # the violation alone cannot tell an infeasible problem from one not solved yet: the hint says both
    assert "or the method has not reached one yet" in str(err.value)
    with pytest.raises(pp.SolverError, match=hint) as err:  # auto: the fallback fails too, and says so
        solve(prob)
    assert "did not converge either" in str(err.value)
