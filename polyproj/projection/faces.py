"""Faces of a polyhedron: the gathered active rows of a batch and the one factorisation of them.

A face is given per sample by its active inequality rows (rows of ``A``; active bounds fix
coordinates) and all equality rows ``B``. With ``M = [A_I; B]`` restricted to the free coordinates
``F`` and its rows normalised (``M_n = diag(s) M_F``), everything the projection and its
backpropagation need is an operator of ``M_n``:

* the exact projection onto the face, ``y = z − M_nᵀ G⁺ s⊙(M z − c)`` with ``G = M_n M_nᵀ``, and its
  multipliers ``λ = s ⊙ G⁺ s⊙(M z − c)``;
* the HS-Jacobian ``J v = f⊙v − M_nᵀ G⁺ M_n (f⊙v)`` — the orthogonal projector onto the null space of
  the active rows (no multiplier and no LICQ needed: dependent rows leave the null space unchanged);
* the gradient with respect to the active right-hand sides, ``r = s ⊙ G⁺ M_n (f⊙g)`` (``= (M_F⁺)ᵀ g`` for
  independent rows; for dependent ones the least-norm solution in the normalised rows: projection.backward).

:class:`Face` factors ``G = L Lᵀ`` by Cholesky (``O(k³)`` batched); a sample whose Gram matrix is
singular or ill-conditioned (a pivot below ``eps^(1/4)``: dependent active rows, LICQ fails; or, since pivots
bound ``λ_min(G)`` from above only, a lower bound of ``1/λ_min(G)`` above ``2 / eps^(1/2)``) takes the
rank-revealing SVD of ``M_n`` instead, whose dropped directions are exactly those of the dependent rows. With
``λ_min(G)`` near ``ρ² / 2`` (``G_ii = 1``; as far as the estimate of ``1/λ_min`` sees) the products by ``G⁻¹``
(``J v``, ``r``) are accurate to about ``eps / ρ²`` relative: ``eps^(1/2)`` at the threshold (two unit rows at an
angle of 1.5e-4: 3e-9), rounding on well-separated rows; the projection itself is refined to rounding
(:data:`REFINE_STEPS`).
Every operator is written against the array API and returns arrays of the input's namespace and device.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
from array_api_compat import array_namespace, is_torch_namespace
from array_api_compat import device as _device

from ..linalg import cho_solve, cholesky, cumulative_sum, identity_where, in_chunks, row_norms

__all__ = ["REFINE_ROUNDINGS", "REFINE_STEPS", "ActiveRows", "Face", "expand_rows", "face_rhs", "gather_active_rows",
           "off_rounding", "put_rows", "qr_null_basis", "scatter_rows", "svd_factor"]


#: a face point whose equations miss by more than this many roundings of their terms (``|M||y| + |c|``) gets
#: iterative refinement (:func:`off_rounding`); well-scaled faces miss by at most ~20 (n 10 to 200)
REFINE_ROUNDINGS = 32.0
#: refinement steps at most: each multiplies the error by ~cond(G) eps (two reach rounding up to cond(G) ~ 1e11)
REFINE_STEPS = 2


def off_rounding(xp: Any, resid: Any, terms: Any) -> Any:
    """(b,) bool: a face point whose equations ``M y = c`` miss by more than rounding (:data:`REFINE_ROUNDINGS`).

    ``resid`` = M y − c and ``terms`` = |M||y| + |c| (b, k). The face point ``y = z − M⁺(M z − c)`` computed through
    the Gram matrix G = M Mᵀ (Cholesky: the normal equations) carries an error ~ cond(G) eps in the rows' span, and
    one of eps |z| where |z| ≫ |y| (cancellation); both show in the residual, and one step
    ``y ← y − M⁺(M y − c)`` with the same factor removes them (iterative refinement: the residual is computed
    from the rows themselves, so each step multiplies the error by ~cond(G) eps; :data:`REFINE_STEPS` at most).
    Coordinates on scales 1e-2 to 1e2 leave the normal equations' answer 1e-8 off (relative), one step at rounding.
    Where cond(G) eps is near 1 refinement does not converge: the direct path leaves a face still off rounding
    after it to the pipeline; the polish's consistency test (relative to the same terms) then judges it.
    """
    eps = machine_eps(xp, resid.dtype)
    if resid.shape[1] == 0:
        return xp.zeros((resid.shape[0],), dtype=xp.bool, device=_device(resid))
    return xp.any(xp.abs(resid) > REFINE_ROUNDINGS * eps * terms, axis=1)


def machine_eps(xp: Any, dtype: Any) -> float:
    """Machine epsilon of a floating dtype of the namespace."""
    return float(np.finfo(np.float32 if dtype == xp.float32 else np.float64).eps)


def scatter_rows(xp: Any, full: Any, mask: Any, part: Any) -> Any:
    """``full`` with the rows where ``mask`` is True replaced by the rows of ``part`` (in order)."""
    if part.shape[0] == 0:
        return full
    m = xp.reshape(mask, (-1,) + (1,) * (full.ndim - 1))
    if is_torch_namespace(xp):  # one kernel: the True rows take part's rows in order
        return full.masked_scatter(m, part.to(full.dtype))
    pos = cumulative_sum(xp, xp.astype(mask, xp.int64)) - 1
    pos = xp.where(pos > 0, pos, xp.zeros_like(pos))
    return xp.where(m, xp.take(part, pos, axis=0), full)


class NamespaceState:
    """Pickling and deep copies of an object that holds its array namespace (a module) as ``xp``.

    A module does not pickle: the namespace is kept by its import name (``numpy``, ``array_api_compat.torch``) and
    imported again (a result made with ``record=True``, sent back from a process pool, failed with "cannot pickle
    'module' object").
    """

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "xp": self.__dict__["xp"].__name__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        import importlib

        self.__dict__.update(state, xp=importlib.import_module(state["xp"]))  # past a frozen dataclass's guard


# ----------------------------------------------------------------------------- gathered rows
class ActiveRows(NamespaceState):
    """The compacted active rows of a batch: active A rows first (padded with zero rows), then B.

    ``rows`` (b, k+p, n) are the unnormalised, unmasked rows and ``Mn`` the rows restricted to the
    free columns and normalised (zero rows stay zero); ``scale`` (b, k+p) is 1/||row|| on the free
    columns (0 for zero rows) and ``order`` (b, m) the argsort putting active rows first.

    With constraint matrices shared by the batch (NumPy or PyTorch), the rows are indices ``ridx``
    (b, k+p) into the table ``[A; 0; B]``: products with them are one matrix product with the table
    and a gather (:meth:`dot`) or a scatter (:meth:`tdot`), and ``rows`` / ``Mn`` are formed only when
    asked for (the SVD path).
    """

    def __init__(self, xp, scale, order, k: int, m: int, p: int, free, *, rows=None, Mn=None,
                 table=None, ridx=None, tabn=None):
        self.xp, self.scale, self.order, self.k, self.m, self.p, self.free = xp, scale, order, k, m, p, free
        self.table, self.ridx, self.tabn = table, ridx, tabn  # tabn: the table's rows normalised
        self._rows, self._Mn = rows, Mn

    def _gather(self):
        xp = self.xp
        b, kk = self.ridx.shape
        return xp.reshape(xp.take(self.table, xp.reshape(self.ridx, (-1,)), axis=0), (b, kk, self.table.shape[1]))

    @property
    def kk(self) -> int:
        """Rows per sample (padded active rows of A, then the rows of B)."""
        return self.k + self.p

    @property
    def rows(self):
        """(b, k+p, n) the unnormalised, unmasked rows (gathered from the table on first use)."""
        if self._rows is None:
            self._rows = self._gather()
        return self._rows

    @property
    def Mn(self):
        """(b, k+p, n) the rows on the free columns, normalised (formed on first use)."""
        if self._Mn is None:
            own = self._rows is None  # a gather of our own (not kept as rows) can be scaled in place
            self._Mn = _normalised(self.xp, self._gather() if own else self._rows, self.free, self.scale, own)
        return self._Mn

    def dot(self, Y):
        """``rows @ y`` per sample: Y (b, n) -> (b, k+p)."""
        xp = self.xp
        if self.table is None:
            return xp.sum(self.rows * Y[:, None, :], axis=-1)
        return xp.take_along_axis(xp.matmul(Y, xp.matrix_transpose(self.table)), self.ridx, axis=1)

    def tdot(self, lam):
        """``rowsᵀ λ`` per sample: λ (b, k+p) -> (b, n) (values on padding rows are ignored)."""
        xp = self.xp
        if self.table is None:
            return xp.matmul(lam[:, None, :], self.rows)[:, 0, :]
        full = xp.zeros((lam.shape[0], self.table.shape[0]), dtype=lam.dtype, device=_device(lam))
        if is_torch_namespace(xp):  # padding rows all point at the zero row of the table: a sum there
            full.scatter_add_(1, self.ridx, lam)  # is multiplied by zero (deterministic on CUDA)
        else:
            np.put_along_axis(full, self.ridx, lam, axis=1)
        return xp.matmul(full, self.table)

    def abs_dot(self, Y):
        """``|rows| @ |y|`` per sample (b, k+p): the size of the terms of :meth:`dot`, the scale of its rounding."""
        xp = self.xp
        if self.table is None:
            return xp.sum(xp.abs(self.rows) * xp.abs(Y)[:, None, :], axis=-1)
        return xp.take_along_axis(xp.matmul(xp.abs(Y), xp.matrix_transpose(xp.abs(self.table))), self.ridx, axis=1)

    def gram(self):
        """The Gram matrices ``M_n M_nᵀ`` (b, k+p, k+p) of the normalised free-column rows.

        Shared rows: entries of the table's Gram matrix gathered (one flat gather); samples with fixed
        columns are formed from their masked rows (all samples so when most have fixed columns). Per-sample
        rows: a batched product.
        """
        xp = self.xp
        if self.table is not None:
            b, kk = self.ridx.shape
            r = self.table.shape[0]
        if self.table is None or r * r > b * kk * kk:  # the table's Gram would cost more
            Mn = self.Mn
            return xp.matmul(Mn, xp.matrix_transpose(Mn))
        hasfix = xp.any(self.free == 0, axis=1)
        nfix = int(xp.sum(xp.astype(hasfix, xp.int64)))
        if 2 * nfix > b:  # most samples need their own product: one product for all, no gather
            Mn = self.Mn
            return xp.matmul(Mn, xp.matrix_transpose(Mn))
        Gf = xp.matmul(self.tabn, xp.matrix_transpose(self.tabn))
        flat = self.ridx[:, :, None] * r + self.ridx[:, None, :]
        G = Gf.take(flat)  # NumPy's ndarray.take and torch's Tensor.take both index the flattened array
        if nfix:
            idx = xp.nonzero(hasfix)[0]
            sub = self.take(idx)
            G[idx] = xp.matmul(sub.Mn, xp.matrix_transpose(sub.Mn))
        return G

    def take(self, idx):
        """The rows of the samples ``idx`` (an index array)."""
        xp = self.xp

        def t(v):
            return None if v is None else xp.take(v, idx, axis=0)

        return ActiveRows(xp, t(self.scale), t(self.order), self.k, self.m, self.p, t(self.free),
                          rows=t(self._rows), Mn=t(self._Mn), table=self.table, ridx=t(self.ridx), tabn=self.tabn)


def _masked(xp, rows, free, own: bool):
    """``rows`` on the free columns (``rows`` itself when nothing is fixed; in place when ``own``, torch)."""
    if bool(xp.all(free == 1)):
        return rows
    if own and is_torch_namespace(xp):
        return rows.mul_(free[:, None, :])
    return rows * free[:, None, :]


def _scaled(xp, M, scale, own: bool):
    if own and is_torch_namespace(xp):
        return M.mul_(scale[:, :, None])
    return M * scale[:, :, None]


def _normalised(xp, rows, free, scale, own: bool):
    Mf = _masked(xp, rows, free, own)
    return _scaled(xp, Mf, scale, own or Mf is not rows)


def _inverse_norms(xp, norms):
    return xp.where(norms > 0, 1.0 / xp.where(norms > 0, norms, xp.ones_like(norms)), xp.zeros_like(norms))


def gather_active_rows(A, B, active, free) -> ActiveRows:
    """Gather the active rows of A (and all of B), mask the fixed columns, normalise the rows.

    Parameters
    ----------
    A : (m, n) or (b, m, n) array
    B : (p, n) or (b, p, n) array
    active : (b, m) bool array
        Active rows of A.
    free : (b, n) 0/1 array (the dtype of A)
        Coordinates not fixed by an active bound.
    """
    xp = array_namespace(A, B, free)
    dtype, dev = A.dtype, _device(A)
    batch, n = free.shape
    m, p = A.shape[-2], B.shape[-2]
    if m:
        order = xp.argsort(xp.astype(active, xp.int8), axis=-1, descending=True, stable=True)
        count = xp.sum(xp.astype(active, xp.int32), axis=-1)
    else:
        order = xp.zeros((batch, 0), dtype=xp.int64, device=dev)
        count = xp.zeros((batch,), dtype=xp.int32, device=dev)
    k = int(xp.max(count)) if m and batch else 0
    idx = order[:, :k]
    maskA = xp.arange(k, dtype=xp.int32, device=dev)[None, :] < count[:, None]  # active rows come first
    if A.ndim == 2 and B.ndim == 2:
        # shared rows: indices into [A; 0; B] (padding indices point at the zero row)
        table = xp.concat([A, xp.zeros((1, n), dtype=dtype, device=dev), B], axis=0)
        ridx = xp.where(maskA, idx, xp.full_like(idx, m))
        bidx = xp.broadcast_to(xp.arange(m + 1, m + 1 + p, dtype=ridx.dtype, device=dev)[None, :], (batch, p))
        ridx = xp.concat([ridx, bidx], axis=1)
        if is_torch_namespace(xp) or isinstance(table, np.ndarray):
            inv_tn = _inverse_norms(xp, row_norms(xp, table))
            tabn = table * inv_tn[:, None]
            scale = xp.reshape(xp.take(inv_tn, xp.reshape(ridx, (-1,)), axis=0), tuple(ridx.shape))
            if not bool(xp.all(free == 1)):  # a sample's rows on its free columns only
                nsq = xp.take_along_axis(xp.matmul(free, xp.matrix_transpose(tabn * tabn)), ridx, axis=1)
                ok = nsq > 0
                scale = xp.where(ok, scale / xp.sqrt(xp.where(ok, nsq, xp.ones_like(nsq))), xp.zeros_like(nsq))
            return ActiveRows(xp, scale, order, k, m, p, free, table=table, ridx=ridx, tabn=tabn)
        rows = xp.reshape(xp.take(table, xp.reshape(ridx, (-1,)), axis=0), (batch, k + p, n))
    else:
        if A.ndim == 2:
            rowsA = xp.reshape(xp.take(A, xp.reshape(idx, (-1,)), axis=0), (batch, k, n))
        else:
            rowsA = xp.take_along_axis(A, xp.broadcast_to(idx[:, :, None], (batch, k, n)), axis=1)
        rowsA = rowsA * xp.astype(maskA, dtype)[:, :, None]
        Bb = xp.broadcast_to(B[None, ...], (batch, p, n)) if B.ndim == 2 else B
        rows = xp.concat([rowsA, Bb], axis=1)
    Mf = _masked(xp, rows, free, own=False)
    scale = _inverse_norms(xp, row_norms(xp, Mf))
    return ActiveRows(xp, scale, order, k, m, p, free, rows=rows, Mn=_scaled(xp, Mf, scale, own=Mf is not rows))


#: a torch GPU batch of at most this many entries is decomposed on the host: copied there, LAPACK's SVD and the
#: copy back beat cuSOLVER's batched Jacobi SVD on such faces (benchmarks/gpu_probe.py; docs/torch.md, CUDA)
SVD_HOST_ENTRIES = 1 << 22


def _svd(xp, Mn):
    """``xp.linalg.svd(Mn, full_matrices=False)``: small torch GPU batches on the host, large ones in chunks."""
    if is_torch_namespace(xp) and Mn.device.type != "cpu" and Mn.numel() <= SVD_HOST_ENTRIES:
        return tuple(t.to(Mn.device) for t in xp.linalg.svd(Mn.cpu(), full_matrices=False))
    return in_chunks(xp, lambda M: xp.linalg.svd(M, full_matrices=False), Mn)


def svd_factor(Mn, n: int):
    """Rank-revealing SVD of normalised rows: ``(U, s_inv, Vh)`` with the dropped directions zeroed."""
    xp = array_namespace(Mn)
    U, s, Vh = _svd(xp, Mn)
    tol = max(Mn.shape[1], n) * machine_eps(xp, Mn.dtype) * xp.max(s, axis=-1, keepdims=True)
    keep = s > tol
    s_inv = xp.where(keep, 1.0 / xp.where(keep, s, xp.ones_like(s)), xp.zeros_like(s))
    return U, s_inv, Vh * xp.astype(keep, Mn.dtype)[:, :, None]


#: smallest ``|R_jj|`` of the QR factor of a face's unit rows (so ``|R_jj| <= 1``) for QR to settle it; the
#: pivot test of :func:`gram_cholesky` (``G = RᵀR``, so ``L_jj = |R_jj|``): eps^(1/4)
QR_PIVOT = float(np.finfo(np.float64).eps) ** 0.25


def qr_null_basis(R: ActiveRows) -> tuple[np.ndarray, np.ndarray]:
    """``(Q, ok)``: an orthonormal basis (b, n, kk) of the span of each face's rows, and whether QR settled it.

    NumPy rows (the HS-Jacobian functions on a Polyhedron): a Householder QR of ``M_nᵀ``, accurate to
    ``eps cond(M_n)`` as the SVD (:func:`svd_factor`) and a fraction of its cost; the faces it does not settle
    (a pivot below :data:`QR_PIVOT`: dependent rows, where unpivoted QR does not reveal the rank) take the SVD.

    ``Q`` is zero on the face's fixed coordinates; ``ok``: every pivot at least :data:`QR_PIVOT`. A zero row
    (padding, or a row whose support the bounds fix) gets a unit column outside the n coordinates of its own,
    so it has a unit pivot and adds nothing to the basis.
    """
    b, kk = R.scale.shape
    n = R.free.shape[1]
    T = np.zeros((b, n + kk, kk))
    T[:, :n, :] = np.swapaxes(R.Mn, 1, 2)
    diag = np.arange(kk)
    T[:, n + diag, diag] = R.scale <= 0
    Q, U = np.linalg.qr(T)
    ok = (np.abs(np.diagonal(U, axis1=1, axis2=2)) >= QR_PIVOT).all(axis=1)
    # Q's first n rows are Mnᵀ U⁻¹, zero on the fixed coordinates but for the reflections' rounding: masked
    return Q[:, :n, :] * R.free[:, :, None], ok


def gram_cholesky(xp, R: ActiveRows, eps: float):
    """Cholesky of the face Gram matrices of ``R`` (padding rows get a unit pivot).

    Returns ``(L, ok)``: ``ok`` refuses the faces known to be ill-conditioned (a pivot of a real row below
    ``eps^(1/4)``, or the lower bound of ``1/λ_min(G)`` of :func:`_inverse_norm_estimate` above
    ``2 / eps^(1/2)``; an estimate, so a face it underrates can pass); ``L`` is the identity where it is False.
    """
    pos = R.scale > 0
    kk = pos.shape[1]
    dtype = R.scale.dtype
    eye = xp.eye(kk, dtype=dtype, device=_device(R.scale))
    pad = 1.0 - xp.astype(pos, dtype)  # zero rows (padding, or a row whose support is fixed)
    G = R.gram()
    if is_torch_namespace(xp):  # in place on our own product: no (b, k, k) temporaries
        G.diagonal(dim1=1, dim2=2).add_(pad)
    elif isinstance(G, np.ndarray) and G.flags.c_contiguous:
        G.reshape(G.shape[0], kk * kk)[:, :: kk + 1] += pad
    else:
        G = G + eye[None, :, :] * pad[:, :, None]
    L, ok = cholesky(xp, G)
    diag = xp.linalg.diagonal(L)
    ok = ok & xp.all(xp.where(pos, diag, xp.ones_like(diag)) >= eps ** 0.25, axis=1)
    L = identity_where(xp, ok, L, own=True)
    if kk > 1 and bool(xp.any(ok)):
        ok = ok & (_inverse_norm_estimate(xp, L) <= 2.0 / eps ** 0.5)
        L = identity_where(xp, ok, L, own=True)
    return L, ok


@functools.lru_cache(maxsize=64)
def _unit_start(k: int) -> np.ndarray:
    """A fixed pseudo-random unit vector of length ``k`` (read-only)."""
    v = np.random.default_rng(k).standard_normal(k)
    v /= np.linalg.norm(v)
    v.flags.writeable = False
    return v


def _inverse_norm_estimate(xp, L):
    """(b,) a lower bound of ``||G⁻¹||₂ = 1/λ_min(G)`` for ``G = L Lᵀ``: two batched Cholesky solves.

    Cholesky pivots bound ``λ_min(G)`` from above only (``λ_min <= min L_jj²``): unit rows can have every pivot near
    1e-4 and ``λ_min`` ~ 1e-24 (Kahan's matrix, 40 rows), and the products by ``G⁻¹`` are then off by O(1).
    ``||G⁻¹ v|| / ||v||`` is at most ``||G⁻¹||₂`` for any ``v``, and at least ``|v·u_min| / (||v|| λ_min)``. The first
    ``v`` is a fixed pseudo-random unit vector (reproducible); its component along ``u_min`` can be small (a sign
    pattern of the rows, which leaves the face unchanged, can make it so), so the second is ``ξ = sign(G⁻¹ v)``,
    chosen by the data as LINPACK's condition estimator chooses its right-hand side: ``G⁻¹ v`` already leans
    towards ``u_min``, and ``ξ`` follows its signs. The larger ratio is returned. A face it puts beyond the pivot
    test's own level (``1/λ_min`` of two unit rows at the angle eps^(1/4): ``2/eps^(1/2)``) is ill-conditioned for
    certain; one it misses keeps the pivot test's accuracy claim only.
    """
    b, kk = L.shape[0], L.shape[-1]
    v = xp.asarray(_unit_start(kk).copy(), dtype=L.dtype, device=_device(L))  # the cached v is read-only
    with np.errstate(all="ignore"):  # an overflow is an infinite estimate: refused by the caller
        w = cho_solve(xp, L, xp.asarray(xp.broadcast_to(v[None, :], (b, kk)), copy=True))
        sign = xp.where(w >= 0, xp.ones_like(w), -xp.ones_like(w))
        z = cho_solve(xp, L, sign)
        est = xp.maximum(xp.linalg.vector_norm(w, axis=-1), xp.linalg.vector_norm(z, axis=-1) / kk ** 0.5)
    return xp.where(xp.isfinite(est), est, xp.full_like(est, float("inf")))


# ----------------------------------------------------------------------------- the face factorisation
@dataclass(frozen=True)
class SVDPart:
    """The rank-revealing SVD ``M_n = U Σ Vh`` of the samples ``idx`` of a face (the others use Cholesky)."""

    idx: Any  # (s,) index array into the batch
    U: Any  # (s, kk, r)
    s_inv: Any  # (s, r): 1/σ on the numerical range, 0 elsewhere
    Vh: Any  # (s, r, n), zero rows where rank-deficient


@dataclass(frozen=True)
class Face:
    """The active face of each sample of a batch and the factorisation of its Gram matrix.

    Attributes
    ----------
    rows : ActiveRows
        The gathered rows (active rows of A, then B) and the free coordinates.
    L : (b, kk, kk) array or None
        Cholesky factor of ``M_n M_nᵀ`` (identity where ``ok`` is False); None when ``kk == 0``.
    ok : (b,) bool array
        Samples factored by Cholesky; the others are in ``svd``.
    svd : SVDPart or None
    """

    rows: ActiveRows
    L: Any
    ok: Any
    svd: SVDPart | None

    @property
    def xp(self) -> Any:
        """Array namespace."""
        return self.rows.xp

    @property
    def free(self) -> Any:
        """(b, n) 0/1: coordinates not fixed by an active bound."""
        return self.rows.free

    @classmethod
    def factor(cls, A, B, active, free, *, method: str = "auto") -> Face:
        """Factor the faces of a batch (arguments of :func:`gather_active_rows`).

        ``method="svd"`` takes the rank-revealing SVD for every sample; ``"auto"`` Cholesky first.
        """
        return cls.of_rows(gather_active_rows(A, B, active, free), method=method)

    @classmethod
    def of_rows(cls, R: ActiveRows, *, method: str = "auto") -> Face:
        """Factor already gathered rows."""
        xp = R.xp
        batch, kk = R.scale.shape
        dev = _device(R.scale)
        if kk == 0:
            return cls(R, None, xp.ones((batch,), dtype=xp.bool, device=dev), None)
        n = R.free.shape[1]
        if method == "auto" and kk <= 2 * n:  # more rows than 2n are dependent: no Cholesky
            L, ok = gram_cholesky(xp, R, machine_eps(xp, R.scale.dtype))
        else:
            L, ok = None, xp.zeros((batch,), dtype=xp.bool, device=dev)
        svd = None
        if not bool(xp.all(ok)):
            idx = xp.nonzero(~ok)[0]
            U, s_inv, Vh = svd_factor(xp.take(R.Mn, idx, axis=0), n)
            svd = SVDPart(idx, U, s_inv, Vh)
        return cls(R, L, ok, svd)

    def take(self, idx) -> Face:
        """The faces of the samples ``idx`` (an index array): their factors, the SVD samples' taken, not redone."""
        xp = self.xp
        sub_ok = xp.take(self.ok, idx, axis=0)
        L = None if self.L is None else xp.take(self.L, idx, axis=0)
        face = Face(self.rows.take(idx), L, sub_ok, None)
        if self.svd is None or bool(xp.all(sub_ok)):
            return face
        s = self.svd
        match = idx[:, None] == s.idx[None, :]  # (t, s): which SVD sample each taken sample is, if any
        new = xp.nonzero(xp.any(match, axis=1))[0]
        j = xp.take(xp.argmax(xp.astype(match, xp.int32), axis=1), new, axis=0)
        return Face(face.rows, L, sub_ok, SVDPart(new, xp.take(s.U, j, axis=0), xp.take(s.s_inv, j, axis=0),
                                                   xp.take(s.Vh, j, axis=0)))

    # ------------------------------------------------------------------ operators
    def _gram_pinv(self, rn):
        """``G⁺ rn`` on the Cholesky samples (rows of the SVD samples are left to the caller)."""
        return cho_solve(self.xp, self.L, rn) if self.L is not None else self.xp.zeros_like(rn)

    def project_residual(self, resid):
        """Multipliers and step of the projection onto the face for the residual ``M z − c``.

        Returns ``(lam, step, Mt)``: ``lam`` (b, kk) the compact multipliers ``s ⊙ G⁺ s⊙resid``,
        ``step = M_n⁺ (s⊙resid)`` (b, n) so that ``y = z − step``, and ``Mt = Mᵀ lam`` on all columns.
        The SVD samples use ``step = Vhᵀ Σ⁻¹ Uᵀ rn`` (no squared condition number).
        """
        xp, R = self.xp, self.rows
        batch, kk = R.scale.shape
        if kk == 0:
            z = xp.zeros((batch, R.free.shape[1]), dtype=R.scale.dtype, device=_device(R.scale))
            return xp.zeros((batch, 0), dtype=z.dtype, device=_device(z)), z, z
        rn = resid * R.scale
        lam = self._gram_pinv(rn) * R.scale
        if self.svd is None:
            Mt = R.tdot(lam)
            return lam, Mt * R.free, Mt
        s = self.svd
        u = xp.sum(s.U * xp.take(rn, s.idx, axis=0)[:, :, None], axis=1) * s.s_inv  # Σ⁻¹ Uᵀ rn
        lam_s = xp.sum(s.U * (u * s.s_inv)[:, None, :], axis=-1) * xp.take(R.scale, s.idx, axis=0)
        lam = put_rows(xp, lam, s.idx, lam_s)
        Mt = R.tdot(lam)
        # Vh is zero on the fixed columns only to rounding: times u ~ |x| that is eps |x| on coordinates
        # that sit exactly at their bounds (1.8e-7 below 0 at |x| 1e9): masked
        step = xp.sum(s.Vh * u[:, :, None], axis=1) * xp.take(R.free, s.idx, axis=0)
        return lam, put_rows(xp, Mt * R.free, s.idx, step), Mt

    def vjp(self, g):
        """``(J g, r, Mᵀr)``: the HS-Jacobian product, ``r = (M_F⁺)ᵀ g`` (b, kk) and ``Mᵀ r`` (b, n).

        The SVD samples use ``J g = f⊙g − Vhᵀ Vh (f⊙g)`` and ``r = s ⊙ U Σ⁻¹ Vh (f⊙g)``.
        """
        xp, R = self.xp, self.rows
        fg = R.free * g
        if R.scale.shape[1] == 0:
            return fg, xp.zeros_like(R.scale), xp.zeros_like(g)
        r = self._gram_pinv(R.dot(fg) * R.scale) * R.scale
        if self.svd is None:
            Mr = R.tdot(r)  # M_nᵀ G⁺ M_n (f⊙g) = f ⊙ Mᵀ r
            return fg - R.free * Mr, r, Mr
        s = self.svd
        fgs = xp.take(fg, s.idx, axis=0)
        c = xp.sum(s.Vh * fgs[:, None, :], axis=-1)  # Vh (f⊙g)
        r = put_rows(xp, r, s.idx, xp.sum(s.U * (c * s.s_inv)[:, None, :], axis=-1) * xp.take(R.scale, s.idx, axis=0))
        Mr = R.tdot(r)
        Jg = put_rows(xp, fg - R.free * Mr, s.idx,
                      fgs - xp.sum(s.Vh * c[:, :, None], axis=1) * xp.take(R.free, s.idx, axis=0))
        return Jg, r, Mr

    def null_apply(self, v):
        """``J v`` (b, n): the orthogonal projection onto the null space of the active rows."""
        return self.vjp(v)[0]


def put_rows(xp, full, idx, part):
    """``full`` with rows ``idx`` (an index array) replaced by ``part``."""
    if is_torch_namespace(xp):
        out = full.clone()
        out[idx] = part.to(full.dtype)
        return out
    if isinstance(full, np.ndarray):
        out = full.copy()
        out[idx] = part
        return out
    # other namespaces (CuPy, array_api_strict): no in-place indexed write in the standard. Row i takes part's row
    # k where idx[k] == i, whatever the order of idx (the Birkhoff faces' eigen parts list their samples as merged,
    # [1, 3, 5, 2, 0, 4]): idx sorted once, each row's k found by binary search (O(b log b), no b × k table)
    if part.shape[0] == 0:
        return full
    order = xp.argsort(idx)
    sidx = xp.take(idx, order)
    rows = xp.arange(full.shape[0], dtype=sidx.dtype, device=_device(full))
    at = xp.clip(xp.searchsorted(sidx, rows), 0, sidx.shape[0] - 1)  # where row i is (or would be) in sidx
    mask = xp.take(sidx, at) == rows
    m = xp.reshape(mask, (-1,) + (1,) * (full.ndim - 1))
    return xp.where(m, xp.astype(xp.take(part, xp.take(order, at), axis=0), full.dtype), full)


# ----------------------------------------------------------------------------- row values
def face_rhs(xp, A, a, b, active, R: ActiveRows):
    """Right-hand sides (b, k+p) of the gathered rows.

    A gathered row keeps its right-hand side when it is an active row of A with a non-zero entry (a
    row whose support is fixed keeps it too: the consistency residual needs it); padding rows get 0.
    """
    batch, k = R.scale.shape[0], R.k
    parts = []
    if R.m:
        idx = R.order[:, :k]
        a0 = xp.where(xp.isfinite(a), a, xp.zeros_like(a))
        a_k = xp.take_along_axis(xp.broadcast_to(a0, (batch, R.m)), idx, axis=1)
        real = active & xp.broadcast_to(xp.any(A != 0, axis=-1), (batch, R.m))
        parts.append(xp.where(xp.take_along_axis(real, idx, axis=1), a_k, xp.zeros_like(a_k)))
    if R.p:
        parts.append(xp.broadcast_to(b, (batch, R.p)))
    if not parts:
        return xp.zeros((batch, 0), dtype=R.scale.dtype, device=_device(R.scale))
    return xp.concat(parts, axis=1)


def expand_rows(R: ActiveRows, r):
    """Split compact row values (b, k+p) into ``(b, m)`` for A (0 on inactive rows) and ``(b, p)`` for B."""
    xp = R.xp
    batch = r.shape[0]
    rA, rB = r[:, : R.k], r[:, R.k:]
    if not R.m:
        return xp.zeros((batch, 0), dtype=r.dtype, device=_device(r)), rB
    if is_torch_namespace(xp):  # the inverse permutation is a scatter, not a second sort
        return xp.zeros((batch, R.m), dtype=r.dtype, device=_device(r)).scatter_(1, R.order[:, : R.k], rA), rB
    if isinstance(r, np.ndarray):
        fullA = np.zeros((batch, R.m), dtype=r.dtype)
        np.put_along_axis(fullA, R.order[:, : R.k], rA, axis=1)
        return fullA, rB
    pad = xp.zeros((batch, R.m - R.k), dtype=r.dtype, device=_device(r))
    inv = xp.argsort(R.order, axis=-1, stable=True)
    return xp.take_along_axis(xp.concat([rA, pad], axis=1), inv, axis=1), rB
