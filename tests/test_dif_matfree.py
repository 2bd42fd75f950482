"""DIF matrix-free path: agreement with the dense path in every regime, Krylov reporting, indefinite
Hessians, vmap per-sample gradients, executors, non-convex training to a KKT point."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

import polyproj as pp
from polyproj.adapters.dif import DIF, ConstrainedProblem, Constraint, KKTPoint, Loss, retrain, solve
from polyproj.adapters.dif.krylov import IndefiniteHessianError
from polyproj.adapters.dif.scores import per_sample_grads_vmap
from tests.dif_helpers import flat_along_a_cap, net_sq, untrained_tanh

pytestmark = [pytest.mark.filterwarnings("ignore::polyproj.errors.PolyprojWarning"),
              pytest.mark.usefixtures("one_torch_thread", "quiet_polyproj_warnings")]


def _rel(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


# ----------------------------------------------------------------------------- matrix-free = dense
def test_matrix_free_equals_dense_every_regime(study):
    prob, kkt = study.problem, study.kkt
    assert set(kkt.classification.values()) == {"equality", "binding", "weakly_active", "inactive"}
    dense = DIF(prob, kkt, method="dense")
    free = DIF(prob, kkt, method="matrix-free", rtol=1e-13)
    seen_weak_on = seen_weak_off = False
    for rem in study.removals[:12]:
        a, b = dense.result(rem), free.result(rem)
        assert _rel(b.omega.numpy(), a.omega.numpy()) < 1e-8
        np.testing.assert_allclose(b.constraint_change, a.constraint_change, atol=1e-8 * float(a.omega.abs().max()))
        # active sets agree up to weakly active rows (zero multiplier and zero change: either answer is exact)
        names = list(kkt.names)
        for name in set(a.active) ^ set(b.active):
            j = names.index(name)
            scale = 1e-8 * (1.0 + float(np.abs(a.multipliers).max()))
            assert abs(a.multipliers[j]) <= scale and abs(b.multipliers[j]) <= scale, (name, a.active, b.active)
            assert abs(a.constraint_change[j]) <= 1e-8 * float(a.omega.abs().max()), (name, a.active, b.active)
        seen_weak_on |= "weak5" in b.active
        seen_weak_off |= "weak5" not in b.active
    assert seen_weak_on and seen_weak_off
    # all-point scores and removals with constraint data
    s_dense, s_free = dense.influence(study.test_loss).numpy(), free.influence(study.test_loss).numpy()
    assert _rel(s_free, s_dense) < 1e-8
    assert _rel(free.influence(study.test_loss, study.removals).numpy(),
                dense.influence(study.test_loss, study.removals).numpy()) < 1e-8


def test_group_removal_matrix_free_is_joint(study):
    """A group with a weakly active constraint: the joint removal (not the sum), equal on both paths."""
    prob, kkt = study.problem, study.kkt
    dense, free = DIF(prob, kkt, method="dense"), DIF(prob, kkt, method="matrix-free", rtol=1e-13)
    singles = [dense.result({"objective": [i]}) for i in range(40)]
    on = [i for i, r in enumerate(singles) if "weak5" in r.active]
    off = [i for i, r in enumerate(singles) if "weak5" not in r.active and r.constraint_change[3] < -1e-6]
    group = {"objective": [on[0], off[0]]}
    joint_d, joint_f = dense.delta_theta(group).numpy(), free.delta_theta(group).numpy()
    assert _rel(joint_f, joint_d) < 1e-8
    summed = singles[on[0]].omega.numpy() + singles[off[0]].omega.numpy()
    assert np.max(np.abs(summed - joint_d)) > 1e-3 * np.max(np.abs(joint_d))
    g_f = free.influence(study.test_loss, [group]).numpy()
    g_d = dense.influence(study.test_loss, [group]).numpy()
    assert _rel(g_f, g_d) < 1e-8
    idx, joint = free.top_k(study.test_loss, 3)
    assert idx.size == 3
    np.testing.assert_allclose(joint, float(dense.influence(study.test_loss, [{"objective": idx}])[0]),
                               rtol=1e-8)


def test_matrix_free_equals_dense_on_mlp(mlp):
    prob, kkt, removals, _ = mlp
    assert kkt.classification == {"group": "binding", "bias_cap": "weakly_active"}
    dense = DIF(prob, kkt, method="dense")
    free = DIF(prob, kkt, method="matrix-free", rtol=1e-13)
    assert dense.method == "dense" and free.method == "matrix-free"
    for rem in removals[:8]:
        assert _rel(free.delta_theta(rem).numpy(), dense.delta_theta(rem).numpy()) < 1e-8

    def F(m):
        return (m(mlp[3][0][:10]) ** 2).mean()

    assert _rel(free.influence(F, removals).numpy(), dense.influence(F, removals).numpy()) < 1e-8


def test_krylov_residuals_and_iterations_are_reported(study):
    free = DIF(study.problem, study.kkt, method="matrix-free", rtol=1e-11)
    free.influence(study.test_loss)
    log = free.krylov_log
    whats = [w for w, _ in log]
    assert sum(w.startswith("H⁻¹∇g_A") for w in whats) == free.rows.size and "s_test = H⁻¹∇F" in whats
    for _, info in log:
        assert info.method == "cg" and 0 < info.iterations <= 10 * study.problem.dim
        assert info.converged and info.residual <= 1e-10  # the true residual, checked by one more product
        assert info.min_curvature > 0
    with pytest.raises(pp.SolverError, match="stopped at relative residual"):
        DIF(study.problem, study.kkt, method="matrix-free", rtol=1e-14, maxiter=2)


# ----------------------------------------------------------------------------- indefinite H
@pytest.fixture(scope="module")
def indefinite():
    """H indefinite along θ₁, positive definite on null(C_B) (θ₁ fixed by an equality); θ₂ capped weakly."""
    rng = np.random.default_rng(1)
    X = torch.as_tensor(rng.normal(size=(40, 3)))
    y = torch.as_tensor(rng.normal(size=40))

    def loss(th, b):
        return (b[0] @ th - b[1]) ** 2 - 3.0 * th[1] ** 2

    cons = [Constraint(lambda th: th[1], None, tau=0.3, name="fix1", kind="eq")]
    k0 = solve(ConstrainedProblem(torch.zeros(3), Loss(loss, (X, y)), cons))
    cons.append(Constraint(lambda th: th[2], None, tau=float(k0.theta[2]), name="weak2"))
    prob = ConstrainedProblem(torch.zeros(3), Loss(loss, (X, y)), cons)
    kkt = solve(prob, theta0=k0.theta, lambdas0=[float(k0.lambdas[0]), 0.0])
    return prob, kkt


def kkt_solve(P, q, C, u):
    """``[[P, Cᵀ], [C, 0]] [x; z] = [-q; u]`` by a dense solve (the independent reference)."""
    n, k = P.shape[0], C.shape[0]
    K = np.block([[P, C.T], [C, np.zeros((k, k))]])
    sol = np.linalg.lstsq(K, np.concatenate([-q, u]), rcond=None)[0]
    return sol[:n], sol[n:]


def _kkt_reference(dif, removal):
    """The DIF QP by enumeration of the weak row (equality or free), each a dense KKT solve."""
    c, r = dif._terms(removal)
    H = dif.lin.H
    u = -r[dif.rows]
    for keep in (np.array([True, True]), np.array([True, False])):
        x, z = kkt_solve(H, c, dif.C[keep], u[keep])
        if keep[1] and z[1] >= -1e-12:
            return x
        if not keep[1] and dif.C[1] @ x <= u[1] + 1e-12:
            return x
    raise AssertionError("no active set satisfies the KKT conditions")


def test_indefinite_hessian_cg_error_minres_exact(indefinite):
    prob, kkt = indefinite
    assert kkt.classification == {"fix1": "equality", "weak2": "weakly_active"}
    assert np.linalg.eigvalsh(DIF(prob, kkt, method="dense").lin.H)[0] < 0
    with pytest.raises(IndefiniteHessianError, match="not positive definite.*damping.*minres"):
        DIF(prob, kkt, method="matrix-free")
    mr = DIF(prob, kkt, method="matrix-free", krylov="minres", rtol=1e-13)
    assert mr.dual.reduced  # S is indefinite: the binding multipliers are eliminated first
    for i in range(6):
        rem = {"objective": [i]}
        assert _rel(mr.delta_theta(rem).numpy(), _kkt_reference(mr, rem)) < 1e-8
    damped = DIF(prob, kkt, method="matrix-free", damping="auto")
    assert damped.damping > 0 and np.all(np.isfinite(damped.delta_theta({"objective": [0]}).numpy()))
    # the dense path: H convexified by the equality row (same solution and multipliers), then polished;
    # one removal and the batch give the same ω
    dense = DIF(prob, kkt, method="dense")
    rems = [{"objective": [i]} for i in range(6)]
    batch = dense.influence(None, rems).numpy()
    for i, rem in enumerate(rems):
        res = dense.result(rem)
        assert res.status is pp.Status.SOLVED
        assert _rel(res.omega.numpy(), _kkt_reference(mr, rem)) < 1e-8
        assert _rel(batch[i], res.omega.numpy()) < 1e-10


def test_singular_psd_hessian_auto_damping_bounds_the_condition():
    """Least squares with dependent features (rank 10 of d = 30, as an over-parameterised model's H): H is
    singular to rounding. damping='auto' bounds cond(H + δI) (AUTO_MAX_CONDITION) on both paths instead of
    the stationarity floor (~1e-14, where the matrix-free path failed), and the test-loss scores (test points
    in the features' span: the same for every solution of the singular QP) agree with the undamped dense
    path's to the damping's bias. Undamped CG says H is singular, not indefinite."""
    from polyproj.adapters.dif.engine import AUTO_MAX_CONDITION

    rng = np.random.default_rng(0)
    W = rng.normal(size=(10, 30))
    X, y = torch.as_tensor(rng.normal(size=(40, 10)) @ W), torch.as_tensor(rng.normal(size=40))
    Xt, yt = torch.as_tensor(rng.normal(size=(15, 10)) @ W), torch.as_tensor(rng.normal(size=15))
    prob = ConstrainedProblem(torch.zeros(30, dtype=torch.float64), Loss(lambda th, b: (b[0] @ th - b[1]) ** 2, (X, y)),
                              [Constraint(lambda th: th[:5].sum(), None, tau=0.5, kind="eq", name="s")])
    kkt = solve(prob, tol=1e-10)
    assert kkt.suggested_damping < 1e-12

    def test_loss(th):
        return ((Xt @ th - yt) ** 2).mean()

    exact = DIF(prob, kkt, method="dense", damping=0.0)
    w = np.linalg.eigvalsh(exact.lin.H)
    assert abs(w[0]) < 1e-12 * w[-1] and w[19] < 1e-12 * w[-1] < w[20]  # rank 10
    ref = exact.influence(test_loss).numpy()
    with pytest.raises(IndefiniteHessianError, match="singular.*damping='auto'"):
        DIF(prob, kkt, method="matrix-free")
    for method, bias in (("dense", 1e-6), ("matrix-free", 1e-5)):
        dif = DIF(prob, kkt, method=method, damping="auto")
        assert w[-1] / AUTO_MAX_CONDITION * 0.01 <= dif.damping <= w[-1] * 1e-5
        assert _rel(dif.influence(test_loss).numpy(), ref) < bias, method


def test_dependent_active_constraints_matrix_free_equals_dense():
    """LICQ fails (two active constraints with parallel gradients): the dual matrix is singular; the
    minimum-norm multipliers give the unique ω on both paths."""
    rng = np.random.default_rng(3)
    X = torch.as_tensor(rng.normal(size=(100, 3)))
    y = X @ torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64) + 0.1 * torch.as_tensor(rng.normal(size=100))
    sq = lambda th, b: (b[0] @ th - b[1]) ** 2  # noqa: E731
    F = lambda th: sq(th, (X[:5], y[:5])).mean()  # noqa: E731
    for kind in ("eq", "ineq"):
        prob = ConstrainedProblem(torch.zeros(3), Loss(sq, (X, y)), [
            Constraint(lambda th: th[2], None, tau=1.0, name="c1", kind=kind),
            Constraint(lambda th: 2 * th[2], None, tau=2.0, name="c2", kind=kind)])
        kkt = solve(prob, warn=False)
        dense, mf = DIF(prob, kkt, method="dense"), DIF(prob, kkt, method="matrix-free")
        for rem in ({"objective": [0, 1]}, {"objective": [7]}):
            assert _rel(mf.delta_theta(rem).numpy(), dense.delta_theta(rem).numpy()) < 1e-8, kind
        np.testing.assert_allclose(mf.influence(F).numpy(), dense.influence(F).numpy(), rtol=0,
                                   atol=1e-8 * float(dense.influence(F).abs().max()))


# ----------------------------------------------------------------------------- vmap, executors
def test_vmap_grads_and_scores_equal_per_sample_loop(mlp):
    prob, kkt, removals, _ = mlp
    idx = np.array([0, 3, 7, 11])
    g, v = per_sample_grads_vmap(prob, "objective", kkt.theta, idx)
    X, y = prob.objective.data
    for k, i in enumerate(idx):
        ref = torch.func.grad(lambda t, i=i: prob.per_sample(prob.objective, t, (X[i:i + 1], y[i:i + 1]))[0])(
            kkt.theta)
        np.testing.assert_allclose(g[k].numpy(), ref.numpy(), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(float(v[k]), float(prob.per_sample(prob.objective, kkt.theta,
                                                                      (X[i:i + 1], y[i:i + 1]))[0]), rtol=1e-13)
    free = DIF(prob, kkt, method="matrix-free", rtol=1e-12)

    def F(m):
        return (m(X[:10]) ** 2).mean()

    scores = free.influence(F, removals[:8], chunk_size=7).numpy()  # per-sample gradients 7 at a time
    gF = torch.func.grad(lambda t: F(prob.wrap(t)))(kkt.theta).numpy()
    loop = np.array([free.delta_theta(r).numpy() @ gF for r in removals[:8]])
    assert _rel(scores, loop) < 1e-8


def test_executors_equal_in_process(mlp):
    distributed = pytest.importorskip("distributed")
    prob, kkt, removals, (X, _) = mlp
    free = DIF(prob, kkt, method="matrix-free", rtol=1e-12, chunk_size=16)

    def F(m):
        return (m(X[:10]) ** 2).mean()

    ref = free.influence(F, removals).numpy()
    before = [p.detach().clone() for p in prob.model.parameters()]
    with ThreadPoolExecutor(2) as ex:
        # the same arithmetic in other threads: equal up to the order of BLAS reductions (thread counts differ)
        np.testing.assert_allclose(free.influence(F, removals, executor=ex).numpy(), ref, rtol=1e-12,
                                   atol=1e-14 * float(np.abs(ref).max()))
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        got = free.influence(F, removals, executor=client.get_executor()).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14 * float(np.abs(ref).max()))
    # functional calls from several threads leave the shared module's own parameters as they were
    after = list(prob.model.parameters())
    assert all(p.is_leaf for p in after)
    assert all(torch.equal(a.detach(), b) for a, b in zip(after, before, strict=True))
    # the dense path scores on an executor too, with the same answers as its own in-process scores
    dense = DIF(prob, kkt, method="dense")
    with ThreadPoolExecutor(2) as ex:
        assert _rel(dense.influence(F, removals, executor=ex).numpy(), dense.influence(F, removals).numpy()) < 1e-8


# ----------------------------------------------------------------------------- non-convex training
def test_solve_reaches_kkt_on_nonconvex_mlp(mlp):
    prob, kkt, removals, _ = mlp
    assert kkt.residual <= 1e-11 and kkt.classification["group"] == "binding"
    H = DIF(prob, kkt, method="dense").lin.H
    assert H.shape == (31, 31)
    # the augmented Lagrangian + Newton-MINRES path from the untrained net reaches the same tolerance
    k2 = solve(ConstrainedProblem(prob.model, prob.objective, prob.constraints[:1]), method="auglag", tol=1e-10)
    assert k2.residual <= 1e-10 and k2.info["method"] == "auglag"
    # a trained net handed over as a module: residual reported, used as the damping floor
    net = prob.model
    with torch.no_grad():
        for p, t in zip(net.parameters(), torch.split(kkt.theta, [p.numel() for p in net.parameters()]), strict=True):
            p.copy_(t.reshape(p.shape))
    k3 = KKTPoint.from_params(prob, net, tol=1e-8)
    assert k3.residual <= 1e-8 and k3.suggested_damping == k3.residuals["stationarity"]
    loo = retrain(prob, removals[0], warm_start=kkt, tol=1e-10)
    assert loo.residual <= 1e-10


# ----------------------------------------------------------------------------- Newton-MINRES preconditioned by H̄
def _frozen_at(prob, theta, lam):
    from polyproj.adapters.dif.hvp import HessianOperator
    from polyproj.adapters.dif.newton import FrozenHessian

    return FrozenHessian(HessianOperator(prob, theta, lam).dense())


def _hidden_unit_symmetry(theta: np.ndarray, hidden: int = 6, inputs: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """(order, signs) of the conftest MLP's hidden units at θ: flipping a tanh unit's sign (its input row,
    bias and output weight) and permuting units leave every loss unchanged, so a trained KKT point is one
    of 2ᵏ·k! equivalent points, and which one depends on the rounding of the training path (ATen's default
    kernels round the initial float32 weights differently in the last bit and land on a flipped, permuted
    copy). The canonical copy has positive output weights in increasing order."""
    w2 = theta[hidden * (inputs + 1):hidden * (inputs + 2)]
    signs = np.where(w2 < 0, -1.0, 1.0)
    return np.argsort(signs * w2, kind="stable"), signs


def _equivariant(theta: np.ndarray, v: np.ndarray, hidden: int = 6, inputs: int = 3) -> np.ndarray:
    """v (given in the canonical copy's coordinates) carried to θ's copy: the same displacement relative to
    every equivalent KKT point, hence the same iterations on every machine."""
    order, signs = _hidden_unit_symmetry(theta, hidden, inputs)
    out = np.array(v, dtype=np.float64)
    unit = lambda a, ncol: a.reshape(hidden, ncol)  # noqa: E731
    W1 = unit(v[:hidden * inputs], inputs)
    b1 = v[hidden * inputs:hidden * (inputs + 1)]
    w2 = v[hidden * (inputs + 1):hidden * (inputs + 2)]
    W1o, b1o, w2o = np.empty_like(W1), np.empty_like(b1), np.empty_like(w2)
    W1o[order], b1o[order], w2o[order] = W1 * signs[order, None], b1 * signs[order], w2 * signs[order]
    out[:hidden * inputs], out[hidden * inputs:hidden * (inputs + 1)] = W1o.reshape(-1), b1o
    out[hidden * (inputs + 1):hidden * (inputs + 2)] = w2o
    return out


def test_newton_minres_preconditioned_reaches_kkt_and_matches_plain_step(mlp):
    """From a perturbed start, H̄-preconditioned Newton-MINRES reaches KKT residual 1e-11 in a few steps,
    MINRES needs ~3 iterations once H ≈ H̄ (the preconditioned KKT matrix's three eigenvalue clusters),
    and each step is the unpreconditioned step (the same linear system)."""
    from polyproj.adapters.dif.newton import _kkt_step, first_order, newton_kkt

    prob, kkt, _, _ = mlp
    lam = kkt.lambdas.numpy()
    frozen = _frozen_at(prob, kkt.theta, lam)
    # the start: a fixed displacement from the canonical copy of the KKT point, carried to the copy the training
    # reached here (a displacement fixed in θ's own coordinates is another start on another machine). The counts
    # below are those of this start (6 Newton steps, MINRES 26, 34, 10, 6, 4, 3 on every kernel set tried): a
    # displacement of this size is partly outside Newton's quadratic region, so other starts take 5-10 steps.
    shift = _equivariant(kkt.theta.numpy(), np.random.default_rng(2).normal(size=prob.dim))
    th0 = kkt.theta + 0.01 * torch.as_tensor(shift)
    th, lam_out, info = newton_kkt(prob, th0, lam, tol=1e-11, preconditioner=frozen)
    assert info.converged and info.residuals[-1] <= 1e-11 and info.residuals[0] > 1e-2
    assert len(info.residuals) - 1 <= 6 and info.method == "newton-minres (H̄-preconditioned)"
    assert info.krylov_iterations[-1] <= 5 and max(info.krylov_residuals) <= 1e-9
    assert float((th - kkt.theta).abs().max()) < 1e-8 and np.allclose(lam_out, lam, atol=1e-9)
    # one step from the perturbed start, with and without the preconditioner
    _, gf, g, G = first_order(prob, th0)
    A = np.array([0, 1])
    d_pre, l_pre, it_pre, _ = _kkt_step(gf, G[A], g[A], prob, th0, lam, 2048, 1e-12, frozen)
    d_plain, l_plain, it_plain, _ = _kkt_step(gf, G[A], g[A], prob, th0, lam, 2048, 1e-12)
    assert _rel(d_pre, d_plain) < 1e-8 and _rel(l_pre, l_plain) < 1e-8
    assert it_pre < it_plain


def test_newton_minres_finishes_where_chord_stalls(mlp):
    """A 10 % group removal (the group-risk multiplier moves by 17 %) and a frozen H̄ from another point:
    the chord SQP stalls; preconditioned Newton-MINRES from where it stopped reaches 1e-11."""
    from polyproj.adapters.dif.newton import first_order, kkt_residuals, newton_kkt

    prob, kkt, removals, _ = mlp
    lam = kkt.lambdas.numpy()
    frozen = _frozen_at(prob, kkt.theta, lam)
    idx = list(range(1, 60, 10))
    rem = {"objective": idx, "group": [k for i in idx for k in removals[i].get("group", [])]}
    p2 = prob.remove(rem)
    th_c, lam_c, chord = newton_kkt(p2, kkt.theta, lam, tol=1e-11, hessian=frozen, max_iter=30)
    assert not chord.converged and chord.residuals[-1] > 1e-5
    th, lam2, info = newton_kkt(p2, th_c, lam_c, tol=1e-11, preconditioner=frozen)
    assert info.converged and len(info.residuals) - 1 <= 6
    _, gf, g, G = first_order(p2, th)  # checked independently of the solver's bookkeeping
    assert max(kkt_residuals(gf, G, g, lam2, p2.eq_mask).values()) <= 1e-11
    assert lam2[0] > 0.1 and abs(lam2[0] - lam[0]) > 0.03
    # H̄ from a different point (θ̄ + 0.3·noise, shifted to be positive definite): the chord's first
    # step cannot lower the residual; as a preconditioner it still gives the exact Newton step
    other = _frozen_at(prob, kkt.theta + 0.3 * torch.as_tensor(np.random.default_rng(2).normal(size=prob.dim)), lam)
    th0 = kkt.theta + 0.01 * torch.as_tensor(np.random.default_rng(1).normal(size=prob.dim))
    _, _, chord = newton_kkt(prob, th0, lam, tol=1e-11, hessian=other)
    assert not chord.converged
    th, _, info = newton_kkt(prob, th0, lam, tol=1e-11, preconditioner=other)
    assert info.converged and float((th - kkt.theta).abs().max()) < 1e-8


def test_newton_kkt_rejects_hessian_and_preconditioner(mlp):
    from polyproj.adapters.dif.newton import newton_kkt

    prob, kkt, _, _ = mlp
    frozen = _frozen_at(prob, kkt.theta, kkt.lambdas.numpy())
    with pytest.raises(ValueError, match="not both"):
        newton_kkt(prob, kkt.theta, kkt.lambdas.numpy(), hessian=frozen, preconditioner=frozen)


def test_auto_damping_covers_solves_after_the_setup():
    """No active constraint: the matrix-free setup solves nothing, so the first Krylov solve is s_test's, which
    meets the negative curvature of an untrained tanh net. damping='auto' raised an IndefiniteHessianError there
    (asking for the damping it was meant to choose); now it raises the damping, sets the path up again, and
    the scores are those of a DIF built with that damping (matrix-free and dense)."""
    prob, kkt, X, y = untrained_tanh(60, 8)
    assert kkt.classification == {"cap": "inactive"}

    def test_loss(m):
        return net_sq(m, (X[:5], y[:5])).mean()

    with pytest.raises(IndefiniteHessianError):
        DIF(prob, kkt, method="matrix-free").influence(test_loss)
    auto = DIF(prob, kkt, method="matrix-free", damping="auto", rtol=1e-12)
    floor = auto.damping
    scores = auto.influence(test_loss).numpy()
    assert auto.damping > floor  # raised at s_test's solve
    fixed = DIF(prob, kkt, method="matrix-free", damping=auto.damping, rtol=1e-12).influence(test_loss).numpy()
    dense = DIF(prob, kkt, method="dense", damping=auto.damping).influence(test_loss).numpy()
    assert _rel(scores, fixed) < 1e-8 and _rel(scores, dense) < 1e-7


def _concave_first(th, b):
    """Least squares minus 3 θ₀²: the Lagrangian's Hessian is indefinite along θ₀ only."""
    return (b[0] @ th - b[1]) ** 2 - 3.0 * th[0] ** 2


def _theta0(th):
    return th[0]


def test_dense_auto_damping_reads_the_curvature_on_the_binding_rows_null_space():
    """H with eigenvalues (−4, 1.4, 1.9, 2.8), positive definite on the null space of the binding cap θ₀ <= 0.7:
    second-order sufficiency holds and the DIF is defined. damping="auto" on the dense path damped past the
    full H's most negative eigenvalue (δ = 4.4) and returned ω 74 % off retraining, while dense at damping 0
    and matrix-free MINRES (which checks Zᵀ H Z) agreed with each other. The dense rule now reads Zᵀ H Z too."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(60, 4, dtype=torch.float64, generator=g)
    y = X @ torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64) + 0.3 * torch.randn(60, dtype=torch.float64,
                                                                                        generator=g)
    prob = ConstrainedProblem(torch.zeros(4), Loss(_concave_first, (X, y)), [Constraint(_theta0, None, tau=0.7)])
    kkt = solve(prob, theta0=torch.tensor([0.7, -2.0, 0.5, 3.0], dtype=torch.float64))
    assert kkt.status[0] == "binding"
    rem = {"objective": [3]}
    exact = DIF(prob, kkt, method="dense").delta_theta(rem)
    assert np.linalg.eigvalsh(DIF(prob, kkt, method="dense").H)[0] < -3.0
    for kw in (dict(method="dense"), dict(), dict(method="matrix-free", krylov="minres")):
        dif = DIF(prob, kkt, damping="auto", **kw)
        assert dif.damping <= 1e-8
        assert _rel(dif.delta_theta(rem), exact) <= 1e-8
    truth = retrain(prob, rem, warm_start=kkt).theta - kkt.theta
    assert _rel(exact, truth) <= 0.05  # first order: ~3 % off the removal's finite effect


def test_dense_auto_damping_keeps_h_clear_of_singular_for_the_schur_paths():
    """H singular along a constrained direction (PD on the binding row's null space): the dense QP is exact with
    the stationarity floor alone, but an executor's scores and order 2 solve with H + δI itself. With δ ~ 6e-16
    that solve was singular and the executor's scores 11 % off the in-process ones; δ now also keeps every
    eigenvalue of H + δI at least λ_max / AUTO_MAX_CONDITION from zero."""
    from polyproj.adapters.dif.engine import AUTO_MAX_CONDITION

    prob, kkt = flat_along_a_cap(60)
    dif = DIF(prob, kkt, method="dense", damping="auto")
    w = np.linalg.eigvalsh(dif.H)
    assert np.abs(w).min() >= 0.99 * np.abs(w).max() / AUTO_MAX_CONDITION

    def F(th):
        return th.sum() + (th ** 2).sum()

    here = dif.influence(None).numpy() @ torch.func.grad(F)(kkt.theta).numpy()  # ω by the dense QPs
    assert _rel(dif.influence(F).numpy(), here) <= 1e-7  # the Schur route (H + δI is positive definite)
    with ThreadPoolExecutor(1) as ex:
        assert _rel(dif.influence(F, executor=ex).numpy(), here) <= 1e-7
    assert _rel(DIF(prob, kkt, method="matrix-free", damping="auto").influence(F).numpy(), here) <= 1e-7
