"""Registry, session 50: installed distributions that cannot be read, and entry points with refused names.

An unrelated distribution whose ``entry_points.txt`` is malformed made every polyproj call raise importlib.metadata's
raw TypeError (or UnicodeDecodeError), built-in backends included; an entry point named ``"auto"`` (or with a name
``register_backend`` refuses) was listed and used.
"""

from __future__ import annotations

import textwrap
import warnings

import numpy as np
import pytest

import polyproj as pp
from polyproj import registry
from tests.toy_backend import ToyKKTSolver

METADATA = "Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"


@pytest.fixture
def fresh_registry(monkeypatch):
    """The registry's caches and records of warnings emptied for the test (restored after it)."""
    for attr, value in [("_EP_NAMES", {}), ("_RESOLVED", {}), ("_WARNED_HIDDEN", set()),
                        ("_WARNED_ENTRY_POINTS", set())]:
        monkeypatch.setattr(registry, attr, value)


def _dist(root, name: str, entry_points: bytes) -> None:
    """An installed distribution ``name`` 1.0 in ``root`` with the raw ``entry_points.txt``."""
    dist = root / f"{name}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(METADATA.format(name=name, version="1.0"))
    (dist / "entry_points.txt").write_bytes(entry_points)


def _eq_qp_and_reference(seed=0, n=5, m=2):
    """min ½|x|² + qᵀx s.t. Bx = b, and its closed-form solution x = -q + Bᵀ(BBᵀ)⁻¹(b + Bq)."""
    rng = np.random.default_rng(seed)
    B, b, q = rng.normal(size=(m, n)), rng.normal(size=m), rng.normal(size=n)
    x = -q + B.T @ np.linalg.solve(B @ B.T, b + B @ q)
    return pp.QP(P=np.eye(n), q=q, C=B, l=b, u=b), x


def _messages(record, text: str) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, pp.PolyprojWarning) and text in str(w.message)]


@pytest.mark.core
@pytest.mark.filterwarnings("always::polyproj.errors.PolyprojWarning")
@pytest.mark.parametrize(("content", "cause"), [
    (b"[console_scripts]\nthis line has no equals sign\n", "TypeError"),      # a line without '='
    (b"[polyproj.backends]\nbad\xff\xfe = mod:Cls\n", "UnicodeDecodeError"),  # not UTF-8
])
def test_an_unreadable_distribution_is_skipped_and_the_others_still_load(tmp_path, monkeypatch, fresh_registry,
                                                                          content, cause):
    """Built-in backends, pp.project and another distribution's plugin work; one warning names the broken
    distribution and the cause."""
    _dist(tmp_path, "otherpkg", content)
    _dist(tmp_path, "goodplug_dist", b"[polyproj.backends]\ngoodplug = tests.toy_backend:ToyKKTSolver\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    qp = pp.QP(P=np.eye(2), q=[-1.0, -1.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0])
    eq_qp, x_ref = _eq_qp_and_reference()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always", pp.PolyprojWarning)
        for _ in range(2):  # said once, however often the entry points are listed
            assert type(pp.get_backend("ipm")).__name__ == "IPMSolver"
            # min ½|x|² - x1 - x2 s.t. x1 + x2 <= 1: the projection of (1, 1) onto the half-space, (½, ½)
            np.testing.assert_allclose(pp.solve_qp(qp, backend="ipm").x, [0.5, 0.5], atol=1e-7)
            np.testing.assert_allclose(pp.project(np.ones(2), pp.Polyhedron(A=[[1.0, 1.0]], a=[1.0])).y,
                                       [0.5, 0.5], atol=1e-7)
            assert "goodplug" in pp.available_backends() and "ipm" in pp.available_backends()
            sol = pp.solve_qp(eq_qp, backend="goodplug")
            np.testing.assert_allclose(sol.x, x_ref, atol=1e-10)
    said = _messages(record, "otherpkg")
    assert len(said) == 1, said
    assert "entry_points.txt cannot be read" in said[0] and cause in said[0] and "otherpkg-1.0.dist-info" in said[0]


@pytest.mark.core
@pytest.mark.filterwarnings("always::polyproj.errors.PolyprojWarning")
@pytest.mark.parametrize("name", ["auto", "my solver", "a:b", "", "--help"])
def test_an_entry_point_with_a_refused_name_is_skipped(tmp_path, monkeypatch, fresh_registry, name):
    """The name rule of register_backend holds for entry points: "auto" does not run a plugin, nor is it listed;
    the distribution's other entry point still loads."""
    _dist(tmp_path, "namedplug", textwrap.dedent(f"""\
        [polyproj.backends]
        {name} = tests.toy_backend:ToyKKTSolver
        fineplug = tests.toy_backend:ToyKKTSolver
        """).encode())
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(pp.PolyprojError) as refused:
        pp.register_backend(name, ToyKKTSolver)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always", pp.PolyprojWarning)
        names = [row.name for row in pp.backend_info()]
        assert name not in names and name not in pp.available_backends()
        assert "fineplug" in pp.available_backends()
        if name == "auto":
            with pytest.raises(pp.BackendNotFound, match="no backend named 'auto'"):
                pp.get_backend("auto")
    said = _messages(record, f"entry point {name!r}")
    assert len(said) == 1, said
    assert "namedplug" in said[0] and str(refused.value) in said[0]  # the one rule, in register_backend's words
    eq_qp, x_ref = _eq_qp_and_reference(seed=1)
    np.testing.assert_allclose(pp.solve_qp(eq_qp, backend="fineplug").x, x_ref, atol=1e-10)
