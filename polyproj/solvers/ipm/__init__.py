"""Batched Mehrotra predictor–corrector primal–dual interior-point method on the array API.

One implementation, written against the array API standard (``array_api_compat.array_namespace``),
runs on NumPy, PyTorch (CPU or CUDA, no copy), CuPy and ``array_api_strict``. It solves a batch of
convex QPs in polyproj's canonical form::

    minimize ½ xᵀPx + qᵀx   subject to   l <= C x <= u,   lb <= x <= ub

with a leading batch dimension on ``q, l, u, lb, ub`` (and on ``P, C`` when given per element), and
returns multipliers in polyproj's sign convention: with ``z = z_u − z_l (+ y)`` stationarity reads
``P x + q + Cᵀz + z_box = 0``. The method, its options and its measurements: ``docs/ipm.md``.

Modules, in the order of a solve:

- :mod:`.problem`      validated inputs (:class:`~.problem.BatchQP`), the stacked rows ``G = [C; I]``
- :mod:`.scaling`      Ruiz equilibration, the scaled problem and the way back
- :mod:`.normal_matrix` assembly of ``K = P + Gᵀ D G + ρ I`` for the whole batch
- :mod:`.kkt`          factorisation of the reduced KKT system (named :class:`~.kkt.Factorization`),
  the eigendecomposition start, Newton solves and iterative refinement
- :mod:`.direction`    residuals, Mehrotra's predictor and corrector, step lengths
- :mod:`.termination`  unscaled residuals, tolerances, infeasibility certificates, final statuses
- :mod:`.state`        the iterate, the best point, the loop state and the resume state
- :mod:`.iteration`    init / step / terminate
- :mod:`.batch`        parts, worker threads, compaction of finished elements
- :mod:`.solve`        :func:`solve_qp_batch`
"""

from .result import CODES, IPMResult, code_to_status
from .solve import solve_qp_batch

__all__ = ["CODES", "IPMResult", "code_to_status", "solve_qp_batch"]
