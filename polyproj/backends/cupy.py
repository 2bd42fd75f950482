"""``cupy`` backend: the batched IPM of :mod:`polyproj.solvers.ipm` on a CUDA GPU through CuPy.

The same array-API code as the ``ipm`` backend, run on CuPy arrays: the problem data are copied to
the device once, the whole batch is solved there, and the results are copied back to NumPy. On a
machine without CuPy or without a CUDA device the backend is listed as unavailable and asking for
it raises :class:`~polyproj.errors.BackendUnavailable` with the install hint.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Capabilities, QPSolver
from .ipm import IPMSolver

__all__ = ["CuPySolver"]


class CuPySolver(IPMSolver):
    """Batched IPM on the GPU (``pip install "polyproj[cupy]"``; needs a CUDA device).

    Backend-specific options: ``ruiz_iter``, ``batch_chunk`` (as for ``ipm``) and ``device``
    (CUDA device id, default 0).
    """

    name = "cupy"
    capabilities = Capabilities(dense=True, sparse=False, batch=True, gpu=True, warm_start=False, infeasibility=True)
    requires = ("cupy",)
    extra = "cupy"
    options = {"ruiz_iter": 10, "batch_chunk": None, "device": 0}

    @classmethod
    def version(cls) -> str:
        """CuPy's version (the algorithm is polyproj's IPM)."""
        return QPSolver.version.__func__(cls)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """None when CuPy imports and sees a CUDA device, else why not (with the install hint)."""
        reason = super().unavailable_reason()
        if reason is not None:
            return reason
        try:
            import cupy

            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # no driver, no device
            return f"CuPy is installed but no CUDA device is usable: {exc.__class__.__name__}: {exc}"
        if count < 1:
            return "CuPy is installed but no CUDA device is present"
        return None

    def _to(self, a: np.ndarray | None):
        if a is None:
            return None
        import cupy

        with cupy.cuda.Device(int(self.backend_options.get("device", 0))):
            return cupy.asarray(a)

    @staticmethod
    def _back(a: Any) -> np.ndarray:
        return np.asarray(a.get() if hasattr(a, "get") else a, dtype=np.float64)
