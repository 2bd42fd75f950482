"""Smoke tests of the DIF benchmarks' quick modes (the full runs are benchmarks, not tests)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("sklearn")
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::polyproj.errors.PolyprojWarning")]


def test_fairness_quick(bench, tmp_path):
    # --precondition as the reported study runs (CG on the chord's factorised H̄: the same scores to the CG
    # tolerance; unpreconditioned CG took 150 iterations a solve here, 2.5 of the test's 6 minutes)
    mod = bench("dif_fairness")
    assert mod.main(["--quick", "--precondition", "--cache", str(tmp_path / "cache")]) == 0
    out = json.loads((tmp_path / "dif_fairness_quick.json").read_text())
    assert out["truth"]["n"] == 9 and out["truth"]["converged"] == 9 and out["truth"]["worst_residual"] <= 1e-10
    assert out["noise_floor"]["rows"][0]["converged"] and out["seed_to_seed"]["all_converged"]
    assert set(out["correlation"]) >= {"DIF", "classic IF", "TracIn"}
    # the per-removal predictions and the split by DIF's own flag (the full second-order correction is taken)
    pred, flag = out["predicted"], out["correlation_by_dif_flag"]
    assert len(pred["actual"]) == len(pred["DIF"]) == len(pred["keys"]) == 9
    assert flag["full_step"] + flag["shortened_or_not_applied"] == 9
    steps = out["dif_order2"]["step_length"]
    assert len(steps) == 9 and flag["full_step"] == sum(not s < 1.0 for s in steps)
    assert (tmp_path / "dif_fairness_quick.png").stat().st_size > 0


def test_scale_quick(bench, tmp_path):
    mod = bench("dif_scale")
    assert mod.main(["--quick", "--loo-samples", "1"]) == 0
    out = json.loads((tmp_path / "dif_scale_quick.json").read_text())
    assert out["dif"]["peak_rss_mb"] > 0 and out["loo"]["extrapolated_all_points_s"] > 0


def test_counterfactual_quick(bench, tmp_path):
    mod = bench("dif_counterfactual")
    assert mod.main(["--quick", "--fracs", "0.05"]) == 0
    out = json.loads((tmp_path / "dif_counterfactual_quick.json").read_text())
    assert set(out["table"]) == {f"0.05/{m}" for m in ("DIF", "TracIn", "Penalty-IF", "random")}
