"""The dependency direction of docs/architecture.md ("Dependency direction"), checked on the source.

Every relative import of a module under ``polyproj/`` goes to a layer at or below its own. Imports executed at
import time (module and class bodies, not under ``TYPE_CHECKING``) have no exception; imports inside functions
(run when called) have the ones listed in ``LAZY_UP``, each with its reason. No module imports the package root.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.core

ROOT = Path(__file__).resolve().parent.parent / "polyproj"

#: the layers, lowest first (docs/architecture.md); a module may import its own layer and those below
LAYERS = [
    {"errors", "_version"},
    {"linalg"},
    {"polydata"},
    {"problem", "solution"},
    {"runtime", "maros_meszaros"},
    {"solvers"},
    {"backends"},
    {"registry"},
    {"projection"},
    {"sets"},
    {"api"},
    {"adapters", "testing"},
    {"cli", "bench", "apps", "demo"},
    {"__main__"},
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}
#: the package's modules and subpackages, by name
MODULES = {p.relative_to(ROOT).with_suffix("").parts[0] for p in ROOT.rglob("*.py")} - {"__init__"}

#: upward imports allowed inside functions: (importing package, imported module) -> why
LAZY_UP = {
    ("backends", "registry"): "a backend asks the registry for another backend by name (a second opinion, the "
                              "default's availability); the registry imports the backends' base at import time",
    ("solvers", "backends.options"): "the settings validators; backends/options.py imports only errors",
}


def _imports(tree: ast.Module):
    """(node, at import time?) for every relative ImportFrom of the module."""
    eager: set[int] = set()

    def visit(body):
        for node in body:
            if isinstance(node, ast.ImportFrom):
                eager.add(id(node))
            elif isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    visit(node.body)
                    visit(node.orelse)
            elif isinstance(node, ast.Try):
                for part in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                    visit(part)
            elif isinstance(node, ast.ClassDef):
                visit(node.body)

    visit(tree.body)
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                   for n in ast.walk(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level and id(node) not in typing_only:
            yield node, id(node) in eager


def _edges():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts == ("__init__.py",):
            continue  # the package root re-exports the public API
        package = list(rel.parent.parts)
        src = rel.with_suffix("").parts[0]
        for node, eager in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            base = package[: len(package) - (node.level - 1)]
            names = [a.name for a in node.names]
            if node.module or base:
                yield rel, node.lineno, src, base + (node.module.split(".") if node.module else []), names, eager
                continue
            for name in names:  # ``from .. import registry``: a module of the package is imported, by name
                yield rel, node.lineno, src, [name] if name in MODULES else [], [name], eager


def test_every_module_has_a_layer():
    assert MODULES <= set(RANK), f"not in LAYERS (add it, and to docs/architecture.md): {sorted(MODULES - set(RANK))}"


def test_no_module_imports_the_package_root():
    bad = [f"{rel}:{line} from .. import {names}" for rel, line, _, target, names, _ in _edges() if not target]
    assert not bad, bad


def test_imports_go_down_the_layers():
    bad = []
    for rel, line, src, target, _, eager in _edges():
        if not target or target[0] == src:
            continue
        if RANK[target[0]] <= RANK[src]:
            continue
        if not eager and ((src, target[0]) in LAZY_UP or (src, ".".join(target[:2])) in LAZY_UP):
            continue
        bad.append(f"{rel}:{line} ({src}, layer {RANK[src]}) imports {'.'.join(target)} (layer {RANK[target[0]]})"
                   f"{' at import time' if eager else ''}")
    assert not bad, "\n".join(bad)


def test_testing_does_not_use_adapters():
    bad = [f"{rel}:{line}" for rel, line, src, target, _, _ in _edges()
           if src == "testing" and target[:1] == ["adapters"]]
    assert not bad, bad
