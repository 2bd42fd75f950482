"""Probe: projections onto a polytope whose coordinates lie on very different scales — is SOLVED exact?

bench_layer's polytope (n 20, m 40, one equality, a box; 100 points, seeds 0-2) with coordinate j in
units of 10^u_j, u_j uniform in [−d, d] (``tests/test_projection.py::_coordinate_scaled``). Per backend and
d: how many points are SOLVED, how many polished, the worst constraint miss of a SOLVED point in units of
the rounding of its terms (``eps (|a_i| + |A_i||y|)``, ``_rounding_misses``), and the largest slack of a row
reported active relative to its own terms (README, "Coordinates on very different scales").

Run::

    .venv/bin/python benchmarks/probe_coordinate_scales.py --decades 4 5 --backends daqp highs piqp clarabel ipm auto

With ``PYTHONPATH=<another checkout>`` it probes that checkout's code (its tests must have ``_coordinate_scaled``).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))  # after PYTHONPATH: another checkout may be probed

import polyproj as pp
from tests.test_projection import _coordinate_scaled, _rounding_misses


def active_slack(P: pp.Polyhedron, r) -> float:
    """Largest |slack| / terms over the rows reported active at polished points."""
    slack = np.concatenate([P.a - r.y @ P.A.T, r.y - P.lb, P.ub - r.y], axis=1)
    terms = np.concatenate([np.abs(r.y) @ np.abs(P.A).T + np.abs(P.a), np.abs(r.y) + np.abs(P.lb),
                            np.abs(r.y) + np.abs(P.ub)], axis=1)
    reported = np.asarray(r.active) & r.polished[:, None]
    return float(np.max(np.abs(slack[reported]) / terms[reported], initial=0.0))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decades", type=float, nargs="+", default=[4.0])
    ap.add_argument("--backends", nargs="+", default=["daqp", "piqp"])
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args(argv)
    for d in args.decades:
        for be in args.backends:
            if be != "auto" and be not in pp.available_backends():
                print(f"d = {d:g} {be}: not installed")
                continue
            solved = polished = total = 0
            miss = act = 0.0
            t0 = time.perf_counter()
            for seed in range(args.seeds):
                P, X = _coordinate_scaled(seed, d)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", pp.PolyprojWarning)
                    r = pp.project(X, P, backend=be)
                ok = np.array([s is pp.Status.SOLVED for s in r.status])
                total, solved, polished = total + ok.size, solved + int(ok.sum()), polished + int(r.polished.sum())
                if ok.any():
                    miss = max(miss, float(_rounding_misses(P, r.y)[ok].max()))
                act = max(act, active_slack(P, r))
            print(f"d = {d:g} {be}: SOLVED {solved}/{total}, polished {polished}, worst miss of a SOLVED point "
                  f"{miss:.3g} roundings, largest active-row slack {act:.2g} of its terms, "
                  f"{time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
