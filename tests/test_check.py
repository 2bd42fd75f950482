"""``check_backend`` and ``polyproj check``: built-in backends pass, deliberately broken backends are
caught by the raw-contract properties with a readable shrunk example, third-party backends are
checkable by name through the entry-point group, and a missing conformance module is reported.
"""

from __future__ import annotations

import importlib
import textwrap

import numpy as np
import pytest

import polyproj as pp
from polyproj.backends.proxsuite import ProxSuiteSolver
from polyproj.cli import main
from polyproj.solution import Solution
from polyproj.testing import check_backend
from polyproj.testing import properties as pr
from polyproj.testing.check import PROPERTIES, run_property

CPU_BACKENDS = [name for name in pp.available_backends() if name != "cupy"]
FAST = ["qp_contract", "infeasibility", "batch_contract"]


# ----------------------------------------------------------------------------- broken backends
class _Broken(ProxSuiteSolver):
    """ProxSuite with its answer corrupted after the solve (``solve_batch`` loops over ``solve``)."""

    capabilities = pp.Capabilities(dense=True, sparse=True, infeasibility=True)

    def solve(self, qp, warm_start=None):
        sol = super().solve(qp, warm_start)
        return self.corrupt(qp, sol) if sol.status.ok else sol

    def solve_batch(self, qp, q=None, l=None, u=None, lb=None, ub=None, warm_start=None):
        return pp.QPSolver.solve_batch(self, qp, q=q, l=l, u=u, lb=lb, ub=ub, warm_start=warm_start)

    def corrupt(self, qp, sol):  # pragma: no cover - overridden
        raise NotImplementedError


def _replace(sol, **kw):
    d = dict(x=sol.x, z=sol.z, z_box=sol.z_box, status=sol.status, iterations=sol.iterations,
             backend=sol.backend, qp=sol.qp)
    d.update(kw)
    return Solution(**d)


class SlightlyInfeasibleSolver(_Broken):
    """Moves x 1e-4 outside the most nearly active constraint."""

    name = "slightly_infeasible"

    def corrupt(self, qp, sol):
        x = np.array(sol.x)
        qd = qp.dense()
        best = (np.inf, None)
        for i in range(qp.m):
            row = qd.C[i]
            if not row.any():
                continue
            for side, bound in ((1.0, qp.u[i]), (-1.0, qp.l[i])):
                if np.isfinite(bound):
                    slack = side * (bound - row @ x)
                    if slack < best[0]:
                        best = (slack, side * row / (row @ row) * (slack + 1e-4))
        for j in range(qp.n):
            for side, bound in ((1.0, qp.ub[j]), (-1.0, qp.lb[j])):
                if np.isfinite(bound):
                    slack = side * (bound - x[j])
                    if slack < best[0]:
                        e = np.zeros(qp.n)
                        e[j] = side * (slack + 1e-4)
                        best = (slack, e)
        if best[1] is not None:
            x = x + best[1]
        return _replace(sol, x=x)


class WrongSignSolver(_Broken):
    """Returns the multipliers with the opposite sign convention (z > 0 at lower bounds)."""

    name = "wrong_sign"

    def corrupt(self, qp, sol):
        return _replace(sol, z=-np.asarray(sol.z), z_box=-np.asarray(sol.z_box))


class NonOptimalSolver(_Broken):
    """Returns the midpoint of the optimum and the optimum of another objective: feasible, not optimal."""

    name = "non_optimal"

    def corrupt(self, qp, sol):
        other = super(_Broken, self).solve(qp.with_vectors(q=qp.q + 10.0))
        if not other.status.ok:
            return sol
        return _replace(sol, x=0.5 * (np.asarray(sol.x) + np.asarray(other.x)))


@pytest.mark.parametrize(
    ("cls", "caught_by", "phrase"),
    [
        (SlightlyInfeasibleSolver, "qp_contract", "violates the constraints"),
        (WrongSignSolver, "qp_contract", "wrong sign"),
        (NonOptimalSolver, "qp_contract", "dual residual"),
    ],
)
def test_broken_backends_are_caught_with_a_readable_example(cls, caught_by, phrase):
    report = check_backend(cls(), max_examples=10, seed=0, properties=FAST, conformance=False)
    assert not report.passed
    res = report[caught_by]
    assert res.status == "failed"
    assert phrase in res.message
    # the shrunk falsifying example names the QP in full, compactly
    assert "Failing test case" in res.falsifying
    assert "FeasibleQP(P=" in res.falsifying and "feasible point=" in res.falsifying
    assert len(res.falsifying) < 1500
    # the batch path is checked on the raw solve_batch result too
    assert report["batch_contract"].status == "failed"


def test_projection_polish_repairs_a_slightly_infeasible_backend_so_raw_checks_are_needed():
    # pp.project polishes the backend's point into the exact projection: the projection
    # properties hold, and only the raw contract sees the broken backend.
    report = check_backend(SlightlyInfeasibleSolver(), max_examples=5, seed=0,
                           properties=["projection", "batch_contract"], conformance=False)
    assert report["projection"].status == "passed"
    assert report["batch_contract"].status == "failed"


@pytest.mark.skipif("highs" not in CPU_BACKENDS, reason="highspy not installed")
def test_highs_solves_a_strongly_convex_projection_qp():
    """HiGHS 1.16 answers 'Unbounded' here (shrunk by `polyproj check highs`, conservativity, seed 3); the glue
    retries with the free variables boxed and keeps the answer because the box is inactive."""
    P = pp.Polyhedron(A=[[2, 4, 0], [3, -3, 3]], a=[0, 11], B=[[1, 4, 0]], b=[-2], lb=[-np.inf, -3, -np.inf],
                      ub=[2, 1, np.inf])
    sol = pp.get_backend("highs").solve(P.projection_qp(np.array([7.550969, 14.92142, 0.664342])))
    assert sol.status is pp.Status.SOLVED and "retry" in sol.info
    np.testing.assert_allclose(sol.x, [2.0, -1.0, 0.664342], atol=1e-6)
    assert max(sol.residuals().values()) <= 1e-7


@pytest.mark.skipif("highs" not in CPU_BACKENDS, reason="highspy not installed")
@pytest.mark.parametrize("case", [
    # shrunk by `polyproj check highs --examples 20`: every variable fixed
    dict(P=[[1.0, 0.0], [0.0, 0.0]], q=[1.0, 0.0], lb=[0.0, 0.0], ub=[0.0, 0.0]),
    # `--examples 50`, seed 0: a singular Hessian with one fixed variable
    dict(P=np.diag([0.0, 1.0, 0.0]), q=[0.0, 1.0, 0.0], lb=[0.0, 0.0, 0.0], ub=[0.0, 1.0, 1.0]),
    dict(P=np.diag([1.0, 0.0]), q=[1.0, 0.0], lb=[0.0, 0.0], ub=[1.0, 1.0]),  # no fixed variable, same defect
    dict(P=[[1.0, 0.0], [0.0, 0.0]], q=[1.0, 0.0], C=[[1.0, 1.0]], l=[-5.0], u=[5.0], lb=[1.0, -1.0],
         ub=[1.0, np.inf]),
])
def test_highs_solves_qps_with_fixed_variables_and_singular_hessians(case):
    """HiGHS 1.16 ends these in 'Solve error'; the glue substitutes fixed variables (their multipliers from
    stationarity) and retries a solve error with more regularisation."""
    qp = pp.QP(**case)
    sol = pp.get_backend("highs", eps_abs=1e-9).solve(qp)
    assert sol.status is pp.Status.SOLVED, sol.info
    assert max(sol.residuals().values()) <= 1e-9
    fixed = qp.lb == qp.ub
    np.testing.assert_array_equal(sol.x[fixed], qp.lb[fixed])


@pytest.mark.core
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_builtin_backend_passes_my_properties(backend):
    report = check_backend(backend, max_examples=3, seed=3, conformance=False, shrink_budget=0.0)
    assert report.passed, str(report)
    assert {r.name for r in report.results} == set(PROPERTIES)


# ----------------------------------------------------------------------------- conformance module
def test_conformance_checks_are_included_when_present():
    pytest.importorskip("polyproj.testing.conformance")
    report = check_backend("proxsuite", max_examples=1, properties=["qp_contract"])
    names = [r.name for r in report.results if r.group == "conformance"]
    assert names and all(n.startswith("conformance:") for n in names)


def test_missing_conformance_module_is_reported_not_a_crash(monkeypatch):
    real = importlib.import_module

    def fake(name, *args):
        if name == "polyproj.testing.conformance":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", fake)
    report = check_backend("proxsuite", max_examples=1, properties=["qp_contract"])
    row = report["conformance"]
    assert row.status == "skipped" and "not installed" in row.message
    assert report.passed


# ----------------------------------------------------------------------------- CLI
def test_cli_check_prints_the_table_and_exits_zero(capsys):
    name = "osqp" if "osqp" in CPU_BACKENDS else "proxsuite"
    assert main(["check", name, "--examples", "2", "--seed", "1"]) in (0, 1)
    out = capsys.readouterr().out
    for name in ("qp_contract", "conservativity", "licq_equivalence", "nonlicq_example"):
        assert name in out


def test_cli_check_fails_on_a_broken_backend_given_as_module_path(capsys):
    assert main(["check", "tests.test_check:WrongSignSolver", "--examples", "3"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "wrong sign" in out and "Failing test case" in out


@pytest.mark.core
def test_cli_check_unknown_backend(capsys):
    assert main(["check", "proxsuitte"]) == 2
    assert "proxsuite" in capsys.readouterr().err  # the close match is suggested (errors go to stderr)


def test_runtime_registered_backend_is_checkable_by_name():
    pp.register_backend("wrong_sign_rt", WrongSignSolver, overwrite=True)
    try:
        report = check_backend("wrong_sign_rt", max_examples=3, properties=["qp_contract"], conformance=False)
        assert report["qp_contract"].status == "failed"
    finally:
        pp.unregister_backend("wrong_sign_rt")


def test_entry_point_backend_is_checkable_by_name(tmp_path, monkeypatch, capsys):
    (tmp_path / "fakeqp_polyproj.py").write_text(textwrap.dedent('''
        from polyproj.backends.proxsuite import ProxSuiteSolver

        class FakeQP(ProxSuiteSolver):
            name = "fakeqp"
    '''))
    dist = tmp_path / "fakeqp_polyproj-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeqp-polyproj\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[polyproj.backends]\nfakeqp = fakeqp_polyproj:FakeQP\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    info = {row.name: row for row in pp.backend_info()}
    assert info["fakeqp"].available and info["fakeqp"].source == "entry point"
    report = check_backend("fakeqp", max_examples=3, properties=["qp_contract", "projection", "licq_equivalence"],
                           conformance=False)
    assert report.passed, str(report)
    assert report.backend == "fakeqp"
    code = main(["check", "fakeqp", "--examples", "2"])
    out = capsys.readouterr().out
    assert "polyproj check fakeqp" in out
    assert code in (0, 1)  # the table is printed either way; the verdict follows the ProxSuite backend


@pytest.mark.core
def test_conformance_checks_for_missing_capabilities_are_skips_not_errors():
    """A backend without warm start passes `polyproj check` with that check marked skipped."""
    if "ipm" not in CPU_BACKENDS:
        pytest.skip("ipm backend not available")
    from polyproj.testing.check import _conformance

    results = {r.name: r for r in _conformance(pp.get_backend("ipm"), seed=0) if r.name.endswith("warm_start")}
    assert results["conformance:warm_start"].status == "skipped"
    assert "warm_start" in results["conformance:warm_start"].message


class _Raiser(pp.QPSolver):
    name = "raiser"

    def solve(self, qp, warm_start=None):
        raise RuntimeError("boom")


def test_a_backend_that_raises_gives_error_rows_not_an_abort():
    """Every property, the non-LICQ example included, reports the backend's exception as an error row."""
    report = check_backend(_Raiser, max_examples=1, conformance=False)
    rows = {r.name: r for r in report.results}
    assert rows["nonlicq_example"].status == "error" and "boom" in rows["nonlicq_example"].message
    assert all(r.status in ("error", "skipped") for r in report.results)


# ----------------------------------------------------------------------------- a third party's mistakes
class _SolvedOnInfeasible(ProxSuiteSolver):
    """Declares no infeasibility detection and answers SOLVED (x = 0) where ProxSuite finds the QP infeasible."""

    name = "solved_on_infeasible"
    capabilities = pp.Capabilities(dense=True, sparse=True, infeasibility=False)

    def solve(self, qp, warm_start=None):
        sol = super().solve(qp, warm_start)
        if sol.status is pp.Status.PRIMAL_INFEASIBLE:
            return Solution(x=np.zeros(qp.n), z=np.zeros(qp.m), z_box=np.zeros(qp.n), status=pp.Status.SOLVED,
                            backend=self.name, qp=qp)
        return sol


def test_a_false_solved_on_an_infeasible_qp_fails_whatever_the_backend_declares():
    """The guard demoted the false SOLVED to NUMERICAL_ERROR, which the property took for an honest failure."""
    report = check_backend(_SolvedOnInfeasible, max_examples=4, properties=["infeasibility"], conformance=False,
                           shrink_budget=0.0)
    row = report["infeasibility"]
    assert row.status == "failed" and "claimed SOLVED on a certified-infeasible QP" in row.message


class _PrimalOnly(pp.QPSolver):
    """An honest primal-only backend: ProxSuite's x, no multipliers (NaN)."""

    name = "primal_only"
    capabilities = pp.Capabilities(dense=True, duals=False)
    shift = 0.0

    def solve(self, qp, warm_start=None):
        s = pp.get_backend("proxsuite", eps_abs=self.settings["eps_abs"]).solve(qp)
        x = s.x if qp.primal_violation(s.x + self.shift) > 0 else s.x + self.shift  # a feasible detour
        return Solution(x=x, z=np.full(qp.m, np.nan), z_box=np.full(qp.n, np.nan), status=s.status,
                        backend=self.name, qp=qp)


class _PrimalOnlySuboptimal(_PrimalOnly):
    name = "primal_only_suboptimal"
    shift = 0.3


def test_a_primal_only_backend_is_checked_by_its_objective_not_its_multipliers():
    """``Capabilities(duals=False)``: the guard accepts such answers; the kit failed every KKT check on NaN duals."""
    report = check_backend(_PrimalOnly, max_examples=3, seed=1, properties=["qp_contract", "batch_contract"],
                           shrink_budget=0.0)
    assert report.passed, str(report)
    assert report["conformance:sign_convention"].status == "skipped"
    bad = check_backend(_PrimalOnlySuboptimal, max_examples=6, seed=1, properties=["qp_contract"],
                        conformance=False, shrink_budget=0.0)
    assert bad["qp_contract"].status == "failed" and "not optimal" in bad["qp_contract"].message


class _Hangs(ProxSuiteSolver):
    name = "hangs"

    def solve(self, qp, warm_start=None):
        import time

        time.sleep(3600)  # stands in for a solve that never returns


def test_a_property_past_its_timeout_is_an_error_and_the_check_goes_on():
    report = check_backend(_Hangs, max_examples=2, properties=["qp_contract", "infeasibility"], conformance=False,
                           timeout=0.5)
    assert [r.status for r in report.results] == ["error", "error"]
    assert all("timed out after 0.5 s" in r.message for r in report.results)


class _DictCaps(ProxSuiteSolver):
    name = "dict_caps"
    capabilities = {"dense": True, "sparse": True}


@pytest.mark.core
def test_registry_refuses_what_would_break_it_later():
    """Capabilities written as a dict broke backend_info, solve_qp and the kit later with AttributeErrors; names
    with inner whitespace split the 'Known backends' messages; a list given to unregister_backend was a TypeError."""
    with pytest.raises(pp.PolyprojError, match="capabilities = .* must be a polyproj.Capabilities"):
        pp.register_backend("dict_caps", _DictCaps)
    for bad in ("a b", "a\nb"):
        with pytest.raises(pp.PolyprojError, match="without spaces"):
            pp.register_backend(bad, ProxSuiteSolver)
    with pytest.raises(pp.PolyprojError, match="takes a backend name"):
        pp.unregister_backend(["x"])


@pytest.mark.core
def test_kit_arguments_are_checked_by_name():
    from polyproj.testing import check_projector, run_property

    S = pp.sets.Simplex(3)
    for call, what in ((lambda: check_projector(S, examples=0), "examples must be an integer >= 1"),
                       (lambda: check_projector(S, seed=-1), "seed must be an integer >= 0"),
                       (lambda: check_projector(S, tol=-1.0), "tol must be a positive finite number"),
                       (lambda: check_backend("ipm", tol=float("nan")), "tol must be a positive finite number"),
                       (lambda: check_backend("ipm", timeout=0), "timeout must be a positive finite number"),
                       (lambda: check_backend("ipm", properties="qp_contract"), "sequence of names"),
                       (lambda: run_property("nope", "ipm"), "unknown property 'nope'"),
                       (lambda: run_property("qp_contract", "ipm", max_examples=0), "max_examples must be")):
        with pytest.raises(pp.PolyprojError, match=what):
            call()


class _BadBatch(pp.QPSolver):
    name = "bad_batch"
    capabilities = pp.Capabilities(dense=True)

    def solve(self, qp, warm_start=None):
        return pp.get_backend("ipm").solve(qp)

    def solve_batch(self, qp, q=None, l=None, u=None, lb=None, ub=None, warm_start=None):
        import dataclasses

        bs = pp.QPSolver.solve_batch(self, qp, q=q, l=l, u=u, lb=lb, ub=ub)
        return dataclasses.replace(bs, x=np.asarray(bs.x) + 1.0)


@pytest.mark.core
def test_a_batch_element_keeps_the_guards_reason():
    """BatchSolution.solution(i) dropped info: the kit's message lost why the guard demoted the element."""
    bs = pp.get_backend(_BadBatch).solve_batch(pp.QP(P=[[1.0]], q=[0.0], lb=[0.0]), q=[[1.0]])
    sol = bs.solution(0)
    assert sol.info["claimed_status"] == "SOLVED" and "violates stationarity" in sol.info["validation"]


def test_cli_check_imports_module_class_from_the_working_directory(tmp_path):
    """The installed console script does not put the working directory on sys.path; `polyproj check
    my_module:MySolver` from the module's folder said it could not import it."""
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "my_probe_module.py").write_text(textwrap.dedent("""
        from polyproj.backends.proxsuite import ProxSuiteSolver
        class MySolver(ProxSuiteSolver):
            name = "mysolver"
            capabilities = {"dense": True}   # refused: proves the module was imported
    """))
    script = Path(sys.executable).parent / "polyproj"
    if not script.exists():
        pytest.skip("no polyproj console script beside this interpreter")
    run = subprocess.run([str(script), "check", "my_probe_module:MySolver", "--examples", "1"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "must be a polyproj.Capabilities" in run.stderr, run.stderr


# ----------------------------------------------------------------------------- batches of general QPs (a review)
class _BatchAssumesIdentity(ProxSuiteSolver):
    """A projection fast path taken for every batch: ``solve_batch`` replaces P by I."""

    name = "batch_assumes_identity"

    def solve_batch(self, qp, q=None, l=None, u=None, lb=None, ub=None, warm_start=None):
        qp_i = pp.QP(P=np.eye(qp.n), q=qp.q, C=qp.C, l=qp.l, u=qp.u, lb=qp.lb, ub=qp.ub)
        return super().solve_batch(qp_i, q=q, l=l, u=u, lb=lb, ub=ub, warm_start=warm_start)


class _BatchIgnoresBounds(ProxSuiteSolver):
    """``solve_batch`` solves with the QP's own l, u, lb, ub: only a batched q is read."""

    name = "batch_ignores_bounds"

    def solve_batch(self, qp, q=None, l=None, u=None, lb=None, ub=None, warm_start=None):
        if q is None:
            q = np.tile(qp.q, (next(np.shape(v)[0] for v in (l, u, lb, ub) if v is not None), 1))
        return super().solve_batch(qp, q=q)


class _BatchSlightlyOutside(ProxSuiteSolver):
    """``solve_batch`` moves x 0.3 % of the data's scale past every active upper bound (a rounding "fix" gone
    wrong): the guard judges it SOLVED_INACCURATE, an ok status."""

    name = "batch_slightly_outside"

    def solve_batch(self, qp, q=None, l=None, u=None, lb=None, ub=None, warm_start=None):
        import dataclasses

        bs = super().solve_batch(qp, q=q, l=l, u=u, lb=lb, ub=ub, warm_start=warm_start)
        UB = np.broadcast_to(qp.ub if ub is None else ub, bs.x.shape)
        size = np.maximum(np.abs(bs.x).max(axis=1), np.abs(np.where(np.isfinite(UB), UB, 0.0)).max(axis=1))
        at_ub = np.isfinite(UB) & (np.abs(bs.x - UB) <= 1e-6)
        return dataclasses.replace(bs, x=np.where(at_ub, UB + 3e-3 * (1.0 + size)[:, None], bs.x))


def _general_batch():
    """Two QPs sharing P = [[2, 1], [1, 2]] and C = [[1, 1]], every vector batched (x = 0 feasible in both)."""
    from polyproj.testing import strategies as ps

    inf = np.inf
    vec = {"q": np.array([[-4.0, -4.0], [1.0, -3.0]]), "l": np.array([[-inf], [-1.0]]), "u": np.array([[1.0], [inf]]),
           "lb": np.array([[-1.0, -1.0], [0.0, -2.0]]), "ub": np.array([[1.0, 1.0], [2.0, 0.0]])}
    qp = pp.QP(P=[[2.0, 1.0], [1.0, 2.0]], C=[[1.0, 1.0]], **{k: v[0] for k, v in vec.items()})
    return ps.QPBatchCase(qp, vec, np.zeros((2, 2)), strictly_convex=True)


@pytest.mark.core
@pytest.mark.skipif("proxsuite" not in CPU_BACKENDS, reason="proxsuite not installed")
@pytest.mark.parametrize(("cls", "phrase"), [
    (_BatchAssumesIdentity, "dual residual"),
    (_BatchIgnoresBounds, "violates the constraints"),
    (_BatchSlightlyOutside, "violates the constraints"),
])
def test_batch_paths_that_solve_other_problems_are_caught(cls, phrase):
    """`batch_contract` batches projection QPs (P = I, only q): a batch path that replaces P by I or ignores the
    batched l, u, lb, ub passed every row. `batch_qp_contract` gives a general P and batches every vector."""
    case = _general_batch()
    assert pr.check_qp_batch_contract(case, ProxSuiteSolver()) == {"qps": 2, "batches": 2}
    with pytest.raises(AssertionError, match=phrase) as caught:
        pr.check_qp_batch_contract(case, cls())
    assert "solve_batch element" in str(caught.value)


def test_batch_qp_contract_finds_a_batch_path_that_replaces_p_by_the_identity():
    """Through hypothesis, with a readable shrunk example; the projection batches of `batch_contract` pass it."""
    res = run_property("batch_qp_contract", _BatchAssumesIdentity(), max_examples=3, seed=0, shrink_budget=0.5)
    assert res.status == "failed" and "dual residual" in res.message and "solve_batch element" in res.message
    assert "FeasibleQPBatch(P=" in res.falsifying and len(res.falsifying) < 1500
    assert run_property("batch_contract", _BatchAssumesIdentity(), max_examples=3, seed=0).status == "passed"


def test_a_point_the_guard_calls_solved_inaccurate_still_fails_the_batch_contract():
    """0.3 % outside an active bound: the guard keeps an ok status (SOLVED_INACCURATE); the kit fails it."""
    qp = pp.QP(P=[[2.0, 1.0], [1.0, 2.0]], q=[-4.0, -4.0], lb=[-1.0, -1.0], ub=[1.0, 1.0])
    bs = pp.get_backend(_BatchSlightlyOutside).solve_batch(qp, q=[[-4.0, -4.0], [-5.0, -4.0]])
    assert bs.status[0] is pp.Status.SOLVED_INACCURATE and bs.solution(0).info["claimed_status"] == "SOLVED"
    with pytest.raises(AssertionError, match="violates the constraints"):
        pr.check_solution_kkt(qp, bs.solution(0), 1e-6)


@pytest.mark.core
@pytest.mark.skipif("proxsuite" not in CPU_BACKENDS, reason="proxsuite not installed")
def test_batch_qp_contract_holds_for_proxsuite_cold_and_warm():
    res = run_property("batch_qp_contract", "proxsuite", max_examples=5, seed=0)
    assert res.status == "passed", res.message + "\n" + res.falsifying
    assert res.counts["batches"] == 10 and res.counts["qps"] >= 10


# ----------------------------------------------------------------------------- the contract's tolerance (a review)
def test_the_contract_follows_the_backends_own_tolerance():
    """A correct backend at eps_abs = 1e-5 failed batch_contract at 2.6e-6 > 2e-6 (a fixed 1e-6) while the
    conformance checks allowed max(1e-6, 100 eps_abs): one rule for both now, unless tol is given."""
    from polyproj.testing.conformance import kkt_tolerance

    loose = ProxSuiteSolver(eps_abs=1e-5)
    assert pr.contract_tolerance(loose) == kkt_tolerance(loose) == pytest.approx(1e-3)
    assert pr.contract_tolerance(loose, 1e-6) == 1e-6  # an explicit tol is kept
    assert pr.contract_tolerance(ProxSuiteSolver()) == 1e-6
    report = check_backend("proxsuite", max_examples=3, seed=0, conformance=False, shrink_budget=0.0,
                           properties=["qp_contract", "batch_contract", "batch_qp_contract"], eps_abs=1e-5)
    assert report.passed, str(report)
    assert report.tol == pytest.approx(1e-3)


# ----------------------------------------------------------------------------- sys.exit in a backend (a review)
class _Exits(ProxSuiteSolver):
    """Calls exit() in solve, as a wrapped command-line solver might."""

    name = "exits"

    def solve(self, qp, warm_start=None):
        import sys

        sys.exit(3)


class _ExitsOutsideTheGuard(ProxSuiteSolver):
    """Calls exit() in its own solve_projections (guarded too: its exit is a SolverError naming the backend)."""

    name = "exits_outside"

    def solve_projections(self, X, data, *, rough=False):
        import sys

        sys.exit()


def test_a_backend_calling_sys_exit_gives_error_rows_and_a_nonzero_exit(capsys, monkeypatch):
    """`polyproj check` on such a backend ended with status 0 and printed nothing: the guard turns the SystemExit of
    solve into a SolverError (an error row), and the kit reports one raised elsewhere as the property's error."""
    from polyproj.testing import check as kit

    with monkeypatch.context() as m:
        m.setattr(kit, "PROPERTIES", ("qp_contract", "nonlicq_example"))  # two of them, and the conformance
        assert main(["check", "tests.test_check:_Exits", "--examples", "1"]) == 1
    out = capsys.readouterr().out
    assert "qp_contract" in out and "conformance:feasible_dense" in out and "properties failed" in out
    assert out.count("ERROR") >= 3 and "SolverError: backend 'exits' raised SystemExit: 3" in out  # the guard's
    outside = check_backend(_ExitsOutsideTheGuard, max_examples=1, properties=["projection", "nonlicq_example"],
                            conformance=False)
    assert [r.status for r in outside.results] == ["error", "error"]
    assert all("backend 'exits_outside' raised SystemExit" in r.message for r in outside.results)


# ----------------------------------------------------------------------------- infeasibility on every side (a review)
def test_proxsuite_proves_infeasibility_through_lower_sides_and_bounds():
    """ProxQP stops at MAX_ITER with z = 0 on x <= −1, x >= 1 (the kit's infeasible QPs used upper sides only);
    the glue finds the Farkas certificate on the sides its last iterate violates."""
    qps = [pp.QP(P=np.eye(1), q=[0.0], C=[[1.0], [1.0]], l=[-np.inf, 1.0], u=[-1.0, np.inf]),
           # shrunk by `infeasibility`: x fixed at 3 by its bounds, a row asking x >= 4
           pp.QP(P=np.eye(1), q=[2.0], C=[[1.0]], l=[4.0], u=[np.inf], lb=[3.0], ub=[3.0]),
           pp.QP(P=np.eye(3), q=[-1.0, 2.0, 2.0], C=[[-2.0, 2.0, 0.0]], l=[3.0], u=[6.0], lb=[2.0, 2.0, -np.inf],
                 ub=[np.inf, 2.0, np.inf])]
    solver = pp.get_backend("proxsuite")
    for qp in qps:
        sol = solver.solve(qp)
        assert sol.status is pp.Status.PRIMAL_INFEASIBLE, (qp, sol.info)
    bs = solver.solve_batch(qps[0], l=[[-np.inf, 1.0], [-np.inf, -2.0]])  # the native batch path too
    assert bs.status == (pp.Status.PRIMAL_INFEASIBLE, pp.Status.SOLVED)
    # a feasible problem that stops at MAX_ITER keeps it: its violated sides carry no certificate
    slow = pp.get_backend("proxsuite", max_iter=1).solve(pp.QP(P=np.eye(2), q=[1.0, 1.0], C=[[1.0, 1.0]],
                                                               l=[1.0], u=[2.0], lb=[0.0, 0.0]))
    assert slow.status is not pp.Status.PRIMAL_INFEASIBLE


def test_proxsuite_looks_for_certificates_after_its_first_budget():
    """conformance.random_infeasible_qp (seed 1 of its test): ProxQP ran 9.6e6 inner iterations (17 s) to MAX_ITER;
    after FIRST_BUDGET outer ones the violated sides carry the certificate. A problem that needs more is solved
    again from the start with ProxQP's own budget: the answer it gives unstaged (to rounding)."""
    from polyproj.backends import proxsuite as px
    from polyproj.testing import conformance as cf

    rng = np.random.default_rng(1)
    cf.random_feasible_qp(rng, 5, 3, 1)
    cf.random_feasible_qp(rng, 20, 10, 2, sparse=True, density=0.2)
    sol = pp.get_backend("proxsuite").solve(cf.random_infeasible_qp(rng, 6, 4))
    assert sol.status is pp.Status.PRIMAL_INFEASIBLE and sol.iterations < 10**5
    qp = cf.random_feasible_qp(np.random.default_rng(0), 20, 15, 3)
    plain = pp.get_backend("proxsuite", max_iter=10_000).solve(qp)  # ProxQP's own budget, unstaged
    with pytest.MonkeyPatch.context() as m:
        m.setattr(px, "FIRST_BUDGET", 2)  # every solve needs a second run now
        staged = pp.get_backend("proxsuite").solve(qp)
        batch = pp.get_backend("proxsuite").solve_batch(qp, q=np.stack([qp.q, qp.q]))
    assert staged.status is plain.status is pp.Status.SOLVED and staged.iterations > plain.iterations
    # the same run (ProxQP's own answers differ in the last bits between calls: the first call builds its matrices)
    np.testing.assert_allclose(staged.x, plain.x, rtol=0, atol=1e-13)
    np.testing.assert_allclose(batch.x, np.stack([plain.x, plain.x]), rtol=0, atol=1e-13)


# ----------------------------------------------------------------------------- a third party's mistakes (a probe)
class _NoSuper(pp.QPSolver):
    name = "nosuper"

    def __init__(self, **settings):  # forgot super().__init__(**settings)
        pass

    def solve(self, qp, warm_start=None):
        return pp.get_backend("ipm").solve(qp)


class _InfoNone(pp.QPSolver):
    name = "infonone"

    def solve(self, qp, warm_start=None):
        from dataclasses import replace

        return replace(pp.get_backend("ipm").solve(qp), info=None)


class _ProjectionsRaise(pp.QPSolver):
    name = "projraise"

    def solve(self, qp, warm_start=None):
        return pp.get_backend("ipm").solve(qp)

    def solve_projections(self, X, data, *, rough=False):
        raise ValueError("proj boom")


def test_a_backend_that_skips_qpsolver_init_or_returns_bad_info_is_named():
    """A constructor without super().__init__ gave AttributeError tracebacks (also from `polyproj check`); info=None
    a TypeError inside the guard; a raising solve_projections a bare ValueError from pp.project."""
    qp = pp.QP(P=np.eye(2), q=[-1.0, -1.0], lb=0.0, ub=1.0)
    with pytest.raises(pp.SolverError, match="'nosuper'.*did not call QPSolver.__init__"):
        pp.get_backend(_NoSuper)
    with pytest.raises(pp.SolverError, match="'nosuper'.*did not call QPSolver.__init__"):
        _NoSuper().solve(qp)
    with pytest.raises(pp.SolverError, match="'infonone' returned info of type NoneType"):
        _InfoNone().solve(qp)
    with pytest.raises(pp.SolverError, match="backend 'projraise' raised ValueError: proj boom"):
        pp.project(np.array([[2.0, 2.0]]), pp.Polyhedron(A=[[1.0, 1.0]], a=[1.0]), backend=_ProjectionsRaise(),
                   structured=False)


class _SwallowsAlarms(pp.QPSolver):
    name = "swallows"

    def solve(self, qp, warm_start=None):
        import time

        try:
            time.sleep(5)
        except BaseException:  # a catch-all around a slow call swallows the kit's alarm
            pass
        return pp.get_backend("ipm").solve(qp)


def test_a_swallowed_timeout_still_ends_the_property_and_large_timeouts_and_numpy_seeds_work():
    """The one-shot alarm was swallowed and the property ran on without a limit, then PASSED; a timeout of 1e12 s
    raised OverflowError from setitimer; seed=np.int64(0) made hypothesis refuse the seed (an error row)."""
    from polyproj.testing.check import _time_limit

    rep = check_backend(_SwallowsAlarms, max_examples=2, properties=["qp_contract"], conformance=False, timeout=1)
    row = {r.name: r for r in rep.results}["qp_contract"]
    assert row.status == "error" and "timed out after 1 s" in row.message
    with _time_limit(1e12):
        pass
    assert run_property("qp_contract", "ipm", max_examples=2, seed=np.int64(0)).status == "passed"
    with pytest.raises(pp.PolyprojError, match="properties must be a sequence of names"):
        check_backend("ipm", properties=5)


def test_false_claims_are_reported_as_claims():
    """A false PRIMAL_INFEASIBLE on a feasible QP was reported as a NUMERICAL_ERROR "status" the backend never
    returned; a backend without the infeasibility capability passed while claiming SOLVED on unbounded QPs."""
    from dataclasses import replace

    from polyproj.testing import conformance

    class FalseInfeasible(pp.QPSolver):
        name = "falseinf"

        def solve(self, qp, warm_start=None):
            return replace(pp.get_backend("ipm").solve(qp), status=pp.Status.PRIMAL_INFEASIBLE)

    qp = pp.QP(P=np.eye(2), q=[-1.0, -1.0], lb=0.0, ub=1.0)
    with pytest.raises(AssertionError, match="the backend claimed PRIMAL_INFEASIBLE on a feasible, bounded QP"):
        pr.check_solution_kkt(qp, FalseInfeasible().solve(qp), 1e-6)

    class SolvedWhenUnbounded(pp.QPSolver):
        name = "unbsolved"
        capabilities = pp.Capabilities(infeasibility=False)

        def solve(self, qp, warm_start=None):
            sol = pp.get_backend("ipm").solve(qp)
            if sol.status is pp.Status.DUAL_INFEASIBLE:
                return replace(sol, x=np.zeros(qp.n), z=np.zeros(qp.m), z_box=np.zeros(qp.n), status=pp.Status.SOLVED)
            return sol

    with pytest.raises(AssertionError, match="the backend claimed SOLVED"):
        conformance.check_dual_infeasible(SolvedWhenUnbounded(), np.random.default_rng(0))


def test_falsifying_text_drops_every_line_of_hypothesis_explanation():
    from polyproj.testing.check import _falsifying_text

    exc = AssertionError("x")
    for note in ("Falsifying example: prop(case=1)", "Explanation:",
                 "    These lines were always and only run by failing test cases:",
                 "        /some/file.py:298", "You can add @seed(1) to this test"):
        exc.add_note(note)
    assert _falsifying_text(exc) == "Falsifying example: prop(case=1)"


def test_registration_refuses_names_no_command_line_could_give():
    from tests.toy_backend import ToyKKTSolver

    for bad in ("\u200b", "a\x00b", "--help"):
        with pytest.raises(pp.PolyprojError, match="printable characters"):
            pp.register_backend(bad, ToyKKTSolver)


def test_a_backend_without_infeasibility_detection_may_raise_on_infeasible_problems():
    """Raising is no claim of an answer: the infeasibility rows stay skipped (a review: they became errors)."""
    from polyproj.testing import conformance

    class Strict(pp.QPSolver):
        name = "strict"
        capabilities = pp.Capabilities(infeasibility=False)

        def solve(self, qp, warm_start=None):
            sol = pp.get_backend("ipm").solve(qp)
            if not sol.status.ok:
                raise RuntimeError(f"could not solve ({sol.status.name})")
            return sol

    for check in (conformance.check_primal_infeasible, conformance.check_dual_infeasible):
        with pytest.raises(conformance.CheckSkipped, match="does not declare the 'infeasibility' capability"):
            check(Strict(), np.random.default_rng(0))
