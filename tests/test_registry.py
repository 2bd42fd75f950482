"""Registry: names, close matches, install hints, run-time and entry-point backends, import isolation."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import polyproj as pp
from tests.helpers import installed_entry_point
from tests.toy_backend import ToyKKTSolver


def _eq_qp(rng, n=5, m=2):
    B = rng.normal(size=(m, n))
    b = rng.normal(size=m)
    return pp.QP(P=np.eye(n) * 2.0, q=rng.normal(size=n), C=B, l=b, u=b), B, b


@pytest.mark.core
def test_unknown_name_names_close_matches():
    with pytest.raises(pp.BackendNotFound, match=r"no backend named 'proxsuit'.*Did you mean 'proxsuite'"):
        pp.get_backend("proxsuit")
    with pytest.raises(pp.BackendNotFound, match="Known backends: proxsuite"):
        pp.get_backend("nothing-like-it")


def test_unknown_setting_is_an_error():
    with pytest.raises(pp.SettingsError, match=r"unknown setting\(s\) \['eps_ab'\].*Did you mean 'eps_abs'"):
        pp.get_backend("proxsuite", eps_ab=1e-9)
    with pytest.raises(pp.SettingsError, match="eps_abs must be a finite number"):
        pp.get_backend("proxsuite", eps_abs=-1.0)
    with pytest.raises(pp.SettingsError, match="max_iter must be a positive"):
        pp.get_backend("proxsuite", max_iter=0)


def test_get_backend_accepts_instances_and_classes():
    s = pp.get_backend("proxsuite", eps_abs=1e-7)
    assert pp.get_backend(s) is s
    s2 = pp.get_backend(s, max_iter=50)
    assert s2.settings["eps_abs"] == 1e-7 and s2.settings["max_iter"] == 50
    assert pp.get_backend(type(s)).name == "proxsuite"
    with pytest.raises(pp.PolyprojError, match="subclass of polyproj.QPSolver"):
        pp.get_backend(dict)


def test_runtime_registration_solves_end_to_end(rng):
    pp.register_backend("toy", ToyKKTSolver)
    try:
        assert "toy" in pp.available_backends()
        qp, B, b = _eq_qp(rng)
        sol = pp.solve_qp(qp, backend="toy")
        ref = pp.solve_qp(qp, backend="proxsuite", eps_abs=1e-11)
        np.testing.assert_allclose(sol.x, ref.x, atol=1e-8)
        np.testing.assert_allclose(sol.z, ref.z, atol=1e-7)  # same multiplier convention
        assert sol.dual_residual() < 1e-10
        # and through project(): projection onto an affine set
        P = pp.Polyhedron(B=B, b=b)
        res = pp.project(rng.normal(size=(3, 5)), P, backend="toy")
        assert res.polished.all() and res.max_violation < 1e-12
        with pytest.raises(pp.PolyprojError, match="already registered"):
            pp.register_backend("toy", ToyKKTSolver)
        with pytest.raises(pp.SettingsError, match="toy-specific: \\['shift'\\]"):
            pp.get_backend("toy", shiftt=1.0)
    finally:
        pp.unregister_backend("toy")
    assert "toy" not in pp.available_backends()


@pytest.mark.core
def test_register_rejects_non_solvers():
    with pytest.raises(pp.PolyprojError, match="subclass of polyproj.QPSolver"):
        pp.register_backend("bad", object)




@pytest.mark.core
def test_entry_point_backend_is_discovered_and_solves(tmp_path, rng, monkeypatch):
    """A fake distribution on sys.path declaring the entry point group polyproj.backends."""
    pkg = tmp_path / "fake_polyproj_solver"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from tests.toy_backend import ToyKKTSolver as FakeSolver\n")
    installed_entry_point(tmp_path, monkeypatch, "fakesolver = fake_polyproj_solver:FakeSolver")
    info = {row.name: row for row in pp.backend_info()}
    assert info["fakesolver"].available and info["fakesolver"].source == "entry point"
    qp, _, _ = _eq_qp(rng)
    sol = pp.solve_qp(qp, backend="fakesolver")
    assert sol.status is pp.Status.SOLVED and sol.primal_residual() < 1e-12


@pytest.mark.core
def test_module_class_path_is_accepted(rng):
    qp, _, _ = _eq_qp(rng)
    sol = pp.solve_qp(qp, backend="tests.toy_backend:ToyKKTSolver")
    assert sol.status is pp.Status.SOLVED


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True)
    return out.stdout


@pytest.mark.core
def test_missing_package_gives_install_hint_and_import_still_works():
    out = _run("""
        import sys
        sys.modules["proxsuite"] = None  # make proxsuite unimportable
        import polyproj as pp
        print("available:", pp.available_backends())
        info = {r.name: r for r in pp.backend_info()}
        print("reason:", info["proxsuite"].reason)
        try:
            pp.get_backend("proxsuite")
        except pp.BackendUnavailable as exc:
            print("error:", exc)
    """)
    assert "'proxsuite'" not in out.split("reason:")[0]
    assert 'pip install "polyproj[proxsuite]"' in out.split("reason:")[1]
    assert "error: backend 'proxsuite' is unavailable" in out
    assert 'pip install "polyproj[proxsuite]"' in out.split("error:")[1]


@pytest.mark.core
def test_import_polyproj_imports_no_optional_package():
    out = _run("""
        import sys
        import polyproj
        optional = ("torch", "proxsuite", "osqp", "highspy", "piqp", "clarabel", "daqp", "cupy", "hypothesis", "pytest")
        heavy = [m for m in optional if m in sys.modules]
        print(heavy)
    """)
    assert out.strip() == "[]"


def test_backend_info_rows():
    rows = {r.name: r for r in pp.backend_info()}
    assert rows["proxsuite"].available and rows["proxsuite"].version
    assert "batch" in rows["proxsuite"].capabilities
    for name in ("osqp", "highs", "piqp", "clarabel", "daqp", "ipm", "cupy"):
        assert name in rows  # built-ins are always listed, available or with the reason
        assert rows[name].available or rows[name].reason


class _EntryPoint:
    """Stands in for an importlib.metadata entry point whose module misbehaves at import."""

    def __init__(self, name, load):
        self.name, self.value, self.load = name, f"broken_plugin_{name}:Solver", load


@pytest.mark.parametrize("failure", [lambda: sys.exit(3), lambda: sys.exit("bye"), lambda: 1 / 0,
                                     lambda: __import__("no_such_module_anywhere")])
def test_a_plugin_failing_at_import_is_isolated(monkeypatch, failure):
    """A plugin calling sys.exit() (or raising) at import is listed as unavailable with the reason; it does
    not end `polyproj backends` or available_backends()."""
    import polyproj.registry as registry
    from polyproj.cli import main

    monkeypatch.setattr(registry, "_entry_points", lambda: {"broken": _EntryPoint("broken", failure)})
    assert "broken" not in pp.available_backends() and "proxsuite" in pp.available_backends()
    row = {r.name: r for r in pp.backend_info()}["broken"]
    assert not row.available and "failed to load" in row.reason and row.source == "entry point"
    with pytest.raises(pp.BackendUnavailable, match="failed to load"):
        pp.get_backend("broken")
    assert main(["backends"]) == 0


@pytest.mark.core
@pytest.mark.parametrize("name", ["piqp", "clarabel", "daqp"])
def test_new_backends_have_install_hints(name):
    out = _run(f"""
        import sys
        sys.modules[{name!r}] = None
        import polyproj as pp
        try:
            pp.get_backend({name!r})
        except pp.BackendUnavailable as exc:
            print(exc)
    """)
    assert f'pip install "polyproj[{name}]"' in out


def test_the_default_backend_is_the_measured_best(rng):
    """solve_qp and get_backend default to registry.DEFAULT_BACKEND (PIQP, chosen on Maros–Meszaros)."""
    from polyproj.registry import DEFAULT_BACKEND

    assert DEFAULT_BACKEND == "piqp"
    if DEFAULT_BACKEND not in pp.available_backends():
        pytest.skip("piqp not installed")
    qp, _, _ = _eq_qp(rng)
    assert pp.solve_qp(qp).backend == DEFAULT_BACKEND
    assert pp.get_backend().name == DEFAULT_BACKEND


def test_backend_option_values_are_checked_at_construction():
    """A value the solver would reject later (or ignore) is a SettingsError naming option and backend."""
    with pytest.raises(pp.SettingsError, match="max_iter must be a positive integer"):
        pp.get_backend("proxsuite", max_iter=2.5)
    assert pp.get_backend("proxsuite", max_iter=1e3).settings["max_iter"] == 1e3  # integral floats are fine
    cases = [("proxsuite", "rho", -1.0), ("proxsuite", "num_threads", 0), ("proxsuite", "check_duality_gap", "zz"),
             ("ipm", "batch_chunk", -1), ("ipm", "ruiz_iter", "zz"), ("ipm", "threads", 1.5),
             ("ipm", "namespace", "cupy"), ("admm", "stable", 2.0), ("admm", "alpha", 2.0),
             ("admm", "start_dtype", "float16")]
    for name, key, value in cases:
        with pytest.raises(pp.SettingsError, match=rf"option '{key}' of backend '{name}' must be"):
            pp.get_backend(name, **{key: value})
    for name, key, value in [("osqp", "alpha", 0.0), ("osqp", "scaling", -1), ("highs", "presolve", "zz"),
                             ("highs", "threads", -1), ("piqp", "tau", 1.5), ("clarabel", "max_step_fraction", 0.0),
                             ("clarabel", "presolve_enable", -1), ("daqp", "cycle_tol", "zz")]:
        if name in pp.available_backends():
            with pytest.raises(pp.SettingsError, match=rf"option '{key}' of backend '{name}' must be"):
                pp.get_backend(name, **{key: value})
    # accepted values still solve
    assert pp.get_backend("ipm", namespace="numpy", batch_chunk=64).backend_options["batch_chunk"] == 64


def test_accepted_option_values_reach_the_solver_as_its_types():
    """What the checks accept solves: an integral float as an integer, 0 / 1 as a flag, None as the default.

    OSQP took ``scaling=2.0`` to NUMERICAL_ERROR (its settings refused a float); PIQP and Clarabel raised on
    ``2.0`` counts, Clarabel on ``0`` flags, the IPM and the ADMM on None for an option with a default.
    """
    qp = pp.QP(P=np.eye(2), q=[-1.0, -1.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0])
    cases = [("osqp", "scaling", 2.0), ("osqp", "polish_refine_iter", 2.0), ("osqp", "check_termination", 2.0),
             ("osqp", "polishing", 0), ("piqp", "preconditioner_iter", 2.0), ("clarabel", "max_threads", 2.0),
             ("clarabel", "equilibrate_enable", np.int64(0)), ("clarabel", "presolve_enable", 1.0),
             ("highs", "threads", 1.0), ("ipm", "ruiz_iter", None), ("ipm", "ruiz_iter", 5.0),
             ("admm", "rho", None), ("admm", "alpha", None), ("admm", "check", None), ("admm", "check", 10.0),
             ("proxsuite", "num_threads", 1.0), ("daqp", "cycle_tol", 10.0)]
    for name, key, value in cases:
        if name not in pp.available_backends():
            continue
        backend = pp.get_backend(name, **{key: value})
        taken = backend.backend_options.get(key)
        if value is None:
            assert key not in backend.backend_options
        else:
            assert taken == value and type(taken) is type(backend.option_checks[key].convert(value)), (name, key)
        sol = pp.solve_qp(qp, backend=name, **{key: value})
        assert sol.status is pp.Status.SOLVED, (name, key, value, sol.status)
        np.testing.assert_allclose(sol.x, [0.5, 0.5], atol=1e-5)


def test_highs_thread_counts_may_change_within_a_process():
    """HiGHS sizes its process-wide thread pool at its first run: a later run with another `threads` ended
    NUMERICAL_ERROR ("Not Set", found when a clean run of the suite had solved with HiGHS before)."""
    if "highs" not in pp.available_backends():
        pytest.skip("highspy not installed")
    qp = pp.QP(P=np.eye(2), q=[-1.0, -1.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0])
    for threads in (None, 2, 1, None, 2):
        sol = pp.solve_qp(qp, backend="highs", **({} if threads is None else {"threads": threads}))
        assert sol.status is pp.Status.SOLVED, (threads, sol.status)


def test_solver_side_option_rejections_are_settings_errors():
    """What only the solver can judge (OSQP's own validation, HiGHS's option table) is a SettingsError too."""
    P = pp.Polyhedron(A=np.array([[1.0, 1.0]]), a=[1.0])
    x = np.array([2.0, 2.0])
    if "osqp" in pp.available_backends():
        with pytest.raises(pp.SettingsError, match="OSQP rejected"):
            pp.project(x, P, backend="osqp", eps_prim_inf=0.0, structured=False)
        with pytest.raises(pp.SettingsError, match="OSQP rejected"):
            pp.project(np.stack([x, -x]), P, backend="osqp", eps_dual_inf=0.0, structured=False)
    if "highs" in pp.available_backends():
        with pytest.raises(pp.SettingsError, match="HiGHS rejected"):
            pp.project(x, P, backend="highs", primal_feasibility_tolerance=1e-30, structured=False)
        res = pp.project(x, P, backend="highs", presolve="off", structured=False)
        np.testing.assert_allclose(res.y, [0.5, 0.5], atol=1e-12)


def test_registration_names_are_checked_and_unregistering_an_unknown_name_is_an_error():
    for bad in ("", "  ", " toy", "pkg:Cls", None, 3):
        with pytest.raises(pp.PolyprojError, match="backend name must be a non-empty string"):
            pp.register_backend(bad, ToyKKTSolver)
    with pytest.raises(pp.BackendNotFound, match="no run-time registration named 'nope'"):
        pp.unregister_backend("nope")
    with pytest.raises(pp.BackendNotFound, match="built-in or entry-point"):
        pp.unregister_backend("proxsuite")
    pp.unregister_backend("nope", missing_ok=True)
    assert "proxsuite" in pp.available_backends()


def test_tolerance_and_time_limit_values():
    assert pp.get_backend("proxsuite", eps_abs=np.float32(1e-6)).settings["eps_abs"] == pytest.approx(1e-6)
    assert pp.get_backend("proxsuite", eps_abs=0.0, eps_rel=1e-6).settings["eps_abs"] == 0.0
    with pytest.raises(pp.SettingsError, match="both 0"):
        pp.get_backend("proxsuite", eps_abs=0)
    with pytest.raises(pp.SettingsError, match="eps_abs must be a finite number"):
        pp.get_backend("proxsuite", eps_abs=True)
    assert pp.get_backend("proxsuite", time_limit=float("inf")).settings["time_limit"] is None


def test_ragged_data_is_a_problem_error():
    with pytest.raises(pp.ProblemError, match="C is not a rectangular array"):
        pp.QP(P=np.eye(2), q=[0.0, 0.0], C=[[1.0, 1.0], [1.0]], l=[0, 0], u=[1, 1])
    with pytest.raises(pp.ProblemError, match="a is not a rectangular array"):
        pp.Polyhedron(A=np.ones((2, 2)), a=[[1.0], [1.0, 2.0]])


def test_an_abstract_backend_class_is_refused_at_registration():
    class NoSolve(pp.QPSolver):
        name = "nosolve"

    with pytest.raises(pp.PolyprojError, match="does not implement solve"):
        pp.register_backend("nosolve", NoSolve)
    assert "nosolve" not in pp.available_backends()


def test_boolean_settings_refuse_strings():
    """``warm_start="no"`` is truthy: refused rather than read as True (0 and 1 are accepted)."""
    for k in ("warm_start", "verbose"):
        with pytest.raises(pp.SettingsError, match=f"{k} must be True or False"):
            pp.get_backend("ipm", **{k: "no"})
        assert pp.get_backend("ipm", **{k: 0}).settings[k] is False


def test_piqp_refuses_a_purely_relative_tolerance_when_built():
    pytest.importorskip("piqp")
    with pytest.raises(pp.SettingsError, match="needs eps_abs > 0"):
        pp.get_backend("piqp", eps_abs=0, eps_rel=1e-7)


def test_solve_qp_takes_warm_start_false_as_the_setting():
    """``solve_qp(qp, warm_start=False)``: the keyword names the start, and a boolean is the on/off setting."""
    qp = pp.QP(P=np.eye(2), q=[-1.0, -1.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0])
    for flag in (False, True):
        sol = pp.solve_qp(qp, backend="ipm", warm_start=flag)
        assert sol.status is pp.Status.SOLVED
        np.testing.assert_allclose(sol.x, [0.5, 0.5], atol=1e-6)
    first = pp.solve_qp(qp, backend="ipm")
    assert pp.solve_qp(qp, backend="ipm", warm_start=first).status is pp.Status.SOLVED


def _ipm_entry_point(tmp_path, monkeypatch, target: str) -> None:
    """An installed distribution whose entry point ``ipm`` points at ``target``."""
    installed_entry_point(tmp_path, monkeypatch, f"ipm = {target}")


@pytest.mark.core
def test_an_entry_point_named_like_a_builtin_is_reported_not_silently_hidden(tmp_path, monkeypatch):
    """A plugin registering ``ipm`` is never used (the built-in wins): a warning says so, once."""
    _ipm_entry_point(tmp_path, monkeypatch, "fake_polyproj_solver:FakeSolver")
    with pytest.warns(pp.PolyprojWarning, match=r"'ipm' is a built-in backend; the installed entry point 'ipm' "
                                                r"\(fake_polyproj_solver:FakeSolver\)"):
        solver = pp.get_backend("ipm")
    assert type(solver).__module__ == "polyproj.backends.ipm"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pp.get_backend("ipm")  # once a process


@pytest.mark.core
def test_an_entry_point_naming_the_same_class_is_not_reported(tmp_path, monkeypatch):
    """A plugin whose entry point and registration are one class hides nothing."""
    _ipm_entry_point(tmp_path, monkeypatch, "polyproj.backends.ipm:IPMSolver")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pp.get_backend("ipm")


def test_a_third_party_constructor_or_availability_check_that_raises_is_named():
    """A backend whose __init__ raises gave get_backend / solve_qp / project a bare ValueError, one whose
    availability check raises a bare RuntimeError: now a SolverError and a BackendUnavailable naming it."""

    class CtorRaises(ToyKKTSolver):
        name = "ctor_raises_test"

        def __init__(self, **settings):
            raise ValueError("bad ctor")

    class AvailRaises(ToyKKTSolver):
        name = "avail_raises_test"

        @classmethod
        def unavailable_reason(cls):
            raise RuntimeError("availability check broken")

    qp = pp.QP(P=np.eye(2), q=[-1.0, -1.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0])
    for cls in (CtorRaises, AvailRaises):
        pp.register_backend(cls.name, cls)
    try:
        for call in (lambda: pp.get_backend("ctor_raises_test"), lambda: pp.solve_qp(qp, backend="ctor_raises_test"),
                     lambda: pp.get_backend(CtorRaises)):
            with pytest.raises(pp.SolverError, match="ctor_raises_test.*constructor raised ValueError: bad ctor"):
                call()
        with pytest.raises(pp.BackendUnavailable, match="availability check raised RuntimeError"):
            pp.get_backend("avail_raises_test")
    finally:
        for cls in (CtorRaises, AvailRaises):
            pp.unregister_backend(cls.name)


def test_an_availability_check_that_exits_is_unavailable():
    """SystemExit from a third party's availability check escaped get_backend (its constructor's was caught)."""

    class AvailExits(ToyKKTSolver):
        name = "avail_exits_test"

        @classmethod
        def unavailable_reason(cls):
            raise SystemExit(3)

    pp.register_backend(AvailExits.name, AvailExits)
    try:
        with pytest.raises(pp.BackendUnavailable, match="availability check raised SystemExit"):
            pp.get_backend("avail_exits_test")
    finally:
        pp.unregister_backend(AvailExits.name)


def test_a_plugin_may_register_its_own_entry_point_name(monkeypatch):
    """A plugin whose module registers its class under its entry point's name (so that it works uninstalled too)
    failed to load once entry-point names needed overwrite=True (a review of the change): they do not."""
    import polyproj.registry as registry

    def load():
        pp.register_backend("selfreg", ToyKKTSolver)
        return ToyKKTSolver

    monkeypatch.setattr(registry, "_entry_points", lambda: {"selfreg": _EntryPoint("selfreg", load)})
    try:
        assert isinstance(pp.get_backend("selfreg"), ToyKKTSolver)
    finally:
        pp.unregister_backend("selfreg", missing_ok=True)
