"""DIF engine, from a review (2026-12-07, each failing before its fix): ``influence(None)`` on the dense path scored
an undefined removal (the one sample of nonzero weight) as 0; the matrix-free ``active`` held a row's slack to an
absolute floor (a small removal's weakly active rows all "active"); a re-damping interrupted by KeyboardInterrupt
left the engine answering at a damping it did not report."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

import torch

from polyproj.adapters.dif import DIF, ConstrainedProblem, Constraint, Loss, solve
from polyproj.errors import ProblemError

pytestmark = [pytest.mark.filterwarnings("ignore::polyproj.errors.PolyprojWarning"),
              pytest.mark.usefixtures("one_torch_thread", "quiet_polyproj_warnings")]


def _one_weighted_problem():
    """Least squares with weights nonzero on sample 2 only (the loss renormalised by them) and a cap on θ₀."""
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(6, 2, dtype=torch.float64, generator=gen)
    y = torch.randn(6, dtype=torch.float64, generator=gen)
    w = torch.zeros(6, dtype=torch.float64)
    w[2] = 1.0
    loss = Loss(lambda th, b: 0.5 * (b[0] @ th - b[1]) ** 2 + 0.1 * (th ** 2).sum(), (X, y), weights=w)
    cap = Constraint(lambda th: th[0], None, tau=0.1, name="cap")
    problem = ConstrainedProblem(torch.zeros(2, dtype=torch.float64), loss, [cap])
    return problem, solve(problem)


@pytest.mark.parametrize("method", ["dense", "matrix-free"])
def test_influence_of_every_sample_refuses_removing_the_only_weighted_one(method):
    """Removing sample 2 leaves weights summing to 0 (the renormalised loss is undefined): ``influence(None)``
    refuses it as ``influence`` with that removal does, on every path (the dense path returned ω = 0 for it)."""
    problem, kkt = _one_weighted_problem()
    dif = DIF(problem, kkt, method=method)
    with pytest.raises(ProblemError, match="every sample of nonzero weight"):
        dif.influence(None, removals=[{"objective": [2]}])
    with pytest.raises(ProblemError, match="every sample of nonzero weight"):
        dif.influence(None)


@pytest.mark.parametrize("scale", [1.0, 1e-9])
def test_matrix_free_active_rows_are_judged_at_the_answers_scale(scale):
    """θ̄₀ = mean(b) = τ = 0 with λ̄ = 0: the cap θ₀ <= 0 is weakly active. Removing b₃ > 0 moves θ₀ below it
    by b₃ / N = 0.2 b₃ to first order (the cap then slack, as the dense path says); removing b₀ < 0 would push
    θ₀ past it (held at 0, active). At data of size 1e-9 the slack 2e-10 was under the matrix-free path's
    absolute 1e-8 floor."""
    b = torch.tensor([-1.0, -0.5, 0.5, 1.0, 0.0], dtype=torch.float64) * scale
    loss = Loss(lambda th, d: 0.5 * (th[0] - d[0]) ** 2 + 0.5 * (th[1] - 1.0) ** 2, (b,))
    problem = ConstrainedProblem(torch.zeros(2, dtype=torch.float64), loss,
                                 [Constraint(lambda th: th[0], None, tau=0.0, name="cap")])
    kkt = solve(problem)
    for method in ("dense", "matrix-free"):
        dif = DIF(problem, kkt, method=method)
        out, held = dif.result({"objective": [3]}), dif.result({"objective": [0]})
        np.testing.assert_allclose(out.omega.numpy(), [-0.2 * scale, 0.0], atol=1e-12 * scale)
        assert out.active == (), (method, out.active)
        assert abs(float(held.omega[0])) <= 1e-12 * scale and held.active == ("cap",), (method, held)


def test_an_interrupted_re_damping_keeps_the_previous_damping_in_force(study, monkeypatch):
    """damping="auto", matrix-free: a solve meeting negative curvature re-damps the engine (a new operator and
    V = H⁻¹Cᵀ). A KeyboardInterrupt during that set-up left the new inverse with the old ``damping`` (and V
    dropped), so later answers used a damping the engine did not report. The engine now changes only when the
    new set-up is complete: after the interrupt its answers are those of a DIF built at its reported damping."""
    from polyproj.adapters.dif import matfree
    from polyproj.adapters.dif.krylov import IndefiniteHessianError

    prob, kkt = study.problem, study.kkt
    rng = np.random.default_rng(5)
    rem = {"objective": np.sort(rng.choice(prob.objective.n_samples, 4, replace=False))}
    auto = DIF(prob, kkt, method="matrix-free", damping="auto", rtol=1e-12)
    floor = auto.damping
    solve_one, solve_many = matfree.KrylovInverse.solve, matfree.KrylovInverse.solve_many

    def curvature(self, b, what):
        raise IndefiniteHessianError("negative curvature (test)", -1e-3, 1.0)

    def interrupted(self, B, what):
        raise KeyboardInterrupt

    monkeypatch.setattr(matfree.KrylovInverse, "solve", curvature)
    monkeypatch.setattr(matfree.KrylovInverse, "solve_many", interrupted)
    with pytest.raises(KeyboardInterrupt):
        auto.delta_theta(rem)
    monkeypatch.setattr(matfree.KrylovInverse, "solve", solve_one)
    monkeypatch.setattr(matfree.KrylovInverse, "solve_many", solve_many)
    assert auto.damping == floor
    got = auto.delta_theta(rem).numpy()
    want = DIF(prob, kkt, method="matrix-free", damping=floor, rtol=1e-12).delta_theta(rem).numpy()
    assert np.abs(got - want).max() <= 1e-9 * np.abs(want).max(), np.abs(got - want).max()
