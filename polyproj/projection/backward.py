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
from .faces import Face, expand_rows, machine_eps, put_rows

__all__ = ["VJPParts", "data_vjp", "hs_vjp", "vjp_parts"]


@dataclass(frozen=True)
class VJPParts:
    """``J g``, the row gradients ``rA`` (b, m), ``rB`` (b, p), ``Mᵀ r`` and the bound masks."""

    Jg: Any
    rA: Any
    rB: Any
    Mr: Any
    at_lb: Any
    at_ub: Any


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
        return VJPParts(_exact_zero(xp, Jg, g, Mr), rA, rB, Mr, at_lb, at_ub)
    Jg, Mr = xp.zeros_like(g), xp.zeros_like(g)
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
    rest = xp.nonzero(~covered)[0]
    if rest.shape[0]:
        sub = d.take(rest)
        face = Face.factor(sub.A, sub.B, xp.take(activeA, rest, axis=0), xp.take(free, rest, axis=0))
        Jg_r, r, Mr_r = face.vjp(xp.take(g, rest, axis=0))
        rA_r, rB_r = expand_rows(face.rows, r)
        Jg, Mr = put_rows(xp, Jg, rest, Jg_r), put_rows(xp, Mr, rest, Mr_r)
        rA, rB = put_rows(xp, rA, rest, rA_r), put_rows(xp, rB, rest, rB_r)
    return VJPParts(_exact_zero(xp, Jg, g, Mr), rA, rB, Mr, at_lb, at_ub)


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
    v = vjp_parts(info, G) if parts is None else parts
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
    rules = {
        "a": lambda: red(v.rA, ndims["a"]),
        "b": lambda: red(v.rB, ndims["b"]),
        "lb": lambda: red(gv * v.at_lb, ndims["lb"]),
        "ub": lambda: red(gv * v.at_ub, ndims["ub"]),
        "A": lambda: red(-(info.mult[:, :m, None] * v.Jg[:, None, :] + v.rA[:, :, None] * info.Y[:, None, :]),
                         ndims["A"]),
        "B": lambda: red(-(info.mu[:, :, None] * v.Jg[:, None, :] + v.rB[:, :, None] * info.Y[:, None, :]),
                         ndims["B"]),
    }
    for k in names:
        out[k] = xp.astype(rules[k](), G.dtype)
    return out
