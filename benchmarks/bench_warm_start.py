"""What a warm start saves in training: ``ProjectionLayer(warm_start=True)`` against a cold layer.

A training loop as the layer meets it: a linear model maps fixed inputs to the points projected onto
bench_layer's polytope (n 50, m 100 inequalities, one equality, box bounds, float64), and SGD on a
regression loss through the projection moves the points a little every step. Two layers project the
same points at every step — one cold, one that starts the polish from its previous call's active sets
(``warm_start=True``: only the samples it cannot verify in a few rounds go through the whole pipeline) —
in alternating order, and the model takes the cold layer's gradient (both are the exact projection's
HS-Jacobian: the warm layer's output and gradient are checked against it every step). Reported per
batch and learning rate: how far the points move a step (median ‖Δx‖ / ‖x‖), the median forward +
backward time of each layer over the steps (spread), the ratio, and how many samples the warm start
sent to the whole pipeline.

Run::

    .venv/bin/python benchmarks/bench_warm_start.py                  # batches 16 128 1024, 3 learning rates
    .venv/bin/python benchmarks/bench_warm_start.py --quick          # smoke run: warm_start_quick.json

JSON: ``benchmarks/results/warm_start.json`` (``--quick``: ``warm_start_quick.json``; ``--out``: a name there
or a path).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_layer import make_problem  # noqa: E402
from common import quick_name, write_results  # noqa: E402


def run(batch: int, lr: float, steps: int, n: int, seed: int) -> dict:
    import torch

    from polyproj.adapters.torch import ProjectionLayer
    from polyproj.projection import pipeline

    d = make_problem(batch, n, 2 * n, seed=seed)
    t = {k: torch.tensor(v) for k, v in d.items()}
    cold = ProjectionLayer(t["A"], t["a"], t["B"], t["b"], t["lb"], t["ub"])
    warm = ProjectionLayer(t["A"], t["a"], t["B"], t["b"], t["lb"], t["ub"], warm_start=True)
    gen = torch.Generator().manual_seed(seed)
    inputs = torch.randn(batch, 16, generator=gen, dtype=torch.float64)
    W = torch.nn.Parameter(torch.randn(16, n, generator=gen, dtype=torch.float64) * 0.75)
    bias = torch.nn.Parameter(t["X"].mean(0).clone())
    target = t["X"] + 0.5 * torch.randn(batch, n, generator=gen, dtype=torch.float64)
    opt = torch.optim.SGD([W, bias], lr=lr)
    full = []  # samples the warm start sent through the whole pipeline, per step
    real_run = pipeline.run

    def counting_run(X, data, solver, opts, **kw):
        if kw.get("warm") is None and counting_run.inside_warm:
            full[-1] += int(X.shape[0])
        return real_run(X, data, solver, opts, **kw)

    counting_run.inside_warm = False
    # small batches take the direct path: the points whose guess is not verified are solved by DAQP
    from polyproj.backends.daqp import DAQPSolver

    daqp = []
    real_points = DAQPSolver.solve_points

    def counting_points(self, X, arrays, *norms):
        if counting_run.inside_warm:
            daqp[-1] += int(X.shape[0])
        return real_points(self, X, arrays, *norms)

    times = {"cold": [], "warm": []}
    worst_dy = worst_dg = 0.0
    drift, prev = [], None
    try:
        pipeline.run = counting_run
        DAQPSolver.solve_points = counting_points
        for step in range(steps):
            x = inputs @ W + bias
            if prev is not None:  # how far the points moved since the last step, relative to their size
                drift.append(float((x.detach() - prev).norm(dim=1).median() / prev.norm(dim=1).median()))
            prev = x.detach()
            out = {}
            for name in (("cold", "warm") if step % 2 else ("warm", "cold")):
                layer = cold if name == "cold" else warm
                xi = x.detach().clone().requires_grad_()
                counting_run.inside_warm = name == "warm"
                if name == "warm":
                    full.append(0)
                    daqp.append(0)
                t0 = time.perf_counter()
                y = layer(xi)
                loss = ((y - target) ** 2).sum(1).mean()
                loss.backward()
                times[name].append(time.perf_counter() - t0)
                counting_run.inside_warm = False
                out[name] = (y.detach(), xi.grad)
            worst_dy = max(worst_dy, float((out["warm"][0] - out["cold"][0]).abs().max()))
            worst_dg = max(worst_dg, float((out["warm"][1] - out["cold"][1]).abs().max()))
            opt.zero_grad()
            x.backward(out["cold"][1])
            opt.step()
    finally:
        pipeline.run = real_run
        DAQPSolver.solve_points = real_points
    skip = min(2, steps - 1)  # the first warm call has nothing to start from
    med = {k: float(np.median(v[skip:])) for k, v in times.items()}
    return {"batch": batch, "n": n, "lr": lr, "steps": steps,
            "cold_ms": 1e3 * med["cold"], "warm_ms": 1e3 * med["warm"],
            "cold_spread_ms": [1e3 * float(np.min(times["cold"][skip:])), 1e3 * float(np.max(times["cold"][skip:]))],
            "warm_spread_ms": [1e3 * float(np.min(times["warm"][skip:])), 1e3 * float(np.max(times["warm"][skip:]))],
            "speedup": med["cold"] / med["warm"], "median_relative_step": float(np.median(drift)),
            "full_pipeline_share": float(np.sum(full[skip:]) / (batch * max(len(full) - skip, 1))),
            "daqp_share": float(np.sum(daqp[skip:]) / (batch * max(len(daqp) - skip, 1))),
            "max_abs_dy": worst_dy, "max_abs_dgrad": worst_dg}


def main(argv: list[str] | None = None) -> int:

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 128, 1024])
    ap.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 1e-2, 1e-1])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None,
                    help="results name in benchmarks/results or a .json path (default warm_start; --quick: "
                    "warm_start_quick)")
    args = ap.parse_args(argv)
    if args.quick:
        args.batches, args.lrs, args.steps, args.n = [16], [1e-2], 4, 10
    from polyproj.runtime import set_torch_threads  # not torch.set_num_threads: see there
    set_torch_threads(args.threads)
    rows = []
    for batch in args.batches:
        for lr in args.lrs:
            r = run(batch, lr, args.steps, args.n, args.seed)
            rows.append(r)
            print(f"batch {batch:5d} lr {lr:g} (points move {100 * r['median_relative_step']:.2f} % a step): "
                  f"cold {r['cold_ms']:8.2f} ms, warm {r['warm_ms']:8.2f} ms ({r['speedup']:.2f}x), whole pipeline "
                  f"for {100 * r['full_pipeline_share']:.1f} %, DAQP for {100 * r['daqp_share']:.1f} % of the samples, "
                  f"max |dy| {r['max_abs_dy']:.1e}, max |dgrad| {r['max_abs_dgrad']:.1e}", flush=True)
    path = write_results(args.out or quick_name("warm_start", args.quick),
                         {"quick": bool(args.quick), "threads": args.threads, "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
