"""ProxSuite's staged solve and ``time_limit`` (a probe, 2026-12-07; each failing before its fix)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import polyproj as pp

pytest.importorskip("proxsuite")


def _qp():
    """min ½|x|² − 1ᵀx on x₁ + x₂ <= 1, x >= 0: x* = (½, ½), z* = ½."""
    return pp.QP(P=np.eye(2), q=[-1.0, -1.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0], lb=[0.0, 0.0])


def test_a_warm_start_that_did_not_converge_is_dropped_for_the_full_run():
    """A multiplier warm start of 1e10 keeps ProxQP from converging in its first FIRST_BUDGET outer iterations; the
    full run then started from it too and took ~10⁷ iterations (44 s) to MAX_ITER. It now starts cold: SOLVED."""
    ws = {"x": np.zeros(2), "z": np.array([1e10]), "z_box": np.zeros(2)}
    sol = pp.solve_qp(_qp(), backend="proxsuite", warm_start=ws)
    assert sol.status is pp.Status.SOLVED
    np.testing.assert_allclose(sol.x, [0.5, 0.5], atol=1e-6)
    assert sol.iterations < 100_000


def test_max_iter_past_the_time_limit_is_time_limit_and_not_resumed(monkeypatch):
    """A first run that ends MAX_ITER after the time limit has passed is TIME_LIMIT, with no second run (ProxQP
    cannot be stopped once started: the second run had no bound at all)."""
    from polyproj.backends import proxsuite

    calls = []
    once = proxsuite.ProxSuiteSolver._solve_once

    def slow_first(self, qp, warm_start, rho=None, first_budget=False):
        calls.append(first_budget)
        sol = once(self, qp, warm_start, rho, first_budget)
        return replace(sol, status=pp.Status.MAX_ITER, solve_time=5.0)  # as if it had run 5 s

    monkeypatch.setattr(proxsuite.ProxSuiteSolver, "_solve_once", slow_first)
    sol = pp.get_backend("proxsuite", time_limit=1.0).solve(_qp())
    assert sol.status is pp.Status.TIME_LIMIT
    assert calls == [True]
