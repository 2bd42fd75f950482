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
from polyproj.testing.check import PROPERTIES

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
