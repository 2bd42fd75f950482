"""``check_backend``: run the backend contract and the property suites on any backend.

What runs (each property is a hypothesis test driven programmatically, seeded, no database):

=====================  ==============  ===========================================================
property               group           what it checks
=====================  ==============  ===========================================================
qp_contract            contract        raw ``solve`` on feasible QPs: SOLVED, feasibility, KKT,
                                       multiplier sign convention, duality gap
qp_contract_sparse     contract        the same with scipy.sparse data (backends declaring sparse)
infeasibility          contract        certified-infeasible QPs are never SOLVED (PRIMAL_INFEASIBLE
                                       when the backend declares detection)
batch_contract         contract        raw ``solve_batch`` on projection QPs: KKT per element,
                                       agreement with the exact projection
batch_qp_contract      contract        raw ``solve_batch`` on QPs sharing a general P and C, a random
                                       non-empty subset of q, l, u, lb, ub batched (the others shared),
                                       cold and warm-started: KKT per element, agreement with the
                                       backend's ``solve`` of each element
projection_contract    contract        raw ``solve_projections`` (the projection entry, overridden by
                                       array-API backends): SOLVED, KKT of each point's start read as
                                       its projection QP's Solution, agreement with the exact projection
projection             projection      KKT, idempotence, firm non-expansiveness, variational ineq.
conservativity         hs-jacobian     path integral of J d over kinks = chord; a.e. derivative
                                       = J d for every HS element (8 segments per example)
licq_equivalence       hs-jacobian     under LICQ: Jacobians at nearby points = the HS set
hs_contains_b          hs-jacobian     without LICQ: nearby Jacobians ⊆ HS set, our J ∈ HS set
nonlicq_example        hs-jacobian     the documented example where ∂_B ≠ ∂_HS
conformance:<name>     conformance     the checks of ``polyproj.testing.conformance`` (if present)
=====================  ==============  ===========================================================

The contract properties look at the backend's *raw* Solution: ``pp.project`` polishes a slightly
wrong answer into the exact projection, so the projection properties alone would not catch it. Their
tolerance is the backend's own, ``max(1e-6, 100 eps_abs)`` (:func:`~polyproj.testing.properties.contract_tolerance`,
the rule of the conformance checks), unless ``tol`` is given.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import signal
import sys
import threading
import time
import unittest
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backends.base import QPSolver
from ..errors import PolyprojError
from ..registry import get_backend

__all__ = ["PROPERTIES", "CheckReport", "PropertyResult", "PropertySpec", "check_backend", "cli_main",
           "run_property"]

DEFAULT_EXAMPLES = 20


@dataclass(frozen=True)
class PropertySpec:
    """One property: how to draw a case for a solver and how to check it."""

    name: str
    group: str
    description: str
    strategy: Callable[[QPSolver], Any]
    check: Callable[[Any, QPSolver, np.random.Generator, float], dict[str, int]]
    applies: Callable[[QPSolver], str | None] = lambda s: None  # reason to skip, or None
    examples: Callable[[int], int] = lambda n: n


@dataclass(frozen=True)
class PropertyResult:
    """Outcome of one property.

    ``status`` is 'passed', 'failed' (the property is false: ``falsifying`` holds the shrunk
    example), 'error' (the check itself crashed) or 'skipped' (``message`` says why).
    """

    name: str
    group: str
    status: str
    examples: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    message: str = ""
    falsifying: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True unless failed or errored."""
        return self.status in ("passed", "skipped")


@dataclass(frozen=True)
class CheckReport:
    """Result of :func:`check_backend`."""

    backend: str
    results: tuple[PropertyResult, ...]
    seed: int
    max_examples: int
    tol: float | None = None  # the raw contract's tolerance (None: not a backend check)

    @property
    def passed(self) -> bool:
        """True when no property failed or errored."""
        return all(r.ok for r in self.results)

    def __getitem__(self, name: str) -> PropertyResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(name)

    @property
    def failed(self) -> list[PropertyResult]:
        """The properties that failed or errored."""
        return [r for r in self.results if not r.ok]

    def table(self):
        """A rich Table of the results."""
        from rich.markup import escape
        from rich.table import Table

        tol = "" if self.tol is None else f", contract tolerance {self.tol:g}"
        t = Table(title=f"polyproj check {escape(self.backend)} (seed {self.seed}, {self.max_examples} examples per "
                        f"property{tol})")
        for col in ("property", "group", "result", "examples", "checked", "time [s]", "detail"):
            t.add_column(col, overflow="fold")
        style = {"passed": "[green]PASS[/green]", "failed": "[red]FAIL[/red]", "error": "[red]ERROR[/red]",
                 "skipped": "[yellow]SKIP[/yellow]"}
        for r in self.results:
            counts = ", ".join(f"{v} {k}" for k, v in r.counts.items())
            t.add_row(escape(r.name), escape(r.group), style[r.status], str(r.examples), counts, f"{r.seconds:.1f}",
                      escape(r.message.splitlines()[0][:160]) if r.message else "")
        return t

    def __str__(self) -> str:
        lines = [f"polyproj check {self.backend}: {'PASSED' if self.passed else 'FAILED'}"]
        width = max((len(r.name) for r in self.results), default=0)  # conformance:primal_infeasible is 29
        for r in self.results:
            lines.append(f"  {r.name:<{width}} {r.status:<8} {r.message.splitlines()[0][:120] if r.message else ''}")
            if r.falsifying:
                lines += ["      " + s for s in r.falsifying.splitlines()]
        return "\n".join(lines)


# --------------------------------------------------------------------------- the properties
def _props() -> list[PropertySpec]:
    from . import properties as pr
    from . import strategies as ps

    def sparse_reason(s: QPSolver) -> str | None:
        return None if s.capabilities.sparse else "the backend does not declare sparse support"

    return [
        PropertySpec("qp_contract", "contract", "raw solve on feasible QPs: status, feasibility, KKT, signs, gap",
                     lambda s: ps.feasible_qps(), lambda c, s, rng, tol: pr.check_qp_contract(c, s, tol)),
        PropertySpec("qp_contract_sparse", "contract", "the same with scipy.sparse P and C",
                     lambda s: ps.feasible_qps(sparse=True), lambda c, s, rng, tol: pr.check_qp_contract(c, s, tol),
                     applies=sparse_reason, examples=lambda n: max(1, n // 2)),
        PropertySpec("infeasibility", "contract", "certified-infeasible QPs are not reported solved",
                     lambda s: ps.infeasible_qps(), lambda c, s, rng, tol: pr.check_infeasible_contract(c, s, tol),
                     examples=lambda n: max(1, n // 2)),
        PropertySpec("batch_contract", "contract", "raw solve_batch on projection QPs: KKT per element",
                     lambda s: ps.projection_batches(),
                     lambda c, s, rng, tol: pr.check_batch_contract(c[0].polyhedron, c[1], s, tol)),
        PropertySpec("batch_qp_contract", "contract", "raw solve_batch on QPs sharing a general P and C, a random "
                     "subset of the vectors batched, cold and warm-started: KKT per element, agreement with solve",
                     lambda s: ps.qp_batches(subsets=True),
                     lambda c, s, rng, tol: pr.check_qp_batch_contract(c, s, tol)),
        # the backend's own projection entry: pp.project polishes a wrong start into the exact projection, so only
        # its raw start shows a broken one (the default entry goes through solve_batch: checked all the same, cheap)
        PropertySpec("projection_contract", "contract", "raw solve_projections: SOLVED, KKT of each start, "
                     "agreement with the exact projection",
                     lambda s: ps.projection_batches(),
                     lambda c, s, rng, tol: pr.check_projection_contract(c[0].polyhedron, c[1], s, tol),
                     examples=lambda n: max(1, n // 2)),
        PropertySpec("projection", "projection", "KKT, idempotence, firm non-expansiveness, variational inequality",
                     lambda s: ps.projection_batches(),
                     lambda c, s, rng, tol: pr.check_projection(c[0].polyhedron, c[1], s, feasible=c[0].y_star)),
        PropertySpec("conservativity", "hs-jacobian", "∫ J(x(t)) d dt over kinks = Π(x(1)) − Π(x(0)); "
                     "a.e. derivative = J d for every HS element",
                     lambda s: ps.segments(ps.degenerate_points(ps.polyhedron_cases(licq=None)), count=8),
                     lambda c, s, rng, tol: pr.check_conservativity(c, s, rng=rng)),
        PropertySpec("licq_equivalence", "hs-jacobian", "under LICQ the Jacobians near a degenerate point "
                     "are exactly the HS set",
                     lambda s: ps.degenerate_points(ps.polyhedron_cases(licq=True)),
                     lambda c, s, rng, tol: pr.check_licq_equivalence(c, s, rng)),
        PropertySpec("hs_contains_b", "hs-jacobian", "without LICQ: nearby Jacobians lie in the HS set",
                     lambda s: ps.degenerate_points(ps.polyhedron_cases(licq=False)),
                     lambda c, s, rng, tol: pr.check_b_subdifferential_in_hs(c, s, rng),
                     examples=lambda n: max(1, n // 2)),
    ]


PROPERTIES: tuple[str, ...] = ("qp_contract", "qp_contract_sparse", "infeasibility", "batch_contract",
                               "batch_qp_contract", "projection_contract", "projection", "conservativity",
                               "licq_equivalence", "hs_contains_b", "nonlicq_example")


def check_arguments(**given: Any) -> None:
    """Check the kit's arguments by name.

    Counts (``max_examples``, ``examples``) are integers >= 1 and ``seed`` one >= 0; ``tol`` and ``timeout``
    positive finite numbers (either may be None: the backend's own tolerance, no time limit), ``shrink_budget``
    a finite number >= 0.
    """
    for what, v in given.items():
        if what in ("max_examples", "examples", "seed"):
            low = 0 if what == "seed" else 1
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                raise PolyprojError(f"{what} must be an integer >= {low}, got {v!r}")
        elif not (what in ("timeout", "tol") and v is None):
            number = not isinstance(v, bool) and isinstance(v, (int, float, np.integer, np.floating))
            zero_ok = what == "shrink_budget"
            if not (number and (0 <= v if zero_ok else 0 < v) and v < np.inf):
                raise PolyprojError(f"{what} must be a {'non-negative' if zero_ok else 'positive'} finite number, "
                                    f"got {v!r}")


#: the longest alarm set (seconds, ~3 years): a longer timeout is no limit in practice
MAX_ALARM = 1e8


class _TimedOut(BaseException):
    """Raised by the alarm of :func:`_time_limit`: a BaseException, so that hypothesis does not shrink it."""


@contextlib.contextmanager
def _time_limit(seconds: float | None):
    """Interrupt the block after ``seconds`` (SIGALRM; the main thread on POSIX, else no limit).

    A signal reaches Python code only: a solver's C loop that never returns to the interpreter is not cut short.
    """
    if seconds is None or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    fired = [False]

    def alarm(signum: int, frame: Any) -> None:
        fired[0] = True
        raise _TimedOut()

    previous = signal.signal(signal.SIGALRM, alarm)
    # then again every second: an alarm swallowed on its way (a backend's bare except, hypothesis's gc callback,
    # which only prints what it raises) would otherwise leave the block without a limit; at most MAX_ALARM s
    # (setitimer overflows the platform's time_t beyond ~1e10 s)
    signal.setitimer(signal.ITIMER_REAL, min(float(seconds), MAX_ALARM), 1.0)
    try:
        try:
            yield
        except Exception as exc:
            if fired[0]:  # an error after the alarm is its consequence (hypothesis's `assert state._runner` when
                raise _TimedOut() from exc  # it hit hypothesis's set-up, a backend's conversion): timed out
            raise
        if fired[0]:  # the block ran past its time, every alarm swallowed: timed out all the same
            raise _TimedOut()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        signal.signal(signal.SIGALRM, previous)


def _timed_out(name: str, group: str, seconds: float, calls: int = 0) -> PropertyResult:
    return PropertyResult(name, group, "error", calls, {}, f"timed out after {seconds:g} s (timeout): a solve that "
                          "does not return, or a property too slow for this backend", "", seconds)


def _exited(exc: SystemExit) -> str:
    """The message of an error row for a ``sys.exit()`` that reached the kit.

    The guard turns a SystemExit inside a backend's ``solve`` / ``solve_batch`` into a SolverError; one raised
    elsewhere (a backend's own ``solve_projections``, a set's method) would otherwise end ``polyproj check``
    with status 0 and no table: it is the property's error, and the check goes on.
    """
    return f"SystemExit({exc.code!r}): the code under check called sys.exit()"


def _falsifying_text(exc: BaseException) -> str:
    notes = [str(n) for n in getattr(exc, "__notes__", [])]
    # hypothesis's seed hint and its "Explanation" of the lines only failing cases ran (the kit's own lines:
    # nothing a backend's author can use): the block's heading and every line of it (one note each)
    out, explaining = [], False
    for n in notes:
        if n.startswith("Explanation:"):
            explaining = True
            continue
        if explaining and (n.startswith((" ", "\t")) or "were always and only run by failing" in n):
            continue
        explaining = False
        if not n.startswith("You can add @seed"):
            out.append(n)
    return "\n".join(out)


def _require_hypothesis() -> None:
    """The properties are hypothesis tests: without it installed, a PolyprojError with the install hint."""
    try:
        import hypothesis  # noqa: F401
    except ImportError as exc:
        raise PolyprojError(f"the properties are hypothesis tests, and hypothesis is not installed ({exc}); "
                            "pip install 'polyproj[test]' (or pip install hypothesis)") from None


def run_property(name: str, backend: Any = "proxsuite", *, max_examples: int = DEFAULT_EXAMPLES, seed: int = 0,
                 tol: float | None = None, shrink_budget: float = 30.0, timeout: float | None = None) -> PropertyResult:
    """Run one property of :data:`PROPERTIES` on a backend and return its result.

    ``tol`` is the relative tolerance of the raw contract properties; None (the default) takes the backend's
    own, ``max(1e-6, 100 eps_abs)`` (:func:`~polyproj.testing.properties.contract_tolerance`). ``shrink_budget``
    (seconds) bounds the time spent shrinking a falsifying example. ``timeout`` (seconds, or None) ends the
    property as an error (:func:`_time_limit`: Python code only, in the main thread).

    The counts (``result.counts``) sum what the checks verified, e.g. ``segments`` for
    conservativity or ``points`` for LICQ equivalence.
    """
    check_arguments(max_examples=max_examples, seed=seed, tol=tol, shrink_budget=shrink_budget, timeout=timeout)
    if name not in PROPERTIES:
        raise PolyprojError(f"unknown property {name!r}; known: {', '.join(PROPERTIES)}")
    solver = get_backend(backend)
    from .properties import contract_tolerance

    tol = contract_tolerance(solver, tol)
    if name == "nonlicq_example":
        try:
            with _time_limit(timeout):
                return _run_nonlicq(solver)
        except _TimedOut:
            return _timed_out(name, "hs-jacobian", timeout)
        except SystemExit as exc:
            return PropertyResult(name, "hs-jacobian", "error", 1, {}, _exited(exc))
    specs = {s.name: s for s in _props()}
    spec = specs[name]
    reason = spec.applies(solver)
    if reason:
        return PropertyResult(name, spec.group, "skipped", message=reason)
    _require_hypothesis()
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

    counts: dict[str, int] = {}
    calls = [0]
    n_examples = spec.examples(max_examples)
    # shrinking budget: once exceeded, only cases already seen failing are re-checked, so hypothesis
    # stops at the smallest failing case found so far (and its final replay still fails)
    failing: set[str] = set()
    first_failure = [0.0]

    @hseed(int(seed))  # a NumPy integer (accepted by check_arguments) is refused by hypothesis
    @settings(max_examples=n_examples, deadline=None, database=None, derandomize=False, print_blob=False,
              report_multiple_bugs=False, suppress_health_check=list(HealthCheck))
    @given(case=spec.strategy(solver))
    def prop(case: Any) -> None:
        key = repr(case)
        if failing and time.perf_counter() - first_failure[0] > shrink_budget and key not in failing:
            return
        try:
            out = spec.check(case, solver, np.random.default_rng(seed), tol)
        except Exception:
            if not failing:
                first_failure[0] = time.perf_counter()
            failing.add(key)
            raise
        calls[0] += 1
        for k, v in out.items():
            counts[k] = counts.get(k, 0) + int(v)

    t0 = time.perf_counter()
    try:
        with _time_limit(timeout):
            prop()
    except _TimedOut:
        return _timed_out(name, spec.group, timeout, calls[0])
    except SystemExit as exc:
        return PropertyResult(name, spec.group, "error", calls[0], {}, _exited(exc), _falsifying_text(exc),
                              time.perf_counter() - t0)
    except AssertionError as exc:
        return PropertyResult(name, spec.group, "failed", calls[0], {}, str(exc), _falsifying_text(exc),
                              time.perf_counter() - t0)
    except Exception as exc:
        return PropertyResult(name, spec.group, "error", calls[0], {},
                              f"{type(exc).__name__}: {exc}", _falsifying_text(exc), time.perf_counter() - t0)
    return PropertyResult(name, spec.group, "passed", calls[0], counts, spec.description, "",
                          time.perf_counter() - t0)


def _run_nonlicq(solver: QPSolver) -> PropertyResult:
    from . import properties as pr

    t0 = time.perf_counter()
    P, x, _ = pr.nonlicq_example()
    try:
        res = pr.project_checked(x, P, solver)
        els = pr.hs_set(P, x, res.y[0], res.active[0])
        Jb, _ = pr.b_subdifferential_samples(P, x, solver, np.random.default_rng(0), n_random=16, delta=1e-3)
        expected = [np.zeros((2, 2)), np.eye(2) - 0.5 * np.ones((2, 2))]
        hs_ok = len(els) == 2 and all(min(np.abs(e.J - E).max() for E in expected) < 1e-9 for e in els)
        b_ok = len(Jb) >= 8 and all(np.abs(J).max() < 1e-6 for J in Jb)
        from ..projection.hs_jacobian import hs_jacobian

        used_ok = np.abs(hs_jacobian(P, res.active[0])).max() < 1e-12
        if not (hs_ok and b_ok and used_ok):
            raise AssertionError(f"non-LICQ example: HS set {[list(e.K) for e in els]} (expected 2 elements "
                                 f"{{0, I − ½11ᵀ}}), {len(Jb)} nearby Jacobians (expected all 0), "
                                 f"used J = 0: {used_ok}")
    except AssertionError as exc:
        return PropertyResult("nonlicq_example", "hs-jacobian", "failed", 1, {}, str(exc),
                              seconds=time.perf_counter() - t0)
    except Exception as exc:  # the backend raised (a SolverError naming it): a row of the report, as elsewhere
        return PropertyResult("nonlicq_example", "hs-jacobian", "error", 1, {}, f"{type(exc).__name__}: {exc}",
                              seconds=time.perf_counter() - t0)
    return PropertyResult("nonlicq_example", "hs-jacobian", "passed", 1,
                          {"hs_elements": len(els), "b_samples": len(Jb)},
                          "∂_B = {0} ⊊ ∂_HS = {0, I − ½11ᵀ} at x = (1, 1); used J = 0 in both",
                          seconds=time.perf_counter() - t0)


def _conformance(solver: QPSolver, seed: int, timeout: float | None = None,
                 out: list[PropertyResult] | None = None) -> list[PropertyResult]:
    """The conformance checks' results, appended to ``out`` (returned) as each one finishes."""
    out = [] if out is None else out
    try:
        mod = importlib.import_module("polyproj.testing.conformance")
    except ModuleNotFoundError as exc:
        if exc.name != "polyproj.testing.conformance":
            raise
        out.append(PropertyResult("conformance", "conformance", "skipped",
                                  message="polyproj.testing.conformance is not installed: conformance checks not run"))
        return out
    checks = getattr(mod, "CHECKS", None)
    if not checks:
        out.append(PropertyResult("conformance", "conformance", "skipped",
                                  message="polyproj.testing.conformance defines no CHECKS"))
        return out
    for name, fn in checks.items():
        t0 = time.perf_counter()
        try:
            with _time_limit(timeout):
                fn(solver, np.random.default_rng(seed))
        except _TimedOut:
            out.append(_timed_out(f"conformance:{name}", "conformance", timeout, 1))
            continue
        except SystemExit as exc:
            out.append(PropertyResult(f"conformance:{name}", "conformance", "error", 1, message=_exited(exc),
                                      seconds=time.perf_counter() - t0))
            continue
        except unittest.SkipTest as exc:  # conformance.CheckSkipped: a capability the backend lacks
            out.append(PropertyResult(f"conformance:{name}", "conformance", "skipped", message=str(exc),
                                      seconds=time.perf_counter() - t0))
            continue
        except AssertionError as exc:
            out.append(PropertyResult(f"conformance:{name}", "conformance", "failed", 1, message=str(exc),
                                      seconds=time.perf_counter() - t0))
            continue
        except Exception as exc:
            out.append(PropertyResult(f"conformance:{name}", "conformance", "error", 1,
                                      message=f"{type(exc).__name__}: {exc}", seconds=time.perf_counter() - t0))
            continue
        doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
        out.append(PropertyResult(f"conformance:{name}", "conformance", "passed", 1, message=doc[0] if doc else "",
                                  seconds=time.perf_counter() - t0))
    return out


def check_backend(name_or_solver: Any, max_examples: int = DEFAULT_EXAMPLES, seed: int = 0, *,
                  properties: Sequence[str] | None = None, conformance: bool = True, tol: float | None = None,
                  progress: bool = False, shrink_budget: float = 30.0, timeout: float | None = None,
                  finished: list | None = None, **settings: Any) -> CheckReport:
    """Run the backend contract, projection and HS-Jacobian properties on a backend.

    Parameters
    ----------
    name_or_solver : str, QPSolver instance or subclass
        A registered name (built-in, :func:`polyproj.register_backend`, or the entry-point group
        ``polyproj.backends``), ``"module:Class"``, or a solver.
    max_examples : int
        Hypothesis examples per property (conservativity draws 8 segments per example); ``max(1, max_examples //
        2)`` for qp_contract_sparse, infeasibility, projection_contract and hs_contains_b, one fixed case for
        nonlicq_example, none for the conformance checks (fixed problems).
    seed : int
        Seed of the example generation (reproducible reports).
    properties : sequence of str, optional
        A subset of :data:`PROPERTIES` (default: all).
    conformance : bool
        Also run ``polyproj.testing.conformance.CHECKS`` when that module exists.
    tol : float, optional
        Relative tolerance of the raw contract checks (residuals <= tol · (1 + max |data|)). None (the
        default): the backend's own, ``max(1e-6, 100 eps_abs)`` with its ``eps_abs`` (``**settings``
        included), the rule of the conformance checks; ``report.tol`` says which was used.
    progress : bool
        Show a progress bar.
    shrink_budget : float
        Seconds allowed for shrinking each falsifying example.
    timeout : float, optional
        Seconds each property (and each conformance check) may take; past it the property is reported as an
        error and the next one runs. Enforced by an alarm in the main thread (POSIX): it interrupts Python
        code, not a solver's own compiled loop. ``polyproj check`` sets 900.
    finished : list, optional
        Receives each :class:`PropertyResult` as it finishes: what a run stopped by Ctrl-C keeps
        (``polyproj check`` prints them).
    **settings
        Solver settings (``eps_abs``, ...).

    Returns
    -------
    CheckReport
        ``report.passed``, ``report[name]`` (a :class:`PropertyResult` with the shrunk falsifying
        example in ``.falsifying``), ``report.table()``.

    Examples
    --------
    >>> import polyproj as pp
    >>> from polyproj.testing import check_backend
    >>> report = check_backend("proxsuite", max_examples=2, properties=["qp_contract"], conformance=False)
    >>> report.passed
    True
    """
    check_arguments(max_examples=max_examples, seed=seed, tol=tol, shrink_budget=shrink_budget, timeout=timeout)
    if isinstance(properties, str):
        raise PolyprojError(f"properties must be a sequence of names, e.g. [{properties!r}], got the string "
                            f"{properties!r}")
    if properties is not None and not hasattr(properties, "__iter__"):  # 5 raised TypeError (not iterable)
        raise PolyprojError(f"properties must be a sequence of names (or None for all), got {properties!r}")
    solver = get_backend(name_or_solver, **settings)  # a constructor that fails (or exits): a SolverError naming it
    label = name_or_solver if isinstance(name_or_solver, str) else (solver.name or type(solver).__name__)
    names = list(PROPERTIES if properties is None else properties)
    unknown = [n for n in names if n not in PROPERTIES]
    if unknown:
        raise PolyprojError(f"unknown properties {unknown}; known: {', '.join(PROPERTIES)}")
    if finished is not None and not isinstance(finished, list):
        raise PolyprojError(f"finished must be a list (it receives the results), got {type(finished).__name__}")
    if any(n != "nonlicq_example" for n in names):  # before the run, not after the conformance checks
        _require_hypothesis()
    results: list[PropertyResult] = [] if finished is None else finished  # appended as each one finishes
    if progress:
        from rich.markup import escape
        from rich.progress import Progress

        with Progress(transient=True) as bar:
            shown = escape(str(label))  # a third party's name is text, never markup
            task = bar.add_task(f"checking {shown}", total=len(names) + int(conformance))
            if conformance:
                _conformance(solver, seed, timeout, results)
                bar.advance(task)
            for n in names:
                bar.update(task, description=f"{shown}: {n}")
                results.append(run_property(n, solver, max_examples=max_examples, seed=seed, tol=tol,
                                            shrink_budget=shrink_budget, timeout=timeout))
                bar.advance(task)
    else:
        if conformance:
            _conformance(solver, seed, timeout, results)
        for n in names:
            results.append(run_property(n, solver, max_examples=max_examples, seed=seed, tol=tol,
                                        shrink_budget=shrink_budget, timeout=timeout))
    from .properties import contract_tolerance

    return CheckReport(str(label), tuple(results), seed, max_examples, contract_tolerance(solver, tol))


def set_target(spec: str) -> Any:
    """The set ``polyproj check module:attr`` names, or None when ``spec`` names a backend.

    ``attr`` may be a :class:`~polyproj.sets.Projector` or :class:`~polyproj.Polyhedron` instance, a Projector
    class that needs no arguments, or a function of no arguments returning either (DESIGN §12: third-party sets
    that break the contract are caught by ``polyproj check`` too). Anything else (a QPSolver class, a name) is
    left to :func:`check_backend`, whose errors say what a backend must be.
    """
    from ..backends.base import QPSolver
    from ..errors import ProblemError
    from ..problem import Polyhedron
    from ..registry import _import_path
    from ..sets.base import Projector

    if ":" not in spec:
        return None
    obj = _import_path(spec)
    if isinstance(obj, (Projector, Polyhedron)):
        return obj
    if isinstance(obj, type) and issubclass(obj, QPSolver):
        return None
    if (isinstance(obj, type) and issubclass(obj, Projector)) or (callable(obj) and not isinstance(obj, type)):
        try:
            inspect.signature(obj).bind()
        except TypeError as exc:  # the call itself may raise a TypeError of its own: told apart here
            raise ProblemError(f"{spec!r} needs arguments ({exc}); point polyproj check at an instance or at a "
                               "function of no arguments that builds the set") from exc
        except ValueError:  # no signature to read (a builtin): the call says
            pass
        try:
            made = obj()
        except Exception as exc:  # the user's factory failing is a report, not a traceback
            raise ProblemError(f"{spec!r} raised {type(exc).__name__}: {exc}") from exc
        if isinstance(made, (Projector, Polyhedron)):
            return made
        raise ProblemError(f"{spec!r} returned {type(made).__name__}, not a polyproj Projector or Polyhedron")
    return None


def cli_main(args: Any) -> int:
    """``polyproj check NAME|module:Class [--examples N] [--seed S]``: print the table; 1 on failure."""
    from rich.console import Console
    from rich.markup import escape

    console = Console()
    if not console.is_terminal:  # logs and pipes: do not fold the table into 80 columns
        console = Console(width=200)
    if ":" in args.backend and "" not in sys.path and os.getcwd() not in sys.path:
        # "my_module:MySolver" from the directory holding my_module.py, as `python -m polyproj` finds it (the
        # installed console script does not put the working directory on the path)
        sys.path.append(os.getcwd())
    # solver settings, where the parser defines them (``--eps-abs`` / ``--eps-rel``): the contract's tolerance
    # follows the backend's eps_abs (run_property)
    settings = {k: v for k in ("eps_abs", "eps_rel") if (v := getattr(args, k, None)) is not None}
    done: list[PropertyResult] = []
    examples = args.examples or DEFAULT_EXAMPLES
    try:
        target = set_target(args.backend)
        if target is not None and settings:
            raise PolyprojError("--eps-abs / --eps-rel set a backend's tolerances; a set is checked at its own")
        if target is not None:
            from .projector import check_projector

            report = check_projector(target, examples=examples, seed=args.seed)
        else:
            report = check_backend(args.backend, max_examples=examples, seed=args.seed, progress=console.is_terminal,
                                   timeout=getattr(args, "timeout", 900.0), finished=done, **settings)
    except PolyprojError as exc:
        print(f"polyproj check: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: the table of what finished, then the interrupt's exit status
        if done:
            console.print(CheckReport(str(args.backend), tuple(done), args.seed, examples).table())
        print(f"polyproj check: interrupted after {len(done)} finished checks", file=sys.stderr)
        return 130
    console.print(report.table())
    for r in report.failed:
        console.print(f"\n[bold red]{r.name}[/bold red] ({r.status}): {escape(r.message)}")
        if r.falsifying:
            console.print(r.falsifying, markup=False, highlight=False)
    console.print("[green]all properties hold[/green]" if report.passed else
                  f"[red]{len(report.failed)} properties failed[/red]")
    return 0 if report.passed else 1
