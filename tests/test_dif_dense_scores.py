"""The dense path's all-point scores in process: through the Schur complement where H is positive definite (one
Cholesky factorisation, a k-variable dual QP per removal), one d-variable QP per removal where it is not.

Both routes solve the same KKT system exactly (the dual QPs are polished), so their answers agree to rounding.
The in-process dense path used to solve one d-variable QP per sample (N 2,000, d 800: 109 s against 0.13 s).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from polyproj.adapters.dif import DIF

pytestmark = pytest.mark.usefixtures("one_torch_thread", "quiet_polyproj_warnings")


@pytest.mark.parametrize("rule", ["derivative", "finite"])
def test_dense_scores_take_the_schur_route_and_equal_the_qps(study, rule, monkeypatch):
    """Equality, binding, weakly active and inactive rows (the regression study): the scores of every single
    removal and of group removals equal ∇Fᵀω with ω from the QPs, without a d-variable QP."""
    dif = DIF(study.problem, study.kkt, method="dense", rule=rule)
    assert dif._inv.positive_definite
    F = study.test_loss
    gF = torch.func.grad(F)(study.kkt.theta).numpy()
    singles = dif.influence(None).numpy() @ gF  # ω by the QPs (the parameter changes keep that route)
    groups = [{"objective": np.arange(s, s + 7)} for s in range(0, 70, 10)]
    grouped = dif.delta_theta(groups).numpy() @ gF
    import polyproj.adapters.dif.qp as qp_mod

    sizes, real = [], qp_mod.solve_qp_exact_batch

    def counted(P, *args, **kwargs):
        sizes.append(P.shape[-1])
        return real(P, *args, **kwargs)

    monkeypatch.setattr(qp_mod, "solve_qp_exact_batch", counted)
    got = dif.influence(F, chunk_size=13).numpy()
    scale = np.abs(singles).max()
    np.testing.assert_allclose(got, singles, rtol=0, atol=1e-9 * scale)
    np.testing.assert_allclose(dif.influence(F, groups).numpy(), grouped, rtol=0, atol=1e-9 * np.abs(grouped).max())
    assert sizes and max(sizes) == dif.rows.size < study.problem.dim  # the dual QPs only (k variables, not d)


def test_a_singular_hessian_keeps_the_qp_route():
    """H singular along θ₀ (no damping), positive definite on the binding cap's null space: the Schur route would
    need H⁻¹, the QPs are defined, so the scores come from them and equal ∇Fᵀω."""
    from tests.dif_helpers import flat_along_a_cap

    prob, kkt = flat_along_a_cap(40)
    dif = DIF(prob, kkt, method="dense", damping=0.0)
    assert dif._inv.singular and not dif._inv.positive_definite

    def F(th):
        return th.sum() + (th ** 2).sum()

    want = dif.influence(None).numpy() @ torch.func.grad(F)(kkt.theta).numpy()
    got = dif.influence(F).numpy()
    assert np.all(np.isfinite(got)) and np.abs(want).max() > 0
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())
