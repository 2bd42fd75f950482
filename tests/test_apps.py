"""``polyproj bench apps``: smoke runs of the three applications (their --quick presets), the JSON rows,
polyproj's feasibility in every row, the peers' maps, and the import isolation of the command."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import polyproj as pp  # noqa: E402
from polyproj.cli import main  # noqa: E402

ROW_KEYS = {"method", "max_violation", "train_loss", "test_metric", "time_s", "peak_mem_mb"}


def _run(tmp_path, app, *extra):
    out = tmp_path / f"{app}.json"
    code = main(["bench", "apps", app, "--quick", "--out", str(out), *extra])
    payload = json.loads(out.read_text())
    return code, payload, out


def _check_rows(payload, methods):
    rows = payload["records"]
    assert payload["complete"] and {r["method"] for r in rows} == set(methods)
    for r in rows:
        assert ROW_KEYS <= set(r), r
        assert r["status"] == "ok", r["status"]
        if r["method"].startswith("polyproj"):
            assert r["max_violation"] <= 1e-9, r  # exact to rounding in float64
        if r["method"] != "fixed":
            assert r["time_s"] > 0 and len(r["curve"]) == payload["config"]["epochs"]


def test_portfolio_quick_in_process(tmp_path, capsys):
    pytest.importorskip("skfolio")
    pytest.importorskip("LinSATNet")
    methods = ["fixed", "polyproj", "linsatnet", "softmax_penalty", "radial"]
    code, payload, _ = _run(tmp_path, "portfolio", "--in-process", "--epochs", "1", "--methods", *methods)
    assert code == 0
    _check_rows(payload, methods)
    assert set(payload["variants"]) == {"preference", "capped"}
    assert "test Sharpe" in capsys.readouterr().out  # the table
    for v in payload["variants"]:
        assert (tmp_path / f"portfolio_{v}.png").stat().st_size > 10_000
    worst = {r["method"]: r["max_violation"] for r in payload["records"] if r["variant"] == "preference"}
    assert worst["softmax_penalty"] >= 0 and worst["radial"] <= 1e-12  # interior map: feasible by construction


def test_matching_quick_in_a_fresh_process_per_run(tmp_path):
    pytest.importorskip("LinSATNet")
    code, payload, _ = _run(tmp_path, "matching", "--epochs", "1", "--methods", "polyproj", "linsatnet_i10",
                            "--no-plot")
    assert code == 0 and payload["isolated"]
    _check_rows(payload, ["polyproj", "linsatnet_i10"])
    for r in payload["records"]:
        assert 0.0 <= r["test_metric"] <= 1.0 and r["peak_mem_mb"] >= 0


def test_mhc_quick_in_process(tmp_path):
    pytest.importorskip("sklearn")
    code, payload, _ = _run(tmp_path, "mhc", "--in-process", "--epochs", "1", "--no-plot")
    assert code == 0
    _check_rows(payload, ["polyproj", "sinkhorn20", "sinkhorn30"])
    viol = {r["method"]: r["max_violation"] for r in payload["records"]}
    assert viol["sinkhorn20"] > 1e-9  # Sinkhorn's row sums are off after finitely many iterations


@pytest.mark.slow
@pytest.mark.parametrize("app", ["portfolio", "matching", "mhc"])
def test_quick_preset_with_every_method(tmp_path, app):
    """The whole --quick run of each application, every method in its own process (a few minutes each)."""
    for mod in ("skfolio", "LinSATNet", "sklearn", "qpth", "cvxpylayers", "moreau"):
        pytest.importorskip(mod)
    code, payload, _ = _run(tmp_path, app)
    assert code == 0
    from polyproj.apps.runner import APPS

    methods = __import__(APPS[app], fromlist=["METHODS"]).METHODS
    _check_rows(payload, methods)


def test_a_failing_run_is_a_row_not_the_end():
    """An exception in a training run's process becomes that row's status (the runner goes on)."""
    from polyproj.apps import mhc
    from polyproj.apps.runner import _isolated

    rec = _isolated("mhc", "nope", "", 0, mhc.config(True), 1, 120.0)
    # (a ProblemError, as for the portfolio's unknown methods; it was a bare ValueError)
    assert rec.status.startswith("ProblemError") and "nope" in rec.status and rec.method == "nope"


def test_unknown_method_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="unknown method"):
        main(["bench", "apps", "mhc", "--quick", "--methods", "sinkhorn7", "--out", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit, match="unknown variant"):
        main(["bench", "apps", "portfolio", "--quick", "--variants", "nosuch", "--out", str(tmp_path / "x.json")])
    for flag in ("--seeds", "--epochs", "--threads"):
        with pytest.raises(SystemExit) as info:
            main(["bench", "apps", "mhc", "--quick", flag, "0", "--out", str(tmp_path / "x.json")])
        assert info.value.code == 2
    assert not (tmp_path / "x.json").exists()


def test_the_command_imports_no_torch():
    code = ("import sys; import polyproj.cli as c; c.build_parser(); import polyproj.apps.runner, "
            "polyproj.apps.records, polyproj.apps.measure; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------------- the peers' maps
def test_sinkhorn_has_unit_column_sums_and_converges():
    from polyproj.apps.peers import sinkhorn

    logits = torch.randn(5, 4, 4, dtype=torch.float64)
    M = sinkhorn(logits, 20)
    assert torch.allclose(M.sum(-2), torch.ones(5, 4, dtype=torch.float64), atol=1e-14)
    err = lambda k: float((sinkhorn(logits, k).sum(-1) - 1).abs().max())  # noqa: E731
    assert err(200) < err(20) and err(200) < 1e-8


def test_radial_map_is_strictly_feasible_and_full_rank():
    from polyproj.apps.peers import RadialMap, Rows
    from polyproj.problem import Polyhedron

    n = 6
    s = np.r_[np.ones(2), np.zeros(4)]
    rows = Rows.of(Polyhedron(A=-s[None], a=[-0.5], B=np.ones((1, n)), b=[1.0], lb=np.zeros(n)))
    z0 = np.r_[np.full(2, 0.3), np.full(4, 0.1)]
    f = RadialMap(rows, z0)
    u = 10.0 * torch.randn(200, n, dtype=torch.float64)
    y = f(u).detach().numpy()
    assert (rows.h - y @ rows.G.T).min() > 0  # interior: every inequality strict
    assert np.abs(y.sum(1) - 1).max() < 1e-12
    J = torch.autograd.functional.jacobian(f, u[:1])[0, :, 0, :].numpy()  # (n, n) at one point
    assert np.linalg.matrix_rank(J, tol=1e-10) == n - 1  # full rank on the affine hull (one equality)
    with pytest.raises(ValueError, match="strictly inside"):
        RadialMap(rows, np.r_[np.full(2, 0.25), np.full(4, 0.125)])  # on the preference row


def test_qp_layers_agree_with_the_projection():
    pytest.importorskip("qpth")
    from polyproj.adapters.torch import project
    from polyproj.apps.peers import QPLayer, Rows
    from polyproj.problem import Polyhedron

    n = 5
    P = Polyhedron(A=-np.r_[1.0, 1.0, 0, 0, 0][None], a=[-0.5], B=np.ones((1, n)), b=[1.0], lb=np.zeros(n))
    x = torch.randn(7, n, dtype=torch.float64)
    ref = project(x, P)
    for lib in ("qpth", "moreau"):
        pytest.importorskip(lib)
        assert torch.allclose(QPLayer(Rows.of(P), lib)(x), ref, atol=1e-6), lib


def test_portfolio_sets_check_their_configuration():
    import dataclasses

    from polyproj.apps import portfolio as pf
    from polyproj.errors import ProblemError

    cfg = pf.config(True)
    for bad, match in (({"preferred": 20}, "preferred must be"), ({"preferred": 25}, "preferred must be"),
                       ({"min_preferred": 1.5}, "min_preferred")):
        for fn in (pf.anchor, pf.polyhedron):
            with pytest.raises(ProblemError, match=match):
                fn("preference", dataclasses.replace(cfg, **bad), 20)
    with pytest.raises(ProblemError, match="'simplex'"):
        pf.polyhedron("foo", cfg, 20)
    assert abs(pf.anchor("preference", cfg, 20).sum() - 1.0) < 1e-12


def test_app_models_run_in_float32_and_an_unwritable_out_fails_first(tmp_path):
    import torch

    from polyproj.apps import mhc
    from polyproj.apps import portfolio as pf

    for method in ("polyproj", "sinkhorn20"):  # a model in the default dtype (run() makes it float64)
        net = mhc.Net(mhc.Config(blocks=2, width=8, heads=2, streams=3), method)
        out = net(torch.rand(5, 64))
        out.sum().backward()
        assert out.dtype == torch.float32 and bool(torch.isfinite(out).all())
    head = pf.Head("softmax_penalty", "preference", pf.config(True), 20)
    assert head.penalty(head(torch.randn(2, 20))).dtype == torch.float32
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(SystemExit, match="cannot write the results"):  # before any training run
        main(["bench", "apps", "mhc", "--quick", "--in-process", "--epochs", "1", "--methods", "sinkhorn20",
              "--no-plot", "--out", str(blocked / "x.json")])


def test_portfolio_sets_refuse_unknown_variants_and_empty_caps():
    """anchor("bogus") returned the preference anchor, and anchor("capped") with n · cap <= 1 a portfolio above the
    cap ([1/3] * 3 for a cap of 0.2), where polyhedron() and projection_set() refuse."""
    import polyproj as pp
    from polyproj.apps import portfolio

    cfg = portfolio.Config()
    with pytest.raises(pp.ProblemError, match="unknown portfolio constraint 'bogus'"):
        portfolio.anchor("bogus", cfg, 20)
    for f in (portfolio.anchor, portfolio.polyhedron):
        with pytest.raises(pp.ProblemError, match="n · cap = 0.6 must exceed 1"):
            f("capped", cfg, 3)
    w = portfolio.anchor("capped", cfg, 20)
    assert np.isclose(w.sum(), 1.0) and w.max() < cfg.cap


def test_non_finite_outputs_are_not_hidden_by_the_reports():
    """A probe: Python's max dropped a NaN violation after a finite one (mHC reported 0.0 for NaN matrices), and the
    summary's spreads over finite values counted a diverged seed as ok and left it out of every column."""
    import math

    from polyproj.apps import mhc
    from polyproj.apps.records import RunRecord, summarise, worst

    assert math.isnan(worst([0.0, math.nan, 1.0])) and math.isnan(worst([math.nan, 0.0]))
    assert worst([0.5, 2.0]) == 2.0 and worst([]) == 0.0
    net = mhc.Net(mhc.config(True), "sinkhorn20").double()
    for b in net.blocks:
        b.last_res = torch.full((1, 4, 4), float("nan"), dtype=torch.float64)
    assert math.isnan(net.doubly_stochastic_violation())
    s = summarise([RunRecord("m", 0, max_violation=1e-3, test_metric=0.9),
                   RunRecord("m", 1, max_violation=math.inf, test_metric=math.nan)])[0]
    assert (s.runs, s.failed) == (2, 1) and s.spreads["max_violation"].n == 1


def test_sinkhorn_survives_rows_far_below_the_others():
    from polyproj.apps.peers import sinkhorn

    out = sinkhorn(torch.tensor([[0.0, 0.0], [-800.0, -800.0]], dtype=torch.float64), 20)
    torch.testing.assert_close(out, torch.full((2, 2), 0.5, dtype=torch.float64))


def test_app_settings_are_checked_by_name_before_training():
    """train = 0 ended in an empty StopIteration, epochs = 0 in an IndexError, inliers = 10.5 in a TypeError,
    horizon = 1 in "x contains NaN"; min_preferred = 1 passed its check and the radial map raised ValueError."""
    from dataclasses import replace

    from polyproj.apps import matching, mhc, portfolio
    from polyproj.apps.measure import Session
    from polyproj.runtime import set_torch_threads

    cfg = matching.config(True)
    for field, value in (("train", 0), ("epochs", 0), ("inliers", 10.5), ("lr", float("nan")), ("batch", True)):
        with pytest.raises(pp.ProblemError, match=f"Config.{field} must be"):
            matching.run("polyproj", "", 0, replace(cfg, **{field: value}), Session())
    with pytest.raises(pp.ProblemError, match="Config.epochs must be an integer >= 1"):
        mhc.run("sinkhorn20", "", 0, replace(mhc.config(True), epochs=0), Session())
    with pytest.raises(pp.ProblemError, match="Config.horizon must be an integer >= 2"):
        portfolio.run("polyproj", "simplex", 0, replace(portfolio.config(True), horizon=1), Session())
    with pytest.raises(pp.ProblemError, match="unknown mHC method"):
        mhc.Net(mhc.config(True), "nope")
    with pytest.raises(pp.ProblemError, match="min_preferred = 1 leaves no strictly feasible portfolio"):
        portfolio.anchor("preference", replace(portfolio.config(True), min_preferred=1.0), 20)
    for bad in (0, -1, 2.5):
        with pytest.raises(pp.SettingsError, match="thread count must be an integer >= 1"):
            set_torch_threads(bad)


def test_portfolio_dates_outside_the_data_are_named():
    pytest.importorskip("skfolio")
    from dataclasses import replace

    from polyproj.apps import portfolio

    with pytest.raises(pp.ProblemError, match="the validation period holds no day"):
        portfolio.load(replace(portfolio.config(True), train_end="2030-01-01", val_end="2031-01-01"))


def test_bench_apps_without_torch_is_a_clear_message(tmp_path):
    code = ("import sys; sys.modules['torch'] = None\n"
            "from polyproj.cli import main\n"
            f"sys.exit(main(['bench', 'apps', 'mhc', '--quick', '--no-plot', '--out', {str(tmp_path / 'x.json')!r}]))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert "needs 'torch'" in run.stderr
