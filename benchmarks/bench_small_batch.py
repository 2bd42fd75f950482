#!/usr/bin/env python
"""Small batches at larger n, and per-slice data gradients under ``vmap``: polyproj fwd+bwd medians.

The figures behind ``per_point_limit`` (docs/torch.md) and the one-backward ``vmap(grad)`` path. For an
A/B against another commit, run the script once per checkout in alternating processes on one core::

    mkdir -p /tmp/base && git archive <sha> polyproj | tar -x -C /tmp/base
    taskset -c 1 .venv/bin/python benchmarks/bench_small_batch.py                        # this checkout
    PYTHONPATH=/tmp/base taskset -c 1 .venv/bin/python benchmarks/bench_small_batch.py   # the other

``--crossover``: the figures behind ``direct_points`` (docs/torch.md): each case as ``"auto"`` chooses,
with the direct path forced (its limits lifted), and with it switched off (``direct.DIRECT_BATCH = 0``:
the ADMM start + polish), in the same process.

Data: ``bench_layer.make_problem`` (m = 2n, one equality, box bounds), one torch thread.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CROSSOVER = [(10, 128), (10, 256), (10, 512), (10, 1024), (20, 128), (20, 256), (20, 512), (20, 1024), (30, 128),
             (30, 256), (30, 384), (30, 512), (40, 96), (40, 160), (40, 192), (40, 256), (50, 32), (50, 64), (50, 96),
             (60, 24), (60, 48), (70, 8), (70, 12), (70, 16), (70, 32), (80, 8), (80, 16), (100, 8)]
CASES = [(50, 1), (50, 16), (100, 1), (100, 4), (100, 8), (100, 12), (150, 1), (150, 2), (150, 8), (200, 1),
         (200, 2), (200, 8), (300, 1), (500, 1), (500, 4)]


def _median_ms(f, calls: int) -> float:
    for _ in range(3):
        f()
    ts = []
    for _ in range(calls):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2] * 1e3


def layer_cases(cases) -> list[dict]:
    """fwd+bwd of ``project(x, A, a, B, b, lb, ub)`` (bench_layer's polyproj call)."""
    from bench_layer import build, make_problem

    out = []
    for n, batch in cases:
        f = build("polyproj", make_problem(batch, n, 2 * n))
        ms = _median_ms(f, max(5, int(200 / (batch * (n / 50) ** 2))))
        out.append({"n": n, "batch": batch, "ms": ms})
        print(f"n {n:4d} batch {batch:3d}: {ms:8.2f} ms", flush=True)
    return out


def crossover_cases(cases) -> list[dict]:
    """Each case three ways: as ``"auto"`` chooses, the direct path forced (its limits lifted), and off
    (the batched start + polish). The forced and off columns place the crossover; ``auto`` shows the rule."""
    from bench_layer import build, make_problem

    from polyproj.backends import defaults
    from polyproj.projection import direct

    out, ceiling, points = [], direct.DIRECT_BATCH, defaults.DIRECT_POINTS
    for n, batch in cases:
        row = {"n": n, "batch": batch}
        for key, limit, scale in (("auto_ms", ceiling, points), ("direct_ms", 1 << 30, float(1 << 30)),
                                  ("no_direct_ms", 0, points)):
            direct.DIRECT_BATCH, defaults.DIRECT_POINTS = limit, scale
            try:
                f = build("polyproj", make_problem(batch, n, 2 * n))
                row[key] = _median_ms(f, 30)
            finally:
                direct.DIRECT_BATCH, defaults.DIRECT_POINTS = ceiling, points
        out.append(row)
        print(f"n {n:4d} batch {batch:3d}: auto {row['auto_ms']:8.2f} ms, direct path {row['direct_ms']:8.2f} ms, "
              f"without it {row['no_direct_ms']:8.2f} ms", flush=True)
    return out


def vmap_case(slices: int = 64, rows: int = 16, n: int = 20) -> dict:
    """``vmap(grad)`` of a loss with respect to shared A and a, over ``slices`` slices of ``rows`` points."""
    import numpy as np
    import torch
    from torch.func import grad, vmap

    from polyproj.adapters.torch import project

    rng = np.random.default_rng(0)
    A = rng.standard_normal((30, n))
    data = [torch.tensor(A), torch.tensor(np.abs(rng.standard_normal(30)) + 0.5)]

    def loss(x, A, a):
        return (project(x, A, a) ** 2).sum()

    X = torch.tensor(3 * rng.standard_normal((slices, rows, n)))
    f = vmap(grad(loss, argnums=(1, 2)), in_dims=(0, None, None))
    ms = _median_ms(lambda: f(X, *data), 5)
    print(f"vmap(grad) {slices} slices x {rows} points, n {n}: {ms:.1f} ms", flush=True)
    return {"slices": slices, "rows": rows, "n": n, "ms": ms}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="JSON file for the figures")
    p.add_argument("--no-vmap", action="store_true")
    p.add_argument("--crossover", action="store_true", help="only the direct path's crossover cases")
    args = p.parse_args()

    from polyproj.runtime import set_torch_threads  # not torch.set_num_threads: see there
    set_torch_threads(1)
    from bench_layer import warm_heap

    warm_heap()
    if args.crossover:
        res = {"crossover": crossover_cases(CROSSOVER)}
    else:
        res = {"layer": layer_cases(CASES)}
        if not args.no_vmap:
            res["vmap"] = vmap_case()
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
