"""Differentiable exact projection onto a polyhedron for PyTorch, with the HS-Jacobian backward.

``y = Π_P(x)`` with ``P = {y : A y <= a, B y = b, lb <= y <= ub}``. The forward is a backend solve
followed by the exact active-set polish (:mod:`polyproj.polish`), so every output is feasible to
rounding. The backward is the HS-Jacobian (DESIGN §6) on the polished active face: with the active
rows ``M = [A_I; B]``, the fixed coordinates ``E`` (active bounds), ``F`` the free coordinates and
``J = I − H(HᵀH)⁺Hᵀ``, ``H = [Mᵀ, Eᵀ]`` (projector onto the null space of the active rows),

    ∂L/∂x     = J g,
    ∂L/∂c_I   = r := (M_F⁺)ᵀ g            (c = a_I, b: zero on inactive rows of a),
    ∂L/∂v_E   = g_E − (Mᵀ r)_E            (v the value of an active bound: lb or ub),
    ∂L/∂M     = −λ (J g)ᵀ − r yᵀ          (A_I, B; λ the multipliers of y = x − Mᵀλ − ...),

computed without forming ``J`` from one batched factorisation of the active rows
(:func:`polyproj.polish.factor_face`, the building blocks of :mod:`polyproj.hs_jacobian`), on the
tensor's device and in its dtype. Constraint data may be shared (``A (m, n)``) or carry the batch
dimension (``A (..., m, n)``); shared data receive the gradient summed over the batch.

Backends: ``"torch"`` — a batched ADMM written in torch (shared factorisation, runs on the
tensor's device) that only has to *identify* the active face, which the polish then solves exactly;
``"ipm"`` — the batched interior-point method of :mod:`polyproj.solvers.ipm` when installed; any registered
CPU backend (``"proxsuite"``, ``"osqp"``, ``"highs"``, ...) through NumPy. ``"auto"`` (default):
see :func:`choose_backend`.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import InfeasibleError, PolyprojError, PolyprojWarning, ProblemError
from ..hs_jacobian import expand_rows, gather_active_rows, null_apply, pinv_t_apply
from ..polish import factor_face, gram_cholesky, polish
from ..solution import Status
from ..threads import torch_single_thread

__all__ = ["ProjectionLayer", "choose_backend", "project"]

_NAMES = ("A", "a", "B", "b", "lb", "ub")
_POLISH_KEYS = ("tol", "max_polish_iter")


# ----------------------------------------------------------------------------- backend choice
def _ipm_available() -> bool:
    try:
        from ..solvers import ipm
    except ImportError:
        return False
    return hasattr(ipm, "solve_qp_batch")


def choose_backend(x: torch.Tensor, shared: bool) -> str:
    """The ``backend="auto"`` rule, from measurements (forward + backward, float64, CPU).

    * constraint matrices shared by the batch (any device): ``"torch"`` — ADMM on one shared
      factorisation identifies the active face with batched matrix products, the exact polish then
      costs one batched Cholesky per active-set correction. Measured on a shared 2-core EPYC
      (medians of 3, n = 50, m = 100 unless said): batch 1: torch 11 ms, proxsuite 13 ms, ipm 65 ms;
      batch 16: 28 / 452 / 234 ms; batch 128: 140 / 1160 / 865 ms; batch 1024: 1.4 / 3.7 / 4.9 s;
      batch 128, n = 200: 1.4 / 68 / 23 s.
    * per-sample matrices (input-dependent ``A`` / ``B``, no shared factorisation): ``"ipm"`` when
      :mod:`polyproj.solvers.ipm` is installed (batched, on the tensor's device), else ``"proxsuite"``
      (one solve per sample) on CPU and ``"torch"`` elsewhere (which then raises: it needs shared
      matrices).
    """
    if shared:
        return "torch"
    if _ipm_available():
        return "ipm"
    return "torch" if x.device.type != "cpu" else "proxsuite"


def _choose_fallback(X: torch.Tensor, count: int, settings: dict) -> str:
    """The ``fallback="auto"`` rule for the samples the polish could not verify from the ADMM start.

    ProxSuite one QP at a time on CPU for a few small samples, else the batched IPM on the tensor's
    device. Measured (forward of the fallback, float64, shared 2-core EPYC, m = 2n): n 20: IPM
    26-34 ms vs ProxSuite 2.5-9.5 ms for 1-16 samples; n 100: 58 / 40 ms (1 sample), 81 / 77 ms
    (4), 165 / 258 ms (16); n 400: 0.19 / 4.6 s (1 sample). The IPM pays ~2 ms of dispatch per
    iteration whatever the batch; ProxSuite's dense solve grows with n³ per sample.
    """
    if X.device.type == "cpu" and X.shape[-1] <= 100 and count <= 8:
        try:
            from ..registry import get_backend

            get_backend("proxsuite", **settings)  # installed, and takes the user's settings
            return "proxsuite"
        except PolyprojError:
            pass
    return "ipm"


# ----------------------------------------------------------------------------- validation
def _as_tensor(v: Any, name: str, like: torch.Tensor) -> torch.Tensor | None:
    if v is None:
        return None
    if not isinstance(v, torch.Tensor):
        v = torch.as_tensor(np.asarray(v, dtype=np.float64), dtype=like.dtype, device=like.device)
    if v.device != like.device:
        raise ProblemError(f"{name} is on {v.device} but x is on {like.device}: move the constraint data to "
                           "the device of x (ProjectionLayer.to(device) does it for its buffers)")
    if v.dtype != like.dtype:
        raise ProblemError(f"{name} has dtype {v.dtype} but x has {like.dtype}: use one dtype "
                           "(float32 or float64) for x and the constraint data")
    return v


def _prepare(x, A, a, B, b, lb, ub):
    """Validate and flatten the batch: returns (x2 (N, n), data dict, batch_shape)."""
    if not isinstance(x, torch.Tensor):
        raise ProblemError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float32, torch.float64):
        raise ProblemError(f"x must be float32 or float64, got {x.dtype}")
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ProblemError(f"x must have shape (..., n) with n >= 1, got {tuple(x.shape)}")
    n = x.shape[-1]
    bshape = tuple(x.shape[:-1])
    N = int(np.prod(bshape)) if bshape else 1
    vals = {k: _as_tensor(v, k, x) for k, v in zip(_NAMES, (A, a, B, b, lb, ub), strict=True)}
    if torch.isnan(x).any() or torch.isinf(x).any():
        raise ProblemError("x contains NaN or inf")
    out: dict[str, torch.Tensor | None] = {}
    for M, v in (("A", "a"), ("B", "b")):
        Mt, vt = vals[M], vals[v]
        if (Mt is None) != (vt is None):
            raise ProblemError(f"{M} and {v} must be given together")
        if Mt is None:
            out[M] = out[v] = None
            continue
        if Mt.ndim < 2 or Mt.shape[-1] != n:
            raise ProblemError(f"{M} must have shape (r, {n}) or (..., r, {n}) to match x, got {tuple(Mt.shape)}")
        r = Mt.shape[-2]
        if Mt.ndim > 2:
            if tuple(Mt.shape[:-2]) != bshape:
                raise ProblemError(f"{M} carries batch dimensions {tuple(Mt.shape[:-2])} but x has {bshape}")
            Mt = Mt.reshape(N, r, n)
        if vt.ndim == 0 or vt.shape[-1] != r:
            raise ProblemError(f"{v} must have shape ({r},) or (..., {r}) to match {M}, got {tuple(vt.shape)}")
        if vt.ndim > 1:
            if tuple(vt.shape[:-1]) != bshape:
                raise ProblemError(f"{v} carries batch dimensions {tuple(vt.shape[:-1])} but x has {bshape}")
            vt = vt.reshape(N, r)
        if not torch.isfinite(Mt).all():
            raise ProblemError(f"{M} contains NaN or inf")
        if torch.isnan(vt).any() or (v == "b" and torch.isinf(vt).any()) or (v == "a" and (vt == -torch.inf).any()):
            raise ProblemError(f"{v} contains NaN" + (" or inf" if v == "b" else " or -inf"))
        out[M], out[v] = Mt, vt
    for k, sign in (("lb", -1), ("ub", 1)):
        t = vals[k]
        if t is None:
            out[k] = None
            continue
        if t.shape[-1] != n:
            raise ProblemError(f"{k} must have shape ({n},) or (..., {n}), got {tuple(t.shape)}")
        if t.ndim > 1:
            if tuple(t.shape[:-1]) != bshape:
                raise ProblemError(f"{k} carries batch dimensions {tuple(t.shape[:-1])} but x has {bshape}")
            t = t.reshape(N, n)
        if torch.isnan(t).any() or (t == -sign * torch.inf).any():
            raise ProblemError(f"{k} contains NaN or {'+' if sign < 0 else '-'}inf")
        out[k] = t
    if out["lb"] is not None and out["ub"] is not None and (out["lb"] > out["ub"]).any():
        raise InfeasibleError("lb > ub for some coordinate: the polyhedron is empty")
    return x.reshape(N, n), out, bshape


# ----------------------------------------------------------------------------- forward solvers
def _full(data: dict, x2: torch.Tensor):
    """Float64 constraint data with defaults for missing parts (zero rows, infinite bounds)."""
    n, dev = x2.shape[1], x2.device
    f64 = torch.float64

    def cv(t):
        return None if t is None else t.to(f64)

    A = cv(data["A"]) if data["A"] is not None else torch.zeros(0, n, dtype=f64, device=dev)
    a = cv(data["a"]) if data["a"] is not None else torch.zeros(0, dtype=f64, device=dev)
    B = cv(data["B"]) if data["B"] is not None else torch.zeros(0, n, dtype=f64, device=dev)
    b = cv(data["b"]) if data["b"] is not None else torch.zeros(0, dtype=f64, device=dev)
    lb = cv(data["lb"]) if data["lb"] is not None else torch.full((n,), -torch.inf, dtype=f64, device=dev)
    ub = cv(data["ub"]) if data["ub"] is not None else torch.full((n,), torch.inf, dtype=f64, device=dev)
    return A, a, B, b, lb, ub


def _solve_registry(backend: str, X, A, a, B, b, lb, ub, settings):
    """Any registered CPU backend through NumPy; returns (Y0, full-layout mult0, statuses)."""
    from .. import QP
    from ..registry import get_backend

    solver = get_backend(backend, **settings)
    Xn = X.detach().cpu().numpy()
    N, n = Xn.shape
    An, an, Bn, bn = (t.detach().cpu().numpy() for t in (A, a, B, b))
    lbn, ubn = lb.detach().cpu().numpy(), ub.detach().cpu().numpy()
    m, p = An.shape[-2], Bn.shape[-2]

    def qp_of(i):
        Ai = An if An.ndim == 2 else An[i]
        Bi = Bn if Bn.ndim == 2 else Bn[i]
        ai = an if an.ndim == 1 else an[i]
        bi = bn if bn.ndim == 1 else bn[i]
        return QP(P=np.eye(n), q=-Xn[i], C=np.vstack([Ai, Bi]), l=np.concatenate([np.full(m, -np.inf), bi]),
                  u=np.concatenate([ai, bi]), lb=lbn if lbn.ndim == 1 else lbn[i],
                  ub=ubn if ubn.ndim == 1 else ubn[i], check_psd=False)

    if An.ndim == 2 and Bn.ndim == 2:  # shared matrices: native batch, per-sample vectors allowed
        qp = qp_of(0)
        vecs: dict[str, np.ndarray] = {"q": -Xn}
        if an.ndim == 2 or bn.ndim == 2:
            ab = np.broadcast_to(an, (N, m)) if an.ndim == 1 else an
            bb = np.broadcast_to(bn, (N, p)) if bn.ndim == 1 else bn
            vecs["l"] = np.concatenate([np.full((N, m), -np.inf), bb], axis=1)
            vecs["u"] = np.concatenate([ab, bb], axis=1)
        if lbn.ndim == 2:
            vecs["lb"] = lbn
        if ubn.ndim == 2:
            vecs["ub"] = ubn
        if N == 1:
            sols = [solver.solve(qp)]
        else:
            bs = solver.solve_batch(qp, **vecs)
            sols = None
    else:
        sols = [solver.solve(qp_of(i)) for i in range(N)]
    if sols is not None:
        Y0 = np.stack([s.x for s in sols])
        Z = np.stack([s.z for s in sols])
        Zb = np.stack([s.z_box for s in sols])
        st = [s.status for s in sols]
    else:
        Y0, Z, Zb, st = np.atleast_2d(bs.x), np.atleast_2d(bs.z), np.atleast_2d(bs.z_box), list(bs.status)
    Z, Zb = np.nan_to_num(Z), np.nan_to_num(Zb)
    mult0 = np.concatenate([Z[:, :m], -Zb, Zb], axis=1)
    eps = float(solver.settings.get("eps_abs", 1e-8))
    return (torch.as_tensor(Y0, dtype=X.dtype, device=X.device),
            torch.as_tensor(mult0, dtype=X.dtype, device=X.device), st, eps)


def _solve_ipm(X, A, a, B, b, lb, ub, settings):
    """The batched interior-point method of :mod:`polyproj.solvers.ipm`, in torch on the tensor's device."""
    from ..solvers import ipm

    N, n = X.shape
    m = A.shape[-2]
    if A.ndim == 3 or B.ndim == 3:
        C = torch.cat([A.expand(N, -1, -1) if A.ndim == 2 else A, B.expand(N, -1, -1) if B.ndim == 2 else B], 1)
    else:
        C = torch.cat([A, B], 0)
    if a.ndim == 2 or b.ndim == 2:
        aa, bb = a.expand(N, -1) if a.ndim == 1 else a, b.expand(N, -1) if b.ndim == 1 else b
    else:
        aa, bb = a, b
    lo = torch.cat([torch.full_like(aa, -torch.inf), bb], -1)
    hi = torch.cat([aa, bb], -1)
    eye = torch.eye(n, dtype=X.dtype, device=X.device)
    eps = float(settings.get("eps_abs", 1e-8))
    res = ipm.solve_qp_batch(eye, -X, C, lo, hi, lb, ub, eps_abs=eps, eps_rel=float(settings.get("eps_rel", 0.0)),
                             max_iter=int(settings.get("max_iter") or 100))
    z, zb = torch.nan_to_num(res.z), torch.nan_to_num(res.z_box)
    mult0 = torch.cat([z[:, :m], -zb, zb], dim=-1)
    return res.x, mult0, list(res.statuses()), eps


def _solve_admm(X, A, a, B, b, lb, ub, settings):
    """Batched ADMM for the projection (OSQP splitting, ``P = I``), shared factorisation.

    Iterates ``y = K⁻¹(x + Cᵀρ(z − s))``, ``v = α C y + (1 − α) z`` (over-relaxation),
    ``t = v + s``, ``z = clip(t, l, u)``, ``s = t − z`` with the scaled multipliers ``s = w / ρ``,
    ``C = [A; B; I]`` (rows equilibrated; the bound rows only when some bound is finite) and
    ``K = I + CᵀρC`` factorised once. It only has to identify the active face (rows with
    ``s ≠ 0``); the polish makes the result exact. Runs in ``admm_dtype`` (float32 unless set)
    and returns that dtype.
    """
    N, n = X.shape
    if A.ndim == 3 or B.ndim == 3:
        raise ProblemError("backend 'torch' needs constraint matrices shared by the batch; use 'ipm' or a CPU backend")
    # the ADMM only identifies the active face (the polish then solves it exactly in float64), so it
    # runs in float32 by default: its matrix products are twice as fast (headline fwd+bwd, batch 128,
    # n 50, m 100: 74 -> 47 ms), and the identified faces, polish rounds and fallbacks measured the
    # same as in float64 on 4 seeds x 5 configs (benchmarks/bench_layer.py shapes)
    dt = settings.get("admm_dtype", torch.float32)
    if isinstance(dt, str):
        dt = getattr(torch, dt, None)
    if dt not in (torch.float32, torch.float64):
        raise ProblemError(f"admm_dtype must be torch.float32 or torch.float64, got {settings['admm_dtype']!r}")
    X, A, a, B, b, lb, ub = (t.to(dt) for t in (X, A, a, B, b, lb, ub))
    dev = X.device
    m, p = A.shape[0], B.shape[0]
    tiny = torch.finfo(dt).tiny  # zero rows stay zero (1e-300 would underflow to 0 in float32)
    rows_n = torch.linalg.vector_norm(A, dim=1).clamp_min(tiny)
    Bn = torch.linalg.vector_norm(B, dim=1).clamp_min(tiny)
    # bound rows: none when no coordinate has a finite bound, else one per coordinate (their
    # products with y are y itself: the loop skips them in the matrix product)
    boxed = bool((torch.isfinite(lb) | torch.isfinite(ub)).any())
    nb = n if boxed else 0
    q = m + p  # rows in the matrix product
    C = torch.cat([A / rows_n[:, None], B / Bn[:, None]] + ([torch.eye(n, dtype=dt, device=dev)] if boxed else []))
    # the iterates are kept transposed, (rows, N): the bound rows are then a contiguous block
    hiT = torch.cat([(a / rows_n)[:, None].expand(m, N) if a.ndim == 1 else (a / rows_n).T,
                     (b / Bn)[:, None].expand(p, N) if b.ndim == 1 else (b / Bn).T]
                    + ([ub.T.expand(n, N) if ub.ndim == 2 else ub[:, None].expand(n, N)] if boxed else []))
    loT = torch.cat([torch.full((m, N), -torch.inf, dtype=dt, device=dev), hiT[m: q]]
                    + ([lb.T.expand(n, N) if lb.ndim == 2 else lb[:, None].expand(n, N)] if boxed else []))
    hiT, loT = hiT.contiguous(), loT.contiguous()
    eq = torch.zeros(q + nb, dtype=torch.bool, device=dev)
    eq[m: q] = True
    rho = float(settings.get("admm_rho", 10.0))
    alpha = float(settings.get("admm_alpha", 1.6))  # over-relaxation (OSQP's default)
    rho_v = torch.where(eq, 1e3 * rho, rho)  # OSQP: stiffer equality rows
    K = torch.eye(n, dtype=dt, device=dev) + (C.T * rho_v) @ C
    Kinv = torch.cholesky_inverse(torch.linalg.cholesky(K))
    KCr = Kinv @ (C.T * rho_v)  # (n, r) K⁻¹Cᵀρ: the loop keeps the scaled multipliers s = w / ρ
    Cq = C[:q].contiguous()
    XkT = (X @ Kinv).T.contiguous()
    zT = (C @ X.T).clamp_(loT, hiT)
    sT = torch.zeros_like(zT)
    uT = torch.empty_like(zT)
    yT = torch.empty_like(XkT)
    CyT = torch.empty_like(zT)
    tT = torch.empty_like(zT)
    max_iter = int(settings.get("admm_iter", 0) or 300)
    check = int(settings.get("admm_check", 25))
    # stragglers allowed at the stop: the polish corrects their few wrong rows, while every check
    # more costs 25 iterations of the whole batch (fwd+bwd, n 50, 3 seeds: batch 1024 470 -> 400 ms
    # with 3 % allowed, batch 4096 1.84 -> 1.39 s; at batch 128 any allowance cost more than it saved)
    stable = settings.get("admm_stable")
    stable = 0.03 * max(0, N - 256) / N if stable is None else float(stable)
    pattern = None
    zq, Cyq, zb, Cyb = zT[:q], CyT[:q], zT[q:], CyT[q:]  # views, made once (the loop writes in place)
    addmm, lerp, add, sub, clamp = torch.addmm, torch.lerp, torch.add, torch.sub, torch.clamp
    beta = 1.0 - alpha
    for it in range(max_iter):
        # fused, allocation-free form of: y = K⁻¹(x + Cᵀρ(z − s)); Cy = α C y + (1 − α) z;
        # t = Cy + s; z⁺ = clip(t, l, u); s⁺ = t − z⁺ (the loop is dispatch-bound at these sizes:
        # five elementwise passes)
        sub(zT, sT, out=uT)
        addmm(XkT, KCr, uT, out=yT)
        addmm(zq, Cq, yT, beta=beta, alpha=alpha, out=Cyq)
        if boxed:  # the bound rows of C y are y
            lerp(zb, yT, alpha, out=Cyb)
        add(CyT, sT, out=tT)
        clamp(tT, loT, hiT, out=zT)
        sub(tT, zT, out=sT)
        if (it + 1) % check == 0:
            # stop once no row has joined the identified active set (the rows seen with s ≠ 0 at a
            # check, a union) in two consecutive windows of `check` iterations, in all but a
            # fraction `stable` of the samples (the polish corrects a few rows, cheaply on a
            # subset). Rows leaving are not counted: s is exactly 0 off the bounds, and weakly
            # active rows come and go for long after the face is found (counting them took
            # 175-300 iterations at the headline shape, this 150-200; 12 seeds, fwd+bwd: 38.1 ->
            # 35.4 ms mean; one clean window instead of two: 40.5 ms, the rows still missing sent
            # samples to the fallback solver)
            new = sT != 0
            if pattern is None:
                pattern, clean = new, 0
                continue
            clean = clean + 1 if int((new & ~pattern).any(dim=0).sum()) <= stable * N else 0
            if clean == 2:
                break
            pattern |= new
    y = (XkT + KCr @ (zT - sT)).T
    w = (sT * rho_v[:, None]).T
    wa = w[:, :m] / rows_n
    if boxed:
        mult0 = torch.cat([wa, -w[:, q:], w[:, q:]], dim=1)
    else:
        mult0 = torch.cat([wa, w.new_zeros(N, 2 * n)], dim=1)
    return y, mult0, [Status.SOLVED_INACCURATE] * N, 1e-3


# ----------------------------------------------------------------------------- the Function
def _forward(x2, data, backend, settings):
    """Exact projection of the flattened batch.

    Returns y (float64), active, multipliers (inequality, equality), accepted, and the faces of the
    polish (:class:`polyproj.polish.FaceRecord`: the Cholesky factors the backward reuses).
    """
    polish_tol = float(settings.pop("tol", 1e-9))
    X = x2.detach().to(torch.float64)
    A, a, B, b, lb, ub = _full(data, X)
    shared = A.ndim == 2 and B.ndim == 2
    name = choose_backend(x2, shared) if backend == "auto" else backend
    # from a rough ADMM start, samples not verified after a few corrections go to the fallback solver
    user_polish = settings.pop("max_polish_iter", None)
    # from the ADMM start: 12 + n/20 corrections (a round on the few samples left costs ~1.5 ms at
    # n 50, the fallback ~10 ms a sample: 8 seeds at batch 128, n 50, mean 48.2 ms with 8 rounds,
    # 46.9 ms with 12; the wrong rows grow with n: n 1000, batch 4 took 78 s with 12 rounds, three
    # samples going to the fallback IPM, and 4.4 s with 40 rounds, none)
    n = x2.shape[-1]
    max_polish = int(user_polish if user_polish is not None else (12 + n // 20 if name == "torch" else 50))
    block_iter = int(settings.pop("polish_block_iter", 0))
    if name == "torch":
        admm = {k: settings.pop(k) for k in list(settings) if k.startswith("admm_")}
        fb = str(settings.pop("fallback", "auto"))
        from ..registry import get_backend

        get_backend("ipm" if fb == "auto" else fb, **settings)  # validates the settings (they go to the fallback)
        Y0, mult0, st, eps = _solve_admm(X, A, a, B, b, lb, ub, admm)
        Y0, mult0 = Y0.to(X.dtype), mult0.to(X.dtype)
    elif name == "ipm":
        Y0, mult0, st, eps = _solve_ipm(X, A, a, B, b, lb, ub, settings)
    else:
        Y0, mult0, st, eps = _solve_registry(name, X, A, a, B, b, lb, ub, settings)
    if any(s is Status.PRIMAL_INFEASIBLE for s in st):
        raise InfeasibleError(f"the polyhedron is empty (backend {name!r} reports PRIMAL_INFEASIBLE for "
                              f"{sum(s is Status.PRIMAL_INFEASIBLE for s in st)} of {len(st)} samples)")
    # candidates from the ADMM: its multipliers are exact zeros off the bounds, so rows near their
    # hyperplane without one are rarely active: a distance candidate within 3e-2 of its accuracy
    # (12 seeds of the headline shape: rows wrongly taken in round 1 in 44 -> 12 of 128 samples at
    # seed 0, fwd+bwd mean 31.5 -> 24.1 ms; 1e-1: 25.8, 3e-3: 28.2 with rows missed instead)
    dist_factor = 0.03 if name == "torch" else 1.0
    faces: list = []
    Y, active, mult, mu, accepted = polish(X, A, a, B, b, lb, ub, Y0, torch.nan_to_num(mult0),
                                           cand_tol=max(1e-7, 10.0 * eps), dist_tol=max(1e-9, dist_factor * eps),
                                           tol=polish_tol, max_iter=max_polish,
                                           block_iter=block_iter, faces=faces)
    if name == "torch" and not bool(accepted.all()):
        # the ADMM start was too rough for these samples: solve them accurately and polish again
        bad = ~accepted
        sub = {k: (v[bad] if v.ndim == (3 if k in "AB" else 2) else v)
               for k, v in dict(A=A, a=a, B=B, b=b, lb=lb, ub=ub).items()}
        auto = fb == "auto"
        if auto:
            fb = _choose_fallback(X, int(bad.sum()), settings)
        # the fallback's polish starts from an accurate solution: its own default corrections
        # unless the user set them
        fb_settings = dict(settings, tol=polish_tol)
        if user_polish is not None:
            fb_settings["max_polish_iter"] = user_polish
        try:
            Yb, ab_, mb, mub, accb, faces_b = _forward(X[bad], sub, fb, fb_settings)
        except InfeasibleError:
            if not (auto and fb != "ipm"):
                raise
            # ProxSuite's dense solver misreports PRIMAL_INFEASIBLE on a few feasible points (see
            # pp.project); the automatic choice then asks the IPM, which raises if it agrees
            Yb, ab_, mb, mub, accb, faces_b = _forward(X[bad], sub, "ipm", fb_settings)
        where = torch.nonzero(bad)[:, 0]  # the fallback's batch rows in this batch
        for rec in faces_b:
            rec.idx = where if rec.idx is None else where[rec.idx]
        faces += faces_b
        Y, active = _scatter_rows(Y, bad, Yb), _scatter_rows(active, bad, ab_)
        mult, mu = _scatter_rows(mult, bad, mb), _scatter_rows(mu, bad, mub)
        accepted = _scatter_rows(accepted, bad, accb)
        return Y, active, mult, mu, accepted, faces
    if not bool(accepted.all()):
        bad = ~accepted
        viol = _violation(Y0[bad], A, a, B, b, lb, ub, bad)
        if not bool(torch.isfinite(viol).all()) or float(viol.max()) > 1e-6:
            raise InfeasibleError(
                f"the exact projection could not be verified for {int(bad.sum())} of {bad.numel()} samples "
                f"(backend {name!r}, max violation {float(viol.max()):.2e}): the polyhedron is probably "
                "empty or degenerate beyond the polish; try another backend or a tighter eps_abs")
        warnings.warn(f"polish refused for {int(bad.sum())} of {bad.numel()} points; they keep the backend's "
                      "accuracy and a slack-based active set", PolyprojWarning, stacklevel=4)
        Y = torch.where(accepted[:, None], Y, Y0)
    return Y, active, mult, mu, accepted, faces


def _scatter_rows(full: torch.Tensor, mask: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
    out = full.clone()
    out[mask] = part
    return out


def _violation(Y, A, a, B, b, lb, ub, mask=None):
    def sel(t, nd):
        return t[mask] if (mask is not None and t.ndim == nd) else t

    At, at, Bt, bt, lbt, ubt = sel(A, 3), sel(a, 2), sel(B, 3), sel(b, 2), sel(lb, 2), sel(ub, 2)
    v = torch.zeros(Y.shape[0], dtype=Y.dtype, device=Y.device)
    if At.shape[-2]:
        r = (Y @ At.T if At.ndim == 2 else (At @ Y[:, :, None])[:, :, 0]) - at
        v = torch.maximum(v, r.clamp_min(0).amax(dim=1))
    if Bt.shape[-2]:
        r = (Y @ Bt.T if Bt.ndim == 2 else (Bt @ Y[:, :, None])[:, :, 0]) - bt
        v = torch.maximum(v, r.abs().amax(dim=1))
    v = torch.maximum(v, torch.maximum(Y - ubt, lbt - Y).clamp_min(0).amax(dim=1))
    return torch.where(torch.isfinite(Y).all(dim=1), v, torch.full_like(v, torch.inf))


@contextlib.contextmanager
def _small_work_threads(x: torch.Tensor, work: float):
    """One intra-op thread for small CPU problems (restored after).

    The forward and backward are long sequences of small batched operations; with several intra-op
    threads each one pays a thread wake-up, and on a loaded machine (more runnable threads than
    cores) that wait dominates: measured 4.7 s vs 22 ms per call for a batch of 128, n = 12 on a
    shared 2-core machine. Large problems (``work`` above 5e7 multiply-adds per sweep) keep the
    user's setting.
    """
    if x.device.type != "cpu" or work > 5e7:
        yield
        return
    with torch_single_thread():
        yield


def _work(x: torch.Tensor, A, B) -> float:
    rows = (0 if A is None else A.shape[-2]) + (0 if B is None else B.shape[-2]) + 2 * x.shape[-1]
    return float(x.shape[0]) * rows * x.shape[-1]


def _solve_on_face(R, L, free, g):
    """``J g``, the compact ``r = (M_F⁺)ᵀ g`` and ``Mᵀ r`` from the Cholesky factor ``L`` of the face.

    With the normalised free-column rows ``M_n`` (scaling ``s``), ``G = M_n M_nᵀ = L Lᵀ`` and
    ``t = G⁻¹ M_n (f⊙g)``: ``J g = f⊙g − M_nᵀ t``, ``r = s ⊙ t`` — two triangular solves with a vector.
    """
    fg = free * g
    t = torch.linalg.solve_triangular(L, (R.dot(fg) * R.scale)[:, :, None], upper=False)
    t = torch.linalg.solve_triangular(L.mT, t, upper=True)
    r = t[:, :, 0] * R.scale
    Mr = R.tdot(r)  # M_nᵀ t = f ⊙ Mᵀ r
    return fg - free * Mr, r, Mr


def _face_vjp(A, B, active, free, g):
    """``J g``, ``r`` (compact row order) and ``Mᵀ r`` for the backward, factoring the faces.

    One Cholesky factorisation of the face Gram matrix per sample (the polish's own
    :func:`~polyproj.polish.gram_cholesky`) and :func:`_solve_on_face` — the backward needs
    two vectors, not the face basis ``V = L⁻¹M_n`` that :func:`polyproj.polish.factor_face` forms.
    Samples whose Gram matrix is singular or ill-conditioned (a pivot below ``eps^(1/4)``:
    dependent active rows, LICQ fails) take ``factor_face``'s rank-revealing path. Returns
    ``(R, Jg, r, Mr)`` with ``R`` the gathered rows (for :func:`polyproj.hs_jacobian.expand_rows`).
    """
    R = gather_active_rows(A, B, active, free)
    if R.scale.shape[1] == 0:
        return R, free * g, torch.zeros_like(R.scale), torch.zeros_like(g)
    L, ok = gram_cholesky(R.xp, R, torch.finfo(R.scale.dtype).eps)
    Jg, r, Mr = _solve_on_face(R, L, free, g)
    if not bool(ok.all()):
        bad = ~ok
        Ab = A[bad] if A.ndim == 3 else A
        Bb = None if B is None else (B[bad] if B.ndim == 3 else B)
        Fb = factor_face(Ab, Bb, active[bad], free[bad])
        # factor_face gathers with the subset's own padding k: realign r to the full batch's k
        rb = pinv_t_apply(Fb, g[bad])
        rbA, rbB = rb[:, : Fb.k], rb[:, Fb.k:]
        rbA = torch.cat([rbA, rbA.new_zeros(rbA.shape[0], R.k - Fb.k)], dim=1)
        rb = torch.cat([rbA, rbB], dim=1)
        Jg = _scatter_rows(Jg, bad, null_apply(Fb, g[bad]))
        r = _scatter_rows(r, bad, rb)
        Mr = _scatter_rows(Mr, bad, R.take(torch.nonzero(bad)[:, 0]).tdot(rb))
    return R, Jg, r, Mr


def _vjp_all(A, B, active, fixed, g, faces):
    """``J g``, ``r`` expanded to the rows of A and B, and ``Mᵀ r`` for the whole batch.

    Samples whose final face the forward's polish factored (``faces``) reuse that factor
    (:func:`_solve_on_face`: no gather, no factorisation); the others go through :func:`_face_vjp`.
    The work runs in the factors' dtype (the forward polishes in float64), results in ``g``'s.
    """
    out_dtype = g.dtype
    if faces:
        wd = faces[0].factor.L.dtype
        g, A = g.to(wd), A.to(wd)
        B = None if B is None else B.to(wd)
        fixed = fixed.to(wd)
    batch = g.shape[0]
    m = A.shape[-2]
    free = 1.0 - fixed
    if not faces:
        F, Jg, r, Mr = _face_vjp(A, B, active[:, :m], free, g)
        rA, rB = expand_rows(F, r)
        return Jg, rA, rB, Mr
    p = 0 if B is None else B.shape[-2]
    Jg, Mr = torch.empty_like(g), torch.empty_like(g)
    rA, rB = g.new_zeros(batch, m), g.new_zeros(batch, p)
    covered = torch.zeros(batch, dtype=torch.bool, device=g.device)
    for rec in faces:  # a sample ends in one round only: the records do not overlap
        if not bool(rec.use.any()):
            continue
        R = rec.factor.R
        Jg_r, r, Mr_r = _solve_on_face(R, rec.factor.L, rec.factor.free, g if rec.idx is None else g[rec.idx])
        rA_r, rB_r = expand_rows(R, r)
        sel = torch.nonzero(rec.use)[:, 0] if rec.idx is None else rec.idx[rec.use]
        Jg[sel], rA[sel], rB[sel], Mr[sel] = Jg_r[rec.use], rA_r[rec.use], rB_r[rec.use], Mr_r[rec.use]
        covered[sel] = True
    rest = ~covered
    if bool(rest.any()):
        Ar = A[rest] if A.ndim == 3 else A
        Br = None if B is None else (B[rest] if B.ndim == 3 else B)
        F, Jg[rest], r, Mr[rest] = _face_vjp(Ar, Br, active[rest][:, :m], free[rest], g[rest])
        rA[rest], rB[rest] = expand_rows(F, r)
    return tuple(t.to(out_dtype) for t in (Jg, rA, rB, Mr))


class _Project(torch.autograd.Function):
    """``y = Π_P(x)`` with the HS-Jacobian backward (see the module docstring)."""

    @staticmethod
    def forward(x, A, a, B, b, lb, ub, cfg):
        with _small_work_threads(x, _work(x, A, B)):
            Y, active, mult, mu, _, faces = _forward(x, dict(A=A, a=a, B=B, b=b, lb=lb, ub=ub), cfg["backend"],
                                                     dict(cfg["settings"]))
        return Y.to(x.dtype), active, mult.to(x.dtype), mu.to(x.dtype), faces

    @staticmethod
    def setup_context(ctx, inputs, output):
        _x, A, a, B, b, lb, ub, _ = inputs
        y, active, mult, mu, faces = output
        ctx.mark_non_differentiable(active, mult, mu)
        ctx.faces = faces  # the polish's face factors (the backward reuses them; not saved tensors:
        # they are the forward's own temporaries, never visible to the user, never modified)
        ctx.save_for_backward(y, active, mult, mu, A, B)
        ctx.shapes = {k: (None if t is None else t.ndim) for k, t in zip(_NAMES, (A, a, B, b, lb, ub), strict=True)}
        ctx.has_lb, ctx.has_ub = lb is not None, ub is not None

    @staticmethod
    def backward(ctx, gy, *_):
        y, active, mult, mu, A, B = ctx.saved_tensors
        faces = ctx.faces
        with _small_work_threads(gy, _work(gy, A, B)):
            return _Project._backward(ctx, gy, y, active, mult, mu, A, B, faces)

    @staticmethod
    def _backward(ctx, gy, y, active, mult, mu, A, B, faces):
        need = ctx.needs_input_grad
        g = gy.contiguous()
        n = g.shape[1]
        dt, dev = g.dtype, g.device
        A_ = A if A is not None else torch.zeros(0, n, dtype=dt, device=dev)
        m = A_.shape[-2]
        at_ub = active[:, m + n:].to(dt)
        at_lb = active[:, m: m + n].to(dt) * (1.0 - at_ub)
        fixed = at_lb + at_ub
        Jg, rA, rB, Mr = _vjp_all(A_, B, active, fixed, g, faces)
        shp = ctx.shapes

        def red(t, nd):  # shared data: summed over the batch
            return t.sum(0) if nd is not None and nd < t.ndim else t

        grads: list[torch.Tensor | None] = [Jg if need[0] else None] + [None] * 7
        if need[2]:
            grads[2] = red(rA, shp["a"])
        if need[4]:
            grads[4] = red(rB, shp["b"])
        if need[5] or need[6]:
            gv = fixed * (g - Mr)
            if need[5]:
                grads[5] = red(gv * at_lb, shp["lb"])
            if need[6]:
                grads[6] = red(gv * at_ub, shp["ub"])
        if need[1]:
            lamA = mult[:, :m]
            grads[1] = red(-(lamA[:, :, None] * Jg[:, None, :] + rA[:, :, None] * y[:, None, :]), shp["A"] + 1)
        if need[3]:
            grads[3] = red(-(mu[:, :, None] * Jg[:, None, :] + rB[:, :, None] * y[:, None, :]), shp["B"] + 1)
        return tuple(grads)


def project(x: torch.Tensor, A: Any = None, a: Any = None, B: Any = None, b: Any = None, lb: Any = None,
            ub: Any = None, backend: str = "auto", **settings: Any) -> torch.Tensor:
    """Differentiable exact projection ``Π_P(x)`` onto ``{y : A y <= a, B y = b, lb <= y <= ub}``.

    Parameters
    ----------
    x : (..., n) tensor, float32 or float64
    A, a : (m, n), (m,) — or with the batch dimensions of x, (..., m, n), (..., m)
        Inequality rows; ``a`` may hold ``+inf`` (row ignored).
    B, b : (p, n), (p,) — or batched; B must have full row rank
    lb, ub : (n,) or (..., n), optional
        Bounds (``±inf`` allowed).
    backend : str
        ``"auto"`` (see :func:`choose_backend`), ``"torch"`` (batched ADMM + polish on the tensor's
        device), ``"ipm"``, or any registered CPU backend (``"proxsuite"``, ``"osqp"``, ``"highs"``).
    **settings
        ``tol`` (polish KKT tolerance, default 1e-9), ``max_polish_iter`` (default 12 + n/20 after the ADMM
        of ``"torch"``, 50 after the other backends), backend
        settings (``eps_abs``, ``max_iter``, ...). For ``"torch"``: ``admm_iter`` (300), ``admm_rho``
        (10), ``admm_alpha`` (1.6), ``admm_check`` (25: stop once no row has joined the identified
        active set in two consecutive windows of that many iterations),
        ``admm_stable`` (fraction of samples in which rows may still join at the stop; default
        0.03 (N − 256)/N for a batch of N > 256, else 0),
        ``admm_dtype`` (``torch.float32``: the ADMM only identifies the face; the polish is float64),
        ``polish_block_iter`` (0: polish corrections that change every wrong row at once),
        ``fallback`` (``"auto"``: ProxSuite for up to 8 samples with n <= 100 on CPU when installed,
        else polyproj's batched IPM in torch on the tensor's device, solves the few samples the polish
        could not verify; any registered backend name; the other settings go to it).

    Returns
    -------
    (..., n) tensor in the dtype and on the device of x
        Feasible to rounding; differentiable with respect to x, a, b, lb, ub, A and B (HS-Jacobian).

    Raises
    ------
    ProblemError
        Shapes, NaN/inf, mismatched device or dtype.
    InfeasibleError
        The polyhedron is empty.

    Examples
    --------
    >>> import torch
    >>> from polyproj.adapters.torch import project
    >>> x = torch.tensor([[0.9, 0.5, -1.0]], dtype=torch.float64, requires_grad=True)
    >>> y = project(x, B=torch.ones(1, 3, dtype=torch.float64), b=torch.ones(1, dtype=torch.float64),
    ...             lb=torch.zeros(3, dtype=torch.float64))
    >>> y.detach().numpy().round(12)
    array([[0.7, 0.3, 0. ]])
    >>> y[0, 0].backward(); x.grad
    tensor([[ 0.5000, -0.5000,  0.0000]], dtype=torch.float64)
    """
    x2, d, bshape = _prepare(x, A, a, B, b, lb, ub)
    cfg = {"backend": backend, "settings": settings}
    y, _, _, _, _ = _Project.apply(x2, d["A"], d["a"], d["B"], d["b"], d["lb"], d["ub"], cfg)
    return y.reshape(*bshape, x.shape[-1])


# ----------------------------------------------------------------------------- the Module
class ProjectionLayer(nn.Module):
    """``nn.Module`` projecting its input onto ``{y : A y <= a, B y = b, lb <= y <= ub}``.

    Parameters
    ----------
    A, a, B, b, lb, ub : array-like or tensors, optional
        Shared constraint data (validated with :class:`polyproj.Polyhedron`: shapes, NaN, B of full
        row rank). Stored as buffers (moved by ``.to()``, saved in ``state_dict``).
    learn : iterable of str
        Names among ``A, a, B, b, lb, ub`` to store as ``nn.Parameter`` (learned constraints).
    dtype : torch.dtype
        Storage dtype (default float64).
    backend : str
        As in :func:`project`.
    **settings
        As in :func:`project`.

    Examples
    --------
    >>> import torch
    >>> from polyproj.adapters.torch import ProjectionLayer
    >>> layer = ProjectionLayer(B=[[1.0, 1.0, 1.0]], b=[1.0], lb=[0.0, 0.0, 0.0])
    >>> layer
    ProjectionLayer(n=3, inequalities=0, equalities=1, lower bounds=3, upper bounds=0, backend='auto')
    >>> layer(torch.tensor([[2.0, 0.0, 0.0]], dtype=torch.float64))
    tensor([[1., 0., 0.]], dtype=torch.float64)
    """

    def __init__(self, A: Any = None, a: Any = None, B: Any = None, b: Any = None, lb: Any = None,
                 ub: Any = None, *, learn: tuple[str, ...] | list[str] = (), dtype: torch.dtype = torch.float64,
                 backend: str = "auto", **settings: Any) -> None:
        super().__init__()
        from ..problem import Polyhedron

        unknown = set(learn) - set(_NAMES)
        if unknown:
            raise ProblemError(f"learn takes names among {_NAMES}, got {sorted(unknown)}")
        vals = dict(zip(_NAMES, (A, a, B, b, lb, ub), strict=True))
        P = Polyhedron(**{k: (v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v)
                          for k, v in vals.items()})  # validates shapes, NaN, rank of B, lb <= ub
        self.n = P.n
        self.backend = backend
        self.settings = settings
        for k, v in vals.items():
            t = None if v is None else torch.as_tensor(np.asarray(
                v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v, dtype=np.float64), dtype=dtype)
            if t is not None and k in ("A", "B") and t.ndim == 1:
                t = t[None, :]
            if k in learn and t is not None:
                self.register_parameter(k, nn.Parameter(t))
            else:
                self.register_buffer(k, t)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Project ``x`` (..., n)."""
        return project(x, self.A, self.a, self.B, self.b, self.lb, self.ub, backend=self.backend, **self.settings)

    def extra_repr(self) -> str:
        """Sizes of the constraint data and the backend."""
        def rows(t):
            return 0 if t is None else int(t.shape[-2])

        def fin(t):
            return 0 if t is None else int(torch.isfinite(t).sum())

        learned = [k for k, _ in self.named_parameters(recurse=False)]
        s = (f"n={self.n}, inequalities={rows(self.A)}, equalities={rows(self.B)}, lower bounds={fin(self.lb)}, "
             f"upper bounds={fin(self.ub)}, backend={self.backend!r}")
        return s + (f", learned={learned}" if learned else "")

