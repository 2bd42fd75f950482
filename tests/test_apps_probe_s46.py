"""The applications, from a probe (each failing before its fix): the radial peer map gave weights at 1e271 for
equal scores; a run that diverged from its first epoch was "ok" with the untrained model's metric; records read back
from the runner's JSON (NaN written as null) crashed the summary; the runner exited 0 with a failed row; a run's
process that died was reported with "exit code None"."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("skfolio")

from polyproj.apps import portfolio as P  # noqa: E402
from polyproj.apps.measure import Session  # noqa: E402
from polyproj.apps.records import EpochPoint, RunRecord, summarise  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("variant", ["simplex", "preference"])
def test_the_radial_map_of_equal_scores_is_feasible(variant):
    from polyproj.apps.peers import RadialMap, Rows

    cfg, n = P.config(False), 20
    rows = Rows.of(P.polyhedron(variant, cfg, n))
    f = RadialMap(rows, P.anchor(variant, cfg, n))
    g = torch.Generator().manual_seed(0)
    for noise in (0.0, 1e-16, 1e-15, 1e-13):
        u = (3.0 + noise * torch.randn(200, n, dtype=torch.float64, generator=g)).requires_grad_()
        y = f(u)
        assert float(rows.violation(y.detach().numpy()).max()) <= 1e-12
        y.sum().backward()
        assert bool(torch.isfinite(u.grad).all())


def test_a_run_that_diverges_from_its_first_epoch_fails():
    from polyproj.errors import SolverError

    cfg = dataclasses.replace(P.config(True), constraints=("capped",), epochs=1, lr=1e308)
    with pytest.raises(SolverError, match="training diverged"):
        P.run("radial", "capped", 0, cfg, Session())


def test_records_read_back_from_the_json_file(tmp_path):
    from polyproj.apps.runner import _write

    recs = [RunRecord("softmax_penalty", 0, "capped", max_violation=0.07, train_loss=math.nan, test_metric=math.nan,
                      time_s=1.0, peak_mem_mb=3.0, curve=(EpochPoint(1, 0.5, math.nan, math.inf),))]
    path = tmp_path / "x.json"
    _write(path, {"app": "portfolio"}, recs, complete=True)
    back = [RunRecord.from_json(r) for r in json.loads(path.read_text())["records"]]
    assert math.isnan(back[0].test_metric) and math.isnan(back[0].curve[0].val_metric)
    assert back[0].failed and summarise(back)[0].failed == 1


def _nan_run(method, variant, seed, cfg, session):
    return RunRecord(method, seed, variant, max_violation=0.0, train_loss=math.nan, test_metric=math.nan, time_s=1.0,
                     peak_mem_mb=1.0, curve=(EpochPoint(1, 0.0, math.nan, math.nan),))


def test_the_runner_exits_1_with_a_diverged_run(tmp_path, monkeypatch):
    import argparse

    from polyproj.apps import runner

    monkeypatch.setattr(P, "run", _nan_run)
    args = argparse.Namespace(app="portfolio", quick=True, seeds=1, out=str(tmp_path / "p.json"), methods=["radial"],
                              variants=["capped"], epochs=None, threads=1, in_process=True, timeout=60.0, no_plot=True)
    assert runner.cli_main(args) == 1


def _die(*args):
    import os

    os._exit(3)


def test_a_dead_run_process_reports_its_exit_code(monkeypatch):
    from polyproj.apps import runner

    monkeypatch.setattr(runner, "_child", _die)
    rec = runner._isolated("portfolio", "radial", "capped", 0, P.config(True), 1, 60.0)
    assert rec.failed and "exit code 3" in rec.status
    assert np.isnan(rec.test_metric)


@pytest.mark.parametrize("change", [{"start": "garbage"}, {"train_end": "2016-13-45"}, {"start": 2014}])
def test_bad_dates_are_refused_by_name(change):
    from polyproj.errors import ProblemError

    with pytest.raises(ProblemError, match=f"{next(iter(change))} must be a date"):
        P.run("fixed", "capped", 0, dataclasses.replace(P.config(True), **change), Session())


def test_widths_the_attention_cannot_split_are_refused_by_name():
    from polyproj.apps import matching as M
    from polyproj.apps import mhc as H
    from polyproj.errors import ProblemError

    with pytest.raises(ProblemError, match=r"width \(30\) must be a multiple of heads \(4\)"):
        H.run("polyproj", "", 0, dataclasses.replace(H.config(True), width=30, epochs=1), Session())
    with pytest.raises(ProblemError, match=r"hidden \(30\) must be a multiple of 4"):
        M.run("polyproj", "", 0, dataclasses.replace(M.config(True), hidden=30, epochs=1), Session())
