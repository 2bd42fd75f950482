"""``benchmarks/bench_layer.py`` (issue 19's benchmark) runs on a clean checkout: a small sweep, its JSON rows.

Not a timing test (speed targets are met in the benchmark's own runs, recorded in the README): it checks
that the script runs, writes its JSON and plot, and that every row it reports for polyproj is exact.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]


def test_bench_layer_quick_sweep_writes_exact_rows(tmp_path):
    methods = ["polyproj"] + (["moreau"] if importlib.util.find_spec("moreau") else [])
    out = tmp_path / "layer.json"
    env = {**os.environ, "RAYON_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_layer.py"), "--quick", "--only", "batch",
                          "--batches", "1", "16", "--methods", *methods, "--no-memory", "--out", str(out), "--fresh"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(out.read_text())
    configs = {tuple(sorted(s["config"].items())): s for s in data["sweep_batch"]}
    assert {dict(c)["batch"] for c in configs} == {1, 16}
    for sweep in data["sweep_batch"]:
        rows = {r["method"]: r for r in sweep["rows"]}
        assert set(methods) <= set(rows)
        mine = rows["polyproj"]
        assert mine["time_s"] > 0 and mine["max_violation"] <= 1e-9
        assert mine["y_error"] <= 1e-9 and mine["grad_rel_error"] <= 1e-8
        if "moreau" in rows:
            assert "moreau" in sweep["ratios"] and sweep["ratios"]["moreau"]["speedup"] > 0
    assert out.with_suffix(".png").exists()
