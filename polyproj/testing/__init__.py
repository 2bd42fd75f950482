"""Public test kit: hypothesis strategies, property checks and backend conformance.

Importable without pytest; hypothesis is needed only when strategies are used. Submodules:

- ``strategies``  hypothesis strategies (polyhedra with/without LICQ, degenerate points, QPs)
- ``properties``  projection properties, conservativity and LICQ-equivalence checks
- ``conformance`` the backend contract (KKT residuals, statuses, sign convention, agreement)
- ``check``       :func:`check_backend` — what ``polyproj check`` runs
- ``projector``   :func:`check_projector` — the property suites on any Projector

Names are resolved lazily from these submodules: ``polyproj.testing.check_backend`` works
without importing hypothesis until it is needed.
"""

from __future__ import annotations

import importlib
from typing import Any

_SUBMODULES = ("check", "conformance", "projector", "properties", "strategies")


def __getattr__(name: str) -> Any:
    for sub in _SUBMODULES:
        try:
            mod = importlib.import_module(f"{__name__}.{sub}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__name__}.{sub}":
                continue
            raise
        if name in getattr(mod, "__all__", ()):
            return getattr(mod, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
