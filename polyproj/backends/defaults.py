"""Which backend for what: the one place where polyproj chooses backends by name, by measurement.

The projection pipeline, ``solve_qp`` and the torch adapter ask here; nothing else names a backend.
The measurements behind each rule are in ``docs/performance.md``.
"""

from __future__ import annotations

from typing import Any

from ..errors import PolyprojError

__all__ = ["PROJECTION_DEFAULT", "QP_DEFAULT", "auto_projection", "direct_points", "exact_points", "fallback_for",
           "independent_of", "per_point_limit", "retries_of", "thin"]

#: default backend of :func:`polyproj.solve_qp` (best at 1e-8 and 1e-9 on the Maros–Meszaros dense subset)
QP_DEFAULT = "piqp"
#: default backend of :func:`polyproj.project` for a Polyhedron: chosen per call by :func:`auto_projection`
PROJECTION_DEFAULT = "auto"
#: the ``backend="auto"`` rule for projections: shared matrices → one factorisation for the batch (the
#: ADMM start); fewer than AUTO_SMALL_BATCH points on the CPU → a dual active-set solver per point;
#: per-sample matrices → the batched IPM
AUTO_SHARED, AUTO_SMALL, AUTO_PER_SAMPLE = "admm", "daqp", "ipm"
AUTO_SMALL_BATCH = 16
#: DAQP's cost per point grows like n^2.5, the ADMM start + polish of a batch has a fixed cost that grows more
#: slowly: per-point solves pay up to AUTO_SMALL_BATCH (PER_POINT_N/n)^2 points, the crossovers measured with
#: benchmarks/bench_layer.py's data (docs/torch.md, section "Backends and backend=auto")
PER_POINT_N = 50.0
#: long thin polytopes: from AUTO_THIN n rows of A on, the ADMM start identifies faces poorly (its polish takes
#: many rounds and leaves samples to the batched IPM) and DAQP per point is faster at most batch sizes; below
#: THIN_MIN_N coordinates the batched start stays ahead up to THIN_TINY n rows (benchmarks/bench_auto_thin.py,
#: docs/performance.md, "Long thin polytopes")
AUTO_THIN = 3.0
THIN_MIN_N, THIN_TINY = 4, 8.0


def per_point_limit(n: int | None) -> int:
    """The most CPU points of dimension ``n`` that the ``"auto"`` rule solves one at a time (DAQP)."""
    if n is None:
        return AUTO_SMALL_BATCH
    return int(min(AUTO_SMALL_BATCH, AUTO_SMALL_BATCH * (PER_POINT_N / max(int(n), 1)) ** 2))

#: the direct path (DAQP per point, then every point's face exact in one pass: polyproj.projection.direct)
#: against the ADMM start + polish of the batch: the direct path's cost grows like DAQP's (n^2.5 a point), the
#: start's crossover falls steeply with n, so the direct path takes up to DIRECT_POINTS (50/n)^4 points, capped by
#: DIRECT_BATCH (crossovers: benchmarks/bench_small_batch.py --crossover, docs/torch.md)
DIRECT_POINTS = 50.0


def direct_points(n: int) -> int:
    """The most CPU points of dimension ``n`` that ``"auto"`` sends the direct path.

    At least :func:`per_point_limit`; the path's own ceiling is ``polyproj.projection.direct.DIRECT_BATCH``.
    """
    return int(max(per_point_limit(n), DIRECT_POINTS * (PER_POINT_N / max(int(n), 1)) ** 4))


#: order in which an independent second opinion is asked (a false infeasibility report)
INDEPENDENT = ("ipm", "highs", "proxsuite", "osqp")
#: order in which other backends solve the points whose polish a backend's answer left refused: interior-point
#: methods first (on coordinates scaled 1e-3 to 1e3 the IPM, PIQP and Clarabel gave points the polish verified
#: where DAQP, HiGHS, ProxSuite and OSQP did not)
RETRY = ("ipm", "piqp", "clarabel", "proxsuite", "highs", "osqp", "daqp")


def _available(name: str, **settings: Any) -> bool:
    from ..registry import get_backend

    try:
        get_backend(name, **settings)
    except PolyprojError:
        return False
    return True


def thin(n: int | None, m: int | None) -> bool:
    """Whether ``m`` inequality rows in dimension ``n`` make a long thin polytope (:data:`AUTO_THIN`)."""
    if n is None or m is None:
        return False
    n = max(int(n), 1)
    return m >= (AUTO_THIN if n >= THIN_MIN_N else THIN_TINY) * n


def auto_projection(shared_matrices: bool, batch: int | None = None, on_cpu: bool = True,
                    settings: dict | None = None, n: int | None = None, m: int | None = None) -> str:
    """The ``backend="auto"`` rule for projections.

    The ADMM start + polish for shared matrices (DAQP, when installed and the settings are unified ones,
    for batches of fewer than :data:`AUTO_SMALL_BATCH` CPU points and at most :func:`per_point_limit`
    of dimension ``n``, and for CPU batches of any size with ``m`` >= :data:`AUTO_THIN` ``n`` rows of A),
    the batched IPM for per-sample matrices.
    """
    if not shared_matrices:
        return AUTO_PER_SAMPLE
    small = batch is not None and batch < AUTO_SMALL_BATCH and batch <= per_point_limit(n)
    if on_cpu and (small or (batch is not None and thin(n, m))) and _available(AUTO_SMALL, **(settings or {})):
        return AUTO_SMALL
    return AUTO_SHARED


#: the exact per-point fallback: DAQP (a dual active-set method) ends on the exact active set, which the
#: polish verifies in one round; its cost grows like n^2.5 against one more polish round on the few samples
#: left, so it takes EXACT_POINTS (50/n)^2.5 CPU points (docs/performance.md, the fallback's figures)
EXACT_FALLBACK, EXACT_POINTS, EXACT_POINTS_MAX = "daqp", 64, 256


def exact_points(n: int, settings: dict | None = None) -> int:
    """How many CPU points of dimension ``n`` the exact per-point fallback takes (0 when DAQP is missing)."""
    if not _available(EXACT_FALLBACK, **(settings or {})):
        return 0
    return int(min(EXACT_POINTS_MAX, EXACT_POINTS * (50.0 / max(n, 1)) ** 2.5))


def fallback_for(on_cpu: bool, n: int, count: int, settings: dict) -> str:
    """The backend that solves the points a start-only backend (the ADMM) leaves to the fallback.

    DAQP one QP at a time for up to :func:`exact_points` CPU samples, else ProxSuite for a few small
    ones (at most 8, n <= 100), else the batched IPM on the input's device.
    """
    if on_cpu and count <= exact_points(n, settings):
        return EXACT_FALLBACK
    if on_cpu and n <= 100 and count <= 8 and _available("proxsuite", **settings):
        return "proxsuite"
    return "ipm"


def independent_of(name: str) -> str | None:
    """A backend other than ``name`` to ask for a second opinion (None when none is installed)."""
    others = independents_of(name)
    return others[0] if others else None


def _installed(order: tuple[str, ...], excluded: tuple[str, ...]) -> list[str]:
    """The installed backends of ``order`` not in ``excluded``, in order."""
    return [other for other in order if other not in excluded and _available(other)]


def retries_of(tried: tuple[str, ...]) -> list[str]:
    """Every installed backend of :data:`RETRY` not in ``tried``, in order."""
    return _installed(RETRY, tried)


def independents_of(name: str) -> list[str]:
    """Every installed backend of :data:`INDEPENDENT` other than ``name``, in order (third opinions)."""
    return _installed(INDEPENDENT, (name,))
