"""Backend registry: built-in table (lazy), run-time registrations, and entry points.

Lookup order for a name: run-time registrations (:func:`register_backend`), the built-in table,
then the entry-point group ``polyproj.backends`` of installed distributions, e.g. in a
third party's ``pyproject.toml``::

    [project.entry-points."polyproj.backends"]
    mysolver = "mysolver_polyproj:MySolver"

Nothing is imported until a backend is used or its availability is asked for. A distribution whose
``entry_points.txt`` cannot be read, and an entry point whose name :func:`register_backend` refuses
(``"auto"``, spaces, ':'), are skipped with a :class:`~polyproj.PolyprojWarning`.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import warnings
from dataclasses import dataclass, field
from importlib.metadata import distributions
from typing import Any

import numpy as np

from .backends.base import Capabilities, QPSolver
from .backends.defaults import QP_DEFAULT
from .errors import (
    BackendNotFound,
    BackendUnavailable,
    PolyprojError,
    PolyprojWarning,
    SettingsError,
    SolverError,
    close_matches,
)

__all__ = [
    "DEFAULT_BACKEND",
    "BackendInfo",
    "available_backends",
    "backend_info",
    "get_backend",
    "register_backend",
    "unregister_backend",
]

ENTRY_POINT_GROUP = "polyproj.backends"

#: the backend of :func:`get_backend` and :func:`polyproj.solve_qp` when none is named: the best of the
#: built-ins on the Maros–Meszaros dense subset at the default tolerance 1e-8 and at 1e-9 (most
#: problems solved, fastest shifted geometric mean; README "Solvers on Maros–Meszaros", docs/solvers.md)
DEFAULT_BACKEND = QP_DEFAULT  # chosen by measurement (polyproj.backends.defaults)

#: name -> (import path, extra that installs it)
_BUILTIN: dict[str, tuple[str, str]] = {
    "proxsuite": ("polyproj.backends.proxsuite:ProxSuiteSolver", "proxsuite"),
    "osqp": ("polyproj.backends.osqp:OSQPSolver", "osqp"),
    "highs": ("polyproj.backends.highs:HiGHSSolver", "highs"),
    "piqp": ("polyproj.backends.piqp:PIQPSolver", "piqp"),
    "clarabel": ("polyproj.backends.clarabel:ClarabelSolver", "clarabel"),
    "daqp": ("polyproj.backends.daqp:DAQPSolver", "daqp"),
    "ipm": ("polyproj.backends.ipm:IPMSolver", "ipm"),
    "admm": ("polyproj.backends.admm:ADMMSolver", "ipm"),
    "cupy": ("polyproj.backends.cupy:CuPySolver", "cupy"),
}

_RUNTIME: dict[str, type[QPSolver]] = {}

#: names that are not backends: ``"auto"`` is :func:`polyproj.project`'s choice per call
RESERVED = frozenset({"auto"})

#: counts the changes of the run-time registrations (every :func:`register_backend` and
#: :func:`unregister_backend`): whatever keeps an object built for a backend *name* compares it to know that the name
#: may now stand for another class.
generation = 0

#: entry-point and ``module:Class`` names resolved already, per ``sys.path``: (name, sys.path) -> (class, source).
#: Finding an entry point lists every installed distribution (milliseconds a call); emptied on every change of the
#: run-time registrations, which come first
_RESOLVED: dict[tuple[str, tuple[str, ...]], tuple[type[QPSolver], str]] = {}


def _changed() -> None:
    global generation
    generation += 1
    _RESOLVED.clear()


@dataclass(frozen=True)
class BackendInfo:
    """One row of :func:`backend_info`."""

    name: str
    available: bool
    reason: str = ""
    version: str = ""
    capabilities: list[str] = field(default_factory=list)
    source: str = "builtin"


def _entry_points() -> dict[str, Any]:
    """The installed entry points of group ``polyproj.backends`` by name, read one distribution at a time.

    ``importlib.metadata.entry_points`` parses every installed distribution's ``entry_points.txt``, whatever its
    groups, and raises on the first malformed one (a line without '=', a file that is not UTF-8): here such a
    distribution is skipped with one warning and the others' plugins still load; built-in backends never depend on
    third parties' files. As there, the first distribution of a name on ``sys.path`` is the one read. An entry point
    whose name :func:`register_backend` refuses (``"auto"``, spaces, ':') is skipped with one warning.
    """
    eps: dict[str, Any] = {}
    seen: set[str] = set()
    try:
        for dist in distributions():
            try:
                key = getattr(dist, "_normalized_name", None) or dist.name  # the key entry_points() dedupes on
                if key in seen:
                    continue
                seen.add(key)
                found = dist.entry_points.select(group=ENTRY_POINT_GROUP)
            except Exception as exc:  # TypeError, ValueError, UnicodeDecodeError, OSError from its files
                _warn_once(f"the installed distribution {_dist_label(dist)} is skipped when looking for entry points "
                           f"of group {ENTRY_POINT_GROUP!r}: its entry_points.txt cannot be read: "
                           f"{type(exc).__name__}: {exc}")
                continue
            for ep in found:
                try:
                    _check_name(ep.name)
                except PolyprojError as exc:
                    _warn_once(f"the installed entry point {ep.name!r} ({ep.value}) of group {ENTRY_POINT_GROUP!r} "
                               f"in distribution {_dist_label(dist)} is skipped: {exc}")
                    continue
                eps[ep.name] = ep
    except Exception as exc:  # the listing itself failed (a finder on sys.path): what was found is used
        _warn_once(f"listing the installed distributions for entry points of group {ENTRY_POINT_GROUP!r} failed, "
                   f"the rest are skipped: {type(exc).__name__}: {exc}")
    return eps


def _dist_label(dist: Any) -> str:
    """A distribution's name and folder for a message (its metadata may be what is broken)."""
    try:
        name = repr(dist.metadata["Name"])
    except Exception:
        name = "?"
    return f"{name} ({getattr(dist, '_path', dist)})"


#: messages about unreadable distributions and refused entry-point names already given (one warning a process)
_WARNED_ENTRY_POINTS: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED_ENTRY_POINTS:
        _WARNED_ENTRY_POINTS.add(message)
        warnings.warn(message, PolyprojWarning, stacklevel=3)


#: entry points (name -> target) per ``sys.path`` (a listing costs milliseconds; a plugin installed into a new path
#: shows up)
_EP_NAMES: dict[tuple[str, ...], dict[str, str]] = {}
#: names already warned about as hiding an entry point (one warning a process)
_WARNED_HIDDEN: set[str] = set()


def _loaded_target(value: str) -> Any:
    """The object an entry point's ``module:attr.sub`` names, if its module is imported already (else None).

    Nothing is imported: a plugin that registers its own class has imported its module.
    """
    mod_name, _, attr = value.replace(" ", "").partition(":")
    obj = sys.modules.get(mod_name)
    for part in attr.partition("[")[0].split(".") if attr else ():  # "[extra]" names extras, not the object
        obj = getattr(obj, part, None)
    return obj if attr else None


def _warn_if_hiding(name: str, kind: str, cls: type) -> None:
    """Warn once when a backend hides an installed entry point of its name that points elsewhere.

    ``kind``: "built-in" or "run-time"; ``cls``: the hiding backend. The entry point points at the same backend
    when its ``module:Class`` is the class's own, or names the class object itself (a re-export: a plugin that
    registers its class under its entry point's name).
    """
    if name in _WARNED_HIDDEN:
        return
    key = tuple(sys.path)
    if key not in _EP_NAMES:  # the listing costs milliseconds: once per sys.path, names and targets
        _EP_NAMES[key] = {n: ep.value for n, ep in _entry_points().items()}
    value = _EP_NAMES[key].get(name)
    if value is not None and value.replace(" ", "") != f"{cls.__module__}:{cls.__qualname__}" \
            and _loaded_target(value) is not cls:
        _WARNED_HIDDEN.add(name)
        warnings.warn(f"backend name {name!r} is a {kind} backend; the installed entry point {name!r} "
                      f"({value}) of group {ENTRY_POINT_GROUP!r} is not used. Its package "
                      "must register it under another name", PolyprojWarning, stacklevel=3)


def _import_path(path: str) -> type[QPSolver]:
    mod_name, _, cls_name = path.partition(":")
    if not cls_name:
        raise BackendNotFound(f"{path!r} is not of the form 'module:Class'")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise BackendNotFound(f"cannot import module {mod_name!r} for backend {path!r}: {exc}") from exc
    except (Exception, SystemExit) as exc:  # a module calling sys.exit() at import must not end the caller
        raise BackendUnavailable(f"module {mod_name!r} for backend {path!r} failed to import: "
                                 f"{type(exc).__name__}({exc})") from exc
    try:
        return getattr(mod, cls_name)
    except AttributeError as exc:
        raise BackendNotFound(f"module {mod_name!r} has no attribute {cls_name!r}") from exc


def _check_class(cls: Any, name: str) -> type[QPSolver]:
    if not (isinstance(cls, type) and issubclass(cls, QPSolver)):
        raise PolyprojError(f"backend {name!r} must be a subclass of polyproj.QPSolver, got {cls!r}")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise PolyprojError(f"backend {name!r} ({cls.__name__}) does not implement {', '.join(missing)}: a backend "
                            "writes solve(self, qp, warm_start=None) -> polyproj.Solution")
    caps = getattr(cls, "capabilities", None)
    if not isinstance(caps, Capabilities):
        raise PolyprojError(f"backend {name!r} ({cls.__name__}) declares capabilities = {caps!r:.80}; it must be a "
                            "polyproj.Capabilities, e.g. pp.Capabilities(dense=True, sparse=True)")
    # each capability is a flag the pipeline branches on by truth: sparse="no" (truthy) sent sparse problems to a
    # dense-only solver, so anything but True or False is refused here, by name
    flags = {f.name: getattr(caps, f.name) for f in dataclasses.fields(caps)}
    bad = {k: v for k, v in flags.items() if not isinstance(v, (bool, np.bool_))}
    if bad:
        raise PolyprojError(f"backend {name!r} ({cls.__name__}) declares capabilities that are not True or False: "
                            f"{', '.join(f'{k}={v!r:.40}' for k, v in bad.items())}")
    return cls


def _all_names() -> list[str]:
    return list(dict.fromkeys([*_RUNTIME, *_BUILTIN, *_entry_points()]))


def _resolve(name: str) -> tuple[type[QPSolver], str]:
    """Return (class, source) for a backend name; raise BackendNotFound."""
    if name in _RUNTIME:
        cls = _RUNTIME[name]
        _warn_if_hiding(name, "run-time", cls)
        return cls, "runtime"
    if name in _BUILTIN:
        cls = _check_class(_import_path(_BUILTIN[name][0]), name)
        _warn_if_hiding(name, "built-in", cls)
        return cls, "builtin"
    key = (name, tuple(sys.path))
    hit = _RESOLVED.get(key)
    if hit is not None:
        return hit
    eps = _entry_points()
    if name in eps:
        try:
            cls = eps[name].load()
        except (Exception, SystemExit) as exc:  # a plugin calling sys.exit() at import must not end the caller
            what = f"{type(exc).__name__}({exc})" if isinstance(exc, SystemExit) else str(exc)
            raise BackendUnavailable(f"entry point {name!r} ({eps[name].value}) failed to load: {what}") from exc
        hit = _check_class(cls, name), "entry point"
    elif ":" in name:
        hit = _check_class(_import_path(name), name), "path"
    else:
        raise BackendNotFound(
            f"no backend named {name!r}.{close_matches(name, _all_names())} "
            f"Known backends: {', '.join(_all_names())}"
        )
    _RESOLVED[key] = hit
    return hit


def _check_name(name: Any) -> None:
    """The rule for a backend name, run-time registration or entry point; raise PolyprojError."""
    if not isinstance(name, str) or not name.strip() or any(c.isspace() for c in name) or ":" in name \
            or not name.isprintable() or name.startswith("-"):  # '\u200b', 'a\x00b', '--help' (no CLI could name it)
        raise PolyprojError(f"a backend name must be a non-empty string of printable characters without spaces or "
                            f"':' (reserved for 'module:Class'), not starting with '-', got {name!r}")
    if name in RESERVED:
        raise PolyprojError(f"backend name {name!r} is reserved: polyproj.project(backend={name!r}) chooses a "
                            "backend per call; register yours under another name")


def register_backend(name: str, cls: type[QPSolver], *, overwrite: bool = False) -> None:
    """Register a backend class under ``name`` for this process.

    Parameters
    ----------
    name : str
    cls : subclass of :class:`QPSolver`
    overwrite : bool
        Replace an existing registration of the same name (built-ins included).

    ``"auto"`` is reserved (:func:`polyproj.project`'s choice per call) and cannot be registered.
    """
    _check_name(name)
    if not isinstance(overwrite, (bool, np.bool_)):  # overwrite="no" is truthy: it replaced the built-in
        raise SettingsError(f"overwrite must be True or False, got {overwrite!r}")
    _check_class(cls, name)
    # an entry point's name is not refused: its own module may register it (so that it works uninstalled too)
    if not overwrite and (name in _RUNTIME or name in _BUILTIN):
        raise PolyprojError(f"backend {name!r} is already registered; pass overwrite=True to replace it")
    _RUNTIME[name] = cls
    _changed()


def unregister_backend(name: str, *, missing_ok: bool = False) -> None:
    """Remove a run-time registration (built-ins and entry points are not affected).

    Raises BackendNotFound when ``name`` has no run-time registration, unless ``missing_ok``.
    """
    if not isinstance(name, str):
        raise PolyprojError(f"unregister_backend takes a backend name (a string), got {type(name).__name__} {name!r}")
    if not isinstance(missing_ok, (bool, np.bool_)):  # missing_ok="no" is truthy: a missing name passed
        raise SettingsError(f"missing_ok must be True or False, got {missing_ok!r}")
    if _RUNTIME.pop(name, None) is not None:
        _changed()
    elif not missing_ok:
        where = " (a built-in or entry-point backend: those cannot be unregistered)" if name in _all_names() else ""
        raise BackendNotFound(f"no run-time registration named {name!r}{where}; registered at run time: "
                              f"{sorted(_RUNTIME) or 'none'}")


def get_backend(backend: str | QPSolver | type[QPSolver] | None = None, **settings: Any) -> QPSolver:
    """Return a ready solver.

    Parameters
    ----------
    backend : str, QPSolver instance or QPSolver subclass, optional
        A registered name, ``"module:Class"``, an instance (returned as is when no settings are
        given, else a copy with the settings merged) or a class; default :data:`DEFAULT_BACKEND`.
    **settings
        Unified settings and backend-specific options.

    Raises
    ------
    BackendNotFound
        Unknown name (the message names close matches).
    BackendUnavailable
        Known, but its package is missing (the message has the ``pip install`` hint).
    SettingsError
        Unknown setting.
    """
    if backend is None:
        backend = DEFAULT_BACKEND
    if isinstance(backend, QPSolver):
        if not settings:
            return backend
        return _construct(type(backend), {**backend.settings, **backend.backend_options, **settings})
    if isinstance(backend, type):
        cls = _check_class(backend, getattr(backend, "__name__", "?"))
    elif isinstance(backend, str):
        cls, _ = _resolve(backend)
    else:
        raise PolyprojError(f"backend must be a name, a QPSolver or a QPSolver subclass, got {backend!r}")
    try:
        cls.ensure_available()
    except PolyprojError:
        raise
    except (Exception, SystemExit) as exc:  # a third party's availability check that raises: it cannot be used
        raise BackendUnavailable(f"backend {cls.name!r} is unavailable: its availability check raised "
                                 f"{type(exc).__name__}: {exc}") from exc
    return _construct(cls, settings)


def _construct(cls: type[QPSolver], settings: dict[str, Any]) -> QPSolver:
    """``cls(**settings)``; a constructor that raises something other than a PolyprojError names the backend."""
    try:
        obj = cls(**settings)
    except PolyprojError:
        raise
    except (Exception, SystemExit) as exc:  # SystemExit too: a constructor that exits does not end the caller
        raise SolverError(f"backend {cls.name!r} could not be set up: its constructor raised {type(exc).__name__}: "
                          f"{exc}") from exc
    if not hasattr(obj, "settings"):  # the guards and the check read them (an AttributeError deep inside before)
        raise SolverError(f"backend {cls.name!r} could not be set up: its __init__ did not call QPSolver.__init__ "
                          "(super().__init__(**settings))")
    return obj


def backend_info() -> list[BackendInfo]:
    """Every known backend with availability, reason, version and capabilities."""
    rows = []
    for name in _all_names():
        try:
            cls, source = _resolve(name)
        except PolyprojError as exc:
            source = "runtime" if name in _RUNTIME else "builtin" if name in _BUILTIN else "entry point"
            rows.append(BackendInfo(name, False, reason=str(exc), source=source))
            continue
        try:
            reason = cls.unavailable_reason()
        except Exception as exc:  # a third party's check that fails is its backend's problem, not the listing's
            reason = f"its availability check raised {type(exc).__name__}: {exc}"
        version = ""
        if reason is None:
            try:
                version = str(cls.version() or "")  # a third party's None, or a number, is shown as text
            except Exception:  # version lookup is cosmetic
                version = ""
        rows.append(
            BackendInfo(
                name,
                reason is None,
                reason=reason or "",
                version=version,
                capabilities=cls.capabilities.as_list(),
                source=source,
            )
        )
    return rows


def available_backends() -> list[str]:
    """Names of the backends that can run here."""
    return [row.name for row in backend_info() if row.available]
