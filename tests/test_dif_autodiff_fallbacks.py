"""DIF on losses that torch cannot differentiate every way: no forward-mode derivative (H·v and the dense
Hessian reverse-over-reverse), no double backward (a ProblemError), and per-sample losses that vmap cannot
trace (per-sample gradients by jacrev, whatever vmap's error)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as Fn

from polyproj.adapters.dif import DIF, ConstrainedProblem, Constraint, Loss, solve
from polyproj.adapters.dif.calculus import lagrangian_hessian, reverse_only
from polyproj.adapters.dif.hvp import HessianOperator, LossPieces
from polyproj.adapters.dif.scores import per_sample_grads_vmap
from polyproj.errors import ProblemError

pytestmark = [pytest.mark.filterwarnings("ignore::polyproj.errors.PolyprojWarning"),
              pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning"),
              pytest.mark.usefixtures("one_torch_thread", "quiet_polyproj_warnings")]


def _rel(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def _data(n: int = 40):
    g = torch.Generator().manual_seed(3)
    X = torch.randn(n, 4, dtype=torch.float64, generator=g)
    w = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    return X, X @ w + 0.3 * torch.randn(n, dtype=torch.float64, generator=g)


def _huber(th, b):
    return Fn.huber_loss(b[0] @ th, b[1], reduction="none", delta=1.0)


def _soft_margin(th, b):  # ridge term: the labels are separable
    return Fn.soft_margin_loss(b[0] @ th, torch.sign(b[1]), reduction="none") + 0.05 * (th ** 2).sum()


def _problem(fn, cap: float, group: float) -> ConstrainedProblem:
    X, y = _data()
    # the objective's loss also in a binding group-risk constraint: constraint pieces take the fallback too
    return ConstrainedProblem(torch.zeros(4), Loss(fn, (X, y)),
                              [Constraint(lambda th: th[3], None, tau=cap, name="cap"),
                               Constraint(fn, (X[:10], y[:10]), tau=group, name="group")])


def _F(th):
    return (th ** 2).sum() + th[0]


# ----------------------------------------------------------------------------- no forward-mode AD
@pytest.mark.parametrize("krylov", ["cg", "minres"])
def test_huber_matrix_free_equals_dense(krylov, monkeypatch):
    prob = _problem(_huber, 0.5, 1.1)
    kkt = solve(prob)
    assert kkt.status == ("binding", "binding")
    forward = []
    plain = LossPieces._hvp_forward

    def counted(self, theta, v):
        forward.append(1)
        return plain(self, theta, v)

    monkeypatch.setattr(LossPieces, "_hvp_forward", counted)
    dense = DIF(prob, kkt, method="dense")
    free = DIF(prob, kkt, method="matrix-free", krylov=krylov, rtol=1e-13)
    for rem in ({"objective": [1]}, {"objective": [0, 5, 9], "group": [2]}):
        assert _rel(free.delta_theta(rem).numpy(), dense.delta_theta(rem).numpy()) < 1e-8
    assert _rel(free.influence(_F).numpy(), dense.influence(_F).numpy()) < 1e-8
    # forward mode was refused once; the problem's later products went straight to reverse-over-reverse
    assert reverse_only(prob)
    assert len(forward) == 1


def test_reverse_over_reverse_products_equal_the_hessian():
    prob = _problem(_huber, 0.5, 1.1)
    theta, lam = torch.tensor([0.9, -1.7, 0.4, 0.5], dtype=torch.float64), np.array([0.3, 0.7])
    H = lagrangian_hessian(prob, theta, lam)  # torch.func.hessian works on huber_loss: forward mode
    assert not reverse_only(prob)
    H_free = HessianOperator(prob, theta, lam, chunk_size=16).dense()  # jvp refused: vjp of grad
    assert reverse_only(prob)
    np.testing.assert_allclose(H_free, H, rtol=0, atol=1e-13 * np.abs(H).max())
    np.testing.assert_allclose(lagrangian_hessian(prob, theta, lam), H, rtol=0, atol=1e-13 * np.abs(H).max())


def test_soft_margin_solve_and_dif():
    prob = _problem(_soft_margin, 0.2, 0.5)
    kkt = solve(prob)  # the SQP's dense Hessian: torch.func.hessian refused, jacrev of jacrev
    assert kkt.residual < 1e-9 and reverse_only(prob)
    assert kkt.status == ("binding", "binding")
    # ∇² mean log(1 + exp(−s xᵀθ)) = mean σ(1 − σ) x xᵀ (σ = σ(s xᵀθ)), + 0.1 I of the ridge; "cap" is linear
    X, y = _data()
    s = torch.sigmoid(torch.sign(y) * (X @ kkt.theta))
    c = (s * (1 - s)).numpy()
    Xn, lam = X.numpy(), kkt.lambdas.numpy()
    H = (Xn.T * c) @ Xn / 40 + lam[1] * (Xn[:10].T * c[:10]) @ Xn[:10] / 10 + 0.1 * (1 + lam[1]) * np.eye(4)
    np.testing.assert_allclose(lagrangian_hessian(prob, kkt.theta, lam), H, rtol=1e-12, atol=1e-15)
    dense = DIF(prob, kkt, method="dense")
    free = DIF(prob, kkt, method="matrix-free", rtol=1e-13)
    for rem in ({"objective": [1]}, {"objective": [0, 5, 9], "group": [2]}):
        assert _rel(free.delta_theta(rem).numpy(), dense.delta_theta(rem).numpy()) < 1e-8
    assert _rel(free.influence(_F).numpy(), dense.influence(_F).numpy()) < 1e-8


def test_no_double_backward_is_a_problem_error():
    g = torch.Generator().manual_seed(5)
    X = torch.randn(30, 3, dtype=torch.float64, generator=g)
    lab = torch.randint(0, 3, (30,), generator=g)

    def multi_margin(th, b):  # neither a forward-mode derivative nor a double backward in torch
        return Fn.multi_margin_loss(b[0] @ th.reshape(3, 3), b[1], reduction="none")

    prob = ConstrainedProblem(torch.zeros(9), Loss(multi_margin, (X, lab)))
    with pytest.raises(ProblemError, match="second derivatives") as err:
        solve(prob)
    assert "the Hessian of the Lagrangian" in str(err.value) and "multi_margin_loss" in str(err.value)
    with pytest.raises(ProblemError, match="Hessian-vector product.*second derivatives"):
        HessianOperator(prob, torch.full((9,), 0.1, dtype=torch.float64), []).matvec(np.ones(9))


# ----------------------------------------------------------------------------- vmap cannot trace the loss
def _tolist_loss(th, b):
    r = b[0] @ th - b[1]
    scale = max([*r.detach().abs().tolist(), 1.0])  # a batch statistic read in Python: no vmap
    return r ** 2 * (scale / scale)


def _loop_grads(prob, name, theta, idx):
    """Per-sample gradients by torch.autograd.grad of each loss of the full batch."""
    t = theta.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        losses = prob.per_sample(prob.loss(name), t)
        return np.stack([torch.autograd.grad(losses[i], t, retain_graph=True)[0].numpy() for i in idx])


def test_vmap_fallback_on_tolist_loss():
    X, y = _data()
    prob = ConstrainedProblem(torch.zeros(4), Loss(_tolist_loss, (X, y)),
                              [Constraint(lambda th: th[3], None, tau=2.9, name="cap")])
    kkt = solve(prob)
    idx = np.array([0, 3, 7, 11, 39])
    g, v = per_sample_grads_vmap(prob, "objective", kkt.theta, idx)
    np.testing.assert_allclose(g.numpy(), _loop_grads(prob, "objective", kkt.theta, idx), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(v.numpy(), ((X[idx] @ kkt.theta - y[idx]) ** 2).numpy(), rtol=1e-13)
    dense = DIF(prob, kkt, method="dense").influence(_F).numpy()
    for chunk in (None, 7):  # one chunk, and several (vmap not retried after its first refusal)
        free = DIF(prob, kkt, method="matrix-free", rtol=1e-13).influence(_F, chunk_size=chunk).numpy()
        assert _rel(free, dense) < 1e-8


@pytest.mark.parametrize("error", [ValueError, TypeError, IndexError, NotImplementedError])
def test_vmap_fallback_whatever_the_error(error):
    X, y = _data()
    state = {"fail": None}
    sizes = []

    def loss(th, b):  # refuses single-sample batches (vmap's view), or every batch when told to
        sizes.append(b[0].shape[0])
        if state["fail"] == "polyproj" and b[0].shape[0] < 2:
            raise ProblemError("a diagnosis of the loss")
        if b[0].shape[0] < 2 or state["fail"] == "always":
            raise error("needs a batch of two samples or more")
        return (b[0] @ th - b[1]) ** 2

    prob = ConstrainedProblem(torch.zeros(4), Loss(loss, (X, y)))
    theta = torch.tensor([0.5, -1.0, 0.2, 2.0], dtype=torch.float64)
    idx = np.arange(2, 30, 3)
    g, _ = per_sample_grads_vmap(prob, "objective", theta, idx)
    np.testing.assert_allclose(g.numpy(), _loop_grads(prob, "objective", theta, idx), rtol=1e-12, atol=1e-14)
    # the fallback's own error is raised, chained to vmap's
    state["fail"] = "always"
    with pytest.raises(error) as err:
        per_sample_grads_vmap(prob, "objective", theta, idx)
    assert isinstance(err.value.__cause__, error) and err.value.__cause__ is not err.value
    # a polyproj error is a diagnosis, not vmap failing to trace: raised as it is, no jacrev of the chunk
    state["fail"] = "polyproj"
    sizes.clear()
    with pytest.raises(ProblemError, match="a diagnosis") as err:
        per_sample_grads_vmap(prob, "objective", theta, idx)
    assert err.value.__cause__ is None and sizes == [1]


class _OnceSquare(torch.autograd.Function):
    """x² with a backward PyTorch cannot differentiate (``@once_differentiable``) and no jvp."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return x * x

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2.0 * x * g


def _once_loss(th, b):
    return _OnceSquare.apply(b[0] @ th - b[1])


def test_a_backward_reverse_mode_reads_as_constant_is_refused_not_zero():
    """Reverse mode takes a ``@once_differentiable`` backward for a constant: with no jvp to fall back from,
    its Hessian came out 0 (ω from H = 0 + damping, silently). The first reverse-over-reverse product is
    checked against central differences of the gradient: a ProblemError saying what is missing."""
    X, y = _data()
    prob = ConstrainedProblem(torch.zeros(4), Loss(_once_loss, (X, y)))
    theta = torch.linalg.lstsq(X, y[:, None]).solution[:, 0]
    for _ in range(2):  # a caller that catches the error and tries again gets it again, not H = 0
        with pytest.raises(ProblemError, match="central differences"):
            lagrangian_hessian(prob, theta, np.zeros(0))
    prob = ConstrainedProblem(torch.zeros(4), Loss(_once_loss, (X, y)))
    op = HessianOperator(prob, theta, np.zeros(0))
    for _ in range(2):
        with pytest.raises(ProblemError, match="central differences"):
            op.matvec(np.ones(4))


def test_vmap_is_not_retried_once_it_refused_a_loss():
    """Each chunk of ``influence`` is a score job of its own: vmap was tried (and failed) again in every one."""
    X, y = _data()
    calls = []

    def loss(th, b):  # vmap's view is one sample: refused
        calls.append(b[0].shape[0])
        if b[0].shape[0] < 2:
            raise ValueError("needs a batch of two samples or more")
        return (b[0] @ th - b[1]) ** 2

    prob = ConstrainedProblem(torch.zeros(4), Loss(loss, (X, y)), [Constraint(lambda th: th[3], None, tau=2.9)])
    kkt = solve(prob)
    calls.clear()
    DIF(prob, kkt, method="matrix-free").influence(_F, chunk_size=7)  # 6 chunks
    assert calls.count(1) == 1
