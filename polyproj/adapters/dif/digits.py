"""The fairness-constrained network study on sklearn's digits (offline stand-in for non-iid MNIST).

1,797 8×8 images, split 70/30 (stratified), the training part spread over ``n_clients`` clients
with skewed class mixes (for each class a Dirichlet(α) share per client); each test image goes to
a client by the same shares. Model: a small all-convolutional net (Springenberg et al.: strided
convolutions only, no pooling or dense layers, tanh so that the loss is smooth). Problem::

    minimise  mean CE(zᵢ, θ) + (wd/2)‖θ‖²    s.t.  Rⱼ(θ) = mean_{client j} CE <= τⱼ  (every client)

with τⱼ = R̄ + τ (R̄ the mean client risk of the unconstrained solution), so the clients that the
unconstrained model serves worst bind; then ``n_weak`` inactive clients get τⱼ = Rⱼ(θ̄) (active with
zero multiplier: weakly active by construction). Shared by ``benchmarks/dif_fairness.py`` and its
smoke test; needs scikit-learn (the ``dif`` extra).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from .kkt import KKTPoint
from .newton import augmented_lagrangian, first_order
from .problem import ConstrainedProblem, Constraint, Loss

__all__ = ["DigitsClients", "FairnessStudy", "allconv_net", "cross_entropy_loss", "load_digits_clients",
           "make_fairness_study"]


@dataclass(frozen=True, eq=False)
class DigitsClients:
    """Images (n, 1, 8, 8) float64, labels, and client ids of the training and test parts."""

    X: torch.Tensor
    y: torch.Tensor
    client: np.ndarray
    X_test: torch.Tensor
    y_test: torch.Tensor
    client_test: np.ndarray
    n_clients: int


def load_digits_clients(seed: int = 0, n_clients: int = 10, alpha: float = 0.5, test_frac: float = 0.3,
                        n_train: int | None = None) -> DigitsClients:
    """Digits split into non-iid clients (``n_train`` caps the training part, for quick runs)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=test_frac, stratify=y, random_state=seed)
    if n_train is not None and n_train < len(ytr):
        Xtr, _, ytr, _ = train_test_split(Xtr, ytr, train_size=n_train, stratify=ytr, random_state=seed)
    rng = np.random.default_rng(seed)
    share = rng.dirichlet(alpha * np.ones(n_clients), size=10)  # share[c, j]: class c's share of client j

    def assign(labels: np.ndarray) -> np.ndarray:
        return np.array([rng.choice(n_clients, p=share[c]) for c in labels])

    ctr, cte = assign(ytr), assign(yte)
    for j in range(n_clients):  # no empty client
        if not np.any(ctr == j):
            ctr[rng.integers(len(ctr))] = j
    T = torch.as_tensor

    def img(A: np.ndarray) -> torch.Tensor:
        return T(A / 16.0, dtype=torch.float64).reshape(-1, 1, 8, 8)

    return DigitsClients(img(Xtr), T(ytr), ctr, img(Xte), T(yte), cte, n_clients)


def allconv_net(widths: tuple[int, int, int] = (16, 32, 40), seed: int = 0) -> nn.Module:
    """All-convolutional net for 8×8 inputs: 3×3/2, 3×3/2, 2×2, 1×1 convolutions, tanh (float64)."""
    torch.manual_seed(seed)
    a, b, c = widths
    return nn.Sequential(nn.Conv2d(1, a, 3, stride=2, padding=1), nn.Tanh(),
                         nn.Conv2d(a, b, 3, stride=2, padding=1), nn.Tanh(),
                         nn.Conv2d(b, c, 2), nn.Tanh(), nn.Conv2d(c, 10, 1), nn.Flatten()).double()


def cross_entropy_loss(wd: float = 0.0):
    """Per-sample ``CE(model(x), y) + (wd/2)‖θ‖²`` for ``Loss(fn, (X, y))`` (θ: the module's parameters)."""
    def per_sample(model, batch):
        logits = model(batch[0])
        ce = nn.functional.cross_entropy(logits, batch[1], reduction="none")
        if wd:
            sq = sum((p ** 2).sum() for p in _params(model))
            ce = ce + 0.5 * wd * sq
        return ce
    return per_sample


def _params(model) -> list[torch.Tensor]:
    params = model.__dict__.get("_params")
    return list(params.values()) if params is not None else list(model.parameters())


def _ce(model, batch):
    return nn.functional.cross_entropy(model(batch[0]), batch[1], reduction="none")


@dataclass(eq=False)
class FairnessStudy:
    """The problem at its KKT point, test functions, and what training recorded."""

    problem: ConstrainedProblem
    kkt: KKTPoint
    data: DigitsClients
    test_loss: object
    client_test_loss: object
    level: float
    unconstrained_risks: np.ndarray
    checkpoints: list = field(default_factory=list)
    info: dict = field(default_factory=dict)


def _test_fn(X: torch.Tensor, y: torch.Tensor):
    def f(model) -> torch.Tensor:
        return nn.functional.cross_entropy(model(X), y)
    return f


def make_fairness_study(seed: int = 0, *, tau: float | None = None, wd: float = 1e-3, n_weak: int = 2,
                        widths: tuple[int, int, int] = (16, 32, 40), n_train: int | None = None,
                        target_client: int | None = None, tol: float = 1e-6, chunk_size: int = 4096,
                        n_clients: int = 10) -> FairnessStudy:
    """Build the study and train it (augmented Lagrangian + L-BFGS) to KKT residual ``tol``.

    The returned KKT point is what ``KKTPoint.from_params`` makes of the trained θ (multipliers
    polished); a tighter point is obtained with :func:`polyproj.adapters.dif.newton.newton_kkt`.
    ``tau`` defaults to halfway between the third and fourth largest unconstrained client risk
    (minus R̄), so that about three clients bind.
    """
    D = load_digits_clients(seed, n_clients=n_clients, n_train=n_train)
    net = allconv_net(widths, seed)
    obj = Loss(cross_entropy_loss(wd), (D.X, D.y))
    p0 = ConstrainedProblem(net, obj)
    checkpoints: list = []
    th0, _, info0 = augmented_lagrangian(p0, p0.theta0, np.zeros(0), tol=tol, chunk_size=chunk_size)
    def client_data(j: int):
        idx = torch.as_tensor(np.flatnonzero(D.client == j))
        return (D.X[idx], D.y[idx])

    risks0 = np.array([float(_ce(p0.wrap(th0), client_data(j)).mean()) for j in range(n_clients)])
    rbar = float(risks0.mean())
    srt = np.sort(risks0)[::-1]
    if tau is None:
        tau = 0.5 * (srt[2] + srt[3]) - rbar
    level = rbar + tau
    cons = [Constraint(_ce, client_data(j), tau=level, name=f"client{j}") for j in range(n_clients)]
    p1 = ConstrainedProblem(net, obj, cons)
    th1, lam1, info1 = augmented_lagrangian(p1, th0, np.zeros(n_clients), tol=tol, chunk_size=chunk_size)
    checkpoints += [(th0, np.zeros(n_clients)), (th1, lam1)]
    _, _, g1, _ = first_order(p1, th1, chunk_size)
    inactive = np.flatnonzero(g1 < -1e-4)
    weak = inactive[np.argsort(-g1[inactive])][:n_weak]  # the inactive clients closest to the level
    taus = [level] * n_clients
    for j in weak:
        taus[j] = float(g1[j] + level)
    cons = [Constraint(_ce, client_data(j), tau=taus[j], name=f"client{j}") for j in range(n_clients)]
    problem = ConstrainedProblem(net, obj, cons)
    kkt = KKTPoint.from_params(problem, th1, lam1, tol=max(10 * tol, 1e-5), active_tol=1e-6, warn=False)
    tc = int(np.argmax(risks0)) if target_client is None else int(target_client)
    it = torch.as_tensor(np.flatnonzero(D.client_test == tc))
    return FairnessStudy(problem=problem, kkt=kkt, data=D, test_loss=_test_fn(D.X_test, D.y_test),
                         client_test_loss=_test_fn(D.X_test[it], D.y_test[it]), level=level,
                         unconstrained_risks=risks0, checkpoints=checkpoints,
                         info={"tau": tau, "weak": [int(j) for j in weak], "target_client": tc,
                               "train_unconstrained": info0, "train_constrained": info1, "wd": wd})
