#!/usr/bin/env python
"""Where the time of a small-batch layer call goes: wall time of each stage, cold and warm-started.

One torch thread, bench_layer's data (n, m = 2n, one equality, box bounds, float64), fwd+bwd through
``ProjectionLayer`` with ``L = <V, y>``. Each stage (DAQP's per-point solves, the direct path's face
solve, its KKT verification, the result's violation and degeneracy report, the start record, the
backward's product) is timed by a wrapper around its function; the stages nest (the face solve is part
of ``_take``, which is part of ``project_batch``), so they do not add up to the total. ``--walk`` moves
the points by that much (normal, per coordinate) before every call, as a training step would: the warm
layer then starts from the previous call's active sets.

Run::

    .venv/bin/python benchmarks/bench_layer_stages.py                       # batches 1 and 16, n 50
    .venv/bin/python benchmarks/bench_layer_stages.py --batches 16 --walk 1e-3 --calls 200

JSON: ``benchmarks/results/layer_stages.json``.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_layer import make_problem, warm_heap  # noqa: E402
from common import write_json  # noqa: E402

#: the stages, in the order printed (indented: part of the stage above)
LABELS = ["project_batch (the forward's projection)", "  DAQP solves", "  direct path: faces + checks",
          "    face solve", "    KKT verification", "  start record", "  violation of the result",
          "  degeneracy report", "backward (autograd Function)", "  HS product"]


def _timed(acc: dict[str, float]):
    """Install the wrappers (adding each stage's time to ``acc``); returns a function that removes them."""
    import polyproj.adapters.torch as AT
    import polyproj.backends.daqp as DQ
    import polyproj.backends.projection as BP
    import polyproj.polydata as PD
    import polyproj.projection.backward as BW
    import polyproj.projection.direct as D
    import polyproj.sets.polyhedral as PH

    targets = [(PH.Polyhedral, "project_batch"), (DQ.DAQPSolver, "solve_points"), (D, "_take"), (D, "_faces"),
               (D, "_verified"), (BP, "start_from_solution"), (PD.PolyData, "violation"), (PH, "degeneracy"),
               (AT._Project, "backward"), (BW, "hs_vjp")]
    saved = []
    for (obj, name), label in zip(targets, LABELS, strict=True):
        real = getattr(obj, name)
        saved.append((obj, name, real))

        def wrapper(*a, _real=real, _label=label, **k):
            t = time.perf_counter()
            try:
                return _real(*a, **k)
            finally:
                acc[_label] += time.perf_counter() - t

        setattr(obj, name, staticmethod(wrapper) if isinstance(obj.__dict__.get(name), staticmethod) else wrapper)

    def undo():
        for obj, name, real in saved:
            setattr(obj, name, staticmethod(real) if isinstance(obj.__dict__.get(name), staticmethod) else real)

    return undo


def run(batch: int, n: int, warm: bool, walk: float, calls: int, seed: int) -> dict:
    import torch

    from polyproj.adapters.torch import ProjectionLayer

    d = make_problem(batch, n, 2 * n, seed=seed)
    t = {k: torch.tensor(v) for k, v in d.items()}
    layer = ProjectionLayer(t["A"], t["a"], t["B"], t["b"], t["lb"], t["ub"], warm_start=warm)
    rng = np.random.default_rng(seed)
    X = t["X"].clone()
    acc: dict[str, float] = collections.defaultdict(float)  # this call's time per stage
    stages: dict[str, list[float]] = collections.defaultdict(list)
    total: list[float] = []

    def call():
        nonlocal X
        if walk:
            X = X + walk * torch.from_numpy(rng.normal(size=tuple(X.shape)))
        acc.clear()
        t0 = time.perf_counter()
        x = X.clone().requires_grad_()
        (layer(x) * t["V"]).sum().backward()
        total.append(time.perf_counter() - t0)
        for k, v in acc.items():
            stages[k].append(v)

    for _ in range(10):  # warm-up (and a first active set for the warm layer)
        call()
    undo = _timed(acc)
    try:
        total.clear()
        stages.clear()
        for _ in range(calls):
            call()
    finally:
        undo()
    # a stage some calls skip (DAQP when every guess holds) counts 0 in those calls
    ms = {k: 1e3 * float(np.median(stages[k] + [0.0] * (calls - len(stages[k])))) for k in LABELS}
    return {"batch": batch, "n": n, "warm": warm, "walk": walk, "calls": calls,
            "total_ms": 1e3 * float(np.median(total)),
            "total_spread_ms": [1e3 * float(np.min(total)), 1e3 * float(np.max(total))], "stages_ms": ms}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--walk", type=float, default=1e-3, help="per-call move of the points (0: the same points)")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="layer_stages")
    args = ap.parse_args(argv)
    from polyproj.runtime import set_torch_threads  # not torch.set_num_threads: see there

    set_torch_threads(1)
    warm_heap()
    rows = []
    for batch in args.batches:
        for warm in (False, True):
            r = run(batch, args.n, warm, args.walk, args.calls, args.seed)
            rows.append(r)
            print(f"batch {batch:4d} n {args.n} {'warm' if warm else 'cold'}: {r['total_ms']:.3f} ms "
                  f"(spread {r['total_spread_ms'][0]:.2f}-{r['total_spread_ms'][1]:.2f})", flush=True)
            for k, v in r["stages_ms"].items():
                print(f"    {k:44s} {v:7.3f} ms")
    path = write_json(args.out, {"threads": 1, "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
