"""The Python examples of README.md and docs/*.md run as written.

Each file's ```python blocks run in order in one namespace, as a reader following the page would run
them, in a fresh interpreter whose working directory is the repository root (the Maros–Meszaros examples
read ``../shared``). A block preceded by ``<!-- example: not run (reason) -->`` is left out, with its
reason stated in the page (a Dask cluster, a GPU). A page whose examples import a package that is not
installed is skipped (``make test-min`` has no torch).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(<!-- example: not run \((?P<why>[^)]*)\) -->\s*\n)?```python\n(?P<code>.*?)```", re.S)
IMPORT = re.compile(r"^\s*(?:from|import)\s+([A-Za-z_][A-Za-z0-9_]*)", re.M)


def blocks(page: Path) -> list[tuple[int, str]]:
    """``(line, code)`` of each block of ``page`` that runs."""
    text = page.read_text()
    return [(text[:m.start("code")].count("\n") + 1, m.group("code")) for m in BLOCK.finditer(text)
            if m.group("why") is None]


#: what runs the test functions a page defines (``def test_...``, a reader puts them in a pytest file), under a
#: hypothesis profile of few examples and a 1 ms deadline: a slower machine than the writer's, where a test that
#: relies on the default deadline of 200 ms fails (the kit's properties take ~0.3 s an example)
TESTS_BEFORE = """from hypothesis import settings as _settings
_settings.register_profile("doc_examples", max_examples=3, deadline=1, derandomize=True, database=None)
_settings.load_profile("doc_examples")
"""
TESTS_AFTER = """import inspect as _inspect
_tests = [f for k, f in list(globals().items()) if k.startswith("test_") and callable(f)]
for _test in _tests:  # a test of the page that takes no fixture (a @given one takes none) runs as pytest would
    if not _inspect.signature(_test).parameters:
        print("running", _test.__name__, flush=True)
        _test()
"""
TEST_DEF = re.compile(r"^def test_\w*\(", re.M)


def script(page: Path) -> str:
    """The page's blocks as one script, each announcing its line (a failure's traceback names the block).

    A page whose blocks define test functions has them called at the end (:data:`TESTS_AFTER`): a test function
    that is only defined would pass whatever it does.
    """
    parts = [f"print('{page.name}:{line}', flush=True)\n{code}" for line, code in blocks(page)]
    if any(TEST_DEF.search(code) for _, code in blocks(page)):
        parts = [TESTS_BEFORE, *parts, TESTS_AFTER]
    # under a main guard: an example that starts worker processes by spawning re-imports this script
    return "if __name__ == '__main__':\n" + textwrap.indent("\n".join(parts), "    ")


def test_every_page_with_examples_is_checked():
    """The harness finds the blocks (a changed fence style would make every page pass vacuously)."""
    assert sum(len(blocks(p)) for p in PAGES) >= 15
    assert all(re.search(r"```python", p.read_text()) is None or blocks(p) or "not run" in p.read_text()
               for p in PAGES)


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)], ids=lambda p: p.name)
def test_page_examples_run(page: Path, tmp_path: Path):
    code = script(page)
    missing = sorted({name for name in IMPORT.findall(code) if importlib.util.find_spec(name) is None})
    if missing:
        pytest.skip(f"{page.name}'s examples import {', '.join(missing)}, not installed here")
    path = tmp_path / f"examples_{page.stem}.py"
    path.write_text(code)
    run = subprocess.run([sys.executable, str(path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"an example of {page.name} failed:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
