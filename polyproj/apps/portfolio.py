"""Portfolio allocation on real daily S&P 500 prices (skfolio's bundled data set: 20 stocks, 1990-2022).

A small sequence model (an LSTM over a window of standardised daily returns of the 20 stocks) gives
scores ``x``; a constraint map turns them into weights ``w``; the loss is the negative annualised Sharpe
ratio of ``w`` over the next ``horizon`` trading days. Three sets (the *variants*):

- ``preference`` — the paper's: ``{w >= 0, Σ w = 1, Σ_{i in F} w_i >= 0.5}``, ``F`` the first five
  stocks of the data set (AAPL, AMD, BAC, BBY, CVX) as the expert's preferred names;
- ``capped`` — the capped simplex ``{0 <= w <= 0.2, Σ w = 1}``;
- ``simplex`` — ``{w >= 0, Σ w = 1}``, the set of Soft-Radial's portfolio experiment (the saturation
  challenge to orthogonal projections).

Walk-forward split in time order (train / validation / test); the model kept is the epoch with the best
validation Sharpe; the test metric is the annualised Sharpe ratio of the daily-rebalanced portfolio over
the test period (each day's weights from the window before it). Methods (``METHODS``): polyproj's exact
projection (HS-Jacobian backward; ``polyproj_leak``: the same forward with the leaky backward of
README.md, "Applications"), LinSATNet, softmax with a quadratic penalty on the remaining constraint, the
Soft-Radial-style interior map, qpth, cvxpylayers and Moreau; ``fixed`` is the anchor portfolio (no
training) for reference. Saturation is measured directly: the share of samples whose gradient with
respect to the scores is zero although the gradient with respect to the weights is not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import ProblemError
from ..problem import Polyhedron
from ..sets.simplex import CappedSimplex, Simplex
from .measure import Session
from .peers import LinSAT, QPLayer, RadialMap, Rows
from .records import RunRecord, worst
from .training import COUNT, NON_NEGATIVE, POSITIVE, UNIT, Range, check_config, fit

__all__ = ["METHODS", "METRIC", "RANGES", "TITLE", "Config", "config", "run", "variants"]

TITLE = "Portfolio on S&P 500 prices (skfolio)"
METRIC = "test Sharpe"
METHODS = ("fixed", "polyproj", "polyproj_leak", "linsatnet", "softmax_penalty", "radial", "qpth", "cvxpylayers",
           "moreau")
ANNUAL = math.sqrt(252.0)


#: the portfolio constraints of the study
VARIANTS: tuple[str, ...] = ("preference", "capped", "simplex")


@dataclass(frozen=True)
class Config:
    """Data split, model and training settings (``config(quick)`` gives the two presets)."""

    constraints: tuple[str, ...] = VARIANTS
    start: str = "2005-01-01"
    train_end: str = "2016-12-31"
    val_end: str = "2018-12-31"
    window: int = 40
    horizon: int = 20
    hidden: int = 32
    epochs: int = 20
    batch: int = 64
    lr: float = 1e-3
    cap: float = 0.2
    preferred: int = 5
    min_preferred: float = 0.5
    penalty: float = 1000.0
    leak: float = 0.1
    linsat_tau: float = 0.05
    linsat_iter: int = 100


#: every numeric setting's allowed values (run() refuses others by name; the dates are checked there too): positive
#: sizes and counts; a horizon of one day has no standard deviation, its Sharpe ratio (the loss) NaN; cap an upper
#: weight (the capped set also needs n · cap > 1, checked with n); preferred also < n (checked with n); min_preferred
#: a share of the portfolio; the penalty weighs a squared violation (negative would reward it); leak mixes the
#: backward from the HS-Jacobian (0) to the identity (1); linsat_tau, LinSATNet's temperature, divides the scores.
RANGES: dict[str, Range] = {
    "window": COUNT, "horizon": Range(2), "hidden": COUNT, "epochs": COUNT, "batch": COUNT, "lr": POSITIVE,
    "cap": POSITIVE, "preferred": COUNT, "min_preferred": UNIT, "penalty": NON_NEGATIVE, "leak": UNIT,
    "linsat_tau": POSITIVE, "linsat_iter": COUNT}


def config(quick: bool) -> Config:
    """The full preset, or the quick one (two of the sets, a shorter training span, two epochs)."""
    return Config(constraints=("preference", "capped"), start="2014-01-01", epochs=2) if quick else Config()


def variants(cfg: Config) -> tuple[str, ...]:
    """The constraint sets to run."""
    return cfg.constraints


# ----------------------------------------------------------------------------- data
@dataclass(frozen=True)
class Data:
    """Standardised returns (inputs), raw returns (targets), and the decision days of each split."""

    names: tuple[str, ...]
    Z: torch.Tensor
    R: torch.Tensor
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray


def load(cfg: Config) -> Data:
    """The S&P 500 prices of skfolio as daily simple returns, split by date; inputs standardised on train."""
    from skfolio.datasets import load_sp500_dataset

    prices = load_sp500_dataset()
    returns = prices.pct_change().dropna().loc[cfg.start:]
    R = returns.to_numpy(dtype=np.float64)
    dates = returns.index
    L, H = cfg.window, cfg.horizon
    days = np.arange(L, len(R))
    tr_end, va_end = np.searchsorted(dates, np.datetime64(cfg.train_end), "right"), \
        np.searchsorted(dates, np.datetime64(cfg.val_end), "right")
    train = days[days + H <= tr_end]  # the training targets stay inside the training period
    val = days[(days >= tr_end) & (days < va_end)]
    test = days[days >= va_end]
    for name, split in (("training", train), ("validation", val), ("test", test)):
        if split.size == 0:
            span = f"{dates[0].date()} to {dates[-1].date()}" if len(dates) else "none"
            raise ProblemError(f"the {name} period holds no day with a full window ({L}) and horizon ({H}): "
                               f"start {cfg.start}, train_end {cfg.train_end}, val_end {cfg.val_end}; the data "
                               f"cover {span}")
    mu, sd = R[:tr_end].mean(0), R[:tr_end].std(0)
    Z = (R - mu) / sd
    return Data(tuple(returns.columns), torch.tensor(Z), torch.tensor(R), train, val, test)


# ----------------------------------------------------------------------------- sets and heads
def _check_preference(cfg: Config, n: int) -> None:
    """The preference variant needs 1 <= preferred < n names and a floor min_preferred in [0, 1]."""
    if not (isinstance(cfg.preferred, (int, np.integer)) and 1 <= cfg.preferred < n):
        raise ProblemError(f"preferred must be an integer in [1, {n - 1}] for {n} assets (some names outside the "
                           f"preferred ones), got {cfg.preferred!r}")
    if not 0.0 <= cfg.min_preferred <= 1.0:
        raise ProblemError(f"min_preferred is a share of the portfolio, in [0, 1]; got {cfg.min_preferred!r}")


def polyhedron(variant: str, cfg: Config, n: int) -> Polyhedron:
    """The variant's set as a Polyhedron (float64)."""
    if variant == "preference":
        _check_preference(cfg, n)
        s = np.zeros(n)
        s[: cfg.preferred] = 1.0
        return Polyhedron(A=-s[None, :], a=[-cfg.min_preferred], B=np.ones((1, n)), b=[1.0], lb=np.zeros(n))
    if variant == "capped":
        _check_cap(cfg, n)
        return Polyhedron(B=np.ones((1, n)), b=[1.0], lb=np.zeros(n), ub=np.full(n, cfg.cap))
    if variant == "simplex":
        return Polyhedron(B=np.ones((1, n)), b=[1.0], lb=np.zeros(n))
    raise _unknown(variant)


def _unknown(variant: str) -> ProblemError:
    return ProblemError(f"unknown portfolio constraint {variant!r}: use one of {', '.join(map(repr, VARIANTS))}")


def _check_cap(cfg: Config, n: int) -> None:
    """``n · cap > 1``: the capped set has an interior (its anchor 1/n lies strictly below the cap)."""
    if not n * cfg.cap > 1.0:
        raise ProblemError(f"a cap of {cfg.cap:g} on {n} assets leaves no room for a fully invested portfolio "
                           f"strictly inside it (n · cap = {n * cfg.cap:g} must exceed 1)")


def anchor(variant: str, cfg: Config, n: int) -> np.ndarray:
    """A strictly feasible portfolio: the radial map's anchor and the ``fixed`` reference."""
    if variant not in VARIANTS:
        raise _unknown(variant)
    if variant == "capped":
        _check_cap(cfg, n)
    if variant in ("capped", "simplex"):
        return np.full(n, 1.0 / n)
    _check_preference(cfg, n)
    if cfg.min_preferred >= 1.0:  # the set is a face of the simplex then: no point strictly inside it
        raise ProblemError("min_preferred = 1 leaves no strictly feasible portfolio (every unpreferred weight 0); "
                           "the radial map and the fixed reference need one: take min_preferred < 1")
    k = cfg.preferred
    share = 0.5 * (cfg.min_preferred + 1.0)  # halfway between the preference floor and all-in
    return np.r_[np.full(k, share / k), np.full(n - k, (1.0 - share) / (n - k))]


def projection_set(variant: str, cfg: Config, n: int) -> Any:
    """The set polyproj projects onto: the structured capped simplex, or the preference Polyhedron."""
    if variant == "capped":
        return CappedSimplex(n, total=1.0, upper=cfg.cap)
    if variant == "simplex":
        return Simplex(n)
    return polyhedron(variant, cfg, n)


class Head(torch.nn.Module):
    """Scores -> weights for one method, and the penalty added to the loss (softmax + penalty only)."""

    def __init__(self, method: str, variant: str, cfg: Config, n: int) -> None:
        super().__init__()
        self.method, self.variant, self.cfg = method, variant, cfg
        self.upper = cfg.cap if variant == "capped" else 1.0
        P = polyhedron(variant, cfg, n)
        self.rows = Rows.of(P)
        if method in ("polyproj", "polyproj_leak"):
            from ..adapters.torch import ProjectionLayer

            self.leak = cfg.leak if method == "polyproj_leak" else 0.0
            self.map = ProjectionLayer(projection_set(variant, cfg, n))
        elif method == "linsatnet":
            kw = dict(C=self.rows_pref(n), d=[cfg.min_preferred], E=np.ones((1, n)), f=[1.0]) \
                if variant == "preference" else dict(E=np.ones((1, n)), f=[1.0 / self.upper])
            self.map = LinSAT(n, cfg.linsat_tau, cfg.linsat_iter, **kw)
        elif method == "radial":
            self.map = RadialMap(self.rows, anchor(variant, cfg, n))
        elif method in ("qpth", "cvxpylayers", "moreau"):
            self.map = QPLayer(self.rows, method)
        elif method != "softmax_penalty":
            raise ProblemError(f"unknown portfolio method {method!r}; the methods: {', '.join(METHODS)}")

    def rows_pref(self, n: int) -> np.ndarray:
        s = np.zeros((1, n))
        s[0, : self.cfg.preferred] = 1.0
        return s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.method == "softmax_penalty":
            return torch.softmax(x, dim=-1)
        w = self.map(x)
        if getattr(self, "leak", 0.0):
            w = w + self.leak * ((x - w) - (x - w).detach())
        if self.method == "linsatnet" and self.variant != "preference":
            w = self.upper * w  # LinSATNet's box is [0, 1]: w = cap · z with Σ z = 1 / cap
        return w

    def penalty(self, w: torch.Tensor) -> torch.Tensor:
        """``penalty · mean Σ max(0, G w − h)²`` for softmax + penalty (softmax keeps the simplex), else 0."""
        if self.method != "softmax_penalty":
            return w.new_zeros(())
        G, h = (torch.as_tensor(v, dtype=w.dtype, device=w.device) for v in (self.rows.G, self.rows.h))
        return self.cfg.penalty * torch.relu(w @ G.T - h).pow(2).sum(-1).mean()


class Model(torch.nn.Module):
    """LSTM over the window of standardised returns, a linear layer to scores, the method's head."""

    def __init__(self, n: int, cfg: Config, head: Head) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(n, cfg.hidden, batch_first=True)
        self.out = torch.nn.Linear(cfg.hidden, n)
        self.head = head

    def scores(self, window: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(window)
        return self.out(h[:, -1])

    def forward(self, window: torch.Tensor) -> torch.Tensor:
        return self.head(self.scores(window))


# ----------------------------------------------------------------------------- training and evaluation
def sharpe(p: torch.Tensor) -> torch.Tensor:
    """Annualised Sharpe ratio of daily returns along the last axis (zero risk-free rate)."""
    return ANNUAL * p.mean(-1) / (p.std(-1) + 1e-12)


def windows(data: Data, days: np.ndarray, cfg: Config) -> torch.Tensor:
    idx = torch.as_tensor(days)[:, None] + torch.arange(-cfg.window, 0)[None, :]
    return data.Z[idx]  # (batch, window, n)


def targets(data: Data, days: np.ndarray, cfg: Config) -> torch.Tensor:
    idx = torch.as_tensor(days)[:, None] + torch.arange(cfg.horizon)[None, :]
    return data.R[idx]  # (batch, horizon, n)


def weights(model: Model, data: Data, days: np.ndarray, cfg: Config, chunk: int = 256) -> torch.Tensor:
    """The model's weights for each decision day (no gradient)."""
    with torch.no_grad():
        return torch.cat([model(windows(data, days[i:i + chunk], cfg)) for i in range(0, len(days), chunk)])


def realised_sharpe(data: Data, days: np.ndarray, W: torch.Tensor) -> float:
    """Sharpe ratio of the portfolio rebalanced daily to ``W`` over ``days``."""
    return float(sharpe((data.R[torch.as_tensor(days)] * W).sum(-1)))


class Saturation:
    """Counts samples whose score gradient vanishes while the weight gradient does not (per step)."""

    def __init__(self) -> None:
        self.dead: list[float] = []
        self.kept: list[float] = []
        self._gy: torch.Tensor | None = None

    def watch(self, x: torch.Tensor, w: torch.Tensor) -> None:
        if not (x.requires_grad and w.requires_grad):
            return
        w.register_hook(self._keep)
        x.register_hook(self._count)

    def _keep(self, g: torch.Tensor) -> None:
        self._gy = g.detach()

    def _count(self, g: torch.Tensor) -> None:
        if self._gy is None:
            return
        gx, gy = g.detach().norm(dim=-1), self._gy.norm(dim=-1)
        live = gy > 0
        self.dead.append(float(((gx <= 1e-12 * gy) & live).double().mean()))
        self.kept.append(float((gx[live] / gy[live]).median()) if bool(live.any()) else math.nan)


def run(method: str, variant: str, seed: int, cfg: Config, session: Session) -> RunRecord:
    """Train one method on one constraint set with one seed; evaluate on validation and test."""
    check_config(cfg, RANGES)
    for k in ("start", "train_end", "val_end"):  # dates, refused by name before the data are read
        v = getattr(cfg, k)
        try:
            ok = isinstance(v, str) and not np.isnat(np.datetime64(v, "D"))
        except ValueError:
            ok = False
        if not ok:
            raise ProblemError(f"{k} must be a date written YYYY-MM-DD, got {v!r}")
    data = load(cfg)
    n = len(data.names)
    if method == "fixed":
        return _fixed(variant, seed, cfg, data)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = Model(n, cfg, Head(method, variant, cfg, n)).double()
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    sat = Saturation()

    def batches(epoch: int):
        order = rng.permutation(data.train)
        return (order[i:i + cfg.batch] for i in range(0, len(order), cfg.batch))

    def loss(days: np.ndarray) -> torch.Tensor:
        x = model.scores(windows(data, days, cfg))
        w = model.head(x)
        sat.watch(x, w)
        p = (targets(data, days, cfg) * w[:, None, :]).sum(-1)
        return -sharpe(p).mean() + model.head.penalty(w)

    def validate() -> float:
        return realised_sharpe(data, data.val, weights(model, data, data.val, cfg))

    steps = math.ceil(len(data.train) / cfg.batch)
    out = fit(model, opt, cfg.epochs, batches, loss, validate, session, f"{variant}/{method} seed {seed}", steps)
    W = {k: weights(model, data, getattr(data, k), cfg) for k in ("train", "val", "test")}
    viol = worst(float(model.head.rows.violation(W[k].numpy()).max()) for k in W)
    support = float((W["test"] > 1e-9).double().sum(-1).mean())
    details = {"val_sharpe": out.best_val, "best_epoch": out.best_epoch, "support_test": support,
               "dead_grad_share": float(np.mean(sat.dead)) if sat.dead else math.nan,
               "dead_grad_share_last_epoch": float(np.mean(sat.dead[-steps:])) if sat.dead else math.nan,
               "grad_norm_ratio_median": float(np.nanmedian(sat.kept)) if sat.kept else math.nan,
               "set": repr(projection_set(variant, cfg, n)) if method.startswith("polyproj") else ""}
    return RunRecord(method, seed, variant, max_violation=viol, train_loss=out.curve[-1].train_loss,
                     test_metric=realised_sharpe(data, data.test, W["test"]), time_s=out.time_s,
                     peak_mem_mb=out.peak_mem_mb, curve=out.curve, details=details)


def _fixed(variant: str, seed: int, cfg: Config, data: Data) -> RunRecord:
    """The anchor portfolio held throughout (no training): the reference a learned allocation must beat."""
    n = len(data.names)
    w = torch.tensor(anchor(variant, cfg, n))
    viol = float(Rows.of(polyhedron(variant, cfg, n)).violation(w[None].numpy()).max())
    val = realised_sharpe(data, data.val, w.expand(len(data.val), n))
    test = realised_sharpe(data, data.test, w.expand(len(data.test), n))
    return RunRecord("fixed", seed, variant, max_violation=viol, test_metric=test, time_s=0.0, peak_mem_mb=0.0,
                     details={"val_sharpe": val})
