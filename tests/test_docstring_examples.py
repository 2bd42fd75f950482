"""The ``>>>`` examples of polyproj's docstrings run and print what they show (``help(pp.project)`` is where a
new user reads first). Every module of the package whose source holds one is collected here, so an example added
later is checked too.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1] / "polyproj"
MODULES = sorted(
    ".".join(("polyproj", *p.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__")
    for p in ROOT.rglob("*.py") if ">>>" in p.read_text()
)


def test_modules_found():
    # the package's public entry points carry examples: the collection above must see them
    assert {"polyproj.api", "polyproj.problem", "polyproj.adapters.torch"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = [t for t in finder.find(module, name) if t.examples]
    assert tests, f"{name} holds '>>>' but doctest found no example in it"
    with np.printoptions(legacy=False):
        for t in tests:
            runner.run(t)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples of {name} failed (above)"
