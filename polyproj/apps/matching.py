"""Partial graph matching of synthetic keypoint sets with outliers.

Each pair: ``inliers`` source points uniform in ``[-1, 1]²``; their targets under a random affine map
(rotation, anisotropic scaling, shear, translation) with Gaussian noise; ``outliers`` extra points on
each side (uniform in the source square and in its image); the target points shuffled. The ground truth
is the partial permutation matrix of the inliers. Features come from the coordinates only: each set is
centred on its mean, and every point enters as ``(x, y, which set)``; both sets go through a small
transformer encoder as one sequence (:class:`Matcher`: ``layers`` layers of width ``hidden``, 4 heads),
the score matrix is ``S = s · E₁E₂ᵀ / √h`` (``s`` learned), and the constraint map turns ``S`` into
``X ∈ {X >= 0, X1 <= 1, Xᵀ1 <= 1, ΣX <= α}`` with ``α = inliers``. Loss: ``‖X − X_gt‖²_F`` per pair;
prediction: ``X_ij > 0.5`` (a partial matching for any feasible ``X``: at most one such entry per row
and column); metric: F1 of the predicted pairs. Methods: polyproj's exact projection onto the partial
matching polytope (``pp.sets.PartialMatching``) and LinSATNet at two iteration counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ProblemError
from ..sets.matching import PartialMatching
from .measure import Session
from .peers import LinSAT
from .records import RunRecord, worst
from .training import COUNT, NON_NEGATIVE, POSITIVE, UNIT, Range, check_config, fit

__all__ = ["METHODS", "METRIC", "RANGES", "TITLE", "Config", "config", "run", "variants"]

TITLE = "Partial graph matching (synthetic keypoints with outliers)"
METRIC = "test F1"
METHODS = ("polyproj", "linsatnet_i10", "linsatnet_i100")
LINSAT_ITERS = {"linsatnet_i10": 10, "linsatnet_i100": 100}


@dataclass(frozen=True)
class Config:
    """Data, model and training settings."""

    inliers: int = 10
    outliers: int = 3
    noise: float = 0.03
    rotation: float = 30.0
    scaling: float = 0.2
    shear: float = 0.2
    translation: float = 0.2
    train: int = 2048
    val: int = 256
    test: int = 1024
    hidden: int = 64
    layers: int = 2
    epochs: int = 15
    batch: int = 32
    lr: float = 3e-3
    linsat_tau: float = 0.05
    #: validation F1 whose first epoch is reported as the time to target (the README's column; at this preset
    #: the best validation F1 of every method stays near 0.66-0.72, so 0.8 was never reached)
    f1_target: float = 0.65


#: every setting's allowed values (run() refuses others by name): outliers >= 0 (any count); noise a standard
#: deviation; rotation (degrees), shear and translation half-widths of uniform draws ``[-r, r]``; scaling draws the
#: axis factors from ``[1 - s, 1 + s]``, positive only for ``s < 1``; linsat_tau (a temperature) divides the scores; the
#: target is an F1 score. hidden must also be a multiple of 4 (checked in run()).
RANGES: dict[str, Range] = {
    "inliers": COUNT, "outliers": Range(0), "noise": NON_NEGATIVE, "rotation": NON_NEGATIVE,
    "scaling": Range(0.0, 1.0, open_high=True), "shear": NON_NEGATIVE, "translation": NON_NEGATIVE,
    "train": COUNT, "val": COUNT, "test": COUNT, "hidden": COUNT, "layers": COUNT, "epochs": COUNT, "batch": COUNT,
    "lr": POSITIVE, "linsat_tau": POSITIVE, "f1_target": UNIT}


def config(quick: bool) -> Config:
    """The full preset, or the quick one (fewer pairs and epochs)."""
    return Config(train=192, val=64, test=128, epochs=2) if quick else Config()


def variants(cfg: Config) -> tuple[str, ...]:
    """One variant."""
    return ("",)


# ----------------------------------------------------------------------------- data
@dataclass(frozen=True)
class Pairs:
    """Source and target points (centred) and the ground-truth matchings."""

    D1: torch.Tensor  # (pairs, m, 2)
    D2: torch.Tensor
    X: torch.Tensor  # (pairs, m, m) 0/1


def _affine(rng: np.random.Generator, cfg: Config) -> np.ndarray:
    """A random affine map near the identity: rotation, anisotropic scaling, shear (``cfg``'s ranges)."""
    th = np.deg2rad(rng.uniform(-cfg.rotation, cfg.rotation))
    R = np.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]])
    S = np.diag(rng.uniform(1 - cfg.scaling, 1 + cfg.scaling, 2))
    return R @ S @ np.array([[1.0, rng.uniform(-cfg.shear, cfg.shear)], [0.0, 1.0]])


def make_pairs(count: int, cfg: Config, rng: np.random.Generator) -> Pairs:
    """``count`` random pairs (see the module docstring); coordinates centred on each set's mean."""
    k, o = cfg.inliers, cfg.outliers
    m = k + o
    src, tgt, X = np.empty((count, m, 2)), np.empty((count, m, 2)), np.zeros((count, m, m))
    for i in range(count):
        M, t = _affine(rng, cfg), rng.uniform(-cfg.translation, cfg.translation, 2)
        P = rng.uniform(-1, 1, (k, 2))
        Q = P @ M.T + t + cfg.noise * rng.normal(size=(k, 2))
        src[i] = np.vstack([P, rng.uniform(-1, 1, (o, 2))])
        out = rng.uniform(-1, 1, (o, 2)) @ M.T + t
        perm = rng.permutation(m)
        tgt[i] = np.vstack([Q, out])[perm]
        inv = np.argsort(perm)  # target row j holds original point perm[j]; point p sits at inv[p]
        X[i, np.arange(k), inv[:k]] = 1.0
    src -= src.mean(1, keepdims=True)
    tgt -= tgt.mean(1, keepdims=True)
    return Pairs(torch.tensor(src), torch.tensor(tgt), torch.tensor(X))


# ----------------------------------------------------------------------------- model
def partial_matching_rows(m: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Row sums, column sums and the total of an m × m matrix (row-major), ``<= [1, 1, α]``."""
    A = np.vstack([np.kron(np.eye(m), np.ones((1, m))), np.kron(np.ones((1, m)), np.eye(m)), np.ones((1, m * m))])
    return A, np.r_[np.ones(2 * m), alpha]


class Head(torch.nn.Module):
    """Score matrices (batch, m, m) -> points of the partial matching polytope."""

    def __init__(self, method: str, cfg: Config) -> None:
        super().__init__()
        m, alpha = cfg.inliers + cfg.outliers, float(cfg.inliers)
        self.m, self.method = m, method
        if method == "polyproj":
            from ..adapters.torch import ProjectionLayer

            self.map = ProjectionLayer(PartialMatching(m, m, max_matches=alpha))
        elif method in LINSAT_ITERS:
            A, b = partial_matching_rows(m, alpha)
            self.map = LinSAT(m * m, cfg.linsat_tau, LINSAT_ITERS[method], A=A, b=b)
        else:
            raise ProblemError(f"unknown matching method {method!r}")

    def forward(self, S: torch.Tensor) -> torch.Tensor:
        """The map of ``S`` (batch, m, m)."""
        if self.method == "polyproj":
            return self.map(S)
        return self.map(S.reshape(S.shape[0], -1)).reshape(S.shape)


class Matcher(torch.nn.Module):
    """Both point sets as one sequence through a small transformer encoder; scores ``s · E₁E₂ᵀ / √h``."""

    def __init__(self, cfg: Config, head: Head) -> None:
        super().__init__()
        h = cfg.hidden
        self.embed = torch.nn.Linear(3, h)  # x, y, which set
        layer = torch.nn.TransformerEncoderLayer(h, nhead=4, dim_feedforward=2 * h, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, num_layers=cfg.layers, enable_nested_tensor=False)
        self.log_scale = torch.nn.Parameter(torch.zeros(()))
        self.head, self.h = head, h

    def scores(self, P1: torch.Tensor, P2: torch.Tensor) -> torch.Tensor:
        m = P1.shape[1]
        side = torch.cat([P1.new_zeros((*P1.shape[:2], 1)), P2.new_ones((*P2.shape[:2], 1))], dim=1)
        E = self.encoder(self.embed(torch.cat([torch.cat([P1, P2], dim=1), side], dim=-1)))
        return torch.exp(self.log_scale) * (E[:, :m] @ E[:, m:].transpose(-1, -2)) / math.sqrt(self.h)

    def forward(self, P1: torch.Tensor, P2: torch.Tensor) -> torch.Tensor:
        return self.head(self.scores(P1, P2))


# ----------------------------------------------------------------------------- training and evaluation
def outputs(model: Matcher, data: Pairs, chunk: int = 128) -> torch.Tensor:
    """The model's matrices for every pair (no gradient)."""
    with torch.no_grad():
        return torch.cat([model(data.D1[i:i + chunk], data.D2[i:i + chunk]) for i in range(0, len(data.X), chunk)])


def f1(Y: torch.Tensor, X: torch.Tensor) -> float:
    """F1 of the pairs with ``Y_ij > 0.5`` against the ground truth ``X``."""
    pred = Y > 0.5
    tp = float((pred & (X > 0.5)).sum())
    denom = float(pred.sum() + (X > 0.5).sum())
    return 2.0 * tp / denom if denom else 1.0


def violation(Y: torch.Tensor, alpha: float) -> torch.Tensor:
    """Largest violation of each matrix: negative entries, row / column sums above 1, total above α."""
    parts = [(-Y).amax((-2, -1)), Y.sum(-1).amax(-1) - 1.0, Y.sum(-2).amax(-1) - 1.0, Y.sum((-2, -1)) - alpha]
    return torch.clamp(torch.stack(parts, -1).amax(-1), min=0.0)


def run(method: str, variant: str, seed: int, cfg: Config, session: Session) -> RunRecord:
    """Train one method with one seed (the seed draws the data set too: every method sees the same pairs)."""
    check_config(cfg, RANGES)
    if cfg.hidden % 4:  # the encoder's 4 heads split the width (refused by name, before torch)
        raise ProblemError(f"hidden ({cfg.hidden}) must be a multiple of 4 (the encoder's attention heads)")
    rng = np.random.default_rng(seed)
    data = {k: make_pairs(getattr(cfg, k), cfg, rng) for k in ("train", "val", "test")}
    torch.manual_seed(seed)
    model = Matcher(cfg, Head(method, cfg)).double()
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    order_rng = np.random.default_rng(seed + 1000)
    tr = data["train"]

    def batches(epoch: int):
        order = order_rng.permutation(len(tr.X))
        return (order[i:i + cfg.batch] for i in range(0, len(order), cfg.batch))

    def loss(idx: np.ndarray) -> torch.Tensor:
        Y = model(tr.D1[idx], tr.D2[idx])
        return (Y - tr.X[idx]).pow(2).sum((-2, -1)).mean()

    def validate() -> float:
        return f1(outputs(model, data["val"]), data["val"].X)

    steps = math.ceil(len(tr.X) / cfg.batch)
    out = fit(model, opt, cfg.epochs, batches, loss, validate, session, f"{method} seed {seed}", steps)
    Y = {k: outputs(model, d) for k, d in data.items()}
    viol = worst(float(violation(y, float(cfg.inliers)).max()) for y in Y.values())
    reached = [p.time_s for p in out.curve if p.val_metric >= cfg.f1_target]
    details = {"val_f1": out.best_val, "best_epoch": out.best_epoch, "f1_target": cfg.f1_target,
               "time_to_target_s": reached[0] if reached else math.nan,
               "train_f1": f1(Y["train"], data["train"].X)}
    return RunRecord(method, seed, variant, max_violation=viol, train_loss=out.curve[-1].train_loss,
                     test_metric=f1(Y["test"], data["test"].X), time_s=out.time_s, peak_mem_mb=out.peak_mem_mb,
                     curve=out.curve, details=details)
