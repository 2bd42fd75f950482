"""Probe: how long ``pp.project`` takes once a backend's ``time_limit`` has cut its start short.

300 points, n 60, m 120 random rows and a box, ``backend="ipm"``: no limit, ``time_limit=0.01`` (spent:
a short polish, no fallback, status TIME_LIMIT with a warning) and ``time_limit=1`` (ample). Prints the
wall time, the share of points polished and the largest violation of each.

Run::

    .venv/bin/python benchmarks/probe_time_limit.py
"""

from __future__ import annotations

import time
import warnings

import numpy as np

import polyproj as pp


def main() -> None:
    warnings.simplefilter("ignore")
    rng = np.random.default_rng(10)
    n, m = 60, 120
    A = rng.standard_normal((m, n))
    poly = pp.Polyhedron(A=A, a=A @ rng.standard_normal(n) + rng.random(m), lb=-3 * np.ones(n), ub=3 * np.ones(n))
    X = 5 * rng.standard_normal((300, n))
    for kw in ({}, {"time_limit": 0.01}, {"time_limit": 1.0}):
        t0 = time.perf_counter()
        r = pp.project(X, poly, backend="ipm", **kw)
        print(f"{kw!s:24s} {time.perf_counter() - t0:6.2f} s   polished {np.mean(r.polished):.2f}   "
              f"max violation {np.max(r.max_violation):.2g}")


if __name__ == "__main__":
    main()
