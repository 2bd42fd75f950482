"""Inputs held to their contracts: a backend's ``solve_projections`` answer and ``polyproj bench apps``'s refusals.

- A third-party ``solve_projections`` returning a malformed :class:`ProjectionStart` (``y`` a row short, ``None``,
  a dict, a short ``status``) crashed ``pp.project`` with raw ValueError / AttributeError / TypeError from deep in the
  polish; ``solve`` / ``solve_batch`` answers of the wrong form were SolverErrors naming the backend already.
- ``polyproj bench apps`` exited 1 (the code of a failed run) on bad input where argparse, ``check`` and ``bench
  solvers`` exit 2, and ``mhc --variants x`` offered the choices ``['']``.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

import polyproj as pp
from polyproj.backends.ipm import IPMSolver
from polyproj.backends.projection import ProjectionStart

# --------------------------------------------------------------------------- solve_projections' answer
#: {y : y1 + y2 <= 1, y >= 0} and three points; their projections by hand (KKT: x - y = λ (1, 1) - μ, λ, μ >= 0):
#: (2, 2) -> (0.5, 0.5) (λ = 1.5); (0.1, 0.1) is inside; (-1, 3) -> (0, 1) (λ = 2, μ1 = 3)
POLY = dict(A=[[1.0, 1.0]], a=[1.0], lb=[0.0, 0.0])
X = np.array([[2.0, 2.0], [0.1, 0.1], [-1.0, 3.0]])
EXACT = np.array([[0.5, 0.5], [0.1, 0.1], [0.0, 1.0]])


def _backend(edit):
    """An IPM whose ``solve_projections`` answer is ``edit(start)`` (a third party's override)."""

    class Edited(IPMSolver):
        name = "edited_sp"

        def solve_projections(self, X, data, *, rough=False):
            return edit(super().solve_projections(X, data, rough=rough))

    return Edited()


MALFORMED = {
    "y a row short": (lambda s: replace(s, y=s.y[:-1]), r"y has shape \(2, 2\); expected \(3, 2\)"),
    "None": (lambda s: None, "returned NoneType from solve_projections"),
    "a dict": (lambda s: {"y": s.y}, "returned dict from solve_projections"),
    "status short": (lambda s: replace(s, status=s.status[:2]), "status is 2 values; expected a tuple of 3"),
    "status of strings": (lambda s: replace(s, status=tuple(x.name for x in s.status)),
                          "status holds 'SOLVED' of type str"),
    "mult of the QP's layout": (lambda s: replace(s, mult=s.mult[:, :1]),
                                r"mult has shape \(3, 1\); expected \(3, 5\)"),
    "mu with a column": (lambda s: replace(s, mu=np.zeros((3, 1))), r"mu has shape \(3, 1\); expected \(3, 0\)"),
    "y of strings": (lambda s: replace(s, y=[["a", "b"]] * 3), "y \\(list\\) is not an array of numbers"),
    "y complex": (lambda s: replace(s, y=s.y + 0j), "y is complex"),
    "accuracy NaN": (lambda s: replace(s, accuracy=float("nan")), "accuracy is nan; expected a non-negative finite"),
    "accuracy None": (lambda s: replace(s, accuracy=None), "accuracy is None"),
}


@pytest.mark.core
@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_projection_start_is_a_solver_error_naming_the_backend(case):
    edit, what = MALFORMED[case]
    with pytest.raises(pp.SolverError, match=rf"backend 'edited_sp' .*{what}"):
        pp.project(X, pp.Polyhedron(**POLY), backend=_backend(edit), structured=False)


@pytest.mark.core
def test_a_projection_start_of_lists_is_taken_in_the_inputs_namespace():
    """Lists (as ``solve_batch``'s answers are converted to float64 arrays) become arrays of X's dtype: the exact
    projections come back; they were a TypeError in the polish."""
    edit = lambda s: replace(s, y=s.y.tolist(), mult=s.mult.tolist(), mu=s.mu.tolist(),  # noqa: E731
                             status=list(s.status))
    res = pp.project(X, pp.Polyhedron(**POLY), backend=_backend(edit), structured=False)
    np.testing.assert_allclose(res.y, EXACT, atol=1e-12)
    assert all(s is pp.Status.SOLVED for s in res.status)


@pytest.mark.core
def test_the_check_passes_a_well_formed_start_through_unchanged():
    """The check costs shape tests only: a well-formed start is the very object the backend returned."""
    from polyproj.backends.validation import check_projection_start
    from polyproj.polydata import PolyData

    data = PolyData.from_polyhedron(pp.Polyhedron(**POLY))
    start = IPMSolver().solve_projections(X, data)
    assert isinstance(start, ProjectionStart)
    assert check_projection_start(start, X, data, "ipm") is start


# --------------------------------------------------------------------------- polyproj bench apps: refusals
@pytest.fixture(scope="module")
def apps():
    """The applications' modules (torch and the apps imported once, ~5 s, not inside each test)."""
    pytest.importorskip("torch")
    import importlib

    from polyproj.apps.runner import APPS

    return [importlib.import_module(m) for m in APPS.values()]


@pytest.mark.parametrize(("argv", "said"), [
    (["matching", "--methods", "nosuch"], r"unknown method\(s\) \['nosuch'\] for matching; choose from \['polyproj'"),
    (["portfolio", "--variants", "nosuch"], r"unknown variant\(s\) \['nosuch'\] for portfolio; choose from "
                                            r"\['preference', 'capped', 'simplex'\]"),
    (["mhc", "--variants", "x"], r"unknown variant\(s\) \['x'\] for mhc; mhc has no variants \(drop --variants\)"),
    (["mhc", "--methods", "polyproj", "polyproj"], "names a method twice"),
])
def test_bench_apps_refuses_bad_input_with_status_2_on_stderr(argv, said, apps, tmp_path, capsys, monkeypatch):
    import polyproj.apps.runner as runner
    from polyproj.cli import main

    def trained(*a, **k):
        raise AssertionError("trained")

    monkeypatch.setattr(runner, "_run_here", trained)
    monkeypatch.setattr(runner, "_isolated", trained)
    out = tmp_path / "x.json"
    with pytest.raises(SystemExit) as info:
        main(["bench", "apps", *argv, "--no-plot", "--out", str(out)])
    assert info.value.code == 2  # the interpreter's exit status: 1 is a failed run
    err = capsys.readouterr().err
    assert re.search(said, err), err
    assert "['']" not in err
    assert not out.exists()
