"""``polyproj demo`` section: a network trained end to end through the exact projection layer."""

from __future__ import annotations

import time

import numpy as np

__all__ = ["training_section"]


def training_section(console, quick: bool, seed: int) -> None:
    """Learn portfolio weights on {w >= 0, Σw = 1, Σ_{i in S} w_i >= 0.5} from synthetic returns.

    Every output of the layer must be feasible to 1e-8 at every step and the loss must fall;
    raises ``AssertionError`` otherwise.
    """
    import torch
    from rich.table import Table

    from .torch import ProjectionLayer

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    n_assets, n_feat, N, epochs = (12, 6, 128, 30) if quick else (30, 10, 512, 80)
    chosen = np.zeros(n_assets)
    chosen[:5] = 1.0
    F = torch.tensor(rng.normal(size=(N, n_feat)))
    R = F @ torch.tensor(rng.normal(size=(n_feat, n_assets))) * 0.05 + 0.01 * torch.tensor(
        rng.normal(size=(N, n_assets)))
    layer = ProjectionLayer(A=-chosen[None, :], a=[-0.5], B=np.ones((1, n_assets)), b=[1.0], lb=np.zeros(n_assets))
    net = torch.nn.Sequential(torch.nn.Linear(n_feat, 64), torch.nn.Tanh(), torch.nn.Linear(64, n_assets)).double()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    table = Table(title=f"training through {layer!r}")
    for col in ("epoch", "loss (−return + ½‖w‖²)", "max violation", "min Σ_S w", "ms / step"):
        table.add_column(col)
    losses, worst = [], 0.0
    for ep in range(epochs):
        t0 = time.perf_counter()
        w = layer(net(F))
        loss = -(w * R).sum(1).mean() + 0.5 * (w ** 2).sum(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        W = w.detach().numpy()
        viol = float(max(-W.min(), np.abs(W.sum(1) - 1).max(), 0.5 - (W @ chosen).min(), 0.0))
        worst = max(worst, viol)
        losses.append(loss.item())
        if ep % max(1, epochs // 6) == 0 or ep == epochs - 1:
            table.add_row(str(ep), f"{losses[-1]:.5f}", f"{viol:.1e}", f"{(W @ chosen).min():.4f}", f"{1e3 * dt:.1f}")
    console.print(table)
    console.print(f"loss {losses[0]:.5f} -> {losses[-1]:.5f}; worst violation over all steps {worst:.1e} "
                  "(gradients: HS-Jacobian of the exact projection)")
    if worst > 1e-8:
        raise AssertionError(f"layer outputs infeasible: {worst:.2e} > 1e-8")
    if not losses[-1] < losses[0] - 0.1 * abs(losses[0]):
        raise AssertionError(f"loss did not fall: {losses[0]:.5f} -> {losses[-1]:.5f}")
