"""``polyproj check module:attr`` on a set (DESIGN §12: sets that break the contract are caught by it too)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

MODULE = textwrap.dedent('''
    import dataclasses
    import numpy as np
    import polyproj as pp

    simplex = pp.sets.Simplex(4)

    def make():
        return pp.Polyhedron(A=np.ones((1, 3)), a=np.ones(1), lb=np.zeros(3))

    class Broken(pp.sets.Simplex):
        """A simplex whose projections are 1 % off: not a projection."""

        def project_batch(self, X, **kw):
            r = super().project_batch(X, **kw)
            return dataclasses.replace(r, y=r.y * 1.01)

    def broken():
        return Broken(4)

    def not_a_set():
        return 3

    def needs_args(n):
        return pp.sets.Simplex(n)

    def factory_raising():
        return pp.sets.Simplex("four")
''')


def check(tmp_path, *args):
    (tmp_path / "mysets.py").write_text(MODULE)
    return subprocess.run([sys.executable, "-m", "polyproj", "check", *args, "--examples", "4"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("target", ["mysets:simplex", "mysets:make"])
def test_a_set_that_keeps_the_contract_passes(tmp_path, target):
    r = check(tmp_path, target)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all properties hold" in r.stdout and "conservativity" in r.stdout


def test_a_set_that_breaks_it_fails(tmp_path):
    r = check(tmp_path, "mysets:broken")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL" in r.stdout


@pytest.mark.parametrize(("target", "says"), [("mysets:not_a_set", "returned int"),
                                              ("mysets:needs_args", "needs arguments"),
                                              ("mysets:factory_raising", "raised"),
                                              ("mysets:missing", "has no attribute")])
def test_what_is_not_a_set_is_a_clear_error(tmp_path, target, says):
    r = check(tmp_path, target)
    assert r.returncode == 2 and says in r.stderr, r.stdout + r.stderr


def test_backend_tolerances_are_refused_for_a_set(tmp_path):
    r = check(tmp_path, "mysets:simplex", "--eps-abs", "1e-9")
    assert r.returncode == 2 and "a set is checked at its own" in r.stderr
