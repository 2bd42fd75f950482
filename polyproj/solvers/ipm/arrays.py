"""Batched products and small array helpers shared by the IPM's modules.

Matrices carry a leading batch dimension of 1 when shared by the batch (one GEMM for the whole batch
then) or ``b`` when given per element; vectors are ``(b, k)``.
"""

from __future__ import annotations

from typing import Any

from array_api_compat import device as _device
from array_api_compat import is_torch_namespace

__all__ = ["add_diag", "inf_norm", "mv", "rmv", "take_rows"]


def mv(M: Any, v: Any) -> Any:
    """(1|b, r, n) matrix times (b, n) vectors -> (b, r); one GEMM when M is shared."""
    if M.shape[0] == 1:
        return v @ M[0, ...].mT
    return (M @ v[..., None])[..., 0]


def rmv(M: Any, w: Any) -> Any:
    """Transposed product: (1|b, r, n)ᵀ times (b, r) -> (b, n)."""
    if M.shape[0] == 1:
        return w @ M[0, ...]
    return (M.mT @ w[..., None])[..., 0]


def inf_norm(xp: Any, v: Any) -> Any:
    """``max |v|`` over the last axis (0 for an empty last axis)."""
    if v.shape[-1] == 0:
        return xp.zeros(v.shape[:-1], dtype=v.dtype, device=_device(v))
    return xp.max(xp.abs(v), axis=-1)


def add_diag(xp: Any, K: Any, d: Any) -> Any:
    """K + diag(d) for K (b, n, n), d (b, n) (a new array; K is not changed)."""
    n = K.shape[-1]
    if is_torch_namespace(xp):
        K = K.clone()
        K.diagonal(dim1=-2, dim2=-1).add_(d)
        return K
    return K + xp.eye(n, dtype=K.dtype, device=_device(K))[None, ...] * d[:, :, None]


def take_rows(xp: Any, M: Any, idx: Any) -> Any:
    """Elements ``idx`` of a per-element array; shared data (leading dimension 1) unchanged."""
    return M if M.shape[0] == 1 else xp.take(M, idx, axis=0)
