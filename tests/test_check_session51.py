"""The kit and the guard, session 51: the documented hypothesis example runs under pytest (and the docs' harness runs
it), a timeout that hits hypothesis's set-up is a "timed out" row, ``--eps-rel 0`` / ``--eps-abs 0`` are accepted,
the README's counts and claims follow the code, a backend that rebinds a field of the frozen QP is caught as a
mutation, and the report's text has no empty parentheses and aligned columns.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest

import polyproj as pp
from polyproj.cli import main
from polyproj.testing import check as chk

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CHECKING = ROOT / "docs" / "checking_a_backend.md"
needs_proxsuite = pytest.mark.skipif("proxsuite" not in pp.available_backends(), reason="proxsuite not installed")


# --------------------------------------------------------------------------- A: the documented hypothesis test
@pytest.fixture
def short_deadline_profile():
    """A profile of 2 examples and a 1 ms deadline (a machine slower than the writer's), restored afterwards."""
    from hypothesis import settings

    before = settings._current_profile
    settings.register_profile("s51_short_deadline", max_examples=2, deadline=1, derandomize=True, database=None)
    settings.load_profile("s51_short_deadline")
    try:
        yield
    finally:
        settings.load_profile(before)


@needs_proxsuite
def test_the_documented_hypothesis_test_runs_where_an_example_is_slower_than_the_deadline(short_deadline_profile):
    """The page's `test_my_backend_licq` failed under pytest with DeadlineExceeded (~0.3 s an example against the
    default 200 ms) and Flaky; the example sets deadline=None, so at a 1 ms default it still passes."""
    from tests.test_doc_examples import blocks

    code = next(c for _, c in blocks(CHECKING) if "def test_my_backend_licq" in c)
    ns: dict = {}
    exec(compile(code, str(CHECKING), "exec"), ns)
    ns["test_my_backend_licq"]()  # hypothesis runs it: 2 examples, each a real LICQ-equivalence check


def test_the_docs_harness_calls_the_test_functions_a_page_defines(tmp_path, short_deadline_profile):
    """A test function a page only defined passed the harness whatever it did: now it is called."""
    from tests.test_doc_examples import script

    page = tmp_path / "page.md"
    page.write_text("```python\ncalls = []\n\ndef test_records():\n    calls.append(1)\n"
                    "    raise ValueError('ran')\n```\n")
    ns = {"__name__": "__main__"}
    with pytest.raises(ValueError, match="ran"):
        exec(compile(script(page), str(page), "exec"), ns)
    assert ns["calls"] == [1]


# --------------------------------------------------------------------------- B: a timeout inside hypothesis's set-up
def test_an_error_raised_after_the_alarm_is_a_timeout():
    """The alarm hit hypothesis's set-up and hypothesis raised its own AssertionError (``state._runner is not
    None``): run_property reported a FAIL row with an empty message. Any error after the alarm is the timeout."""
    def hypothesis_set_up(limit: float) -> None:
        with chk._time_limit(limit):
            try:
                time.sleep(1.0)  # the alarm's handler raises _TimedOut here (at 0.001 s)
            except BaseException:
                raise AssertionError("a real failure") from None  # what hypothesis does with it

    with pytest.raises(chk._TimedOut):
        hypothesis_set_up(0.001)
    with pytest.raises(AssertionError, match="a real failure"):  # no alarm: the error is the block's own
        with chk._time_limit(10.0):
            raise AssertionError("a real failure")


@needs_proxsuite
@pytest.mark.parametrize("timeout", [0.0005, 0.001, 0.003])
def test_a_timeout_during_the_set_up_is_an_error_row_that_says_so(timeout):
    r = chk.run_property("qp_contract", "proxsuite", max_examples=5, seed=0, timeout=timeout)
    assert (r.status, r.falsifying) == ("error", "")
    assert r.message.startswith(f"timed out after {timeout:g} s"), r.message


# --------------------------------------------------------------------------- C: zero tolerances on the command line
def test_check_accepts_zero_tolerances(monkeypatch, capsys):
    """eps_rel = 0 is every backend's default (and check_backend takes it); --eps-rel 0 was refused (exit 2)."""
    seen: dict = {}

    def fake(name, **kwargs):
        seen.update(kwargs)
        raise pp.PolyprojError("stop here")

    monkeypatch.setattr(chk, "check_backend", fake)
    assert main(["check", "osqp", "--eps-abs", "1e-6", "--eps-rel", "0"]) == 2
    assert seen["eps_abs"] == 1e-6 and seen["eps_rel"] == 0.0
    assert pp.get_backend("osqp").settings["eps_rel"] == 0.0  # the default the option must be able to state
    main(["check", "highs", "--eps-abs", "0", "--eps-rel", "1e-7"])
    assert seen["eps_abs"] == 0.0 and seen["eps_rel"] == 1e-7
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(["check", "osqp", "--eps-rel=-1e-9"])
    assert info.value.code == 2 and "--eps-rel must be a finite number > 0 or 0, got -1e-9" in capsys.readouterr().err


def test_check_with_both_tolerances_zero_is_the_backends_settings_error(capsys):
    assert main(["check", "osqp", "--eps-abs", "0", "--eps-rel", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("polyproj check: eps_abs and eps_rel are both 0") and "Traceback" not in err


# --------------------------------------------------------------------------- D: the README follows the code
def test_the_readme_counts_the_rows_polyproj_check_reports():
    """It said "20 properties each: 11 conformance checks + 9 properties of the kit"; a check has 22 rows."""
    from polyproj.testing.conformance import CHECKS

    m = re.search(r"(\d+) rows each: (\d+) conformance checks \+ (\d+) properties of the kit", README)
    assert m, "the README's sentence on the check's rows is gone"
    total, conformance, kit = map(int, m.groups())
    assert (conformance, kit, total) == (len(CHECKS), len(chk.PROPERTIES), len(CHECKS) + len(chk.PROPERTIES))
    assert "all 20 pass" not in README and "20 properties each" not in README


def test_the_halved_properties_are_the_documented_ones():
    """--examples N is halved (max(1, N // 2)) for some properties: the docs name exactly those."""
    halved = [s.name for s in chk._props() if s.examples(20) != 20]
    assert [s.examples(1) for s in chk._props()] == [1] * len(chk._props())  # never 0
    assert all(s.examples(20) in (10, 20) for s in chk._props())
    for text in (README, CHECKING.read_text()):
        para = next(p for p in text.split("\n\n") if "max(1, N // 2)" in p)
        halved_part = para.split("max(1, N // 2)")[1].split(";")[0]
        named = [n for n in chk.PROPERTIES if f"`{n}`" in halved_part]
        assert sorted(named) == sorted(halved), (named, halved)


def test_the_readme_says_what_the_simplex_projection_does():
    """'sort-based' it is not: Newton steps on the threshold over a partial selection; no sort in this case."""
    line = next(s for s in README.splitlines() if "pp.sets.Simplex(3))" in s)
    assert "sort-based" not in line and "no sort" in line
    import numpy as _np

    real_sort, real_argsort = _np.sort, _np.argsort

    def refuse(*a, **k):
        raise AssertionError("sorted")

    try:
        _np.sort, _np.argsort = refuse, refuse
        res = pp.project(np.array([0.9, 0.5, -1.0]), pp.sets.Simplex(3))
    finally:
        _np.sort, _np.argsort = real_sort, real_argsort
    # by hand: θ = (0.9 + 0.5 − 1) / 2 = 0.2, y = max(x − θ, 0)
    np.testing.assert_allclose(res.y, [0.7, 0.3, 0.0], atol=1e-15)


# --------------------------------------------------------------------------- E: a rebound field of the frozen QP
class _Rebinds(pp.QPSolver):
    """The exact answer of the QP below, after rebinding ``target`` of the problem it was given."""

    name = "rebinds"
    target = "q"

    def solve(self, qp, warm_start=None):
        _ = qp.eq_mask  # a cached form made from the data during the call
        if self.target:
            object.__setattr__(qp, self.target, np.zeros_like(getattr(qp, self.target)))
        _ = qp.memo.setdefault("rebinds", qp.q)  # a conversion of the (changed) data
        return pp.Solution(x=np.array([0.5, 0.5]), z=np.array([0.5]), z_box=np.zeros(2), status=pp.Status.SOLVED,
                           backend=self.name, qp=qp)

    def solve_batch(self, qp, q=None, l=None, u=None, lb=None, ub=None, warm_start=None):
        object.__setattr__(qp, self.target, np.zeros_like(getattr(qp, self.target)))
        return pp.get_backend("ipm").solve_batch(qp, q=q)


def _qp():
    return pp.QP(P=np.eye(2), q=[-1.0, -1.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0])


@pytest.mark.parametrize("target", ["q", "u", "P", "lb"])
def test_a_backend_rebinding_a_field_of_the_qp_is_refused_and_the_field_restored(target):
    """The answer (0.5, 0.5) is right; judged against q = 0 it was NUMERICAL_ERROR ("x violates stationarity"),
    and the caller's QP kept q = 0."""
    qp = _qp()
    keep = getattr(qp, target)
    solver = _Rebinds()
    solver.target = target
    with pytest.raises(pp.SolverError, match=rf"'rebinds' wrote into the problem it was given \({target} replaced\)"):
        pp.solve_qp(qp, backend=solver)
    assert getattr(qp, target) is keep
    assert "eq_mask" not in vars(qp) and "rebinds" not in qp.memo  # made from the changed data: dropped
    # the restored problem is the one given: its solution by hand, x = (0.5, 0.5) (x1 + x2 <= 1 active, z = 0.5)
    s = pp.solve_qp(qp, backend="ipm")
    np.testing.assert_allclose(s.x, [0.5, 0.5], atol=1e-7)
    with pytest.raises(pp.SolverError, match=rf"\({target} replaced\)"):
        solver.solve_batch(qp, q=np.stack([qp.q, 2 * qp.q]))
    assert getattr(qp, target) is keep


def test_a_backend_that_caches_forms_of_the_qp_is_not_accused():
    """The QP's cached forms (eq_mask, memo) are added during calls: new attributes, not rebound ones."""
    qp = _qp()
    solver = _Rebinds()
    solver.target = None
    s = pp.solve_qp(qp, backend=solver)
    assert s.status is pp.Status.SOLVED and "eq_mask" in vars(qp) and qp.memo["rebinds"] is qp.q


# --------------------------------------------------------------------------- F: the report's text
def test_a_conformance_failure_without_a_raw_status_has_no_empty_parentheses():
    from polyproj.testing.conformance import _assert_kkt

    qp, solver = _qp(), pp.get_backend("ipm")
    sol = pp.Solution(x=np.array([0.5, 0.5]), z=np.array([0.5]), z_box=np.zeros(2),
                      status=pp.Status.SOLVED_INACCURATE, backend="ipm", qp=qp)
    with pytest.raises(AssertionError) as info:
        _assert_kkt(solver, qp, sol, "feasible")
    assert str(info.value).endswith("got SOLVED_INACCURATE"), str(info.value)
    sol.info["raw_status"] = "Almost solved"
    with pytest.raises(AssertionError, match=r"got SOLVED_INACCURATE \(Almost solved\)$"):
        _assert_kkt(solver, qp, sol, "feasible")


def test_the_report_text_aligns_its_columns_to_the_longest_name():
    results = tuple(chk.PropertyResult(n, "g", s, message="m") for n, s in
                    (("conformance:primal_infeasible", "passed"), ("qp_contract", "failed"),
                     ("a_name_longer_than_any_of_the_kit_s_own", "skipped")))
    lines = str(chk.CheckReport("b", results, 0, 1)).splitlines()[1:]
    columns = {line.index(r.status) for line, r in zip(lines, results)}
    assert columns == {2 + len("a_name_longer_than_any_of_the_kit_s_own") + 1}
