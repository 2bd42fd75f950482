"""Shared helpers of the benchmark scripts: machine description, timing, JSON output."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    """A description of the machine the figures were measured on."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    try:
        info["cpu_model"] = next(
            line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    try:
        info["load_average"] = os.getloadavg()
    except OSError:
        pass
    try:
        info["git_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                            text=True, check=False).stdout.strip()
    except OSError:
        pass
    return info


def median_time(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> tuple[float, list[float]]:
    """Median wall time of ``fn`` over ``repeats`` runs (after ``warmup`` runs)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def write_json(name: str, payload: dict[str, Any]) -> Path:
    """Write ``payload`` with the machine description to ``benchmarks/results/<name>.json``."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"machine": machine(), **payload}
    path.write_text(json.dumps(payload, indent=2, default=float) + "\n")
    return path


def quick_name(name: str, quick: bool) -> str:
    """The results name of a run: ``<name>_quick`` for a ``--quick`` smoke run, so that it never replaces the
    published ``<name>.json`` (bench_sets.py and the dif_*.py scripts name their smoke runs so)."""
    return f"{name}_quick" if quick else name


def write_results(out: str | os.PathLike, payload: dict[str, Any]) -> Path:
    """:func:`write_json` for a ``--out`` that is a name or a path: ``x.json`` is written as it is; anything else
    gets ``.json`` appended, relative to ``benchmarks/results`` (a name: ``warm_start``; an absolute path without
    the suffix, as :func:`write_json` took it: ``/tmp/run1`` is ``/tmp/run1.json``)."""
    out = os.fspath(out)
    path = Path(out) if out.endswith(".json") else RESULTS / f"{out}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine(), **payload}, indent=2, default=float) + "\n")
    return path


def random_qp_batch(seed: int = 0, n: int = 30, m: int = 50, b: int = 64) -> tuple:
    """The GPU checks' random QPs ``(P, q, C, l, u, lb, ub)``: one strongly convex P (lambda_min >= 0.1), b linear
    terms, two-sided rows with 5 one-sided below, 5 above and one equality, a lower bound on x."""
    import numpy as np

    rng = np.random.default_rng(seed)
    A = rng.standard_normal((n, n))
    P = A @ A.T / n + 0.1 * np.eye(n)
    C = rng.standard_normal((m, n))
    x0 = rng.uniform(-1, 1, n)
    l = C @ x0 - rng.uniform(0.1, 1, m)
    u = C @ x0 + rng.uniform(0.1, 1, m)
    l[:5] = -np.inf
    u[5:10] = np.inf
    l[10] = u[10] = (C @ x0)[10]
    lb, ub = -2 * np.ones(n), np.full(n, np.inf)
    q = 3 * rng.standard_normal((b, n))
    return P, q, C, l, u, lb, ub
