"""``cupy`` backend: the batched IPM of :mod:`polyproj.solvers.ipm` on a CUDA GPU through CuPy.

The same array-API code as the ``ipm`` backend, run on CuPy arrays: the problem data are copied to
the device once, the whole batch is solved there, and the results are copied back to NumPy. Projections
(``pp.project``) too: CuPy inputs are solved on their own device, any other input is copied to the
``device`` once with the constraint data and its start comes back in the input's namespace. On a
machine without CuPy or without a CUDA device the backend is listed as unavailable and asking for
it raises :class:`~polyproj.errors.BackendUnavailable` with the install hint.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
from array_api_compat import array_namespace, is_cupy_namespace
from array_api_compat import device as _device

from ..linalg import from_host, to_host
from ..polydata import PolyData
from .base import Capabilities, QPSolver
from .ipm import IPMSolver
from .options import nonnegative_int, positive_int
from .projection import ProjectionStart

__all__ = ["CuPySolver"]


class CuPySolver(IPMSolver):
    """Batched IPM on the GPU (``pip install "polyproj[cupy]"``; needs a CUDA device).

    Backend-specific options: ``ruiz_iter``, ``batch_chunk`` (as for ``ipm``) and ``device``
    (CUDA device id, an integer >= 0, default 0).
    """

    name = "cupy"
    capabilities = Capabilities(dense=True, sparse=False, batch=True, gpu=True, warm_start=False, infeasibility=True)
    requires = ("cupy",)
    extra = "cupy"
    options = {"ruiz_iter": 10, "batch_chunk": None, "device": 0}
    option_checks: ClassVar[dict[str, Any]] = {
        "ruiz_iter": nonnegative_int, "batch_chunk": positive_int, "device": nonnegative_int}

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

    def _gpu(self) -> Any:
        """The CUDA device of the ``device`` option, as a context (arrays made and kernels run there)."""
        import cupy

        return cupy.cuda.Device(self.backend_options.get("device", 0))

    def _to(self, a: np.ndarray | None):
        if a is None:
            return None
        import cupy

        with self._gpu():
            return cupy.asarray(a)

    def _run(self, *args: Any):
        with self._gpu():  # the IPM's kernels on the device its arrays were copied to
            return super()._run(*args)

    def solve_projections(self, X: Any, data: PolyData, *, rough: bool = False) -> ProjectionStart:
        """The IPM's projections on the GPU; ``rough`` is not taken (``capabilities.early_stop`` is False).

        CuPy arrays are solved where they are (their own device). An array of any other namespace (NumPy, ...)
        goes to the ``device`` once with the constraint data (:meth:`_to`), and the start comes back in its
        namespace, device and dtype (:meth:`_back`), as ``solve`` / ``solve_batch`` return NumPy.
        """
        if is_cupy_namespace(array_namespace(X)):
            with _device(X):
                return super().solve_projections(X, data, rough=False)
        with self._gpu():
            start = super().solve_projections(self._to(to_host(X)),
                                              PolyData(*(self._to(to_host(v)) for v in data.parts())), rough=False)
        return replace(start, **{k: from_host(self._back(getattr(start, k)), X) for k in ("y", "mult", "mu")})

    @staticmethod
    def _back(a: Any) -> np.ndarray:
        return np.asarray(a.get() if hasattr(a, "get") else a, dtype=np.float64)
