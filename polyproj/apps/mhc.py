"""Manifold-constrained hyper-connections (mHC) in a small residual network on sklearn's digits.

Hyper-connections keep ``n`` residual streams ``X ∈ R^{n×d}`` per token; a block reads ``h = H_pre X``, computes
``F(h)`` and writes ``X ← H_res X + H_postᵀ F(h)``. mHC (Xie et al., 2025) makes the mixing matrix
``H_res`` doubly stochastic, so that the streams' mean is carried through every block, by Sinkhorn
iterations on ``exp(H̃_res)``; here ``H̃_res`` (input-dependent: a linear map of the normalised streams
plus a learned bias, as in mHC) is either projected onto the Birkhoff polytope exactly
(``pp.sets.Birkhoff(n)``, HS-Jacobian backward) or mapped by Sinkhorn with 20 or 30 iterations
(autograd through the iterations). ``H_pre = σ(H̃_pre)``, ``H_post = 2σ(H̃_post)`` in both. The network
is a small vision transformer: the 8×8 digit as 16 tokens of 2×2 pixels, blocks whose ``F`` is a
transformer layer, so that every block projects ``batch × 16`` matrices (mHC's per-token ``H_res``).
Data: the 1797 digits, a fixed stratified split (train / validation / test), pixels scaled to [0, 1].
Reported: test accuracy of the epoch with the best validation accuracy, the largest violation of double
stochasticity of any ``H_res`` computed on any evaluated input, training time and peak memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ProblemError
from ..sets.birkhoff import Birkhoff
from .measure import Session
from .peers import sinkhorn
from .records import RunRecord, worst
from .training import ANY, COUNT, POSITIVE, Range, check_config, fit

__all__ = ["METHODS", "METRIC", "RANGES", "TITLE", "Config", "config", "run", "variants"]

TITLE = "mHC: doubly stochastic hyper-connections on sklearn digits"
METRIC = "test accuracy"
METHODS = ("polyproj", "sinkhorn20", "sinkhorn30")
SINKHORN = {"sinkhorn20": 20, "sinkhorn30": 30}


@dataclass(frozen=True)
class Config:
    """Model and training settings."""

    streams: int = 4
    width: int = 32
    heads: int = 4
    blocks: int = 6
    epochs: int = 30
    batch: int = 64
    lr: float = 2e-3
    gate_scale: float = 1.0


#: every setting's allowed values (run() refuses others by name): positive sizes and counts (width a multiple of
#: heads, checked in run()); gate_scale any finite factor on the dynamic part of H_pre, H_post, H_res (0 leaves their
#: learned biases alone, a negative one the same family of maps with the linear layer's sign flipped)
RANGES: dict[str, Range] = {"streams": COUNT, "width": COUNT, "heads": COUNT, "blocks": COUNT, "epochs": COUNT,
                            "batch": COUNT, "lr": POSITIVE, "gate_scale": ANY}


def config(quick: bool) -> Config:
    """The full preset, or the quick one (fewer blocks and epochs)."""
    return Config(blocks=2, epochs=2) if quick else Config()


def variants(cfg: Config) -> tuple[str, ...]:
    """One variant."""
    return ("",)


@dataclass(frozen=True)
class Digits:
    """Pixels in [0, 1] and labels of the three splits."""

    X: dict[str, torch.Tensor]
    y: dict[str, torch.Tensor]


def load() -> Digits:
    """The digits of sklearn, split 64 / 16 / 20 % (stratified, fixed seed: the same split for every run)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.2, stratify=y, random_state=0)
    Xtr, Xva, ytr, yva = train_test_split(Xtr, ytr, test_size=0.2, stratify=ytr, random_state=0)
    parts = {"train": (Xtr, ytr), "val": (Xva, yva), "test": (Xte, yte)}
    return Digits({k: torch.tensor(v[0]) for k, v in parts.items()}, {k: torch.tensor(v[1]) for k, v in parts.items()})


class Mixing(torch.nn.Module):
    """``H̃_res -> H_res`` for one method: the exact Birkhoff projection or Sinkhorn."""

    def __init__(self, method: str, n: int) -> None:
        super().__init__()
        self.method = method
        if method == "polyproj":
            from ..adapters.torch import ProjectionLayer

            self.map = ProjectionLayer(Birkhoff(n))
        elif method not in SINKHORN:
            raise ProblemError(f"unknown mHC method {method!r}")

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """Doubly stochastic (to the method's accuracy) ``(batch, n, n)`` matrices."""
        if self.method == "polyproj":
            return self.map(logits)
        return sinkhorn(logits, SINKHORN[self.method])


class Block(torch.nn.Module):
    """One hyper-connected residual block on every token: dynamic ``H_pre``, ``H_post``, ``H_res``.

    ``F`` is a small pre-norm transformer layer (self-attention over the tokens, then an MLP) applied to
    ``h = H_pre X``; ``H_res`` is one ``n × n`` matrix per token and sample (as mHC's, per token).
    """

    def __init__(self, cfg: Config, mixing: Mixing) -> None:
        super().__init__()
        n, d = cfg.streams, cfg.width
        self.n, self.mixing, self.scale = n, mixing, cfg.gate_scale
        self.norm = torch.nn.RMSNorm(n * d)
        self.dyn = torch.nn.Linear(n * d, n + n + n * n, bias=False)  # H̃_pre, H̃_post, H̃_res
        self.b_pre, self.b_post = torch.nn.Parameter(torch.zeros(n)), torch.nn.Parameter(torch.zeros(n))
        # both start at the same H_res = sinkhorn(4 I), 0.95 on the diagonal: Sinkhorn from the logits 4 I, the
        # projection from that (interior) matrix itself. Not from I: the identity is a vertex of the Birkhoff
        # polytope, where the HS-Jacobian is 0 and H_res would never move (README.md, "Applications").
        start = 4.0 * torch.eye(n, dtype=torch.float64)
        self.b_res = torch.nn.Parameter(sinkhorn(start, 50) if mixing.method == "polyproj" else start)
        self.f = torch.nn.TransformerEncoderLayer(d, nhead=cfg.heads, dim_feedforward=2 * d, dropout=0.0,
                                                  activation="gelu", batch_first=True, norm_first=True)
        self.last_res: torch.Tensor | None = None

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """``X`` (batch, tokens, n, d) -> the next streams."""
        B, T, n, d = X.shape
        g = self.scale * self.dyn(self.norm(X.reshape(B, T, n * d)))
        pre = torch.sigmoid(g[..., :n] + self.b_pre)
        post = 2.0 * torch.sigmoid(g[..., n:2 * n] + self.b_post)
        # b_res is made in float64 (its start, Sinkhorn of 4 I, exact there); a float32 model uses it cast
        res = self.mixing(g[..., 2 * n:].reshape(B * T, n, n) + self.b_res.to(g.dtype)).reshape(B, T, n, n)
        self.last_res = res.detach()
        h = torch.einsum("btn,btnd->btd", pre, X)
        Fh = self.f(h) - h  # the layer's residual branch only: the streams carry the residual
        return res @ X + post[..., None] * Fh[:, :, None, :]


class Net(torch.nn.Module):
    """2×2 patches of the 8×8 image as 16 tokens, ``n`` copies of each token's stream, blocks, classifier."""

    def __init__(self, cfg: Config, method: str) -> None:
        super().__init__()
        self.n = cfg.streams
        self.embed = torch.nn.Linear(4, cfg.width)
        self.pos = torch.nn.Parameter(0.02 * torch.randn(16, cfg.width))
        self.blocks = torch.nn.ModuleList([Block(cfg, Mixing(method, cfg.streams)) for _ in range(cfg.blocks)])
        self.out = torch.nn.Sequential(torch.nn.LayerNorm(cfg.width), torch.nn.Linear(cfg.width, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of ``x`` (batch, 64) pixels."""
        patches = x.reshape(-1, 4, 2, 4, 2).permute(0, 1, 3, 2, 4).reshape(-1, 16, 4)
        X = (self.embed(patches) + self.pos)[:, :, None, :].expand(-1, -1, self.n, -1)
        for b in self.blocks:
            X = b(X)
        return self.out(X.sum(2).mean(1))

    def doubly_stochastic_violation(self) -> float:
        """Largest violation of the last call's ``H_res``: negative entries, row and column sums off 1."""
        return worst(v for b in self.blocks for v in (float((-b.last_res).max()),
                                                        float((b.last_res.sum(-1) - 1).abs().max()),
                                                        float((b.last_res.sum(-2) - 1).abs().max())))


def run(method: str, variant: str, seed: int, cfg: Config, session: Session) -> RunRecord:
    """Train one method with one seed; accuracy and violation on every split."""
    check_config(cfg, RANGES)
    if cfg.width % cfg.heads:  # the attention's heads split the width (refused by name, before torch)
        raise ProblemError(f"width ({cfg.width}) must be a multiple of heads ({cfg.heads})")
    data = load()
    torch.manual_seed(seed)
    model = Net(cfg, method).double()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=1e-4)
    rng = np.random.default_rng(seed)
    Xtr, ytr = data.X["train"], data.y["train"]

    def batches(epoch: int):
        order = rng.permutation(len(ytr))
        return (order[i:i + cfg.batch] for i in range(0, len(order), cfg.batch))

    def loss(idx: np.ndarray) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(model(Xtr[idx]), ytr[idx])

    def accuracy(split: str) -> tuple[float, float]:
        with torch.no_grad():
            pred = model(data.X[split]).argmax(-1)
        return float((pred == data.y[split]).double().mean()), model.doubly_stochastic_violation()

    steps = math.ceil(len(ytr) / cfg.batch)
    out = fit(model, opt, cfg.epochs, batches, loss, lambda: accuracy("val")[0], session,
              f"{method} seed {seed}", steps)
    res = {k: accuracy(k) for k in ("train", "val", "test")}
    details = {"val_accuracy": out.best_val, "best_epoch": out.best_epoch, "train_accuracy": res["train"][0]}
    return RunRecord(method, seed, variant, max_violation=worst(v for _, v in res.values()),
                     train_loss=out.curve[-1].train_loss, test_metric=res["test"][0], time_s=out.time_s,
                     peak_mem_mb=out.peak_mem_mb, curve=out.curve, details=details)
