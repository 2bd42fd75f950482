"""Registry, guard and command-line defects found by a probe: each test failed before its fix."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
import warnings
from dataclasses import replace

import numpy as np
import pytest

import polyproj as pp
from polyproj import registry
from tests.helpers import installed_entry_point
from tests.toy_backend import ToyKKTSolver


def _box_qp() -> pp.QP:
    return pp.QP(P=np.eye(2), q=[1.0, 1.0], lb=[0.0, 0.0], ub=[1.0, 1.0])


# --------------------------------------------------------------------------- 1: a false claim of unboundedness
class _SaysUnbounded(ToyKKTSolver):
    name = "s46_says_unbounded"

    def solve(self, qp, warm_start=None):
        return self._nan_solution(qp, pp.Status.DUAL_INFEASIBLE, self.name)


def test_unbounded_claim_on_a_boxed_problem_is_refuted():
    """An LP on the unit box (optimum -1) claimed DUAL_INFEASIBLE: the claim stood (P is not definite)."""
    qp = pp.QP(P=np.zeros((2, 2)), q=[1.0, -1.0], lb=[0.0, 0.0], ub=[1.0, 1.0])
    sol = pp.solve_qp(qp, _SaysUnbounded)
    assert sol.status is pp.Status.NUMERICAL_ERROR
    assert "finite lower and upper bound" in sol.info["validation"]
    bs = _SaysUnbounded().solve_batch(qp, q=np.array([[1.0, -1.0], [0.0, 2.0]]))
    assert all(s is pp.Status.NUMERICAL_ERROR for s in bs.status)


def test_unbounded_claim_stands_where_a_variable_is_unbounded():
    qp = pp.QP(P=np.zeros((2, 2)), q=[1.0, -1.0], lb=[0.0, 0.0], ub=[1.0, np.inf])  # truly unbounded
    assert pp.solve_qp(qp, _SaysUnbounded).status is pp.Status.DUAL_INFEASIBLE


# --------------------------------------------------------------------------- 2: classmethod / staticmethod solve
def test_a_classmethod_solve_is_guarded():
    """callable() is False for a classmethod object: its SOLVED [nan nan] escaped the guard."""

    class CM(pp.QPSolver):
        name = "s46_cm"

        @classmethod
        def solve(cls, qp, warm_start=None):
            return pp.Solution(x=np.full(qp.n, np.nan), z=np.zeros(qp.m), z_box=np.zeros(qp.n),
                               status=pp.Status.SOLVED, backend=cls.name, qp=qp)

    sol = pp.solve_qp(_box_qp(), CM)
    assert sol.status is pp.Status.NUMERICAL_ERROR and "non-finite" in sol.info["validation"]


def test_a_staticmethod_solve_works_and_is_guarded():
    """The guard passed self to a staticmethod solve: a SolverError (3 arguments given) for a correct backend."""

    class SM(pp.QPSolver):
        name = "s46_sm"

        @staticmethod
        def solve(qp, warm_start=None):
            x = np.clip(-qp.q, qp.lb, qp.ub)  # exact for P = I, bounds only
            return pp.Solution(x=x, z=np.zeros(qp.m), z_box=-(x + qp.q), status=pp.Status.SOLVED, backend="s46_sm",
                               qp=qp)

    qp = pp.QP(P=np.eye(2), q=[-0.5, 1.0], lb=[0.0, 0.0], ub=[1.0, 1.0])
    sol = pp.solve_qp(qp, SM)
    assert sol.status is pp.Status.SOLVED
    np.testing.assert_allclose(sol.x, [0.5, 0.0])
    bs = SM().solve_batch(qp, q=np.array([[-0.5, 1.0], [-2.0, -2.0]]))
    assert all(s is pp.Status.SOLVED for s in bs.status)
    np.testing.assert_allclose(bs.x, [[0.5, 0.0], [1.0, 1.0]])


def test_a_solve_that_is_not_a_method_is_refused_when_the_class_is_made():
    with pytest.raises(pp.PolyprojError, match="solve is a property, not a method"):
        class Prop(ToyKKTSolver):
            name = "s46_prop"
            solve = property(lambda self: ToyKKTSolver.solve)


# --------------------------------------------------------------------------- 4: a backend registered over "daqp"
def test_registering_over_daqp_leaves_the_direct_projection_working():
    """The direct path took get_backend('daqp') and called DAQP-only internals on it: an AttributeError."""
    pytest.importorskip("daqp")
    pytest.importorskip("clarabel")
    from polyproj.backends.clarabel import ClarabelSolver

    class MyDAQP(ClarabelSolver):
        name = "daqp"

    P = pp.Polyhedron(A=[[1.0, 1.0]], a=[1.0], lb=[0.0, 0.0])
    pp.register_backend("daqp", MyDAQP, overwrite=True)
    try:
        r = pp.project(np.array([[2.0, 2.0]]), P, structured=False)
        np.testing.assert_allclose(r.y, [[0.5, 0.5]], atol=1e-9)
        named = pp.project(np.array([[2.0, 2.0]]), P, backend="daqp")  # the registered class, not the built-in
        np.testing.assert_allclose(named.y, [[0.5, 0.5]], atol=1e-9)
    finally:
        pp.unregister_backend("daqp")
    assert type(pp.get_backend("daqp")).__module__ == "polyproj.backends.daqp"


def _direct_taken(S, X) -> bool:
    from polyproj.projection import direct

    return any(isinstance(rec.face, direct.DirectFace) for rec in S.project_batch(X, record=True).face.faces)


def test_the_direct_path_is_polyproj_daqp_or_none(monkeypatch):
    """Named "daqp", a registered class is used as the backend it is (the direct path is polyproj's DAQP's); without
    DAQP installed, the pipeline projects."""
    pytest.importorskip("daqp")
    from polyproj.backends.daqp import DAQPSolver
    from polyproj.sets import Polyhedral

    P = pp.Polyhedron(A=[[1.0, 1.0], [1.0, -1.0]], a=[1.0, 0.5], lb=[0.0, 0.0])
    X = np.array([[2.0, 2.0], [0.2, 0.1]])
    assert _direct_taken(Polyhedral(P, "daqp"), X)

    class OtherDAQP(DAQPSolver):  # any class other than polyproj's own
        name = "daqp"

    pp.register_backend("daqp", OtherDAQP, overwrite=True)
    try:
        S = Polyhedral(P, "daqp")
        assert isinstance(S.solver, OtherDAQP) and not _direct_taken(S, X)
    finally:
        pp.unregister_backend("daqp")
    S = Polyhedral(P, "daqp")
    monkeypatch.setattr(DAQPSolver, "unavailable_reason", classmethod(lambda cls: "daqp is not installed"))
    assert not _direct_taken(S, X)
    assert bool(np.all(S.project_batch(X).polished))


# --------------------------------------------------------------------------- 9: flags and the reserved name
def test_register_and_unregister_flags_must_be_booleans():
    class Mine(ToyKKTSolver):
        name = "osqp"

    with pytest.raises(pp.SettingsError, match="overwrite must be True or False, got 'no'"):
        pp.register_backend("osqp", Mine, overwrite="no")
    assert "osqp" not in registry._RUNTIME
    with pytest.raises(pp.SettingsError, match="missing_ok must be True or False, got 'no'"):
        pp.unregister_backend("s46_never_registered", missing_ok="no")
    pp.unregister_backend("s46_never_registered", missing_ok=True)


def test_auto_is_a_reserved_backend_name():
    with pytest.raises(pp.PolyprojError, match="'auto' is reserved"):
        pp.register_backend("auto", ToyKKTSolver)
    assert "auto" not in registry._RUNTIME


# --------------------------------------------------------------------------- 7: third-party text is not markup
class _VersionMarkup(ToyKKTSolver):
    name = "s46_vmark"

    @classmethod
    def version(cls):
        return "2.0[/]"


class _VersionTag(ToyKKTSolver):
    name = "s46_vtag"

    @classmethod
    def version(cls):
        return "2.0 [beta]"


def test_backends_table_escapes_names_and_versions(capsys):
    from polyproj.cli import main

    pp.register_backend("s46_vmark", _VersionMarkup)
    pp.register_backend("s46_vtag", _VersionTag)
    pp.register_backend("s46[/]", ToyKKTSolver)
    try:
        assert main(["backends"]) == 0
    finally:
        for name in ("s46_vmark", "s46_vtag", "s46[/]"):
            pp.unregister_backend(name)
    out = capsys.readouterr().out
    assert "2.0[/]" in out and "2.0 [beta]" in out and "s46[/]" in out


def test_check_report_table_and_progress_escape_the_backend_name():
    from rich.console import Console

    from polyproj.testing.check import CheckReport, PropertyResult, check_backend

    report = CheckReport("solver[/]", (PropertyResult("qp_contract", "contract", "passed", 1),), 0, 1)
    buf = io.StringIO()
    Console(file=buf, width=200).print(report.table())
    assert "solver[/]" in buf.getvalue()
    pp.register_backend("s46[/]", ToyKKTSolver)
    try:  # the progress bar's label is rendered as markup too
        done = check_backend("s46[/]", properties=[], conformance=False, progress=True)
    finally:
        pp.unregister_backend("s46[/]")
    assert done.backend == "s46[/]"


# --------------------------------------------------------------------------- 5: optional packages missing
_BLOCK = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Block())
from polyproj.cli import main
sys.exit(main({argv!r}))
"""


def _cli_without(blocked: str, argv: list[str]) -> subprocess.CompletedProcess:
    code = textwrap.dedent(_BLOCK.format(blocked=blocked, argv=argv))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_check_without_hypothesis_is_one_clear_line(monkeypatch):
    from polyproj.testing.check import check_backend

    monkeypatch.setitem(sys.modules, "hypothesis", None)  # `import hypothesis` raises ModuleNotFoundError
    with pytest.raises(pp.PolyprojError, match="hypothesis is not installed"):
        check_backend(ToyKKTSolver, properties=["qp_contract"], conformance=False)
    out = _cli_without("hypothesis", ["check", "tests.toy_backend:ToyKKTSolver", "--examples", "1"])
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "hypothesis is not installed" in out.stderr and "polyproj[test]" in out.stderr


def test_demo_without_torch_skips_the_torch_sections():
    out = _cli_without("torch", ["demo", "--quick"])
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert out.stdout.count("skipped") == 2 and "'torch'" in out.stdout and "polyproj[torch]" in out.stdout


# --------------------------------------------------------------------------- 8: a plugin registering its own class
@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A package s46_plugin (MySolver defined in s46_plugin._impl, re-exported) installed with the entry point
    ``s46plug = s46_plugin:MySolver``; its modules forgotten afterwards."""
    pkg = tmp_path / "s46_plugin"
    pkg.mkdir()
    (pkg / "_impl.py").write_text("from tests.toy_backend import ToyKKTSolver\n\n\nclass MySolver(ToyKKTSolver):\n"
                                  "    name = 's46plug'\n")
    (pkg / "__init__.py").write_text("from ._impl import MySolver\n")
    installed_entry_point(tmp_path, monkeypatch, "s46plug = s46_plugin:MySolver")
    yield
    sys.modules.pop("s46_plugin", None)
    sys.modules.pop("s46_plugin._impl", None)


def test_a_plugin_registering_its_re_exported_class_is_not_warned_about(plugin):
    """The entry point s46_plugin:MySolver names the class defined in s46_plugin._impl: the same object."""
    import s46_plugin

    pp.register_backend("s46plug", s46_plugin.MySolver)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert isinstance(pp.get_backend("s46plug"), s46_plugin.MySolver)
    finally:
        pp.unregister_backend("s46plug")


def test_a_run_time_registration_of_another_class_is_still_warned_about(plugin):
    import s46_plugin  # noqa: F401

    pp.register_backend("s46plug", ToyKKTSolver)
    try:
        with pytest.warns(pp.PolyprojWarning, match="installed entry point 's46plug'"):
            pp.get_backend("s46plug")
    finally:
        pp.unregister_backend("s46plug")


# --------------------------------------------------------------------------- 6: resolutions are cached
def test_entry_point_and_path_backends_are_resolved_once(plugin, monkeypatch):
    listings = [0]
    real = registry._entry_points

    def counted():
        listings[0] += 1
        return real()

    monkeypatch.setattr(registry, "_entry_points", counted)
    for name in ("s46plug", "tests.toy_backend:ToyKKTSolver"):
        pp.get_backend(name)
        before = listings[0]
        for _ in range(3):
            pp.get_backend(name)
        assert listings[0] == before, name
    gen = registry.generation
    pp.register_backend("s46_other", ToyKKTSolver)  # a registration may hide a name: resolved again
    assert registry.generation == gen + 1
    before = listings[0]
    assert type(pp.get_backend("s46plug")).__name__ == "MySolver"
    assert listings[0] == before + 1
    pp.unregister_backend("s46_other")
    assert registry.generation == gen + 2
    pp.unregister_backend("s46_other", missing_ok=True)  # nothing removed: nothing changed
    assert registry.generation == gen + 2


def test_a_run_time_registration_replaces_a_cached_entry_point(plugin):
    assert type(pp.get_backend("s46plug")).__name__ == "MySolver"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pp.PolyprojWarning)  # the entry point is hidden: said once
        pp.register_backend("s46plug", ToyKKTSolver)
        try:
            assert type(pp.get_backend("s46plug")) is ToyKKTSolver
        finally:
            pp.unregister_backend("s46plug")
    assert type(pp.get_backend("s46plug")).__name__ == "MySolver"


# --------------------------------------------------------------------------- 10: batch messages
def test_batch_statuses_of_the_wrong_type_are_named():
    class StrStatus(ToyKKTSolver):
        name = "s46_strstatus"

        def solve_batch(self, qp, q=None, l=None, u=None, lb=None, ub=None, warm_start=None):
            bs = super().solve_batch(qp, q=q, l=l, u=u, lb=lb, ub=ub)
            return replace(bs, status=tuple(s.value for s in bs.status))

    qp = pp.QP(P=np.eye(2), q=[1.0, 1.0], C=[[1.0, 1.0]], l=[1.0], u=[1.0])
    with pytest.raises(pp.SolverError, match="batch status 'solved' of type str; expected polyproj.Status"):
        StrStatus().solve_batch(qp, q=np.zeros((3, 2)))


def test_a_solve_returning_none_in_a_batch_is_named():
    class ReturnsNone(ToyKKTSolver):
        name = "s46_none"

        def solve(self, qp, warm_start=None):
            return None

    qp = pp.QP(P=np.eye(2), q=[1.0, 1.0], C=[[1.0, 1.0]], l=[1.0], u=[1.0])
    with pytest.raises(pp.SolverError, match="returned NoneType from solve\\(\\); expected a polyproj.Solution"):
        ReturnsNone().solve_batch(qp, q=np.zeros((3, 2)))
    with pytest.raises(pp.SolverError, match="returned NoneType from solve\\(\\); expected a polyproj.Solution"):
        pp.project(np.array([[2.0, 2.0]]), pp.Polyhedron(B=[[1.0, 1.0]], b=[1.0]), backend=ReturnsNone)
