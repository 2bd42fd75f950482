"""Fairness-constrained all-convolutional net on sklearn's digits: DIF vs ground-truth retraining.

The study of ``polyproj.adapters.dif.digits`` (10 non-iid clients, "client risk <= R̄ + τ" for every
client; binding and weakly active clients). Stages, each written to disk as it finishes (an
interrupted run loses nothing; rerunning resumes from the cache):

1. train to a KKT point: augmented Lagrangian + L-BFGS, then chord-Newton polish to ``--tol``
   with the Hessian formed once (``--cache``: H and the trained θ are kept there, not in git);
2. scores of every removal on the test loss by DIF (matrix-free: CG on Hessian-vector products,
   vmapped per-sample gradients), classic IF, Penalty-IF (sweep of ρ, both penalties) and TracIn;
3. ground truth: ``--singles`` single-point and ``--groups`` 1 % group removals, each re-solved
   from θ̄ (full batch, constrained, chord Newton with exact gradients) to KKT residual ``--tol``;
   noise floor (retraining with nothing removed from perturbed starts) and seed-to-seed agreement
   (the same removals re-solved from a differently perturbed start);
4. Pearson / Spearman r of predicted vs actual test-loss change, constraint violations at θ̄ + ω,
   scatter plot ``benchmarks/results/dif_fairness.png``, JSON ``dif_fairness.json``.

    nice -n 10 .venv/bin/python benchmarks/dif_fairness.py            # d = 10,370, N = 1,257
    .venv/bin/python benchmarks/dif_fairness.py --quick                # small net, 200 samples
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import polyproj as pp
from polyproj.adapters.dif import DIF, IndefiniteHessianError, KKTPoint
from polyproj.adapters.dif.baselines import if_scores, tracin_scores
from polyproj.adapters.dif.digits import make_fairness_study
from polyproj.adapters.dif.newton import FrozenHessian, augmented_lagrangian, first_order, newton_kkt
from polyproj.runtime import set_torch_threads

RHOS = {"quadratic": (1e-1, 1.0, 1e1, 1e2, 1e3), "hinge": (1.0, 1e2)}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def spearman(a, b) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


def pearson(a, b) -> float:
    return float(np.corrcoef(np.ravel(a), np.ravel(b))[0, 1])


def hessian_float32(S, theta: torch.Tensor, lam: np.ndarray, block: int = 64) -> np.ndarray:
    """∇²f₀ + Σ λⱼ∇²gⱼ of the study, formed in float32 by vmapped forward-over-reverse products.

    Only the chord re-solves use it (their convergence needs an approximation of H, not H to
    rounding: each step's residual is evaluated exactly, in float64). One forward pass serves the
    objective and every client's risk (the clients' data are the training samples' own).
    """
    import copy

    from torch import nn

    net = copy.deepcopy(S.problem.model).float()
    named = list(net.named_parameters())
    sizes = [p.numel() for _, p in named]
    X, y = S.data.X.float(), S.data.y
    wd = S.info["wd"]
    clients = [(float(lam[j]), torch.as_tensor(np.flatnonzero(S.data.client == j)))
               for j in range(S.data.n_clients) if lam[j] > 0]

    def L(t: torch.Tensor) -> torch.Tensor:
        params = {k: c.reshape(p.shape) for (k, p), c in zip(named, torch.split(t, sizes), strict=True)}
        ce = nn.functional.cross_entropy(torch.func.functional_call(net, params, (X,)), y, reduction="none")
        out = ce.mean() + 0.5 * wd * (t * t).sum()
        for lj, idx in clients:
            out = out + lj * ce[idx].mean()
        return out

    t32 = theta.float()
    grad = torch.func.grad(L)
    hvps = torch.func.vmap(lambda v: torch.func.jvp(grad, (t32,), (v,))[1])
    d = t32.numel()
    H = np.empty((d, d))
    eye = torch.eye(d, dtype=torch.float32)
    for s in range(0, d, block):
        H[:, s:s + block] = hvps(eye[s:s + block]).T.double().numpy()
    return 0.5 * (H + H.T)


def _mt(args) -> str:
    """Suffix of the cached DIF scores of a run with another ``--mult-tol`` (their classification differs)
    or another ``--rule``."""
    return ("" if args.mult_tol == 1e-7 else f"_multol{args.mult_tol:g}") + \
        ("" if args.rule == "derivative" else f"_{args.rule}")


def rebuild(args, cache: Path):
    """The study's problem without training again, from ``study.npz`` (or ``--resume``: from θ̄ alone).

    ``study.npz`` (written by :func:`train` once training is done) holds the trained study's levels
    τⱼ, the level R̄ + τ, the unconstrained risks and TracIn's checkpoints, so a resumed run is the
    same study. Without it (``--resume`` on an older cache) the levels are read off θ̄: a binding or
    weakly active client has Rⱼ(θ̄) = τⱼ (to the KKT residual), every other client has the common
    level R̄ + τ of the binding ones; TracIn then has only the final checkpoint.
    """
    from polyproj.adapters.dif import ConstrainedProblem, Constraint, Loss
    from polyproj.adapters.dif.digits import (
        FairnessStudy,
        _ce,
        _test_fn,
        allconv_net,
        cross_entropy_loss,
        load_digits_clients,
    )

    D = load_digits_clients(args.seed, n_train=args.n_train)
    net = allconv_net(tuple(args.widths), args.seed)
    obj = Loss(cross_entropy_loss(args.wd), (D.X, D.y))

    def cdata(j):
        i = torch.as_tensor(np.flatnonzero(D.client == j))
        return (D.X[i], D.y[i])

    sfile = cache / "study.npz"
    if sfile.exists():
        z = np.load(sfile)
        taus, level, tau, risks0 = z["taus"].tolist(), float(z["level"]), float(z["tau"]), z["risks0"]
        weak, tc = [int(j) for j in z["weak"]], int(z["target_client"])
        checkpoints = [(torch.as_tensor(z[f"ck_theta{i}"]), z[f"ck_lam{i}"]) for i in range(int(z["n_ck"]))]
        kkt0 = (torch.as_tensor(z["theta"]), z["lam"])
    else:
        z = np.load(cache / "kkt.npz")
        th, status = torch.as_tensor(z["theta"]), z["status"]
        p0 = ConstrainedProblem(net, obj)
        risks = np.array([float(_ce(p0.wrap(th), cdata(j)).mean()) for j in range(D.n_clients)])
        level = float(np.mean(risks[status == "binding"]))
        taus = [float(risks[j]) if status[j] in ("binding", "weakly_active") else level for j in range(D.n_clients)]
        tau, risks0, checkpoints, kkt0 = float("nan"), np.full(D.n_clients, np.nan), [], None
        weak, tc = [int(j) for j in np.flatnonzero(status == "weakly_active")], int(np.argmax(risks))
    prob = ConstrainedProblem(net, obj, [Constraint(_ce, cdata(j), tau=taus[j], name=f"client{j}")
                                         for j in range(D.n_clients)])
    it = torch.as_tensor(np.flatnonzero(D.client_test == tc))
    S = FairnessStudy(problem=prob, kkt=None, data=D, test_loss=_test_fn(D.X_test, D.y_test),
                      client_test_loss=_test_fn(D.X_test[it], D.y_test[it]), level=level,
                      unconstrained_risks=np.asarray(risks0), checkpoints=checkpoints,
                      info={"tau": tau, "weak": weak, "target_client": tc, "wd": args.wd, "resumed": True})
    return S, kkt0


def save_study(S, cache: Path) -> None:
    """What :func:`rebuild` needs to make the same study again (levels, risks, checkpoints, trained θ, λ)."""
    ck = {}
    for i, (th, lam) in enumerate(S.checkpoints):
        ck[f"ck_theta{i}"], ck[f"ck_lam{i}"] = np.asarray(th), np.asarray(lam)
    np.savez(cache / "study.npz", taus=np.array([c.tau for c in S.problem.constraints]), level=S.level,
             tau=S.info["tau"], risks0=S.unconstrained_risks, weak=np.array(S.info["weak"], dtype=int),
             target_client=S.info["target_client"], n_ck=len(S.checkpoints), theta=S.kkt.theta.numpy(),
             lam=S.kkt.lambdas.numpy(), **ck)


def train(args, cache: Path):
    """The study at a KKT point polished to ``args.tol`` (cached: θ̄, λ̄, H)."""
    if args.resume or (cache / "study.npz").exists():
        S, kkt0 = rebuild(args, cache)
        log("rebuilt the trained study from the cache")
    else:
        S = make_fairness_study(args.seed, widths=args.widths, n_train=args.n_train, wd=args.wd, tol=1e-6,
                                chunk_size=args.chunk)
        save_study(S, cache)
        kkt0 = (S.kkt.theta, S.kkt.lambdas.numpy())
    prob = S.problem
    hfile, tfile = cache / "H.npy", cache / "kkt.npz"
    if tfile.exists():
        z = np.load(tfile)
        th, lam = torch.as_tensor(z["theta"]), z["lam"]
        log("loaded the polished KKT point from the cache")
    else:
        th, lam = kkt0
    if hfile.exists():
        log("loading H from the cache")
        H = np.load(hfile)
    else:
        log(f"forming H in float32 (d = {prob.dim}: {prob.dim} Hessian-vector products, vmapped)")
        t0 = time.perf_counter()
        H = hessian_float32(S, th, lam)
        np.save(hfile, H)
        log(f"H formed in {time.perf_counter() - t0:.0f} s")
    frozen = FrozenHessian(H)
    if not tfile.exists():
        th, lam, info = newton_kkt(prob, th, lam, tol=args.tol, hessian=frozen, chunk_size=args.chunk, max_iter=60)
        log(f"chord polish: residuals {[f'{r:.1e}' for r in info.residuals]}")
        if not info.converged:
            th, lam, info = newton_kkt(prob, th, lam, tol=args.tol, preconditioner=frozen, chunk_size=args.chunk,
                                       max_iter=args.newton_iter, rtol=args.minres_rtol)
            log(f"Newton-MINRES polish: residuals {[f'{r:.1e}' for r in info.residuals]}, "
                f"MINRES iterations {info.krylov_iterations}")
    kkt = KKTPoint.from_params(prob, th, lam, tol=max(args.tol * 10, 1e-9), polish=False, warn=False,
                               mult_tol=args.mult_tol)
    if not tfile.exists():
        np.savez(tfile, theta=th.numpy(), lam=lam, status=np.array(kkt.status))
    return S, kkt, frozen, H


def retrain_one(prob, kkt, frozen, removal, args, start=None):
    """Re-solve without ``removal`` from θ̄ (or ``start``) to KKT residual ``args.tol``.

    Chord SQP with the frozen H̄ first (triangular solves, finds active-set changes); where it stops
    short of the tolerance, Newton-MINRES with the exact Hessian (Hessian-vector products) on the
    working set's KKT system, MINRES preconditioned by the same H̄, from the chord's point; as a last
    resort the augmented Lagrangian, then Newton-MINRES again. ``info.method`` names the method that
    finished, ``info.residuals`` holds every stage's residuals in order.
    """
    p = prob.remove(removal) if removal else prob
    return resolve_kkt(p, kkt.theta if start is None else start, kkt.lambdas.numpy(), frozen, args)


def resolve_kkt(p, th0, lam0, frozen, args):
    """``p``'s KKT point from (θ₀, λ₀) by :func:`retrain_one`'s chain of methods, to KKT residual ``args.tol``."""
    th, lam, info = newton_kkt(p, th0, lam0, tol=args.tol, hessian=frozen, chunk_size=args.chunk,
                               max_iter=args.chord_iter)
    history = list(info.residuals)
    if not info.converged:
        th, lam, info = newton_kkt(p, th, lam, tol=args.tol, preconditioner=frozen, chunk_size=args.chunk,
                                   max_iter=args.newton_iter, rtol=args.minres_rtol)
        history += info.residuals[1:]
        info.method = "chord-sqp, then " + info.method
    if not info.converged:
        th, lam, _ = augmented_lagrangian(p, th, lam, tol=1e-8, chunk_size=args.chunk)
        th, lam, info = newton_kkt(p, th, lam, tol=args.tol, preconditioner=frozen, chunk_size=args.chunk,
                                   max_iter=args.newton_iter, rtol=args.minres_rtol)
        info.method = "chord-sqp, newton-minres, augmented Lagrangian, then " + info.method
        history += info.residuals
    info.residuals = history
    return th, lam, info


def probe_parser(doc: str):
    """The arguments the probes of a trained study share (``--cache``, ``--removals``, ``--wd``); add your own."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", required=True, help="dif_fairness.py's --cache of a trained study")
    ap.add_argument("--removals", type=int, nargs="*", default=None, help="positions among the 100 (default all)")
    ap.add_argument("--wd", type=float, default=1e-2)
    return ap


def cached_study(cache_dir: str, wd: float):
    """A trained study of this script's default settings from its ``--cache`` (the probes' entry: one torch
    thread, PolyprojWarnings silenced).

    Returns ``(S, kkt, frozen, removals, F0, args, truth)``: F0 the test loss at θ̄, args the settings it was read
    with, truth the cache's re-solved removals by key (``s0``…``s79``, ``g0``…``g19``, in :func:`removals_for`'s
    order: :data:`KEYS`).
    """
    from polyproj.runtime import set_torch_threads

    set_torch_threads(1)
    warnings.simplefilter("ignore", pp.PolyprojWarning)
    sargs = argparse.Namespace(seed=0, singles=80, groups=20, tol=1e-10, chord_iter=12, newton_iter=20,
                               minres_rtol=1e-11, wd=wd, mult_tol=1e-7, rule="derivative", n_train=None,
                               widths=(16, 32, 40), chunk=4096, threads=1, cache=cache_dir, resume=False,
                               precondition=True)
    cache = Path(cache_dir) / f"seed0_w16-32-40_nNone_wd{wd:g}"
    # the probes read a trained study, never train one: without these files train() would train the full
    # study (d = 10,370) from scratch, and the ground truth (truth.jsonl) would still be missing at its end
    missing = [f for f in ("study.npz", "kkt.npz", "H.npy", "truth.jsonl") if not (cache / f).exists()]
    if missing:
        raise SystemExit(f"no trained study in {cache} (missing {', '.join(missing)}): run "
                         f"benchmarks/dif_fairness.py --cache {cache_dir} --wd {wd:g} first")
    S, kkt, frozen, _ = train(sargs, cache)
    truth = {r["key"]: r for r in map(json.loads, (cache / "truth.jsonl").read_text().splitlines())}
    return S, kkt, frozen, removals_for(S, sargs), float(S.test_loss(S.problem.wrap(kkt.theta))), sargs, truth


def probe_removals(args):
    """The removal probes' common part: the cached study (:func:`cached_study`), a matrix-free DIF preconditioned
    by H̄, and per removal of ``args.removals`` (all by default) its key, the removed problem, DIF's first-order
    result and the time it was started. Returns ``(study, rows)``: ``study`` holds ``prob``, ``F`` (the test loss),
    ``F0``, ``kkt``, ``frozen``, ``sargs``, ``truth`` and ``dif``; ``rows`` is the generator of the removals."""
    from types import SimpleNamespace

    S, kkt, frozen, removals, F0, sargs, truth = cached_study(args.cache, args.wd)
    dif = DIF(S.problem, kkt, method="matrix-free", rtol=1e-8, preconditioner=frozen.solve)
    ctx = SimpleNamespace(prob=S.problem, F=S.test_loss, F0=F0, kkt=kkt, frozen=frozen, sargs=sargs, truth=truth,
                          dif=dif)

    def rows():
        for i in (args.removals if args.removals is not None else range(len(removals))):
            t0 = time.perf_counter()
            yield KEYS[i], S.problem.remove(removals[i]), dif.result(removals[i]), t0

    return ctx, rows()


#: the keys of the default 80 singles and 20 groups, in :func:`removals_for`'s order
KEYS = [f"s{k}" for k in range(80)] + [f"g{k}" for k in range(20)]


def removals_for(S, args) -> list[dict]:
    """Single removals and 1 % groups; a training point is removed from the objective and its client."""
    client = S.data.client
    pos = {}
    for j in range(S.data.n_clients):
        for k, i in enumerate(np.flatnonzero(client == j)):
            pos[int(i)] = (j, k)

    def rem(idx):
        out = {"objective": np.sort(np.asarray(idx))}
        for j in range(S.data.n_clients):
            ks = [pos[int(i)][1] for i in idx if pos[int(i)][0] == j]
            if ks:
                out[f"client{j}"] = np.sort(ks)
        return out

    n = len(client)
    singles = [rem([int(i)]) for i in np.random.default_rng(args.seed + 1).choice(n, size=args.singles, replace=False)]
    size = max(2, round(0.01 * n))
    rg = np.random.default_rng(args.seed + 2)
    groups = [rem(rg.choice(n, size=size, replace=False)) for _ in range(args.groups)]
    return singles + groups


def main(argv=None) -> int:
    from common import RESULTS, write_json

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--singles", type=int, default=80)
    ap.add_argument("--groups", type=int, default=20)
    ap.add_argument("--tol", type=float, default=1e-10, help="KKT residual of θ̄ and of every re-solve")
    ap.add_argument("--chord-iter", type=int, default=12, help="chord SQP steps before Newton-MINRES takes over")
    ap.add_argument("--newton-iter", type=int, default=20, help="Newton-MINRES steps (working-set drops included)")
    ap.add_argument("--minres-rtol", type=float, default=1e-11, help="relative residual of each Newton step's MINRES")
    ap.add_argument("--wd", type=float, default=1e-2)
    ap.add_argument("--mult-tol", type=float, default=1e-7,
                    help="KKTPoint's mult_tol: a constraint whose multiplier is at most this is weakly active "
                         "(sign-constrained in the DIF QP) rather than binding (an equality); scores cached apart")
    ap.add_argument("--rule", choices=("derivative", "finite"), default="derivative",
                    help="DIF's removal rule: the directional derivative (the paper's), or the finite step that "
                         "releases a binding constraint whose multiplier the removal uses up")
    ap.add_argument("--n-train", type=int, default=None)
    ap.add_argument("--widths", type=int, nargs=3, default=(16, 32, 40))
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: shared 2-core machine)")
    ap.add_argument("--cache", default="/tmp/polyproj_dif_fairness")
    ap.add_argument("--noise-seeds", type=int, default=2)
    ap.add_argument("--agree", type=int, default=6,
                    help="removals re-solved from a second perturbed start (half singles, half groups)")
    ap.add_argument("--quick", action="store_true", help="widths 4 8 8, 200 samples, 10 + 3 removals")
    ap.add_argument("--name", default="dif_fairness")
    ap.add_argument("--train-only", action="store_true", help="stop after stage 1 (θ̄ and H cached)")
    ap.add_argument("--resume", action="store_true", help="rebuild the problem at the cached θ̄ (no training)")
    ap.add_argument("--truth-from", default=None, metavar="JSON",
                    help="take the ground truth of an earlier run of the same study (its JSON): each dF shifted "
                         "by the two runs' F(θ̄) difference; the seed-to-seed stage, re-solved here from this "
                         "θ̄, then checks it")
    ap.add_argument("--no-order2", action="store_true", help="skip the second-order DIF predictions")
    ap.add_argument("--precondition", action="store_true",
                    help="DIF's CG preconditioned by the chord's factorised H̄ (same answers, fewer iterations)")
    args = ap.parse_args(argv)
    if args.quick:
        args.widths, args.n_train, args.singles, args.groups = (2, 4, 4), 120, 6, 3
        args.noise_seeds, args.agree, args.name = 1, 3, args.name + "_quick"
        args.cache = args.cache + "_quick"
    set_torch_threads(args.threads)
    warnings.simplefilter("ignore", pp.PolyprojWarning)
    cache = Path(args.cache) / f"seed{args.seed}_w{'-'.join(map(str, args.widths))}_n{args.n_train}_wd{args.wd:g}"
    cache.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    S, kkt, frozen, H = train(args, cache)
    prob = S.problem
    t_train = time.perf_counter() - t0
    log(f"{prob}; {kkt}; lambdas {np.round(kkt.lambdas.numpy(), 5).tolist()}")
    if args.train_only:
        return 0
    w = np.linalg.eigvalsh(H) if prob.dim <= 3000 else None
    R = removals_for(S, args)
    F = S.test_loss
    F0 = float(F(prob.wrap(kkt.theta)))

    # ---- predictions
    t = time.perf_counter()
    M = frozen.solve if args.precondition else None
    try:
        dif = DIF(prob, kkt, method="matrix-free", rule=args.rule, rtol=1e-8, preconditioner=M)
    except IndefiniteHessianError as err:
        log(f"CG: {err}; MINRES instead")
        dif = DIF(prob, kkt, method="matrix-free", rule=args.rule, rtol=1e-8, krylov="minres", preconditioner=M)
    pred = {"DIF": dif.influence(F, R).numpy()}
    np.save(cache / f"dif_scores_{len(R)}{_mt(args)}.npy", pred["DIF"])
    t_dif = time.perf_counter() - t
    klog = [(what, info.iterations, info.residual) for what, info in dif.krylov_log]
    log(f"DIF scores of {len(R)} removals in {t_dif:.1f} s; Krylov: {klog}")
    # baselines: the same matrix-free scores, CG preconditioned by the chord's factorised H̄ (≈ H⁻¹)
    act = np.array([s != "inactive" for s in kkt.status])
    _, _, _, G = first_order(prob, kkt.theta, args.chunk)

    def precond(rho: float = 0.0):
        U = np.sqrt(rho) * G[act]
        if rho == 0.0 or U.shape[0] == 0:
            return frozen.solve
        HU = frozen.solve(U.T)
        K = np.linalg.inv(np.eye(U.shape[0]) + U @ HU)
        return lambda v: frozen.solve(v) - HU @ (K @ (HU.T @ v))   # Woodbury: (H̄ + UᵀU)⁻¹

    def scores(**kw):
        """CG; where the Hessian is indefinite (∇²f₀ alone may be), the smallest damping that CG accepts."""
        damping = 0.0
        for _ in range(12):
            try:
                sc, lg = if_scores(prob, kkt, F, R, rtol=1e-8, maxiter=1500, damping=damping, **kw)
                return sc, lg, damping
            except IndefiniteHessianError as err:
                damping = max(2 * damping, damping + 1.5 * -err.curvature)
        raise pp.SolverError("no damping made the baseline's Hessian positive definite")

    t = time.perf_counter()
    pred["classic IF"], lg, if_damping = scores(kind="classic", preconditioner=precond())
    t_if = time.perf_counter() - t
    log(f"classic IF: damping {if_damping:.1e}, {lg[0][1]}")
    pred["TracIn"] = tracin_scores(prob, [*S.checkpoints, (kkt.theta, kkt.lambdas.numpy())], F, R)
    np.savez(cache / f"baseline_scores_{len(R)}.npz", **{k.replace(" ", "_"): v for k, v in pred.items()})
    log("classic IF and TracIn done")

    # ---- second-order DIF: one chord-Newton correction per removal (one pass over the data per step length
    # tried, one solve), shortened by backtracking on the removed problem's KKT residual where the full step
    # overshoots (DIFResult.step_length; 0: not applied)
    t_dif2, order2 = None, None
    if not args.no_order2:
        tag = f"{len(R)}{_mt(args)}"
        f2, f2_log, f2_time = (cache / f"dif2_scores_{tag}.npy", cache / f"dif2_log_{tag}.npy",
                               cache / f"dif2_time_{tag}.txt")
        t = time.perf_counter()
        if f2.exists() and f2_log.exists():  # scored by an earlier run on this cache
            pred["DIF (order 2)"] = np.load(f2)
            if f2_time.exists():
                t_dif2 = float(f2_time.read_text())
        else:  # (a cache from before the step lengths has scores but no log: scored again)
            pred["DIF (order 2)"] = dif.influence(F, R, order=2, progress=True).numpy()
            np.save(f2, pred["DIF (order 2)"])
            np.save(f2_log, np.array([(r, np.nan if s is None else s) for r, s in dif.second_order_log]))
            t_dif2 = time.perf_counter() - t
            f2_time.write_text(f"{t_dif2}\n")
            log(f"second-order DIF scores of {len(R)} removals in {t_dif2:.1f} s")
        ratios, steps = np.load(f2_log).T
        order2 = {"time_s": t_dif2, "correction_ratio": ratios.tolist(), "step_length": steps.tolist(),
                  "not_applied_singles": int(np.sum(steps[:args.singles] == 0)),
                  "not_applied_groups": int(np.sum(steps[args.singles:] == 0)),
                  "shortened_singles": int(np.sum((steps[:args.singles] > 0) & (steps[:args.singles] < 1))),
                  "shortened_groups": int(np.sum((steps[args.singles:] > 0) & (steps[args.singles:] < 1)))}
        log(f"second-order correction shortened on {order2['shortened_singles']} singles and "
            f"{order2['shortened_groups']} groups, not applied on {order2['not_applied_singles']} singles and "
            f"{order2['not_applied_groups']} groups")

    # ---- ground truth, appended line by line
    gt_file = cache / "truth.jsonl"
    keys = [f"s{k}" for k in range(args.singles)] + [f"g{k}" for k in range(args.groups)]
    truth_shift = None
    if args.truth_from and not gt_file.exists():
        prev = json.loads(Path(args.truth_from).read_text())
        truth_shift = float(prev["problem"]["test_loss"]) - F0
        with gt_file.open("w") as fh:
            for row in prev["truth"]["rows"]:
                fh.write(json.dumps(row | {"dF": row["dF"] + truth_shift, "imported_from": args.truth_from,
                                              "dF_shift": truth_shift}) + "\n")
        log(f"ground truth imported from {args.truth_from} (F(θ̄) there - here = {truth_shift:.2e})")
    have = {r["key"]: r for r in map(json.loads, gt_file.read_text().splitlines())} if gt_file.exists() else {}
    if truth_shift is None:  # imported by an earlier run on this cache: its rows carry the shift
        truth_shift = next((r["dF_shift"] for r in have.values() if "dF_shift" in r), None)

    def resolve(key, removal, start=None):
        t = time.perf_counter()
        th, _, info = retrain_one(prob, kkt, frozen, removal, args, start=start)
        row = {"key": key, "dF": float(F(prob.wrap(th))) - F0, "residual": info.residuals[-1],
               "converged": info.converged, "iterations": len(info.residuals) - 1, "method": info.method,
               "residuals": info.residuals, "minres_iterations": info.krylov_iterations,
               "dtheta_norm": float((th - kkt.theta).norm()), "time": time.perf_counter() - t,
               "g_new": (prob.remove(removal) if removal else prob).constraint_values(th).tolist()}
        log(f"{key}: residual {row['residual']:.1e} ({'converged' if row['converged'] else 'NOT converged'}) "
            f"by {row['method']}, {row['iterations']} steps, MINRES {row['minres_iterations']}, {row['time']:.0f} s")
        return th, row

    done = []
    with gt_file.open("a") as fh:
        for k in range(len(R)):
            if keys[k] not in have:
                have[keys[k]] = resolve(keys[k], R[k])[1]
                fh.write(json.dumps(have[keys[k]]) + "\n")
                fh.flush()
            done.append(have[keys[k]])
    actual = np.array([r["dF"] for r in done])
    conv = np.array([r["converged"] for r in done])
    n_single = args.singles
    t_truth = float(sum(r["time"] for r in done))

    # ---- Penalty-IF sweep (after the truth: the slowest baseline; one row per ρ, cached)
    sw_file = cache / f"penalty_sweep_{len(R)}.jsonl"
    sweep = list(map(json.loads, sw_file.read_text().splitlines())) if sw_file.exists() else []
    with sw_file.open("a") as fh:
        for pen, rhos in RHOS.items():
            for rho in rhos:
                if any(r["penalty"] == pen and r["rho"] == rho for r in sweep):
                    continue
                t = time.perf_counter()
                try:
                    sc, lg, dmp = scores(kind="penalty", rho=rho, penalty=pen,
                                         preconditioner=precond(rho if pen == "quadratic" else 0.0))
                    row = {"penalty": pen, "rho": rho, "scores": sc.tolist(), "cg_iterations": lg[0][1].iterations,
                           "residual": lg[0][1].residual, "damping": dmp}
                except pp.PolyprojError as err:
                    row = {"penalty": pen, "rho": rho, "error": str(err)[:200]}
                row["time"] = time.perf_counter() - t
                log(f"Penalty-IF {pen} ρ = {rho:g}: {row.get('cg_iterations', row.get('error'))} CG iterations, "
                    f"damping {row.get('damping')}, {row['time']:.0f} s")
                fh.write(json.dumps(row) + "\n")
                fh.flush()
                sweep.append(row)
    for r in sweep:
        if "scores" in r:
            r["scores"] = np.asarray(r["scores"])

    # ---- noise floor and seed-to-seed agreement (both from starts perturbed by the median single-removal ‖Δθ‖)
    rng = np.random.default_rng(123)
    scale = float(np.median([r["dtheta_norm"] for r in done[:n_single]]))
    extra_file = cache / "noise.jsonl"
    extra = {r["key"]: r for r in map(json.loads, extra_file.read_text().splitlines())} if extra_file.exists() else {}
    agree = [k for k in range(min(args.agree - args.agree // 2, n_single))] + \
        [n_single + k for k in range(min(args.agree // 2, len(R) - n_single))]
    todo = [(f"noise{i}", None, i) for i in range(args.noise_seeds)] + [(f"second_{keys[k]}", R[k], k) for k in agree]
    with extra_file.open("a") as fh:
        for key, removal, _ in todo:
            delta = torch.as_tensor(rng.normal(size=prob.dim))  # drawn for every entry: the same starts on resume
            if key not in extra:
                extra[key] = resolve(key, removal, start=kkt.theta + scale * delta / delta.norm())[1]
                fh.write(json.dumps(extra[key]) + "\n")
                fh.flush()
    noise = [extra[f"noise{i}"] for i in range(args.noise_seeds)]
    second = np.array([extra[f"second_{keys[k]}"]["dF"] for k in agree])
    s2s = np.abs(second - actual[agree])
    floor = [abs(n["dF"]) for n in noise]
    log(f"noise floor |dF| {[f'{v:.1e}' for v in floor]}; seed-to-seed |diff| "
        f"{[f'{v:.1e}' for v in s2s]} (removals {[keys[k] for k in agree]})")

    # ---- correlations, over the re-solves that reached the tolerance
    def stats(p, sel):
        sel = sel[conv[sel]]
        if len(sel) < 3:
            return None
        return {"n": len(sel), "pearson": pearson(p[sel], actual[sel]), "spearman": spearman(p[sel], actual[sel])}

    sel_all, sel_s, sel_g = np.arange(len(R)), np.arange(n_single), np.arange(n_single, len(R))
    ok = [s for s in sweep if "scores" in s]
    best = max(ok, key=lambda s: pearson(s["scores"][conv], actual[conv])) if ok else None
    if best is not None:
        pred[f"Penalty-IF ({best['penalty']}, ρ={best['rho']:g})"] = best["scores"]
    table = {name: {"all": stats(p, sel_all), "singles": stats(p, sel_s), "groups": stats(p, sel_g)}
             for name, p in pred.items()}

    # the same correlations split by DIF's own reliability flag, known before any retraining: whether the full
    # second-order correction lowers the removed problem's KKT residual (DIFResult.step_length 1); where it
    # has to be shortened or is not applied, the removal lies at or beyond the edge of the expansion's range
    by_flag = None
    if order2 is not None:
        steps = np.asarray(order2["step_length"])
        full = ~(steps < 1.0)  # 1, or nan: a removal that moves nothing
        by_flag = {"full_step": int(np.sum(full)), "shortened_or_not_applied": int(np.sum(~full))}
        for name, p in pred.items():
            by_flag[name] = {f"{part}_{flag}": stats(p, sel[mask[sel]])
                             for part, sel in (("all", sel_all), ("singles", sel_s), ("groups", sel_g))
                             for flag, mask in (("full_step", full), ("shortened_or_not_applied", ~full))}
        row = by_flag["DIF (order 2)"]
        log(f"DIF (order 2) where the full correction is taken ({by_flag['full_step']} removals): "
            f"r = {row['all_full_step']['pearson']:.4f}; elsewhere ({by_flag['shortened_or_not_applied']}): "
            f"r = {row['all_shortened_or_not_applied']['pearson']:.4f}" if row["all_full_step"] and
            row["all_shortened_or_not_applied"] else "DIF (order 2): too few removals on one side of the flag")

    def fmt(x, key="pearson"):
        return f"{x[key]:.4f}" if x else "n/a"

    for name, row in table.items():
        log(f"{name:38s} r = {fmt(row['all'])}  ρ_s = {fmt(row['all'], 'spearman')}  "
            f"(singles {fmt(row['singles'])} / {fmt(row['singles'], 'spearman')}, "
            f"groups {fmt(row['groups'])} / {fmt(row['groups'], 'spearman')})")

    # ---- violations at θ̄ + ω (a few removals: one Krylov solve each)
    viol = {"DIF": [], "DIF (order 2)": [], "classic IF": [], "truth": []}
    from polyproj.adapters.dif import classic_if

    pick = list(range(min(3, n_single))) + list(range(n_single, min(n_single + 2, len(R))))
    for k in pick:
        newp = prob.remove(R[k])
        om = dif.delta_theta(R[k])
        viol["DIF"].append(newp.constraint_values(kkt.theta + om).tolist())
        if not args.no_order2:
            viol["DIF (order 2)"].append(newp.constraint_values(kkt.theta + dif.delta_theta(R[k], order=2)).tolist())
        viol["truth"].append(done[k]["g_new"])
        if prob.dim <= 3000:
            viol["classic IF"].append(newp.constraint_values(kkt.theta + classic_if(prob, kkt, R[k])).tolist())
    keep = np.flatnonzero(conv)
    _plot(RESULTS / f"{args.name}.png", {k: v[keep] for k, v in pred.items()}, actual[keep],
          int(np.sum(keep < n_single)), table)
    _, _, gk, _ = first_order(prob, kkt.theta, args.chunk)
    path = write_json(args.name, {
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items()},
        "problem": {"d": prob.dim, "N_train": prob.objective.n_samples, "N_test": int(S.data.y_test.numel()),
                    "clients": [int(np.sum(S.data.client == j)) for j in range(S.data.n_clients)],
                    "level": S.level, "tau": S.info["tau"], "weak_by_construction": S.info["weak"],
                    "classification": kkt.classification, "lambdas": kkt.lambdas.tolist(), "g": gk.tolist(),
                    "kkt_residuals": kkt.residuals, "unconstrained_risks": S.unconstrained_risks.tolist(),
                    "hessian_eigs": None if w is None else [float(w[0]), float(w[-1])],
                    "frozen_shift": frozen.shift, "test_loss": F0},
        "correlation": table,
        "correlation_by_dif_flag": by_flag,
        "predicted": {"keys": keys, "actual": actual.tolist(), "converged": conv.tolist(),
                      **{name: np.asarray(p).tolist() for name, p in pred.items()}},
        "penalty_sweep": [{k: v for k, v in s.items() if k != "scores"} | (
            {"pearson": pearson(s["scores"][conv], actual[conv])} if "scores" in s else {}) for s in sweep],
        "truth": {"n": len(done), "tol": args.tol, "converged": int(conv.sum()),
                  "converged_singles": int(conv[sel_s].sum()), "converged_groups": int(conv[sel_g].sum()),
                  "worst_residual": max(r["residual"] for r in done),
                  "worst_residual_converged": max((r["residual"] for r in done if r["converged"]), default=None),
                  "finished_by": {m: sum(r["method"] == m and r["converged"] for r in done)
                                  for m in sorted({r["method"] for r in done})},
                  "median_time_s": float(np.median([r["time"] for r in done])),
                  "median_time_s_by_method": {m: float(np.median([r["time"] for r in done if r["method"] == m]))
                                              for m in sorted({r["method"] for r in done})},
                  "total_time_s": t_truth,
                  "dF_abs_median_singles": float(np.median(np.abs(actual[sel_s]))),
                  "dF_abs_median_groups": float(np.median(np.abs(actual[sel_g]))) if len(sel_g) else None,
                  "rows": done},
        "noise_floor": {"start_perturbation_norm": scale, "rows": noise,
                        "max_abs_dF": float(max(abs(n["dF"]) for n in noise))},
        "seed_to_seed": {"removals": [keys[k] for k in agree], "second_dF": second.tolist(),
                         "first_dF": actual[agree].tolist(), "abs_diff": s2s.tolist(),
                         "max_abs_diff": float(s2s.max()), "all_converged": all(extra[f"second_{keys[k]}"]["converged"]
                                                                              for k in agree),
                         "pearson": pearson(second, actual[agree]) if len(agree) > 2 else None},
        "violations_at_theta_plus_omega": {"removals": pick, **viol},
        "dif_order2": order2,
        "truth_imported": {"from": args.truth_from, "dF_shift": truth_shift} if args.truth_from else None,
        "classic_if_damping": if_damping,
        "timing": {"train_s": t_train, "dif_scores_s": t_dif, "dif_order2_s": t_dif2, "classic_if_s": t_if, "truth_s": t_truth,
                   "dif_krylov": [{"what": a, "iterations": b, "residual": c} for a, b, c in klog]},
        "paper": {"DIF": 0.90, "Penalty-IF": 0.62},
    })
    log(f"wrote {path}")
    return 0


def _plot(png: Path, pred: dict, actual: np.ndarray, n_single: int, table: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, (lo, hi, what) in zip(axes, ((0, n_single, "single removals"), (n_single, len(actual), "1 % groups")),
                                  strict=True):
        for (name, p), mk in zip(pred.items(), "o+x^s", strict=False):
            if name == "TracIn":
                continue
            r = pearson(p[lo:hi], actual[lo:hi]) if hi - lo > 2 else float("nan")
            ax.scatter(actual[lo:hi], p[lo:hi], s=10, marker=mk, alpha=0.6, label=f"{name}  r={r:.3f}")
        a = ax.get_xlim()
        ax.plot(a, a, "k--", lw=0.8)
        ax.set_xlabel("actual test-loss change (constrained retraining)")
        ax.set_ylabel("predicted")
        ax.set_title(what)
        ax.legend(fontsize=7)
    fig.suptitle("Fairness-constrained all-conv net on digits: predicted vs actual")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=80)


if __name__ == "__main__":
    raise SystemExit(main())
