"""The :class:`QPSolver` abstract base class every backend implements.

A backend is glue: it maps the canonical :class:`~polyproj.problem.QP` to its solver's API,
maps the unified settings (``eps_abs``, ``eps_rel``, ``max_iter``, ``time_limit``, ``verbose``,
``warm_start``) and returns a :class:`~polyproj.solution.Solution` in the single sign convention
of docs/architecture.md ("Conventions"). Backend-specific options are listed in ``options``; an unknown name raises
:class:`~polyproj.errors.SettingsError`.

Writing a backend::

    class MySolver(pp.QPSolver):
        name = "mysolver"
        capabilities = pp.Capabilities(dense=True)
        requires = ("mysolver_pkg",)

        def solve(self, qp, warm_start=None):
            ...
            return pp.Solution(x=x, z=z, z_box=z_box, status=pp.Status.SOLVED, backend=self.name, qp=qp)

    pp.register_backend("mysolver", MySolver)

What polyproj does around every backend (:mod:`polyproj.backends.validation`): the ``solve`` and
``solve_batch`` of every subclass are wrapped when the class is created (``__init_subclass__``),
so a backend writes only the mapping. The wrapper answers ``n = 0`` itself, solves data far from
unit scale in normalised units (:mod:`polyproj.backends.scaling`), turns a backend's exception into
:class:`~polyproj.errors.SolverError` naming the backend, checks the shapes of the answer and
demotes a SOLVED whose residuals say otherwise, and reports TIME_LIMIT for an answer that came
after ``time_limit``.
"""

from __future__ import annotations

import abc
import functools
import importlib
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from ..errors import BackendUnavailable, PolyprojError, SettingsError, SolverError, close_matches
from ..problem import QP
from ..solution import BatchSolution, Solution, Status
from .options import Check, boolean, check_options, nonnegative, positive, positive_int
from .validation import guard

__all__ = ["SETTINGS", "Capabilities", "QPSolver"]

#: The unified settings every backend accepts, with their defaults.
SETTINGS: dict[str, Any] = {
    "eps_abs": 1e-8,
    "eps_rel": 0.0,
    "max_iter": None,
    "time_limit": None,
    "verbose": False,
    "warm_start": True,
}


def report_batch(name: str, statuses: Any, iterations: Any, seconds: float, residuals: Any = None) -> None:
    """The ``verbose`` report of polyproj's own batched solvers (the IPM, the ADMM) and of DAQP: one line a call.

    External solvers print their own logs when ``verbose`` (DAQP has none); this line is what a batch needs: its
    size, the statuses by count, the iterations (largest), the wall time and, when known, the largest residuals.
    """
    from collections import Counter

    counts = ", ".join(f"{k.name} {v}" for k, v in Counter(statuses).most_common())
    its = int(np.max(np.asarray(iterations), initial=0))
    line = f"polyproj {name}: {len(statuses)} QP(s) in {seconds:.3g} s, at most {its} iterations; {counts}"
    if residuals is not None:
        line += "; largest " + ", ".join(f"{k} {float(np.nanmax(np.asarray(v), initial=0.0)):.2e}"
                                         for k, v in residuals.items())
    print(line, flush=True)


class FixedSettings(dict):
    """A backend's settings after construction: read like a dict, not edited (an edit would skip the checks above).

    Settings are given to the constructor (``pp.get_backend(name, **settings)``), which checks them; a new
    backend object is the way to change them. Pickles and copies as the dict it holds.
    """

    def _refuse(self, *_: Any, **__: Any) -> None:
        raise SettingsError("a backend's settings are fixed when it is made (and checked then): make another, "
                            "pp.get_backend(name, **settings)")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = __ior__ = _refuse  # type: ignore

    def __reduce__(self) -> tuple:
        return type(self), (dict(self),)


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do (shown by ``polyproj backends``)."""

    dense: bool = True
    sparse: bool = False
    batch: bool = False  # native solve_batch
    gpu: bool = False
    warm_start: bool = False
    duals: bool = True
    infeasibility: bool = False  # detects primal/dual infeasibility
    #: projections run in the input's array namespace and device (no host round trip)
    array_api: bool = False
    #: per-sample constraint matrices in one native batch (input-dependent constraints)
    batch_matrices: bool = False
    #: ``solve_projections(rough=True)`` stops once the active face looks identified (the polish finishes)
    early_stop: bool = False
    #: its projections are starts for the polish only: points the polish refuses go to another backend
    start_only: bool = False

    def as_list(self) -> list[str]:
        """Names of the capabilities that are true."""
        return [k for k, v in asdict(self).items() if v]


#: the methods every backend class gets wrapped with :func:`~polyproj.backends.validation.guard`
GUARDED = ("solve", "solve_batch", "solve_projections")


class QPSolver(abc.ABC):
    """Abstract base of every backend.

    Parameters
    ----------
    eps_abs, eps_rel : float
        Absolute / relative tolerance on primal residual, dual residual and duality gap.
    max_iter : int or None
    time_limit : float or None
        Seconds; reaching it gives ``Status.TIME_LIMIT``.
    verbose : bool
    warm_start : bool
        Use a given warm start (``solve(qp, warm_start=...)``) and previous results in batches.
    **options
        Backend-specific options; allowed names are in the class attribute ``options``.
    """

    name: ClassVar[str] = ""
    capabilities: ClassVar[Capabilities] = Capabilities()
    #: modules that must import for the backend to be available
    requires: ClassVar[tuple[str, ...]] = ()
    #: ``pip install "polyproj[<extra>]"`` brings the requirements
    extra: ClassVar[str | None] = None
    #: backend-specific option names (passed through to the solver)
    options: ClassVar[Mapping[str, Any]] = {}
    #: checks of the values given for ``options`` (:mod:`polyproj.backends.options`), run at construction
    option_checks: ClassVar[Mapping[str, Check]] = {}
    #: the solver refuses a purely relative tolerance (``eps_abs = 0``): refused at construction, named
    needs_eps_abs: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Wrap the subclass's ``solve`` / ``solve_batch`` with polyproj's checks (module docstring).

        Its own, or one it inherits from a class that is no backend (a mixin): every method a backend
        solves with is guarded, except ``QPSolver``'s default ``solve_batch`` (it calls a guarded ``solve``).
        """
        super().__init_subclass__(**kwargs)
        cls._guard_methods()

    @classmethod
    def _guard_methods(cls) -> None:
        """Wrap what ``solve`` / ``solve_batch`` / ``solve_projections`` resolve to now, where not guarded yet.

        Run when the class is made and again when an instance is (a method assigned to the class after it
        was made, ``Cls.solve = f``, is guarded from the next instance on).
        """
        for meth in GUARDED:
            owner = next(k for k in cls.__mro__ if meth in k.__dict__)
            fn = owner.__dict__[meth]
            if owner is QPSolver or getattr(fn, "_polyproj_guarded", False):
                continue
            if isinstance(fn, (staticmethod, classmethod)):  # guarded as the method it stands for
                fn = _as_method(fn)
            elif not callable(fn):  # a property, a value: what it returns would escape the guard
                raise PolyprojError(f"backend {cls.__name__}.{meth} is a {type(fn).__name__}, not a method: write "
                                    f"def {meth}(self, ...) (or a staticmethod / classmethod)")
            setattr(cls, meth, guard(meth, fn))

    def __init__(self, **settings: Any) -> None:
        type(self)._guard_methods()
        unknown = [k for k in settings if k not in SETTINGS and k not in self.options]
        if unknown:
            known = sorted(SETTINGS) + sorted(self.options)
            # "backend" too: solve_qp / project pass their other keywords here ('backnd' was blamed on the default)
            hints = "".join(close_matches(k, [*known, "backend"]) for k in unknown)
            raise SettingsError(
                f"unknown setting(s) {unknown} for backend {self.name!r}.{hints} "
                f"Unified settings: {sorted(SETTINGS)}; {self.name}-specific: {sorted(self.options) or 'none'}"
            )
        self.settings: dict[str, Any] = {**SETTINGS, **settings}
        for k in ("eps_abs", "eps_rel"):
            v = self.settings[k]
            if nonnegative(v) is not None:
                raise SettingsError(f"{k} must be a finite number >= 0, got {v!r}")
            self.settings[k] = float(v)
        if self.settings["eps_abs"] == 0 and self.settings["eps_rel"] == 0:
            raise SettingsError("eps_abs and eps_rel are both 0: no solver stops at zero residuals; give one > 0")
        if self.needs_eps_abs and self.settings["eps_abs"] == 0:
            raise SettingsError(f"backend {self.name!r} needs eps_abs > 0 (it refuses a purely relative tolerance); "
                                "give eps_abs, e.g. 1e-12, with eps_rel")
        if self.settings["time_limit"] is not None and self.settings["time_limit"] == float("inf"):
            self.settings["time_limit"] = None  # no limit
        for k, check, what in (("max_iter", positive_int, "integer"), ("time_limit", positive, "number")):
            v = self.settings[k]
            if v is not None and check(v) is not None:
                raise SettingsError(f"{k} must be a positive {what} or None, got {v!r}")
        for k in ("verbose", "warm_start"):  # a string such as "no" is truthy: refused, not read as True
            if boolean(self.settings[k]) is not None:
                raise SettingsError(f"{k} must be True or False, got {self.settings[k]!r}")
            self.settings[k] = bool(self.settings[k])
        #: the backend's own options as its solver takes them (checked, converted; None: the solver's default)
        self.backend_options: dict[str, Any] = FixedSettings(check_options(
            self.name, {k: v for k, v in settings.items() if k in self.options}, self.option_checks))
        self.settings = FixedSettings(self.settings)

    # ------------------------------------------------------------------ availability
    @classmethod
    def unavailable_reason(cls) -> str | None:
        """None when the backend can run here, else why not (with the install hint)."""
        for mod in cls.requires:
            try:
                importlib.import_module(mod)
            except Exception as exc:  # ImportError, or a broken install
                hint = f' (pip install "polyproj[{cls.extra}]")' if cls.extra else ""
                return f"cannot import {mod}: {exc.__class__.__name__}: {exc}{hint}"
        return None

    @classmethod
    def version(cls) -> str:
        """Version of the underlying solver package ('' if unknown)."""
        if not cls.requires:
            return ""
        try:
            from importlib.metadata import version

            return version(cls.requires[0])
        except Exception:
            mod = importlib.import_module(cls.requires[0])
            return str(getattr(mod, "__version__", ""))

    @classmethod
    def ensure_available(cls) -> None:
        """Raise :class:`BackendUnavailable` with the install hint when the backend cannot run."""
        reason = cls.unavailable_reason()
        if reason is not None:
            raise BackendUnavailable(f"backend {cls.name!r} is unavailable: {reason}")

    # ------------------------------------------------------------------ solving
    @abc.abstractmethod
    def solve(self, qp: QP, warm_start: Solution | Mapping[str, np.ndarray] | None = None) -> Solution:
        """Solve one QP; never raise on infeasibility or iteration limits (they are statuses)."""

    def solve_batch(
        self,
        qp: QP,
        q: np.ndarray | None = None,
        l: np.ndarray | None = None,
        u: np.ndarray | None = None,
        lb: np.ndarray | None = None,
        ub: np.ndarray | None = None,
        warm_start: BatchSolution | None = None,
    ) -> BatchSolution:
        """Solve many QPs that share ``P`` and ``C``; the given vectors carry a batch dimension.

        The default loops over :meth:`solve`; backends with a native batch path override it.
        ``time_limit`` bounds the whole call: elements not started by then are TIME_LIMIT.
        """
        vecs = self._batch_vectors(qp, q=q, l=l, u=u, lb=lb, ub=ub)
        size = self._batch_size(vecs)
        sols = []
        t0 = time.perf_counter()
        limit = self.settings.get("time_limit")
        for i in range(size):
            qpi = qp.with_vectors(validate=False, **{k: v[i] for k, v in vecs.items()})
            if limit is not None and time.perf_counter() - t0 > limit:
                sols.append(self._nan_solution(qpi, Status.TIME_LIMIT, self.name,
                                               info={"note": "not started: the batch reached time_limit"}))
                continue
            ws = warm_start.solution(i) if warm_start is not None else None
            sol = self.solve(qpi, warm_start=ws)
            if not isinstance(sol, Solution):  # (inside the guard, solve's answer is not checked before stacking)
                raise SolverError(f"backend {self.name or type(self).__name__!r} returned {type(sol).__name__} from "
                                  "solve(); expected a polyproj.Solution")
            sols.append(sol)
        return BatchSolution.stack(sols, backend=self.name, solve_time=time.perf_counter() - t0)

    def solve_projections(self, X: Any, data: Any, *, rough: bool = False) -> Any:
        """Projections of the rows of ``X`` onto a polyhedron: the start of the exact polish.

        Parameters
        ----------
        X : (batch, n) array of any namespace
        data : :class:`~polyproj.polydata.PolyData`
            In the namespace of ``X``; shared or per sample.
        rough : bool
            The backend may stop once the active face looks identified (``capabilities.early_stop``);
            the pipeline solves refused points again with ``rough=False``.

        Returns
        -------
        :class:`~polyproj.backends.projection.ProjectionStart` in the namespace of ``X``.

        The default sends the batch to the host once and solves it by :meth:`solve_batch` (shared
        matrices) or :meth:`solve` per sample; backends that work in any namespace override it.
        """
        from .projection import solve_on_host

        return solve_on_host(self, X, data, rough=rough)

    # ------------------------------------------------------------------ helpers for subclasses
    @staticmethod
    def _batch_vectors(qp: QP, **vecs: np.ndarray | None) -> dict[str, np.ndarray]:
        """Validate batched vectors at once (shapes, NaN, infinities, crossing bounds).

        The checks are :func:`polyproj.problem.check_values` and ``check_order``, as for single
        vectors; returns float64 arrays ready for ``qp.with_vectors(validate=False, ...)``.
        """
        from ..errors import ProblemError
        from ..problem import _asarray, _check_numeric, check_order, check_values

        out = {}
        spec = {"q": (qp.n, 0), "l": (qp.m, -1), "u": (qp.m, 1), "lb": (qp.n, -1), "ub": (qp.n, 1)}
        for k, v in vecs.items():
            if v is None:
                continue
            arr = _asarray(v, f"batched {k}")  # ragged: a ProblemError; strings, complex: refused, not truncated
            _check_numeric(arr, f"batched {k}")
            arr = np.array(arr, dtype=np.float64)
            size, allow_inf = spec[k]
            if arr.ndim != 2 or arr.shape[1] != size:
                raise ProblemError(f"batched {k} must have shape (batch, {size}), got {arr.shape}")
            out[k] = check_values(arr, f"batched {k}", allow_inf, cost=k == "q")
        for lo, hi in (("l", "u"), ("lb", "ub")):
            if lo in out or hi in out:
                check_order(out.get(lo, getattr(qp, lo)[None, :]), out.get(hi, getattr(qp, hi)[None, :]),
                            *(f"batched {k}" if k in out else f"the problem's {k}" for k in (lo, hi)),
                            what="batched bounds")
        return out

    @staticmethod
    def _batch_size(vecs: dict[str, np.ndarray]) -> int:
        from ..errors import ProblemError

        sizes = {v.shape[0] for v in vecs.values()}
        if len(sizes) > 1:
            found = {k: v.shape[0] for k, v in vecs.items()}
            raise ProblemError(f"batched vectors disagree on the batch size: {found}")
        if not sizes:
            raise ProblemError("solve_batch needs at least one batched vector (q, l, u, lb or ub)")
        return sizes.pop()

    @staticmethod
    def _nan_solution(qp: QP, status: Status, backend: str, **kw: Any) -> Solution:
        """A Solution with NaN primal/dual values (for failures)."""
        return Solution(
            x=np.full(qp.n, np.nan),
            z=np.full(qp.m, np.nan),
            z_box=np.full(qp.n, np.nan),
            status=status,
            backend=backend,
            qp=qp,
            **kw,
        )

    def __repr__(self) -> str:
        changed = {k: v for k, v in self.settings.items() if SETTINGS.get(k, object()) != v}
        args = ", ".join(f"{k}={v!r}" for k, v in changed.items())
        return f"{type(self).__name__}({args})"


def _as_method(desc: staticmethod | classmethod) -> Any:
    """A ``staticmethod`` / ``classmethod`` as a plain method of the instance (what :func:`guard` wraps)."""
    fn = desc.__func__

    if isinstance(desc, staticmethod):
        @functools.wraps(fn)
        def method(self: Any, *args: Any, **kw: Any) -> Any:
            return fn(*args, **kw)
    else:
        @functools.wraps(fn)
        def method(self: Any, *args: Any, **kw: Any) -> Any:
            return fn(type(self), *args, **kw)

    return method


# the default batch loop is held to the same checks as a subclass's own solve_batch
QPSolver.solve_batch = guard("solve_batch", QPSolver.solve_batch)  # type: ignore[method-assign]
