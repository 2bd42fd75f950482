"""Sets one projects onto and differentiates through: the :class:`Projector` interface and its sets.

- :class:`Projector` — the abstract interface (project a batch in any array namespace, the HS-Jacobian
  VJP at the result, the set as a Polyhedron);
- :class:`Polyhedral` — the generic implementation: a polyhedron projected by any QP backend, polished;
- :class:`Box`, :class:`Simplex`, :class:`CappedSimplex` — closed-form projections with exact active sets;
- :class:`Birkhoff`, :class:`PartialMatching` — matrices with row / column sums: exact projections by
  semismooth Newton on the dual, then the exact face (``docs/sets.md``).
"""

from .base import Projector
from .birkhoff import Birkhoff
from .box import Box
from .matching import PartialMatching
from .polyhedral import Polyhedral
from .simplex import CappedSimplex, Simplex

__all__ = ["Birkhoff", "Box", "CappedSimplex", "PartialMatching", "Polyhedral", "Projector", "Simplex"]
