"""Backpropagation through the projection onto a polyhedron: the HS-Jacobian and the data gradients.

At ``y = Π_P(x)`` with active rows ``M = [A_I; B]``, fixed coordinates ``E`` (active bounds), free
coordinates ``F`` and ``J = I − H(HᵀH)⁺Hᵀ`` (the projector onto the null space of the active rows):

    ∂L/∂x     = J g,
    ∂L/∂c_I   = r := (M_F⁺)ᵀ g            (c = a_I, b: zero on inactive rows of a),
    ∂L/∂v_E   = g_E − (Mᵀ r)_E            (v the value of an active bound: lb or ub),
    ∂L/∂M     = −λ (J g)ᵀ − r yᵀ          (A_I, B; λ the multipliers of the projection).

With dependent active rows ``r`` is not unique (only ``Mᵀr``, the part of ``g`` in the rows' span, is): the one
computed is ``s ⊙ (M_n⁺)ᵀ g``, the least-norm solution in the normalised rows ``M_n = diag(s) M_F``, which equals
``(M_F⁺)ᵀ g`` for independent rows and, unlike it, does not depend on the rows' scales in its choice: scaling a row
and its right-hand side by α (the same set) divides that row's ``r_i`` by α, as the chain rule asks, and leaves the
others unchanged.

Where the active rows and the active bounds are dependent together (no data near the given ones keep them all
active), the data gradients are the mean of the one-sided derivatives of the adjacent pieces
(:func:`_independent_pieces`).

Computed without forming ``J``: samples whose final face the polish factored reuse that factorisation
(:class:`~polyproj.projection.polish.FaceRecord`), the others are factored here
(:class:`~polyproj.projection.faces.Face`). Shared data receive the gradient summed over the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from array_api_compat import array_namespace
from array_api_compat import device as _device

from ..errors import ProblemError
from ..linalg import to_host
from .faces import Face, expand_rows, machine_eps, put_rows

__all__ = ["VJPParts", "data_vjp", "hs_vjp", "vjp_parts"]


@dataclass(frozen=True)
class VJPParts:
    """``J g``, the row gradients ``rA`` (b, m), ``rB`` (b, p), ``Mᵀ r`` and the bound masks.

    ``dependent`` (b,) bool: samples whose free rows are dependent (:func:`_dependent`). ``g_lb``, ``g_ub`` (b, n),
    ``mult`` (b, m) and ``mu`` (b, p): the bound gradients and the multipliers of the rows of A and B where
    :func:`_independent_pieces` replaced them (None: ``mask ⊙ (g − Mᵀr)`` and the projection's multipliers).
    """

    Jg: Any
    rA: Any
    rB: Any
    Mr: Any
    at_lb: Any
    at_ub: Any
    dependent: Any = None
    g_lb: Any = None
    g_ub: Any = None
    mult: Any = None
    mu: Any = None


def vjp_parts(info: Any, G: Any) -> VJPParts:
    """Everything the backward needs at the faces of ``info`` (a :class:`~polyproj.sets.polyhedral.FaceInfo`)."""
    xp = array_namespace(G)
    d = info.data
    g = xp.astype(_flat(xp, G, d.n), d.A.dtype)
    batch, n = g.shape
    m, p = d.m, d.p
    at_ub = xp.astype(info.active[:, m + n:], g.dtype)
    at_lb = xp.astype(info.active[:, m: m + n], g.dtype) * (1.0 - at_ub)
    free = 1.0 - (at_lb + at_ub)
    activeA = info.active[:, :m]
    if _one_face(xp, info):
        face = info.faces[0].face
        Jg, r, Mr = face.vjp(g)
        rA, rB = expand_rows(face.rows, r)
        return VJPParts(_exact_zero(xp, Jg, g, Mr), rA, rB, Mr, at_lb, at_ub, _dependent(xp, face, activeA))
    Jg, Mr = xp.zeros_like(g), xp.zeros_like(g)
    svd = xp.zeros((batch,), dtype=xp.bool, device=_device(g))  # samples whose free rows are dependent
    rA = xp.zeros((batch, m), dtype=g.dtype, device=_device(g))
    rB = xp.zeros((batch, p), dtype=g.dtype, device=_device(g))
    covered = xp.zeros((batch,), dtype=xp.bool, device=_device(g))
    for rec in info.faces:  # a sample ends in one round only: the records do not overlap
        if not bool(xp.any(rec.use)):
            continue
        g_r = g if rec.idx is None else xp.take(g, rec.idx, axis=0)
        Jg_r, r, Mr_r = rec.face.vjp(g_r)
        rA_r, rB_r = expand_rows(rec.face.rows, r)
        use = xp.nonzero(rec.use)[0]
        sel = use if rec.idx is None else xp.take(rec.idx, use, axis=0)
        Jg, Mr = put_rows(xp, Jg, sel, xp.take(Jg_r, use, axis=0)), put_rows(xp, Mr, sel, xp.take(Mr_r, use, axis=0))
        rA, rB = put_rows(xp, rA, sel, xp.take(rA_r, use, axis=0)), put_rows(xp, rB, sel, xp.take(rB_r, use, axis=0))
        covered = put_rows(xp, covered, sel, xp.ones(sel.shape, dtype=xp.bool, device=_device(g)))
        act_r = activeA if rec.idx is None else xp.take(activeA, rec.idx, axis=0)
        svd = put_rows(xp, svd, sel, xp.take(_dependent(xp, rec.face, act_r), use, axis=0))
    rest = xp.nonzero(~covered)[0]
    if rest.shape[0]:
        sub = d.take(rest)
        face = Face.factor(sub.A, sub.B, xp.take(activeA, rest, axis=0), xp.take(free, rest, axis=0))
        Jg_r, r, Mr_r = face.vjp(xp.take(g, rest, axis=0))
        rA_r, rB_r = expand_rows(face.rows, r)
        Jg, Mr = put_rows(xp, Jg, rest, Jg_r), put_rows(xp, Mr, rest, Mr_r)
        rA, rB = put_rows(xp, rA, rest, rA_r), put_rows(xp, rB, rest, rB_r)
        svd = put_rows(xp, svd, rest, _dependent(xp, face, xp.take(activeA, rest, axis=0)))
    return VJPParts(_exact_zero(xp, Jg, g, Mr), rA, rB, Mr, at_lb, at_ub, svd)


def _dependent(xp: Any, face: Any, activeA: Any) -> Any:
    """(b,) bool: samples whose active rows restricted to the free coordinates are dependent.

    Those the Cholesky factorisation refused (the rank-revealing path), and those with an active row of A or a row
    of B that is zero on the free coordinates (its normalising scale is 0: a row the active bounds alone determine,
    which the Gram matrix leaves out as it does padding).
    """
    R = face.rows
    if not hasattr(face, "ok"):  # the direct path's faces are well posed (every row has free support, Cholesky)
        return xp.zeros((activeA.shape[0],), dtype=xp.bool, device=_device(activeA))
    live = xp.sum(xp.astype(R.scale > 0, xp.int32), axis=1)
    want = xp.sum(xp.astype(activeA, xp.int32), axis=1) + R.p
    return ~face.ok | (live < want)


def _independent_pieces(info: Any, g: Any, v: VJPParts) -> VJPParts:
    """``v`` with the data gradients of samples whose active rows and active bounds are dependent made exact.

    The data gradients ``r = (M_F⁺)ᵀ g``, ``g_E − (Mᵀr)_E`` are those of the piece on which every active row stays
    active; that piece exists (for data near the given ones) only where the active rows ``H = [A_I; B; ±e_E]`` are
    independent. Where they are not — a dependency that involves an inequality row, e.g. ``Σy = b`` with every
    coordinate at a bound (a capped simplex with ``b = k·ub``, a one-hot point under ``ub = 1``) — no data near
    the given ones keep them all active, and that formula's ``∂L/∂b = 0``, ``∂L/∂ub_i = g_i`` would contradict
    ``1ᵀy = b``. There ``y`` is not differentiable in the data; an element of its Clarke Jacobian is
    the derivative on an adjacent piece ``K``: active rows made independent by dropping inequality rows that a
    multiplier of the projection leaves at zero (``supp λ ⊆ K``), the piece where the dropped rows are loosened.
    :func:`_pieces` finds them by the ratio test along the multipliers' null directions (both ends of each, so
    that the answer is the mean of the two one-sided derivatives, as :class:`~polyproj.sets.CappedSimplex`'s
    total; :func:`_one_dependency` for the common single dependency); on ``K``, ``ρ = (H_K⁺)ᵀ g`` gives the
    gradient of each kept row's right-hand side (a lower bound's row is ``−e_i``: its gradient is ``−ρ``), the
    dropped rows get zero, and the A and B rows' multipliers are the piece's. ``J g`` does not change: a dependent
    row adds nothing to the span of the others. Only samples whose free rows are dependent (``v.dependent``,
    :func:`_dependent`) can have such a dependency (with ``M_F`` of full row rank, ``H`` is independent); they are
    solved on the host (NumPy, float64), stacked by their number of active rows.
    """
    xp = array_namespace(g)
    svd = v.dependent
    if svd is None or v.g_lb is not None or not bool(xp.any(svd)):
        return v
    import numpy as np

    d = info.data
    m, p, n = d.m, d.p, d.n
    dev = _device(g)

    idx = to_host(xp.nonzero(svd)[0]).astype(np.int64)
    mult, mu = to_host(info.mult), to_host(info.mu)
    at_lb, at_ub, G = to_host(v.at_lb), to_host(v.at_ub), to_host(g)
    rA, rB, Mr = to_host(v.rA), to_host(v.rB), to_host(v.Mr)
    glb, gub = at_lb * (G - Mr), at_ub * (G - Mr)
    lamA, lamB = mult[:, :m].copy(), mu.copy()
    activeA = to_host(info.active[:, :m]) > 0
    A_all, B_all = to_host(d.A), to_host(d.B)
    # a coordinate with lb == ub is an equality row (+e_i = that value), not two droppable inequalities; its
    # multiplier is the net one, mult_ub − mult_lb (whichever side the projection put it on)
    fixed_all = np.broadcast_to(to_host(d.lb) == to_host(d.ub), (G.shape[0], n))
    own = _own_dependency(B_all) if B_all.ndim == 2 else None
    pk = p if own is None else own[0].size  # the rows of B the pieces carry
    eye = np.eye(n)
    rows = []  # per sample: (its active rows H, which are inequalities, their multipliers, the index lists)
    for s in idx:
        A = A_all[s] if A_all.ndim == 3 else A_all
        B = B_all[s] if B_all.ndim == 3 else B_all
        mu_s = mu[s]
        if own is not None:  # B's independent rows, with the multipliers that give the same Bᵀμ
            keep_b, E, F, sB = own
            B, mu_s = B[keep_b], sB[keep_b] * (F @ (mu_s / sB))
        fixed, lo, up = fixed_all[s], at_lb[s] > 0, at_ub[s] > 0
        ia, il, iu = np.flatnonzero(activeA[s]), np.flatnonzero(lo & ~fixed), np.flatnonzero(up & ~fixed)
        ifx = np.flatnonzero((lo | up) & fixed)
        H = np.concatenate([A[ia], B, -eye[il], eye[iu], eye[ifx]], axis=0)
        ineq = np.concatenate([np.ones(ia.size, bool), np.zeros(pk, bool), np.ones(il.size + iu.size, bool),
                               np.zeros(ifx.size, bool)])
        lam = np.concatenate([mult[s, ia], mu_s, mult[s, m + il], mult[s, m + n + iu],
                              mult[s, m + n + ifx] - mult[s, m + ifx]])
        rows.append((H, ineq, lam, ia, il, iu, ifx))
    solved = _one_dependency(rows, G[idx])  # batched over the samples with one dependency; None for the others
    changed = False
    for j, s in enumerate(idx):
        H, ineq, lam, ia, il, iu, ifx = rows[j]
        if solved[j] is not None:
            rho, lam = solved[j]
        else:
            pieces = _pieces(H, ineq, lam)
            if pieces is None:  # no dependency through an inequality row: the least-norm split stands
                continue
            rho, lam = np.zeros(H.shape[0]), np.zeros(H.shape[0])
            norms = np.linalg.norm(H, axis=1)
            scale = 1.0 / np.where(norms > 0, norms, 1.0)
            for keep, lam_k in pieces:  # the least-norm split on unit rows: invariant to a row's scale
                Hn = H[keep] * scale[keep, None]
                rho[keep] += np.linalg.lstsq(Hn.T, G[s], rcond=None)[0] * scale[keep] / len(pieces)
                lam = lam + lam_k / len(pieces)
        if rho is None:
            continue
        changed = True
        ka, kb, kl, ku = ia.size, ia.size + pk, ia.size + pk + il.size, ia.size + pk + il.size + iu.size
        rA[s], lamA[s] = 0.0, 0.0
        rA[s, ia], lamA[s, ia] = rho[:ka], lam[:ka]
        if own is None:
            rB[s], lamB[s] = rho[ka:kb], lam[ka:kb]
        else:  # back to every row of B: the least-norm split on unit rows, as on an ordinary face
            keep_b, E, F, sB = own
            rB[s], lamB[s] = (sB * (E @ (t[ka:kb] / sB[keep_b])) for t in (rho, lam))
        glb[s], gub[s] = 0.0, 0.0
        glb[s, il], gub[s, iu] = -rho[kb:kl], rho[kl:ku]
        # a fixed coordinate's value is lb_i = ub_i: its gradient goes to the side the other path gives it
        on_ub = at_ub[s, ifx] > 0
        gub[s, ifx[on_ub]], glb[s, ifx[~on_ub]] = rho[ku:][on_ub], rho[ku:][~on_ub]
        Mr[s] = H[:kb].T @ rho[:kb]
    if not changed:
        return v

    def back(a):
        return xp.asarray(a, dtype=v.rA.dtype, device=dev)

    return VJPParts(v.Jg, back(rA), back(rB), back(Mr), v.at_lb, v.at_ub, svd, back(glb), back(gub), back(lamA),
                    back(lamB))


def _own_dependency(B: Any) -> tuple | None:
    """Shared ``B``'s own dependency, kept out of the pieces: ``(kept rows, E, F, row scales)`` or None (independent).

    Dependent rows of ``B`` (a transport polytope's row and column sums) are dependent on every face, whatever the
    bounds; they involve no inequality row and add nothing a piece could drop. The pieces carry an independent
    subset ``K`` of B's rows (QR with column pivoting of the unit rows ``B_n``); a split ``u'`` on ``K``'s unit rows
    goes back to all rows as the least-norm ``u = E u'`` with ``B_nᵀ u = B_n,Kᵀ u'`` (``E = (B_nᵀ)⁺ B_n,Kᵀ``, the
    ordinary face's split), and multipliers come to ``K`` by ``F = (B_n,Kᵀ)⁺ B_nᵀ``.
    """
    import numpy as np
    import scipy.linalg

    p, n = B.shape
    if p < 2:
        return None
    nb = np.linalg.norm(B, axis=1)
    sB = 1.0 / np.where(nb > 0, nb, 1.0)
    Bn = B * sB[:, None]
    _, R, piv = scipy.linalg.qr(Bn.T, mode="economic", pivoting=True)
    dg = np.abs(np.diag(R))
    rank = int(np.sum(dg > max(p, n) * np.finfo(np.float64).eps * (dg[0] if dg.size else 0.0)))
    if rank == p:
        return None
    keep = np.sort(piv[:rank])
    return keep, np.linalg.pinv(Bn.T) @ Bn[keep].T, np.linalg.pinv(Bn[keep].T) @ Bn.T, sB


#: an entry of a null vector below this fraction of its largest is taken as zero (a row outside the dependency)
NULL_ENTRY = 1e-9


def _one_dependency(rows: list, G: Any) -> list:
    """:func:`_pieces` and the pieces' ``(ρ, λ)`` for the samples whose active rows have exactly one dependency.

    ``rows[j] = (H, ineq, λ, ...)`` of a sample, ``G[j]`` its cotangent. Samples with as many active rows are
    stacked and decomposed at once (one rank-revealing SVD of the unit rows, the ratio test at both ends of the
    null direction ``w``, one solve of each end's normal equations ``H_K H_Kᵀ ρ = H_K g`` with the dropped row's
    equation replaced by ``ρ_j = 0``). ``(None, None)`` for a sample whose dependency involves no inequality row
    (nothing to change), None for one with several dependencies (:func:`_pieces`, one at a time).
    """
    import numpy as np

    out: list = [None] * len(rows)
    eps = np.finfo(np.float64).eps
    by_size: dict[int, list[int]] = {}
    for j, r in enumerate(rows):
        by_size.setdefault(r[0].shape[0], []).append(j)
    for k, js in by_size.items():
        H = np.stack([rows[j][0] for j in js])  # (s, k, n)
        ineq = np.stack([rows[j][1] for j in js])
        lam = np.stack([rows[j][2] for j in js])
        g = G[js]
        norms = np.linalg.norm(H, axis=2)
        scale = 1.0 / np.where(norms > 0, norms, 1.0)
        Hn = H * scale[:, :, None]
        U, sv, _ = np.linalg.svd(Hn, full_matrices=True)
        tol = max(k, H.shape[2]) * eps * sv[:, :1]
        rank = np.sum(sv > tol, axis=1)
        one = rank == k - 1
        w = U[:, :, -1] * scale  # the left null vector in the rows' own scale (rank k - 1: U's last column)
        big = np.max(np.abs(w), axis=1, keepdims=True)
        involved = np.any(ineq & (np.abs(w) > NULL_ENTRY * big), axis=1)
        rho_sum, lam_sum, ends = np.zeros((len(js), k)), np.zeros((len(js), k)), np.zeros(len(js))
        for sign in (1.0, -1.0):  # λ − t w with t of this sign: the first inequality row it zeroes is dropped
            cand = ineq & (sign * w > NULL_ENTRY * big)
            t = np.where(cand, lam / np.where(cand, w, 1.0), np.inf)
            drop = np.argmin(np.abs(t), axis=1)
            has = np.any(cand, axis=1) & one & involved
            tj = np.take_along_axis(t, drop[:, None], axis=1)
            lam_e = lam - np.where(has[:, None], tj, 0.0) * w
            # every row the step zeroes is dropped, ties included (:func:`_tied`)
            dropped = _tied(cand, t, tj, lam, w) & has[:, None]
            lam_e[dropped] = 0.0
            keep = ~dropped
            Gram = Hn @ np.swapaxes(Hn, 1, 2) * (keep[:, :, None] & keep[:, None, :]) + np.eye(k) * dropped[:, :, None]
            rhs = np.einsum("skn,sn->sk", Hn, g) * keep
            solve = np.where(has[:, None], 1.0, 0.0)  # samples without this end solve a harmless identity system
            Gram = np.where(has[:, None, None], Gram, np.eye(k))
            rho_e = np.linalg.solve(Gram, rhs[:, :, None])[:, :, 0] * scale * solve
            rho_sum += rho_e
            lam_sum += np.where(has[:, None], lam_e, 0.0)
            ends += has
        for i, j in enumerate(js):
            if rank[i] == k:  # independent rows (B's own dependency taken out): the ordinary split stands
                out[j] = (None, None)
                continue
            if not one[i]:
                continue  # several dependencies: one at a time
            if not involved[i] or not ends[i]:
                out[j] = (None, None)
                continue
            out[j] = (rho_sum[i] / ends[i], lam_sum[i] / ends[i])
    return out


#: ratio-test steps within this fraction of the problem's step scale (max |λ| / max |w|) are one step (a tie)
TIE = 1e-9


def _tied(cand: Any, t: Any, t_min: Any, lam: Any, w: Any) -> Any:
    """The candidate rows whose ratio-test step equals the smallest one ``t_min`` (rows zeroed together).

    A symmetric point (equal entries under equal caps) zeroes several multipliers at one step: dropping them all
    keeps the piece symmetric (dropping one of them kept its twin active, a piece on which one coordinate alone
    moves). Rows of the last axis; works for one sample (1-D) and a stack.
    """
    import numpy as np

    scale = np.max(np.abs(lam), axis=-1, keepdims=True) / np.maximum(np.max(np.abs(w), axis=-1, keepdims=True),
                                                                     np.finfo(np.float64).tiny)
    with np.errstate(invalid="ignore"):  # non-candidates (t = inf), and samples with none (t_min = inf): False
        return cand & (np.abs(t - t_min) <= TIE * np.maximum(scale, np.abs(t_min)))


#: at most this many pieces are averaged (each dependency doubles them; beyond, the nearer end is followed)
MAX_PIECES = 16


def _pieces(H: Any, ineq: Any, lam: Any) -> list | None:
    """Independent subsets ``K`` of the rows of ``H`` (NumPy) with multipliers ``λ_K`` (zero off ``K``), or None.

    ``Hᵀλ`` is the projection's ``x − y`` and must stay so with ``λ ≥ 0`` on the inequality rows (``ineq``).
    While the kept rows are dependent through an inequality row (a left null vector ``w`` of ``H_K``, found on unit
    rows, one of a sparse basis of the null space: a dependency on its own rows gets its own ``w``), ``λ − t w`` is
    a multiplier for every ``t`` between the two ratio-test ends, each of which zeroes inequality rows (ties
    together, :func:`_tied`) that are then dropped. Each dependency is followed to both of its ends (so that a
    single dependency, and separate ones, get the mean of their one-sided derivatives) until :data:`MAX_PIECES`
    pieces, then to the nearer end. None where no dependency involves an
    inequality row (dependent equality rows alone: the split of ``r`` is already a derivative along every
    consistent change of the data).
    """
    import numpy as np
    import scipy.linalg

    norms = np.linalg.norm(H, axis=1)
    scale = 1.0 / np.where(norms > 0, norms, 1.0)
    eps = np.finfo(np.float64).eps

    def null_vector(keep):
        Hn = H[keep] * scale[keep, None]
        U, sv, _ = np.linalg.svd(Hn, full_matrices=True)
        rank = int(np.sum(sv > max(Hn.shape) * eps * (sv[0] if sv.size else 0.0)))
        if rank == Hn.shape[0]:
            return None
        N = U[:, rank:]  # the left null space of the kept unit rows
        Nq = N[ineq[keep]]
        if Nq.size == 0 or np.max(np.abs(Nq)) <= NULL_ENTRY:
            return None  # only equality rows depend on each other
        # a sparse basis of the null space, W = (N_P)⁻¹-normalised so that W is the identity on pivot rows P
        # (chosen by QR with column pivoting of Nᵀ): dependencies on disjoint sets of rows get basis vectors of
        # their own, each followed to its own two ends; the first one that involves an inequality row is taken
        piv = scipy.linalg.qr(N.T, mode="r", pivoting=True)[1][: N.shape[1]]
        W = np.linalg.solve(N[piv].T, N.T)
        Wq = np.abs(W[:, ineq[keep]])
        involved = np.max(Wq, axis=1) > NULL_ENTRY * np.max(np.abs(W), axis=1)
        w = np.zeros(H.shape[0])
        w[keep] = W[int(np.argmax(involved))] * scale[keep]  # Hᵀw = 0 in the rows' own scale
        return w

    def ends(keep, lam, w):
        big = np.max(np.abs(w))
        out = []
        for sign in (1.0, -1.0):  # λ − t w with t of this sign: the first inequality rows it zeroes (ties together)
            cand = keep & ineq & (sign * w > NULL_ENTRY * big)
            if cand.any():
                t = np.where(cand, lam / np.where(cand, w, 1.0), np.inf)
                t_min = t[np.argmin(np.abs(t))]
                out.append((np.flatnonzero(_tied(cand, t, t_min, lam, w)), t_min))
        return out

    def follow(keep, lam, budget):
        w = null_vector(keep)
        e = [] if w is None else ends(keep, lam, w)
        if not e:
            return [(keep, np.where(keep, lam, 0.0))]
        if budget < len(e) or len(e) == 1:
            e = [min(e, key=lambda jt: abs(jt[1]))]
        out = []
        for js, t in e:
            k2, l2 = keep.copy(), lam - t * w
            k2[js], l2[js] = False, 0.0
            out += follow(k2, l2, budget // len(e))
        return out

    keep0 = np.ones(H.shape[0], dtype=bool)
    if null_vector(keep0) is None:
        return None
    return follow(keep0, lam, MAX_PIECES)


def _one_face(xp: Any, info: Any) -> bool:
    """True when one recorded face serves the whole batch of ``info``."""
    return len(info.faces) == 1 and info.faces[0].idx is None and bool(xp.all(info.faces[0].use))


def _flat(xp: Any, G: Any, n: int) -> Any:
    """``G`` as (b, n): the points of a set with a shape (``(b, k, k)`` matrices) are its rows flattened."""
    return G if G.ndim == 2 else xp.reshape(G, (G.shape[0], n))


#: an entry of ``J g`` at most this many machine epsilons of its own terms is rounding: set to 0 (:func:`_exact_zero`)
JG_ROUNDING = 1e3


def _exact_zero(xp: Any, Jg: Any, g: Any, Mr: Any) -> Any:
    """``J g`` with the entries at rounding level set to exactly 0.

    At a vertex ``J = 0``, but ``g − Mᵀr`` leaves ~eps |g|; the gradient of ``A`` multiplies it by the row's
    multiplier (~|x|), and a point 1e12 away got ``dL/dA`` wrong by 1e-3 relative (``−λ (Jg)ᵀ`` against the
    exact ``−r yᵀ``). Entry ``i`` is ``f_i (g_i − (Mᵀr)_i)``: its rounding is a few eps ``(|g_i| + |(Mᵀr)_i|)``
    (times the face's conditioning), so what lies below :data:`JG_ROUNDING` eps of those two terms is set to 0,
    entry by entry. Against the largest ``|g|`` of the row instead, a gradient 1e13 on a fixed coordinate
    zeroed an exact ``J g = (0, 1, 1)`` on the free ones.
    """
    eps = machine_eps(xp, Jg.dtype)
    small = xp.abs(Jg) <= JG_ROUNDING * eps * (xp.abs(g) + xp.abs(Mr))
    return xp.where(small, xp.zeros_like(Jg), Jg)


def hs_vjp(info: Any, G: Any) -> Any:
    """``J g`` (b, n) in the dtype of ``G`` ((b, n), or points with a shape: (b, k, k))."""
    xp = array_namespace(G)
    if not _one_face(xp, info):
        return xp.astype(vjp_parts(info, G).Jg, G.dtype)
    # one face for the batch: J g alone (the row gradients and bound masks are for the data's gradients)
    g = xp.astype(_flat(xp, G, info.data.n), info.data.A.dtype)
    Jg, _, Mr = info.faces[0].face.vjp(g)
    return xp.astype(_exact_zero(xp, Jg, g, Mr), G.dtype)


def data_vjp(info: Any, G: Any, names: tuple[str, ...], ndims: dict[str, int], parts: VJPParts | None = None,
             *, groups: int | None = None) -> dict[str, Any]:
    """Gradients with respect to the data parts ``names`` (``ndims``: each part's own rank, to sum shared ones).

    ``groups``: shared parts are summed over each of that many consecutive equal slices of the batch
    instead of over all of it (a leading dimension ``groups``).
    """
    xp = array_namespace(G)
    # the data gradients at dependent faces are those of the adjacent independent pieces (J g needs no such care)
    v = _independent_pieces(info, _flat(xp, G, info.data.n), vjp_parts(info, G) if parts is None else parts)
    d = info.data
    m = d.m
    if groups is not None and (groups < 1 or G.shape[0] % groups):
        raise ProblemError(f"a batch of {G.shape[0]} cannot be split into {groups} equal slices")

    def red(t, own_ndim):  # shared data: summed over the batch (or over each slice)
        if own_ndim >= t.ndim:
            return t
        if groups is None:
            return xp.sum(t, axis=0)
        return xp.sum(xp.reshape(t, (groups, t.shape[0] // groups, *t.shape[1:])), axis=1)

    out: dict[str, Any] = {}
    gv = (v.at_lb + v.at_ub) * (xp.astype(_flat(xp, G, d.n), v.Jg.dtype) - v.Mr)  # on the fixed coordinates
    g_lb = gv * v.at_lb if v.g_lb is None else v.g_lb
    g_ub = gv * v.at_ub if v.g_ub is None else v.g_ub
    mult = info.mult[:, :m] if v.mult is None else v.mult
    mu = info.mu if v.mu is None else v.mu
    rules = {
        "a": lambda: red(v.rA, ndims["a"]),
        "b": lambda: red(v.rB, ndims["b"]),
        "lb": lambda: red(g_lb, ndims["lb"]),
        "ub": lambda: red(g_ub, ndims["ub"]),
        "A": lambda: red(-(mult[:, :, None] * v.Jg[:, None, :] + v.rA[:, :, None] * info.Y[:, None, :]), ndims["A"]),
        "B": lambda: red(-(mu[:, :, None] * v.Jg[:, None, :] + v.rB[:, :, None] * info.Y[:, None, :]), ndims["B"]),
    }
    for k in names:
        out[k] = xp.astype(rules[k](), G.dtype)
    return out
