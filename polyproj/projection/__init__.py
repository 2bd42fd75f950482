"""The one projection pipeline and what it is built of (all against the array API).

- :mod:`~polyproj.projection.pipeline` — solve → recover → polish → fall back → result;
- :mod:`~polyproj.projection.polish` — the exact active-set polish;
- :mod:`~polyproj.projection.faces` — gathered active rows and the one face factorisation;
- :mod:`~polyproj.projection.backward` — the HS-Jacobian VJP and the data gradients;
- :mod:`~polyproj.projection.hs_jacobian` — ``hs_jacobian`` / ``hs_vjp`` on a Polyhedron;
- :mod:`~polyproj.projection.result` — :class:`ProjectionResult`.
"""

from .hs_jacobian import hs_jacobian, hs_vjp
from .result import ProjectionResult

__all__ = ["ProjectionResult", "hs_jacobian", "hs_vjp"]
