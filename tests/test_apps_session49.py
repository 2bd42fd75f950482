"""The applications, from a probe (each failing before its fix): mHC's Sinkhorn baseline gave NaN for a column of
logits far below the others (exp underflowed to a column of zeros, 0 / 0); finite but out-of-range settings
(``rotation = -5``, ``shear = -0.1``, ``lr = -1``) ended in raw NumPy / torch errors and ``linsat_tau = 0`` in an
"ok" run with NaN metrics, where ``check_config`` only asked floats to be finite."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from polyproj.apps import matching, mhc, portfolio  # noqa: E402
from polyproj.apps.measure import Session  # noqa: E402
from polyproj.apps.peers import sinkhorn  # noqa: E402
from polyproj.errors import ProblemError  # noqa: E402

F64 = torch.float64


def _plain_sinkhorn(logits, iters):
    """The textbook loop (exp, divide by row sums, then column sums): the reference on ordinary logits."""
    M = torch.exp(logits)
    for _ in range(iters):
        M = M / M.sum(-1, keepdim=True)
        M = M / M.sum(-2, keepdim=True)
    return M


# ----------------------------------------------------------------------------- Sinkhorn
def test_sinkhorn_of_a_column_far_below_the_others_is_finite_and_doubly_stochastic():
    out = sinkhorn(torch.tensor([[[0.0, -800.0], [0.0, -800.0]]], dtype=F64), 20)
    torch.testing.assert_close(out, torch.full((1, 2, 2), 0.5, dtype=F64), rtol=0, atol=1e-15)
    # logits a_i + b_j: exp(logits) is a row scaling times a column scaling of the all-ones matrix, so every
    # Sinkhorn iterate is the all-ones matrix / k, whatever the offsets (here columns 750-1000 below the others)
    g = torch.Generator().manual_seed(0)
    a, b = 3 * torch.randn(6, 5, 1, generator=g, dtype=F64), 3 * torch.randn(6, 1, 5, generator=g, dtype=F64)
    b[:, :, 1], b[::2, :, 3] = -1000.0, -750.0
    for iters in (1, 2, 20):
        torch.testing.assert_close(sinkhorn(a + b, iters), torch.full((6, 5, 5), 0.2, dtype=F64), rtol=0, atol=1e-13)
    # the limit is unchanged by a column offset: the scaled problem converges to the unscaled one's limit
    L = torch.randn(4, 3, 3, generator=g, dtype=F64)
    shift = torch.tensor([0.0, -900.0, 0.0], dtype=F64)
    torch.testing.assert_close(sinkhorn(L + shift, 400), sinkhorn(L, 400), rtol=0, atol=1e-12)
    assert bool(torch.isfinite(sinkhorn((L + shift).float(), 20)).all())  # float32 too


def test_sinkhorn_gradients_at_far_apart_logits():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 3, generator=g, dtype=F64)
    x[..., 2] -= 800.0  # a whole column underflows after exp(logits - row max)
    x.requires_grad_()
    assert torch.autograd.gradcheck(lambda t: sinkhorn(t, 5), (x,))
    y = torch.randn(2, 4, 4, generator=g, dtype=F64, requires_grad=True)  # ordinary logits, more iterations
    assert torch.autograd.gradcheck(lambda t: sinkhorn(t, 20), (y,))


def test_sinkhorn_matches_the_plain_loop_on_ordinary_logits():
    g = torch.Generator().manual_seed(2)
    for scale in (0.3, 1.0, 4.0):
        x = (scale * torch.randn(32, 4, 4, generator=g, dtype=F64)).requires_grad_()
        w = torch.randn(32, 4, 4, generator=g, dtype=F64)
        for iters in (1, 20, 30):
            new, ref = sinkhorn(x, iters), _plain_sinkhorn(x, iters)
            torch.testing.assert_close(new, ref, rtol=0, atol=1e-12)
            (g_new,), (g_ref,) = (torch.autograd.grad((m * w).sum(), x) for m in (new, ref))
            torch.testing.assert_close(g_new, g_ref, rtol=0, atol=1e-12)
    assert torch.allclose(sinkhorn(x.detach(), 0), torch.exp(x - x.amax(-1, keepdim=True)))  # iters = 0: unchanged


# ----------------------------------------------------------------------------- settings
_SMALL_MATCHING = dict(train=32, val=8, test=8, epochs=1, hidden=8, layers=1)


@pytest.mark.parametrize(("change", "message"), [
    ({"rotation": -5.0}, r"Config.rotation must be a finite number >= 0, got -5.0"),
    ({"shear": -0.1}, r"Config.shear must be a finite number >= 0, got -0.1"),
    ({"translation": -0.2}, r"Config.translation must be a finite number >= 0"),
    ({"noise": -0.01}, r"Config.noise must be a finite number >= 0"),
    ({"scaling": 1.0}, r"Config.scaling must be a finite number in \[0, 1\), got 1.0"),
    ({"scaling": -0.1}, r"Config.scaling must be a finite number in \[0, 1\)"),
    ({"lr": -1.0}, r"Config.lr must be a finite number > 0, got -1.0"),
    ({"lr": 0.0}, r"Config.lr must be a finite number > 0"),
    ({"linsat_tau": 0.0}, r"Config.linsat_tau must be a finite number > 0, got 0.0"),
    ({"f1_target": 1.5}, r"Config.f1_target must be a finite number in \[0, 1\]"),
    ({"outliers": -1}, r"Config.outliers must be an integer >= 0"),
])
def test_out_of_range_matching_settings_are_refused_by_name(change, message):
    cfg = dataclasses.replace(matching.config(True), **_SMALL_MATCHING, **change)
    with pytest.raises(ProblemError, match=message):
        matching.run("linsatnet_i10" if "linsat_tau" in change else "polyproj", "", 0, cfg, Session())


@pytest.mark.parametrize(("app", "change", "message"), [
    (mhc, {"lr": -1.0}, r"Config.lr must be a finite number > 0, got -1.0"),
    (mhc, {"streams": 0}, r"Config.streams must be an integer >= 1"),
    (portfolio, {"lr": -1.0}, r"Config.lr must be a finite number > 0, got -1.0"),
    (portfolio, {"penalty": -1.0}, r"Config.penalty must be a finite number >= 0"),
    (portfolio, {"leak": 1.5}, r"Config.leak must be a finite number in \[0, 1\]"),
    (portfolio, {"min_preferred": -0.5}, r"Config.min_preferred must be a finite number in \[0, 1\]"),
    (portfolio, {"cap": 0.0}, r"Config.cap must be a finite number > 0"),
    (portfolio, {"linsat_tau": -0.05}, r"Config.linsat_tau must be a finite number > 0"),
    (portfolio, {"preferred": 0}, r"Config.preferred must be an integer >= 1"),
    (portfolio, {"horizon": 1}, r"Config.horizon must be an integer >= 2"),
])
def test_out_of_range_mhc_and_portfolio_settings_are_refused_by_name(app, change, message):
    cfg = dataclasses.replace(app.config(True), epochs=1, **change)
    method, variant = ("polyproj", "") if app is mhc else ("polyproj", "capped")
    with pytest.raises(ProblemError, match=message):
        app.run(method, variant, 0, cfg, Session())


@pytest.mark.parametrize("app", [matching, mhc, portfolio])
def test_every_numeric_setting_has_a_stated_range_that_the_presets_meet(app):
    from polyproj.apps.training import check_config

    numeric = {f.name for f in dataclasses.fields(app.Config) if f.type in ("int", "float")}
    assert numeric == set(app.RANGES)
    for quick in (True, False):
        check_config(app.config(quick), app.RANGES)
    edges = {matching: dict(rotation=0.0, noise=0.0, scaling=0.0, f1_target=1.0, outliers=0),
             mhc: dict(gate_scale=-2.0), portfolio: dict(penalty=0.0, leak=1.0, min_preferred=0.0)}[app]
    check_config(dataclasses.replace(app.config(True), **edges), app.RANGES)  # the closed ends are allowed
    with pytest.raises(TypeError, match="has no field nosuch"):
        check_config(app.config(True), {"nosuch": app.RANGES["epochs"]})
