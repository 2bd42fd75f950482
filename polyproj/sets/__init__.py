"""Sets one projects onto and differentiates through: the :class:`Projector` interface and its sets.

- :class:`Projector` — the abstract interface (project a batch in any array namespace, the HS-Jacobian
  VJP at the result, the set as a Polyhedron);
- :class:`Polyhedral` — the generic implementation: a polyhedron projected by any QP backend, polished;
- :class:`Box`, :class:`Simplex` — closed-form projections with exact active sets.
"""

from .base import Projector
from .box import Box
from .polyhedral import Polyhedral
from .simplex import Simplex

__all__ = ["Box", "Polyhedral", "Projector", "Simplex"]
