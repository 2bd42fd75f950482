"""Framework adapters built on the core: ``torch`` (differentiable projection) and ``dif``.

Only modules under ``adapters`` import torch; import them explicitly, e.g.
``from polyproj.adapters.torch import ProjectionLayer``.
"""
