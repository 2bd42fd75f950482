"""All-point DIF scores at scale: d >= 1e5 parameters, N >= 1e4 samples, bounded memory.

An MLP 64 → 320 → 256 → 10 (tanh, d = 105,546) on N = 10,000 digit images (sklearn's 1,797, each
replicated with pixel noise), 10 client-risk constraints (the three worst clients active by
construction), objective mean CE + (wd/2)‖θ‖². Trained by Adam (float32, mini-batches) then full-batch L-BFGS (float64); the KKT
point is ``KKTPoint.from_params`` of that approximately stationary net (its residual reported and
used as the damping floor, ``damping="auto"``). Then one call ``DIF(...).influence(F)`` scores
every training sample: matrix-free (CG on Hessian-vector products in data chunks, vmapped
per-sample gradients ``--chunk`` at a time), timed, with the peak RSS of the process. The (N, d)
gradient matrix that a direct method would hold is N·d·8 bytes (8.4 GB here); scoring holds one chunk.

The comparison is leave-one-out retraining of all N points: one warm-started re-solve (augmented
Lagrangian + L-BFGS, from θ̄, until the KKT residual is ``--loo-resolve`` (1e-2) times what the
removal changes ∇L at θ̄ by, i.e. the removal's effect resolved to about two digits) is timed on
``--loo-samples`` removals and extrapolated ×N. Writes ``benchmarks/results/dif_scale.json``.

    nice -n 10 .venv/bin/python benchmarks/dif_scale.py               # N = 10,000, d = 105,546
    .venv/bin/python benchmarks/dif_scale.py --quick                   # N = 400, d = 5,002 (smoke)
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import polyproj as pp
from polyproj.adapters.dif import DIF, ConstrainedProblem, Constraint, KKTPoint, Loss
from polyproj.adapters.dif.digits import cross_entropy_loss
from polyproj.adapters.dif.newton import augmented_lagrangian, first_order
from polyproj.runtime import set_torch_threads


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def data(n: int, seed: int, n_clients: int = 10):
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(y), size=n)
    Xs = X[idx] / 16.0 + 0.1 * rng.normal(size=(n, 64))
    share = rng.dirichlet(0.5 * np.ones(n_clients), size=10)
    client = np.array([rng.choice(n_clients, p=share[c]) for c in y[idx]])
    return torch.as_tensor(Xs), torch.as_tensor(y[idx]), client


def ce(model, batch):
    return nn.functional.cross_entropy(model(batch[0]), batch[1], reduction="none")


def pretrain(net: nn.Module, X, y, epochs: int, seed: int, wd: float) -> None:
    torch.manual_seed(seed)
    net32 = net.float()
    opt = torch.optim.Adam(net32.parameters(), lr=2e-3, weight_decay=wd)
    X32 = X.float()
    for _ in range(epochs):
        perm = torch.randperm(len(y))
        for s in range(0, len(y), 256):
            b = perm[s:s + 256]
            opt.zero_grad()
            nn.functional.cross_entropy(net32(X32[b]), y[b]).backward()
            opt.step()
    net.double()


def main(argv=None) -> int:
    from common import write_json

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--widths", type=int, nargs=2, default=(320, 256))
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--wd", type=float, default=1e-3, help="weight decay in the objective")
    ap.add_argument("--lbfgs", type=int, default=100, help="full-batch L-BFGS iterations after Adam")
    ap.add_argument("--chunk", type=int, default=128, help="samples per chunk of per-sample gradients")
    ap.add_argument("--rtol", type=float, default=1e-6, help="CG relative residual")
    ap.add_argument("--loo-resolve", type=float, default=1e-2,
                    help="LOO re-solves stop at this fraction of the stationarity change the removal makes at θ̄")
    ap.add_argument("--loo-samples", type=int, default=3)
    ap.add_argument("--loo-cap", type=float, default=1800.0, help="seconds per LOO re-solve before it is cut")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: shared 2-core machine)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="N = 400, widths 48 32")
    ap.add_argument("--name", default="dif_scale")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.widths, args.epochs, args.lbfgs, args.name = 400, (48, 32), 2, 20, args.name + "_quick"
        args.loo_cap = 30.0
    set_torch_threads(args.threads)
    warnings.simplefilter("ignore", pp.PolyprojWarning)
    X, y, client = data(args.n, args.seed)
    a, b = args.widths
    torch.manual_seed(args.seed)
    net = nn.Sequential(nn.Linear(64, a), nn.Tanh(), nn.Linear(a, b), nn.Tanh(), nn.Linear(b, 10))
    t = time.perf_counter()
    pretrain(net, X, y, args.epochs, args.seed, args.wd)
    t_adam = time.perf_counter() - t

    # constraints: the three worst clients at their current risk (active), the others loose
    with torch.no_grad():
        risks = np.array([float(ce(net, (X[client == j], y[client == j])).mean()) for j in range(10)])
    worst = np.argsort(-risks)[:3]

    def cdata(j):
        i = torch.as_tensor(np.flatnonzero(client == j))
        return (X[i], y[i])

    cons = [Constraint(ce, cdata(j), tau=float(risks[j]) * (1.0 if j in worst else 1.5), name=f"client{j}")
            for j in range(10)]
    objective = Loss(cross_entropy_loss(args.wd), (X, y))  # CE + (wd/2)‖θ‖²: the net does not interpolate
    prob = ConstrainedProblem(net, objective, cons)
    log(f"{prob}")
    t = time.perf_counter()
    th, _, _ = augmented_lagrangian(prob, prob.theta0, np.zeros(10), tol=1e-9, max_outer=2,
                                    inner_maxiter=args.lbfgs, chunk_size=4096)
    t_lbfgs = time.perf_counter() - t
    _, _, g, _ = first_order(prob, th, 4096)
    for j in worst:  # keep the worst clients active at the trained point
        cons[j] = Constraint(ce, cdata(j), tau=float(g[j] + cons[j].tau), name=f"client{j}")
    prob = ConstrainedProblem(net, objective, cons)
    kkt = KKTPoint.from_params(prob, th, None, tol=1.0, active_tol=1e-9, warn=False)
    log(f"trained (Adam {t_adam:.0f} s, L-BFGS {t_lbfgs:.0f} s): {kkt}")
    rss0 = peak_rss_mb()

    def F(m):  # test function: loss on a held-out batch
        return nn.functional.cross_entropy(m(X[:500] + 0.05), y[:500])

    t = time.perf_counter()
    dif = DIF(prob, kkt, method="matrix-free", damping="auto", rtol=args.rtol, chunk_size=4096)
    t_setup = time.perf_counter() - t
    scores = dif.influence(F, chunk_size=args.chunk, progress=False).numpy()
    t_dif = time.perf_counter() - t
    rss = peak_rss_mb()
    klog = [{"what": w, "iterations": i.iterations, "residual": i.residual} for w, i in dif.krylov_log]
    log(f"all-point DIF: {t_dif:.0f} s (setup {t_setup:.0f} s), peak RSS {rss:.0f} MB; Krylov {klog}")

    # leave-one-out: warm-started re-solves to --loo-tol, timed and extrapolated
    loo = []
    for i in np.random.default_rng(args.seed + 7).choice(args.n, size=args.loo_samples, replace=False):
        i = int(i)
        rem = {"objective": [i]}
        j = int(client[i])
        rem[f"client{j}"] = [int(np.flatnonzero(np.flatnonzero(client == j) == i)[0])]
        newp = prob.remove(rem)
        _, gf, _, G = first_order(newp, kkt.theta, 4096)
        _, gf_old, _, G_old = first_order(prob, kkt.theta, 4096)
        lam = kkt.lambdas.numpy()
        r0 = float(np.max(np.abs(gf + G.T @ lam - gf_old - G_old.T @ lam)))  # what the removal adds at θ̄
        t = time.perf_counter()
        _, _, li = augmented_lagrangian(newp, kkt.theta, kkt.lambdas.numpy(), tol=args.loo_resolve * r0,
                                        max_outer=20, inner_maxiter=200, chunk_size=4096,
                                        time_limit=args.loo_cap)
        loo.append({"time_s": time.perf_counter() - t, "initial_residual": r0, "tol": args.loo_resolve * r0,
                    "residual": li.residuals[-1], "converged": li.converged,
                    "lbfgs_iterations": int(sum(li.krylov_iterations))})
        log(f"LOO re-solve {i}: {loo[-1]}")
    t_loo = float(np.median([r["time_s"] for r in loo])) * args.n
    all_conv = all(r["converged"] for r in loo)
    path = write_json(args.name, {
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items()},
        "problem": {"d": prob.dim, "N": args.n, "classification": kkt.classification,
                    "kkt_residuals": kkt.residuals, "damping": dif.damping, "lambdas": kkt.lambdas.tolist()},
        "dif": {"all_points_s": t_dif, "setup_s": t_setup, "peak_rss_mb": rss, "rss_before_mb": rss0,
                "dense_gradients_would_need_mb": args.n * prob.dim * 8 / 2 ** 20,
                "krylov": klog, "score_range": [float(scores.min()), float(scores.max())]},
        "loo": {"per_removal": loo, "extrapolated_all_points_s": t_loo, "all_converged": all_conv,
                "note": "median re-solve time × N" + ("" if all_conv else
                                                      " (re-solves cut at --loo-cap: a lower bound)")},
        "dif_over_loo": t_dif / t_loo,
        "target": 0.01,
    })
    log(f"DIF / LOO = {t_dif / t_loo:.2e} (target <= 1e-2); wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
