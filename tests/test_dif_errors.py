"""DIF engine: bad input gives clear errors; KKTPoint.from_params; retrain on a Dask executor."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import polyproj as pp
from polyproj.adapters.dif import DIF, ConstrainedProblem, Constraint, KKTPoint, Loss, retrain, solve
from tests.dif_helpers import binding_least_squares

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _sq(th, b):
    return (b[0] @ th - b[1]) ** 2


@pytest.fixture(scope="module")
def setup():
    return binding_least_squares(30)[:2]


# ----------------------------------------------------------------------------- removals
@pytest.mark.parametrize(("removal", "match"), [
    ({"objective": [30]}, "out of range"),
    ({"objective": [-1]}, "out of range"),
    ({"group": [10]}, "out of range"),
    ({"objectve": [0]}, "Did you mean 'objective'"),
    ({"grup": [0]}, "Did you mean 'group'"),
    ({"cap": [0]}, "no data"),
    ({"objective": [1, 1]}, "repeated"),
    ({"objective": [0.5]}, "integers"),
    ({"objective": list(range(30))}, "removes all"),
    ([0, 1], "mapping"),
])
def test_bad_removals(setup, removal, match):
    prob, kkt = setup
    with pytest.raises(pp.ProblemError, match=match):
        DIF(prob, kkt).delta_theta(removal)


def test_bad_removal_fails_before_retraining(setup):
    prob, kkt = setup
    with pytest.raises(pp.ProblemError, match="out of range"):
        retrain(prob, [{"objective": [0]}, {"objective": [99]}], warm_start=kkt)


def test_boolean_mask_and_tensor_indices(setup):
    prob, kkt = setup
    dif = DIF(prob, kkt)
    mask = np.zeros(30, bool)
    mask[[2, 5]] = True
    a = dif.delta_theta({"objective": mask})
    b = dif.delta_theta({"objective": torch.tensor([5, 2])})
    np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-14)


# ----------------------------------------------------------------------------- problem validation
def test_bad_problems():
    X, y = torch.randn(10, 3, dtype=torch.float64), torch.randn(10, dtype=torch.float64)
    with pytest.raises(pp.ProblemError, match="share the first"):
        Loss(_sq, (X, y[:5]))
    with pytest.raises(pp.ProblemError, match="NaN"):
        Loss(_sq, (X, y * float("nan")))
    with pytest.raises(pp.ProblemError, match="callable"):
        Loss(3, (X, y))
    with pytest.raises(pp.ProblemError, match="1-D tensor"):
        ConstrainedProblem(torch.zeros(3, 1), Loss(_sq, (X, y)))
    with pytest.raises(pp.ProblemError, match="one loss per sample"):
        ConstrainedProblem(torch.zeros(3), Loss(lambda th, b: (b[0] @ th).sum(), (X, y)))
    with pytest.raises(pp.ProblemError, match="unique"):
        ConstrainedProblem(torch.zeros(3), Loss(_sq, (X, y)),
                           [Constraint(lambda th: th[0], None, 1.0, "c"), Constraint(lambda th: th[1], None, 1.0, "c")])
    with pytest.raises(pp.ProblemError, match="one value"):
        ConstrainedProblem(torch.zeros(3), Loss(_sq, (X, y)), [Constraint(lambda th: th, None, 1.0, "c")])
    with pytest.raises(pp.ProblemError, match="kind"):
        Constraint(lambda th: th[0], None, 1.0, "c", kind="le")
    with pytest.raises(pp.ProblemError, match="finite"):
        Constraint(lambda th: th[0], None, float("inf"), "c")
    with pytest.raises(pp.ProblemError, match="objective"):
        ConstrainedProblem(torch.zeros(3), Loss(_sq, (X, y)), [Constraint(lambda th: th[0], None, 1.0, "objective")])


def test_data_free_constraint_signatures():
    X, y = torch.randn(10, 3, dtype=torch.float64), torch.randn(10, dtype=torch.float64)
    prob = ConstrainedProblem(torch.zeros(3), Loss(_sq, (X, y)),
                              [Constraint(lambda th: th[0], None, 1.0, "a"),
                               Constraint(lambda th, batch: th[1] if batch is None else None, None, 1.0, "b")])
    np.testing.assert_allclose(prob.constraint_values(torch.tensor([2.0, 3.0, 0.0], dtype=torch.float64)).numpy(),
                               [1.0, 2.0])


# ----------------------------------------------------------------------------- KKT points
def test_non_kkt_point_is_rejected(setup):
    prob, kkt = setup
    with pytest.raises(pp.ProblemError, match="not a KKT point"):
        KKTPoint.from_params(prob, kkt.theta + 0.1 * torch.tensor([1.0, -1.0, 1.0, 0.0], dtype=torch.float64))
    infeasible = kkt.theta.clone()
    infeasible[1] = 2.0
    with pytest.raises(pp.ProblemError, match="violated"):
        KKTPoint.from_params(prob, infeasible)
    with pytest.raises(pp.ProblemError, match="entries"):
        KKTPoint.from_params(prob, torch.zeros(3))
    other = ConstrainedProblem(torch.zeros(4), prob.objective)
    with pytest.raises(pp.ProblemError, match="belong"):
        DIF(other, kkt)


def test_from_params_polishes_missing_and_noisy_multipliers(setup):
    prob, kkt = setup
    assert kkt.status == ("binding", "binding")
    k1 = KKTPoint.from_params(prob, kkt.theta)
    assert k1.info["polished_multipliers"]
    np.testing.assert_allclose(k1.lambdas.numpy(), kkt.lambdas.numpy(), atol=1e-9)
    noisy = kkt.lambdas + torch.tensor([0.05, -0.03], dtype=torch.float64)
    k2 = KKTPoint.from_params(prob, kkt.theta, noisy)
    np.testing.assert_allclose(k2.lambdas.numpy(), kkt.lambdas.numpy(), atol=1e-9)
    assert k2.info["polished_multipliers"]
    k3 = KKTPoint.from_params(prob, kkt.theta, kkt.lambdas)
    assert not k3.info["polished_multipliers"]
    with pytest.raises(pp.ProblemError, match="lambdas"):
        KKTPoint.from_params(prob, kkt.theta, [1.0])


def test_warnings_for_licq_and_strict_complementarity(setup):
    prob, kkt = setup
    th = kkt.theta
    dup = ConstrainedProblem(th, prob.objective, [*prob.constraints,
                                                  Constraint(lambda t: 2 * t[1], None, tau=2.0, name="cap2")])
    with pytest.warns(pp.PolyprojWarning, match="LICQ"):
        KKTPoint.from_params(dup, th)
    weak = ConstrainedProblem(th, prob.objective, [*prob.constraints,
                                                   Constraint(lambda t: t[0], None, tau=float(th[0]), name="w")])
    with pytest.warns(pp.PolyprojWarning, match="strict complementarity"):
        k = KKTPoint.from_params(weak, th)
    assert k.classification["w"] == "weakly_active"


def test_solve_reaches_tolerance_and_reports_failure(setup):
    prob, kkt = setup
    assert kkt.residual <= 1e-10
    infeasible = ConstrainedProblem(torch.zeros(4), prob.objective,
                                    [Constraint(lambda t: t[0], None, 0.0, "a"),
                                     Constraint(lambda t: -t[0], None, -1.0, "b")])
    with pytest.raises(pp.SolverError, match="PRIMAL_INFEASIBLE"):
        solve(infeasible)


# ----------------------------------------------------------------------------- retrain on executors
def test_retrain_on_dask_local_cluster(setup):
    distributed = pytest.importorskip("distributed")
    prob, kkt = setup
    removals = [{"objective": [i]} for i in range(4)] + [{"objective": [0, 3], "group": [1]}]
    ref = retrain(prob, removals, warm_start=kkt)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        got = retrain(prob, removals, warm_start=kkt, executor=client.get_executor())
    assert len(got) == len(ref)
    for a, b in zip(got, ref, strict=True):
        assert isinstance(a, KKTPoint) and a.residual <= 1e-10
        np.testing.assert_allclose(a.theta.numpy(), b.theta.numpy(), atol=1e-12)


def test_retrain_thread_pool_matches_single(setup):
    from concurrent.futures import ThreadPoolExecutor

    prob, kkt = setup
    removals = [{"objective": [i]} for i in range(6)]
    single = retrain(prob, removals, warm_start=kkt)
    # several re-solves at once: torch's forward-mode AD (the SQP's Hessian) is process-wide state
    with ThreadPoolExecutor(3) as ex:
        many = retrain(prob, removals, warm_start=kkt, executor=ex)
    for a, b in zip(single, many, strict=True):
        np.testing.assert_allclose(a.theta.numpy(), b.theta.numpy(), atol=1e-14)


# ----------------------------------------------------------------------------- arguments of the engine
def test_bad_engine_arguments(setup):
    prob, kkt = setup
    F = lambda th: _sq(th, (prob.objective.data[0][:5], prob.objective.data[1][:5])).mean()  # noqa: E731
    with pytest.raises(pp.ProblemError, match="damping"):
        DIF(prob, kkt, damping=None)
    with pytest.raises(pp.PolyprojError, match="bogus"):  # at construction, whichever path
        DIF(prob, kkt, backend="bogus", method="matrix-free")
    dm = DIF(prob, kkt, method="matrix-free")
    for bad in (-1, 0, 2.5):
        with pytest.raises(pp.ProblemError, match="chunk_size"):
            dm.influence(F, chunk_size=bad)
        with pytest.raises(pp.ProblemError, match="chunk_size"):
            DIF(prob, kkt, chunk_size=bad)
    d = DIF(prob, kkt)
    for k in (-1, 2.5, 30, 31):
        with pytest.raises(pp.ProblemError, match="top_k"):
            d.top_k(F, k)
    assert d.top_k(F, 0)[0].size == 0 and d.top_k(F, 29)[0].size == 29


def test_influence_keeps_grad_mode_and_takes_iterables(setup):
    prob, kkt = setup
    F = lambda th: _sq(th, (prob.objective.data[0][:5], prob.objective.data[1][:5])).mean()  # noqa: E731
    for method in ("dense", "matrix-free"):
        d = DIF(prob, kkt, method=method)
        ref = d.influence(F, [{"objective": [i]} for i in range(3)])
        got = d.influence(F, ({"objective": [i]} for i in range(3)))  # a generator
        np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=0, atol=1e-14)
        with torch.no_grad():
            d.influence(F)
            assert not torch.is_grad_enabled(), method


def test_engine_checks_its_kkt_point_and_copies_the_data(setup):
    prob, kkt = setup
    X, y = prob.objective.data
    for bad in (dict(rtol=0.0), dict(rtol=-1.0), dict(maxiter=0), dict(maxiter=2.5)):
        with pytest.raises(pp.ProblemError, match="rtol|maxiter"):
            DIF(prob, kkt, method="matrix-free", **bad)
    # the KKT point of another problem (the first 20 samples) is refused, not used
    other = ConstrainedProblem(kkt.theta, Loss(_sq, (X[:20], y[:20])), list(prob.constraints))
    with pytest.raises(pp.ProblemError, match="not a KKT point of this problem"):
        DIF(other, kkt)
    # the problem holds copies: editing the caller's tensors in place changes nothing
    Xc = X.clone()
    p2 = ConstrainedProblem(kkt.theta, Loss(_sq, (Xc, y)), list(prob.constraints))
    d2 = DIF(p2, kkt)
    w0 = d2.delta_theta({"objective": [0, 1]})
    Xc[0] += 5.0
    np.testing.assert_array_equal(d2.delta_theta({"objective": [0, 1]}).numpy(), w0.numpy())


def test_from_params_keeps_inequality_multipliers_nonnegative(setup):
    prob, kkt = setup
    loose = Constraint(lambda th: th[0], None, tau=float(kkt.theta[0]) + 10.0, name="loose")  # inactive
    p3 = ConstrainedProblem(kkt.theta, prob.objective, [*prob.constraints, loose])
    lam = np.append(kkt.lambdas.numpy(), -1e-9)  # inside the tolerance of the dual test
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pp.PolyprojWarning)
        k2 = KKTPoint.from_params(p3, kkt.theta, lam, polish=False, tol=1e-6)
    assert float(k2.lambdas.min()) >= 0.0 and k2.residuals["dual"] == 0.0


def test_from_params_keeps_a_binding_row_slightly_inside(setup):
    """A KKT point at tolerance tol may leave a binding row gⱼ ~ tol/λⱼ below zero, beyond active_tol:
    its multiplier keeps it active (it was classified inactive, the NNLS dropped it and the point was refused)."""
    prob, kkt = setup
    lam = kkt.lambdas.numpy()
    assert lam[0] > 1e-3  # "cap": th[1] <= 1, binding
    th = kkt.theta.clone()
    th[1] -= 3e-6  # slack 3e-6 > active_tol; complementarity lam * 3e-6, stationarity moves by O(3e-6)
    k = KKTPoint.from_params(prob, th, lam, tol=1e-4, active_tol=1e-6)
    assert k.classification["cap"] == "binding"
    assert not k.info["polished_multipliers"]
    np.testing.assert_allclose(k.lambdas.numpy(), lam)
    # without multipliers the NNLS may take the row too (lambda * 3e-6 <= tol: complementary at tol), and does
    kp = KKTPoint.from_params(prob, th, tol=1e-4, active_tol=1e-6)
    assert kp.classification["cap"] == "binding"
    np.testing.assert_allclose(kp.lambdas.numpy(), lam, rtol=1e-3)
    # a multiplier whose complementarity exceeds tol does not make a row active
    far = kkt.theta.clone()
    far[1] -= 0.5
    with pytest.raises(pp.ProblemError, match="not a KKT point"):
        KKTPoint.from_params(prob, far, lam, tol=1e-4, active_tol=1e-6)


# ----------------------------------------------------------------------------- found by probing as a user
def test_module_accessors_give_theta_not_the_frozen_copy():
    """m.parameters(), named_parameters(), state_dict(), get_submodule(), m[i] inside a loss or constraint
    resolve to θ's tensors: a norm constraint written with them binds (it was silently constant in θ,
    classified inactive, and solve returned a point with ‖θ‖² = 9 > τ = 1)."""
    from torch import nn

    torch.manual_seed(0)
    X = torch.randn(60, 3, dtype=torch.float64)
    y = X @ torch.tensor([2.0, -2.0, 1.0], dtype=torch.float64)
    mse = lambda m, b: (m(b[0]).squeeze(-1) - b[1]) ** 2  # noqa: E731
    norm2 = lambda m: sum((p ** 2).sum() for p in m.parameters())  # noqa: E731
    prob = ConstrainedProblem(nn.Linear(3, 1), Loss(mse, (X, y)), [Constraint(norm2, None, tau=1.0, name="norm")])
    kkt = solve(prob)
    assert kkt.status == ("binding",)
    assert abs(float((kkt.theta ** 2).sum()) - 1.0) <= 1e-8
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    forms = {"index": lambda m: m[2].bias.sum(), "negative index": lambda m: m[-1].bias.sum(),
             "get_submodule": lambda m: m.get_submodule("2").bias.sum(),
             "named_parameters": lambda m: dict(m.named_parameters())["2.bias"].sum(),
             "state_dict": lambda m: m.state_dict()["2.bias"].sum(),
             "modules": lambda m: list(m.modules())[3].bias.sum(),
             "children": lambda m: list(m.children())[2].bias.sum()}
    for name, fn in forms.items():
        p = ConstrainedProblem(net, Loss(mse, (X, y)), [Constraint(fn, None, tau=1.0, name="c")])
        _, G = pp.adapters.dif.calculus.constraint_jacobian(p, p.theta0)
        expect = np.zeros(p.dim)
        expect[-1] = 1.0  # d(bias of the last layer)/dθ: θ's last entry
        np.testing.assert_array_equal(G[0], expect, err_msg=name)


def test_terms_that_do_not_depend_on_theta_are_refused():
    X, y = torch.randn(20, 3, dtype=torch.float64), torch.randn(20, dtype=torch.float64)
    for fn in (lambda th: float(th.sum()), lambda th: th.detach().sum(), lambda th: th.sum().detach().numpy()):
        with pytest.raises(pp.ProblemError, match="does not depend on its parameter"):
            ConstrainedProblem(torch.zeros(3), Loss(_sq, (X, y)), [Constraint(fn, None, tau=1.0, name="c")])
    # a zero gradient at θ0 is not independence: ‖θ‖² at θ0 = 0 is accepted
    ConstrainedProblem(torch.zeros(3), Loss(_sq, (X, y)), [Constraint(lambda th: (th ** 2).sum(), None, tau=1.0)])


def test_data_free_constraints_with_defaulted_arguments_are_functions_of_theta():
    """``lambda th, j=j: th[j]`` (a loop variable captured as a default) takes θ alone (it was called as
    fn(θ, None), overwriting the default)."""
    X, y = torch.randn(20, 3, dtype=torch.float64), torch.randn(20, dtype=torch.float64)
    w = torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)
    cons = [Constraint(lambda th, j=j: th[j], None, tau=1.0, name=f"cap{j}") for j in range(2)]
    cons.append(Constraint(lambda th, w=w: w @ th, None, tau=1.5, name="lin"))
    prob = ConstrainedProblem(torch.zeros(3), Loss(_sq, (X, y)), cons)
    np.testing.assert_allclose(prob.constraint_values(torch.tensor([0.5, 2.0, 7.0], dtype=torch.float64)).numpy(),
                               [-0.5, 1.0, 1.0])


def test_a_kkt_point_of_another_tau_is_refused():
    """A KKT point of the same data with another τ can be stationary and feasible here: its constraint values
    (the classification) tell it apart (it gave a DIF twice the right one)."""
    rng = np.random.default_rng(0)
    X = torch.as_tensor(rng.normal(size=(40, 4)))
    y = X @ torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    mk = lambda tau: ConstrainedProblem(torch.zeros(4), Loss(_sq, (X, y)),  # noqa: E731
                                        [Constraint(lambda th: th[3], None, tau=tau, name="cap")])
    pa, pb = mk(2.0), mk(2.5)
    ka, kb = solve(pa), solve(pb)
    with pytest.raises(pp.ProblemError, match="'cap' is -0.5 here against 0"):
        DIF(pb, ka)
    DIF(pb, kb).delta_theta({"objective": [3]})  # its own point is accepted


def test_train_mode_layers_float32_test_data_nan_and_weights():
    from torch import nn

    X, y = torch.randn(30, 3, dtype=torch.float64), torch.randn(30, dtype=torch.float64)
    mse = lambda m, b: (m(b[0]).squeeze(-1) - b[1]) ** 2  # noqa: E731
    for layer in (nn.Dropout(0.2), nn.BatchNorm1d(4)):
        net = nn.Sequential(nn.Linear(3, 4), layer, nn.Linear(4, 1))
        with pytest.raises(pp.ProblemError, match="training mode.*model.eval"):
            ConstrainedProblem(net, Loss(mse, (X, y)))
        ConstrainedProblem(net.eval(), Loss(mse, (X, y)))
    # float32 test data through a module: cast to θ's float64, as the training data are
    prob = ConstrainedProblem(nn.Linear(3, 1), Loss(mse, (X, y)),
                              [Constraint(lambda m: m.weight.sum(), None, tau=0.3, name="ws")])
    dif = DIF(prob, solve(prob))
    Xt, yt = torch.randn(10, 3), torch.randn(10)
    np.testing.assert_allclose(dif.influence(lambda m: mse(m, (Xt, yt)).mean()).numpy(),
                               dif.influence(lambda m: mse(m, (Xt.double(), yt.double())).mean()).numpy(), rtol=1e-12)
    # NaN at θ0, a NaN gradient at a given point
    with pytest.raises(pp.ProblemError, match="NaN or inf at the initial parameters"):
        ConstrainedProblem(torch.zeros(3), Loss(lambda th, b: _sq(th, b) / 0.0, (X, y)))
    root = ConstrainedProblem(torch.zeros(3), Loss(lambda th, b: _sq(th, b) + torch.sqrt((th ** 2).sum()), (X, y)))
    with pytest.raises(pp.ProblemError, match="gradient is not finite"):
        KKTPoint.from_params(root, torch.zeros(3))
    # weights: one finite weight per sample
    for w, match in (([1.0] * 5, "one entry per sample"), (torch.full((30,), float("nan")), "NaN"),
                     (torch.zeros(30), "sum to 0"), ("abc", "array of numbers")):
        with pytest.raises(pp.ProblemError, match=match):
            Loss(_sq, (X, y), weights=w)
    with pytest.raises(pp.ProblemError, match="no data"):
        Constraint(lambda th: th.sum(), None, weights=[1.0])


def test_influence_arguments_are_checked_on_every_path(setup):
    prob, kkt = setup
    F = lambda th: (th ** 2).sum()  # noqa: E731
    for method in ("dense", "matrix-free"):
        dif = DIF(prob, kkt, method=method)
        for kwargs, match in (({"test_fn": 3}, "test_fn must be a callable"),
                              ({"executor": 3}, "executor must be"), ({"chunk_size": 0}, "chunk_size"),
                              ({"progress": "yes"}, "progress"),
                              ({"removals": {"objective": [1]}}, "pass \\[removal\\]"),
                              ({"removals": [{"objective": [[3, 4]]}]}, "1-D"),
                              ({"removals": [{"objective": list(range(30))}]}, "removes all")):
            args = {"test_fn": F, **kwargs}
            with pytest.raises(pp.ProblemError, match=match):
                dif.influence(args.pop("test_fn"), **args)
        with pytest.raises(pp.ProblemError, match="2 candidates"):
            dif.top_k(F, 5, candidates=[0, 1])
    with pytest.raises(pp.ProblemError, match="preconditioner"):
        DIF(prob, kkt, method="matrix-free", preconditioner="bad")
    with pytest.raises(pp.ProblemError, match="tol must be a positive"):
        solve(prob, tol=0)


def test_inconsistent_removal_under_dependent_constraints_is_the_same_error_on_both_paths():
    """Two copies of a group-risk constraint (LICQ fails), a removal from one copy: no direction moves both as
    asked. Both paths raise the same ProblemError (the dense one said the QP was PRIMAL_INFEASIBLE)."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(40, 4, generator=g, dtype=torch.float64)
    y = X @ torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64) + 0.3 * torch.randn(40, generator=g,
                                                                                       dtype=torch.float64)
    free = solve(ConstrainedProblem(torch.zeros(4), Loss(_sq, (X, y))))
    tau = 0.97 * float(_sq(free.theta, (X[:15], y[:15])).mean())
    prob = ConstrainedProblem(torch.zeros(4), Loss(_sq, (X, y)), [Constraint(_sq, (X[:15], y[:15]), tau=tau, name=k)
                                                                  for k in ("g1", "g2")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pp.PolyprojWarning)  # the LICQ warning
        kkt = solve(prob)
    both = {method: DIF(prob, kkt, method=method) for method in ("dense", "matrix-free")}
    np.testing.assert_allclose(both["dense"].delta_theta({"g1": [2], "g2": [2]}).numpy(),
                               both["matrix-free"].delta_theta({"g1": [2], "g2": [2]}).numpy(), rtol=1e-8)
    for dif in both.values():
        with pytest.raises(pp.ProblemError, match="move inconsistently"):
            dif.delta_theta({"g1": [2]})
        with pytest.raises(pp.ProblemError, match="move inconsistently"):
            dif.influence(lambda th: th.sum(), [{"g1": [2]}])


def _sq_loss(th, b):
    return (b[0] @ th - b[1]) ** 2


def _sq_norm(th):
    return (th ** 2).sum()


def _coordinate_sum(th):
    return th.sum()


def test_process_pool_executor_needs_picklable_functions():
    """A process pool pickles every job (the problem with it): module-level functions give the in-process
    scores; a lambda in the problem is a ProblemError that says what to do, not pickle's bare AttributeError."""
    from concurrent.futures import ProcessPoolExecutor

    rng = np.random.default_rng(0)
    X, y = torch.as_tensor(rng.normal(size=(30, 4))), torch.as_tensor(rng.normal(size=30))
    prob = ConstrainedProblem(torch.zeros(4), Loss(_sq_loss, (X, y)), [Constraint(_sq_norm, None, tau=0.05, name="n")])
    dif = DIF(prob, solve(prob))
    rems = [{"objective": [i]} for i in range(6)]
    with ProcessPoolExecutor(2) as ex:
        np.testing.assert_allclose(dif.influence(_coordinate_sum, rems, executor=ex, chunk_size=2).numpy(),
                                   dif.influence(_coordinate_sum, rems).numpy(), rtol=0, atol=1e-15)
        local = ConstrainedProblem(torch.zeros(4), Loss(_sq_loss, (X, y)),
                                   [Constraint(lambda th: (th ** 2).sum(), None, tau=0.05, name="n")])
        with pytest.raises(pp.ProblemError, match="module level"):
            DIF(local, solve(local)).influence(_coordinate_sum, rems, executor=ex, chunk_size=2)


def test_wrap_of_a_module_names_the_mistake():
    """A test function of a module problem receives the module; wrapping it again failed inside torch.split."""
    net = torch.nn.Sequential(torch.nn.Linear(2, 1)).double()
    X, y = torch.randn(8, 2, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    prob = ConstrainedProblem(net, Loss(lambda m, b: (m(b[0]).squeeze(-1) - b[1]) ** 2, (X, y)))
    with pytest.raises(pp.ProblemError, match="already receive the module"):
        prob.wrap(prob.wrap(torch.zeros(prob.dim, dtype=torch.float64)))


def _first_coordinate(th):
    return th[0]


@pytest.mark.timeout(300)
def test_fork_pool_after_openmp_teams_in_the_parent_does_not_hang():
    """A forked worker inherits the OpenMP runtime's state but not its threads: after the parent ran a team
    (torch on two threads; ProxSuite's solve_in_parallel, which the dual QPs of a weakly active constraint
    use), the child's first multithreaded region waited forever. Jobs on an executor run OpenMP on one
    thread in a forked child (runtime.openmp_threads, fork_safe_threads): the in-process scores."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from polyproj.runtime import set_torch_threads

    rng = np.random.default_rng(0)
    X, y = torch.as_tensor(rng.normal(size=(60, 4))), torch.as_tensor(rng.normal(size=60))
    free = solve(ConstrainedProblem(torch.zeros(4), Loss(_sq_loss, (X, y))))
    prob = ConstrainedProblem(torch.zeros(4), Loss(_sq_loss, (X, y)),
                              [Constraint(_first_coordinate, None, tau=float(free.theta[0]), name="weak")])
    kkt = solve(prob, warn=False)
    dif = DIF(prob, kkt)
    assert kkt.status[0] == "weakly_active"  # the sign-constrained dual QPs: ProxSuite's parallel batch
    prev = torch.get_num_threads()
    set_torch_threads(2)
    try:
        big = torch.randn(4_000_000, dtype=torch.float64)
        float((big.exp() + big.sin()).sum())  # a torch OpenMP team in this process
        rems = [{"objective": [i]} for i in range(12)]
        here = dif.influence(_coordinate_sum, rems)
        with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as ex:
            there = dif.influence(_coordinate_sum, rems, executor=ex, chunk_size=3)
    finally:
        set_torch_threads(prev)
    np.testing.assert_allclose(there.numpy(), here.numpy(), rtol=0, atol=1e-12)


_FORK_AFTER_SET_NUM_THREADS = """
import multiprocessing as mp, sys
from concurrent.futures import ProcessPoolExecutor
import numpy as np, torch
from polyproj.adapters.dif import DIF, ConstrainedProblem, Constraint, Loss, retrain, solve

def sq(th, b):
    return (b[0] @ th - b[1]) ** 2

def cap(th):
    return th[3]

def total(th):
    return th.sum()

if __name__ == "__main__":
    torch.set_num_threads(2)  # the standard call: it sets MKL's thread count too
    g = torch.Generator().manual_seed(0)
    X = torch.randn(80, 5, dtype=torch.float64, generator=g)
    y = X @ torch.tensor([1.0, -2.0, 0.5, 3.0, 1.0], dtype=torch.float64) + 0.3 * torch.randn(80, generator=g,
                                                                                           dtype=torch.float64)
    p = ConstrainedProblem(torch.zeros(5), Loss(sq, (X, y)), [Constraint(cap, None, tau=2.5, name="cap")])
    k = solve(p)
    dif = DIF(p, k, method="matrix-free")
    rems = [{"objective": [0]}, {"objective": [1]}]
    here, back = dif.influence(total, chunk_size=40), retrain(p, rems, warm_start=k)
    with ProcessPoolExecutor(1, mp_context=mp.get_context("fork")) as ex:
        there = dif.influence(total, executor=ex, chunk_size=40)
        again = retrain(p, rems, warm_start=k, executor=ex)
    assert float((there - here).abs().max()) <= 1e-12
    assert all(float((a.theta - b.theta).abs().max()) <= 1e-12 for a, b in zip(again, back))
    print("done")
"""


def test_fork_pool_after_torch_set_num_threads_does_not_hang(tmp_path):
    """``torch.set_num_threads(2)`` in the parent also sets MKL's count: a forked worker's first MKL product
    (the scores' ``g @ M``, the SQP's Hessian in ``retrain``) ran a team of 2 and never returned. A forked
    child now keeps one torch and one MKL thread (runtime.fork_safe_threads). In a fresh interpreter, so that
    this process's MKL count is left alone."""
    import os
    import subprocess
    import sys

    script = tmp_path / "fork_after_set_num_threads.py"
    script.write_text(_FORK_AFTER_SET_NUM_THREADS)
    # the polyproj this process imported (a checkout other than the installed one, too)
    root = str(Path(pp.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0 and out.stdout.strip().endswith("done"), out.stderr[-2000:]


def test_third_new_user_trial_of_the_engine(setup):
    """Found by trying the engine as a new user (each failed before): the dense path without constraints
    (a reshape of 0 rows), a loss vmap cannot trace on the matrix-free path, a weight decay written with
    ``p.requires_grad`` (its value was left out where values are computed without gradients), and the
    inputs of from_params, DIF, Loss, the preconditioner and tracin_scores that passed or failed raw."""
    import scipy.sparse.linalg as spla

    from polyproj.adapters.dif import classic_if, tracin_scores
    from polyproj.adapters.dif.calculus import objective_grad

    prob, kkt = setup
    X, y = prob.objective.data
    test = lambda th: _sq(th, (X[:5], y[:5])).mean()  # noqa: E731
    # no constraints: dense = matrix-free = classic IF; top_k on the dense path
    free = ConstrainedProblem(torch.zeros(4), Loss(_sq, (X, y)))
    kf = solve(free)
    rems = [{"objective": [1]}, {"objective": [2, 3]}]
    dense, mf = DIF(free, kf, method="dense"), DIF(free, kf, method="matrix-free", rtol=1e-12)
    want = torch.stack([classic_if(free, kf, r) for r in rems])
    torch.testing.assert_close(dense.influence(None, rems), want, rtol=1e-9, atol=1e-14)
    torch.testing.assert_close(dense.influence(test, rems), mf.influence(test, rems), rtol=1e-8, atol=1e-14)
    assert dense.top_k(test, 2)[0].tolist() == mf.top_k(test, 2)[0].tolist()

    # a Huber loss by boolean-mask indexing: vmap cannot trace it, jacrev takes over (same scores)
    def huber(th, b):
        r = b[0] @ th - b[1]
        out = (r ** 2).clone()
        big = r.abs() > 1.0
        out[big] = 2 * r[big].abs() - 1
        return out

    hp = ConstrainedProblem(torch.zeros(4), Loss(huber, (X, y)), [Constraint(lambda th: th[1], None, 1.0, "cap")])
    hk = solve(hp)
    hd, hm = DIF(hp, hk, method="dense"), DIF(hp, hk, method="matrix-free", rtol=1e-12)
    torch.testing.assert_close(hm.influence(test), hd.influence(test), rtol=1e-8, atol=1e-14)

    # the p.requires_grad idiom: values and gradients of one objective (finite differences)
    net = torch.nn.Linear(4, 1).double()
    net.bias.requires_grad_(False)

    def decayed(m, b):
        reg = sum((p ** 2).sum() for p in m.parameters() if p.requires_grad)
        return (m(b[0]).squeeze(-1) - b[1]) ** 2 + reg

    mp = ConstrainedProblem(net, Loss(decayed, (X, y)))
    th = mp.theta0
    _, g = objective_grad(mp, th)
    e = torch.zeros(mp.dim, dtype=torch.float64)
    e[0] = 1e-6
    with torch.no_grad():
        fd = (mp.objective_value(th + e) - mp.objective_value(th - e)) / 2e-6
    assert abs(float(g[0]) - float(fd)) <= 1e-6 * max(1.0, abs(float(fd)))

    # inputs
    for bad in (float("nan"), "1e-6", -1.0, 0.0):
        with pytest.raises(pp.ProblemError, match="tol must be a positive finite number"):
            KKTPoint.from_params(prob, kkt.theta, kkt.lambdas, tol=bad)
    with pytest.raises(pp.ProblemError, match="must be 1-D"):
        KKTPoint.from_params(prob, kkt.theta[None, :], kkt.lambdas)
    listed = KKTPoint.from_params(prob, kkt.theta.tolist(), kkt.lambdas)  # floats: float64, not float32
    assert torch.equal(listed.theta, kkt.theta)
    with pytest.raises(pp.ProblemError, match="renormalize must be True or False"):
        DIF(prob, kkt, renormalize="no")
    with pytest.raises(pp.ProblemError, match="renormalize must be True or False"):
        Loss(_sq, (X, y), renormalize="no")
    torch.testing.assert_close(DIF(prob, kkt, damping=torch.tensor(1e-3)).delta_theta(rems[0]),
                               DIF(prob, kkt, damping=1e-3).delta_theta(rems[0]))
    Hinv = np.linalg.inv(DIF(prob, kkt, method="dense").H)
    ref = DIF(prob, kkt, method="dense").delta_theta(rems[1])
    for good in (Hinv, spla.aslinearoperator(Hinv), lambda v: torch.as_tensor(Hinv) @ torch.as_tensor(v)):
        got = DIF(prob, kkt, method="matrix-free", preconditioner=good, rtol=1e-12).delta_theta(rems[1])
        torch.testing.assert_close(got, ref, rtol=1e-8, atol=1e-14)
    for bad, match in ((lambda v: v[:3], "returned shape"), (lambda v: v * np.nan, "NaN or inf"),
                       (np.eye(3), "shape")):
        with pytest.raises(pp.ProblemError, match=match):
            DIF(prob, kkt, method="matrix-free", preconditioner=bad).delta_theta(rems[1])
    with pytest.raises(pp.ProblemError, match="not positive definite"):
        DIF(prob, kkt, method="matrix-free", krylov="minres", preconditioner=lambda v: -v).delta_theta(rems[1])
    # tracin: a KKTPoint is a checkpoint; wrong sizes and counts say so
    pair = tracin_scores(prob, [(kkt.theta, kkt.lambdas)], test, rems)
    np.testing.assert_array_equal(tracin_scores(prob, [kkt], test, rems), pair)
    with pytest.raises(pp.ProblemError, match="θ has 3 entries"):
        tracin_scores(prob, [(kkt.theta[:3], None)], test, rems)
    with pytest.raises(pp.ProblemError, match="one finite learning rate per checkpoint"):
        tracin_scores(prob, [kkt], test, rems, weights=[1.0, 2.0])
    # float32 tensors held by a function: the problem computes in float64
    w32 = torch.ones(4)
    with pytest.raises(pp.ProblemError, match="float64 on the CPU"):
        ConstrainedProblem(torch.zeros(4), Loss(_sq, (X, y)), [Constraint(lambda th: th @ w32, None, 1.0, "lin")])
    with pytest.raises(pp.ProblemError, match="test_fn failed .*float64 on the CPU"):
        DIF(prob, kkt).influence(lambda th: (X[:5].float() @ th).sum(), rems)


def test_tied_parameters_resolve_to_theta_under_every_name():
    """``b.weight = a.weight``: θ holds the tensor once (named_parameters drops the duplicate), and a loss written
    with ``m.b(...)`` or ``state_dict()['b.weight']`` got the module's frozen copy: another objective, gradient
    1.68 at the forward-written problem's KKT point."""
    from torch import nn

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.out = nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 1)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.out(torch.tanh(self.b(torch.tanh(self.a(x))))).squeeze(-1)

    torch.manual_seed(0)
    X, y = torch.randn(40, 3, dtype=torch.float64), torch.randn(40, dtype=torch.float64)

    def full(m, b):
        return (m(b[0]) - b[1]) ** 2

    def sub(m, b):
        return (m.out(torch.tanh(m.b(torch.tanh(m.a(b[0]))))).squeeze(-1) - b[1]) ** 2

    net = Tied().double()
    p_full, p_sub = (ConstrainedProblem(net, Loss(f, (X, y))) for f in (full, sub))
    theta = p_full.theta0 + 0.3
    assert float(p_full.objective_value(theta)) == pytest.approx(float(p_sub.objective_value(theta)), rel=1e-14)
    w = p_sub.wrap(theta)
    assert torch.equal(w.b.weight, w.a.weight) and torch.equal(w.state_dict()["b.weight"], w.a.weight)


def test_meta_tensors_are_named_not_raw_torch_errors():
    from torch import nn

    X, y = torch.randn(10, 3, dtype=torch.float64), torch.randn(10, dtype=torch.float64)
    with torch.device("meta"):
        net = nn.Linear(3, 1)
    with pytest.raises(pp.ProblemError, match="'meta' device"):
        ConstrainedProblem(net, Loss(lambda m, b: (m(b[0]).squeeze(-1) - b[1]) ** 2, (X, y)))
    with pytest.raises(pp.ProblemError, match="'meta' device"):
        Loss(_sq, (X.to("meta"), y))
    prob = ConstrainedProblem(torch.zeros(3), Loss(_sq, (X, y)))
    with pytest.raises(pp.ProblemError, match="'meta' device"):
        KKTPoint.from_params(prob, torch.zeros(3, device="meta"))


def test_second_order_of_a_removal_that_moves_nothing_is_zero_without_a_warning():
    """Data of an inactive constraint only: ω = 0, the correction at rounding; ‖δ‖/max(‖ω‖, 1e-300) was 7e284 and
    warned that the removal lay outside the expansion's range."""
    torch.manual_seed(0)
    X = torch.randn(50, 3, dtype=torch.float64)
    y = X @ torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
    prob = ConstrainedProblem(torch.zeros(3), Loss(_sq, (X, y)), [Constraint(_sq, (X[:10], y[:10]), tau=5.0,
                                                                             name="grp")])
    dif = DIF(prob, solve(prob))
    with warnings.catch_warnings():
        warnings.simplefilter("error", pp.PolyprojWarning)
        res = dif.result({"grp": [0]}, order=2)
        scores = dif.influence(lambda th: th.sum(), [{"grp": [0]}, {}], order=2)
    assert res.order == 2 and res.correction_ratio == 0.0 and float(res.omega.abs().max()) == 0.0
    assert scores.abs().max() == 0.0


def test_finite_rule_refuses_a_removal_whose_answer_depends_on_the_multipliers_split():
    """Two copies of a binding constraint (LICQ fails): every split of λ̄ between them is a KKT point, and a removal
    from one copy gave answers 0.11 to 0.93 (relative) from retraining by the split. Refused; a removal from both
    copies alike is split-invariant and kept."""
    torch.manual_seed(0)
    N = 120
    X = torch.randn(N, 4, dtype=torch.float64)
    X[:, -1] = 1.0
    y = (torch.sigmoid(X @ torch.tensor([1.5, -1.0, 0.7, 0.2], dtype=torch.float64))
         > torch.rand(N, dtype=torch.float64)).double()
    grp = torch.arange(N) < 50
    a = torch.where(grp, N / grp.sum(), -N / (~grp).sum()).double()

    def logloss(th, b):
        return torch.nn.functional.binary_cross_entropy_with_logits(b[0] @ th, b[1], reduction="none") + \
            1e-3 * (th ** 2).sum()

    def dp(th, b):
        return b[1] * (b[0] @ th)

    prob = ConstrainedProblem(torch.zeros(4), Loss(logloss, (X, y)),
                              [Constraint(dp, (X, a), tau=-1.0039, name=k) for k in ("dp", "dp2")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pp.PolyprojWarning)  # multipliers not unique
        kkt = solve(prob)
        total = float(kkt.lambdas.sum())
        splits = [KKTPoint.from_params(prob, kkt.theta, [f * total, (1 - f) * total], polish=False)
                  for f in (0.5, 1.0, 0.2)]
    for k in splits:
        with pytest.raises(pp.ProblemError, match="multipliers are not unique"):
            DIF(prob, k, rule="finite").delta_theta({"dp": [4]})
    both = [DIF(prob, k, rule="finite").delta_theta({"dp": [4], "dp2": [4]}).numpy() for k in splits]
    np.testing.assert_allclose(both[1], both[0], atol=1e-10)
    np.testing.assert_allclose(both[2], both[0], atol=1e-10)


def test_a_loss_without_curvature_is_named_when_the_sqp_does_not_converge():
    """An L1 loss on a linear model: its Hessian is zero everywhere, its minimum on a kink, and the SQP circled it
    until max_iter with the advice to raise max_iter or loosen tol; the error now says why."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(60, 3, dtype=torch.float64, generator=g)
    y = X @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) + 0.1 * torch.randn(60, dtype=torch.float64,
                                                                                      generator=g)
    problem = ConstrainedProblem(torch.zeros(3, dtype=torch.float64),
                                 Loss(lambda th, b: (b[0] @ th - b[1]).abs(), (X, y)),
                                 [Constraint(lambda th: th[0], None, tau=0.5, name="cap")])
    with pytest.raises(pp.SolverError, match="Hessian of the Lagrangian is zero.*twice-differentiable"):
        solve(problem, method="sqp", max_iter=30)


def test_unbounded_dif_qp_is_refused_on_every_dense_path():
    """H singular and a removal's linear term off its range (per-sample slopes in θ₁ whose mean is zero): the DIF
    QP is unbounded. delta_theta refused it (the backend's DUAL_INFEASIBLE), while the batched solve behind
    influence / top_k polished ProxSuite's finite x with P + 1e-12 I into 'solved' scores of ~1e10. A bounded QP
    with singular P whose solution lies far along null(P) is still solved exactly."""
    from polyproj.adapters.dif.qp import solve_qp_exact

    gen = torch.Generator().manual_seed(0)
    X, y, s = (torch.randn(60, generator=gen, dtype=torch.float64) for _ in range(3))
    s = s - s.mean()
    prob = ConstrainedProblem(torch.zeros(2), Loss(lambda th, b: (b[0] * th[0] - b[1]) ** 2 + b[2] * th[1],
                                                   (X, y, s)))
    dif = DIF(prob, solve(prob), method="dense")
    for call in (lambda: dif.delta_theta({"objective": [0]}), lambda: dif.influence(lambda th: th.sum()),
                 lambda: dif.influence(None, [{"objective": [0]}, {"objective": [1]}]),
                 lambda: dif.top_k(lambda th: th.sum(), 2)):
        with pytest.raises(pp.SolverError, match="DUAL_INFEASIBLE"):
            call()
    sol = solve_qp_exact(np.diag([1.0, 0.0]), np.array([0.5, 1.0]), np.array([[0.0, -1e-4]]), np.array([1.0]),
                         np.zeros(1, bool))
    assert sol.status is pp.Status.SOLVED and np.allclose(sol.x, [-0.5, -1e4], rtol=1e-10)


def test_dense_paths_through_the_schur_complement_refuse_a_saddle():
    """A stationary saddle without constraints (H eigenvalues −3.75, 1.36, 2.26): the DIF QP is not convex, which
    delta_theta and in-process influence said, while the score job of an executor solved with H by LU and
    returned numbers; ``order=2`` (also through H⁻¹) is refused the same way. With damping past the negative
    curvature the paths agree."""
    from concurrent.futures import ThreadPoolExecutor

    gen = torch.Generator().manual_seed(0)
    X = torch.randn(60, 3, generator=gen, dtype=torch.float64)
    y = torch.randn(60, generator=gen, dtype=torch.float64)
    prob = ConstrainedProblem(torch.zeros(3), Loss(lambda th, b: (b[0] @ th - b[1]) ** 2 - 3.0 * th[0] ** 2,
                                                   (X, y)))
    H = 2 * X.T @ X / 60 - torch.diag(torch.tensor([6.0, 0.0, 0.0], dtype=torch.float64))
    assert float(torch.linalg.eigvalsh(H)[0]) < -1.0
    kkt = KKTPoint.from_params(prob, torch.linalg.solve(H, 2 * X.T @ y / 60))
    dif = DIF(prob, kkt, method="dense")
    with ThreadPoolExecutor(1) as ex:
        for call in (lambda: dif.influence(lambda th: th.sum(), executor=ex),
                     lambda: dif.delta_theta({"objective": [0]}, order=2),
                     lambda: dif.delta_theta({"objective": [0]})):
            with pytest.raises(pp.SolverError, match="not convex"):
                call()
        damped = DIF(prob, kkt, method="dense", damping=5.0)
        here = damped.influence(lambda th: th.sum()).numpy()
        there = damped.influence(lambda th: th.sum(), executor=ex).numpy()
    assert np.allclose(here, there, rtol=1e-10, atol=1e-14)


def test_a_test_function_that_leaves_torch_or_is_complex_is_named(setup):
    """test_fn returning a NumPy value (.numpy() on the traced θ) raised torch's bare RuntimeError about a data
    pointer, and a complex one torch's error about real outputs: now ProblemErrors that say what is wrong."""
    prob, kkt = setup
    dif = DIF(prob, kkt)
    with pytest.raises(pp.ProblemError, match="torch operations"):
        dif.influence(lambda th: th.detach().numpy().sum())
    with pytest.raises(pp.ProblemError, match="real scalar"):
        dif.influence(lambda th: th.sum().to(torch.complex128))
