"""Assembly of the normal matrix ``K = c_i P̃ + G̃ᵀ diag(d) G̃ + ρ I`` for a whole batch.

With ``G̃ = [C̃; I]`` and ``d = [d_C; d_x]`` this is ``c_i P̃ + C̃ᵀ diag(d_C) C̃ + diag(d_x + ρ)``.

When C is shared, ``C̃ᵀ diag(d_C) C̃ = Σ_j d_j c_j c_jᵀ`` is linear in ``d``: with the products
``c_j c_jᵀ`` packed (lower triangle, a table ``CC`` of shape ``(m, n(n+1)/2)``), every K of the batch
is ONE GEMM ``d_C @ CC``, half the flops and memory traffic of the ``(b·n, m) × (m, n)`` product.
On NumPy and torch the packed rows are copied into the lower triangle of a reused ``K`` (the Cholesky
factorisations read only that triangle); other namespaces gather the full symmetric matrices.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from array_api_compat import is_numpy_namespace, is_torch_namespace

from .arrays import add_diag
from .problem import Numerics
from .scaling import Scaling

__all__ = ["PACKED_MAX", "NormalMatrix"]

#: largest packed table ``CC`` (entries; 2**23 is 64 MB in float64)
PACKED_MAX = 2**23


class NormalMatrix:
    """``K`` of every element of a batch of ``b``, for diagonal weights ``d`` (b, m + n).

    Frozen elements (not running) get the identity. NumPy and torch: ``K`` and its packed form are
    allocated once and overwritten by every :meth:`build` (a fresh large array per iteration costs
    page faults), so a returned ``K`` is valid until the next call.
    """

    def __init__(self, xp: Any, scaling: Scaling, rho: float, b: int, num: Numerics) -> None:
        self.xp, self.s, self.rho, self.b, self.num = xp, scaling, rho, b, num
        Ps, Cs = scaling.Ps, scaling.Cs
        self.n, self.m = n, m = Ps.shape[-1], Cs.shape[-2]
        self.CC = self.Ct = None
        self._Kp = self._K = None
        if Cs.shape[0] == 1 and m * n * (n + 1) // 2 <= PACKED_MAX:
            self._packed_plan()
        elif Cs.shape[0] == 1:  # Cᵀ row-major (reshape copies a transposed view in C order in every namespace)
            self.Ct = xp.reshape(xp.reshape(Cs[0, ...].mT, (n * m,)), (n, m))

    def _packed_plan(self) -> None:
        """The packed table ``CC``, the positions of the diagonal, and the packed P (None if diagonal)."""
        xp, n, dev = self.xp, self.n, self.num.device
        Ps = self.s.Ps
        ti, tj = np.tril_indices(n)
        pos = np.empty((n, n), dtype=np.int64)
        pos[ti, tj] = pos[tj, ti] = np.arange(ti.size)
        C0 = self.s.Cs[0, ...]
        self.CC = xp.take(C0, xp.asarray(ti, device=dev), axis=1) * xp.take(C0, xp.asarray(tj, device=dev), axis=1)
        self.sym_gather = xp.asarray(pos.reshape(-1), device=dev)
        diag_np = ti == tj
        self.eye_packed = xp.asarray(diag_np.astype(np.float64), dtype=self.num.dtype, device=dev)  # (T,)
        self.diag_pos = xp.asarray(np.flatnonzero(diag_np), device=dev)  # packed positions of the diagonal
        self.inplace = is_numpy_namespace(xp) or is_torch_namespace(xp)
        self.row_off = [i * (i + 1) // 2 for i in range(n + 1)]  # packed row i: row_off[i]:row_off[i + 1]
        if not self.inplace:  # standard-only: the diagonal spread over the packed positions by a gather
            owner = np.zeros(ti.size, dtype=np.int64)
            owner[diag_np] = np.arange(n)
            self.diag_owner = xp.asarray(owner, device=dev)
        Pp = xp.take(xp.reshape(Ps, (Ps.shape[0], n * n)), xp.asarray(ti * n + tj, device=dev), axis=1)
        self.P_diag = xp.linalg.diagonal(Ps)  # (1, n)
        offdiag = xp.take(Pp, xp.asarray(np.flatnonzero(~diag_np), device=dev), axis=1)
        # a diagonal P (projections: P = I) is folded into the diagonal update
        self.Pp = Pp if bool(xp.any(offdiag != 0)) else None

    @property
    def shared_diagonal_P(self) -> Any:
        """``diag(P̃)`` (1, n) when C is shared (packed) and P̃ shared and diagonal, else None."""
        return self.P_diag if (self.CC is not None and self.Pp is None) else None

    def build(self, Dg: Any, running: Any) -> Any:
        """``K`` (b, n, n) for the weights ``Dg`` (b, m + n); the identity where not ``running``.

        On the packed NumPy / torch path only the lower triangle is written (the upper one is zero).
        """
        if self.CC is not None:
            return self._build_packed(Dg, running)
        xp, s, m, n = self.xp, self.s, self.m, self.n
        Dc = Dg[:, :m]
        if self.Ct is not None:
            K = xp.reshape(xp.reshape(self.Ct[None, ...] * Dc[:, None, :], (self.b * n, m)) @ s.Cs[0, ...],
                           (self.b, n, n))
        else:
            K = (s.Cs.mT * Dc[:, None, :]) @ s.Cs
        K = K + s.c[:, None, None] * s.Ps
        K = add_diag(xp, K, Dg[:, m:] + self.rho)
        frozen = ~running
        if bool(xp.any(frozen)):
            K = xp.where(frozen[:, None, None], xp.eye(n, dtype=self.num.dtype, device=self.num.device)[None, ...], K)
        return K

    def _build_packed(self, Dg: Any, running: Any) -> Any:
        """Everything in the packed domain (half the memory traffic), one copy or gather at the end."""
        xp, c, m, n, b = self.xp, self.s.c, self.m, self.n, self.b
        Dc = Dg[:, :m]
        if self.inplace:
            if self._Kp is None:
                self._Kp = xp.zeros((b, self.CC.shape[1]), dtype=self.num.dtype, device=self.num.device)
            Kp = xp.matmul(Dc, self.CC, out=self._Kp)
        else:
            Kp = Dc @ self.CC
        dvec = Dg[:, m:] + self.rho
        if self.Pp is not None and self.inplace:
            Kp += c[:, None] * self.Pp
        elif self.Pp is not None:
            Kp = Kp + c[:, None] * self.Pp
        else:
            dvec = dvec + c[:, None] * self.P_diag
        if self.inplace:
            Kp[:, self.diag_pos] += dvec
        else:
            Kp = Kp + xp.take(dvec, self.diag_owner, axis=1) * self.eye_packed
        frozen = ~running
        if bool(xp.any(frozen)):
            Kp = xp.where(frozen[:, None], self.eye_packed[None, :], Kp)
        if not self.inplace:
            return xp.reshape(xp.take(Kp, self.sym_gather, axis=1), (b, n, n))
        # the Cholesky factorisations read the lower triangle only: copy the packed rows into it (half
        # the traffic of the symmetric gather); the upper triangle of the buffer stays zero
        if self._K is None:
            self._K = xp.zeros((b, n, n), dtype=self.num.dtype, device=self.num.device)
        K, off = self._K, self.row_off
        for i in range(n):
            K[:, i, : i + 1] = Kp[:, off[i]: off[i + 1]]
        return K
