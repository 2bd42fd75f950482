"""Probe: what a guessed working set saves DAQP on the layer benchmark's data, and whether a cheap guess exists.

The direct path (``polyproj/projection/direct.py``) spends most of a small cold batch in DAQP's per-point
solves (~67 active-set iterations a point at n 50, m 100). This probe measures, on ``bench_layer.py``'s
data (``make_problem``, seed 1):

1. DAQP per point cold, and warm-started (``sense`` flags) from the point's *true* working set, from the
   previous point's set and from the batch's majority set: the ceiling of what any guess could save;
2. the quality of the guess a batched ADMM (OSQP's iteration on ``[A; B; I]`` with unit rows, one cached
   inverse, the whole batch as matrix products) gives after 10-200 iterations, for several ``rho``: the
   share of points whose guessed working set is exact and the mean number of wrong rows a point, and the
   time of one iteration on the batch.

A cheap guess would have to be exact (or nearly) on most points at a cost below DAQP's cold solve;
the figures say whether one is. Results are printed (docs/torch.md quotes a run).

Run::

    .venv/bin/python benchmarks/probe_daqp_warm.py [--n 50] [--batch 16]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def daqp_timings(X: np.ndarray, arrays: tuple, sol) -> None:
    """ms a point and iterations of DAQP cold and warm-started from several guesses."""
    import daqp

    H, A, up, lo, sense = arrays
    true = np.concatenate([sol.z_box != 0, sol.z != 0], axis=1)  # DAQP's layout: bounds first, then rows
    nb = len(up) - A.shape[0]

    def violated(i):  # the bounds and rows the point itself violates
        x, r = X[i], A @ X[i]
        return np.concatenate([(x > up[:nb]) | (x < lo[:nb]), (r > up[nb:]) | (r < lo[nb:])])

    guesses = {
        "cold": lambda i: np.zeros(true.shape[1], dtype=bool),
        "true working set": lambda i: true[i],
        "previous point's set": lambda i: true[i - 1],
        "majority set": lambda i: true.mean(axis=0) > 0.5,
        "rows violated at x": violated,
    }
    model = daqp.Model()
    model.setup(H, -X[0], A, up, lo, sense.copy())
    for name, guess in guesses.items():
        its, wrong = 0, 0
        t0 = time.perf_counter()
        for i in range(1, X.shape[0]):
            s = sense.copy()
            s[guess(i)] |= 1  # DAQP's ACTIVE flag: start with the row in the working set
            model.update(f=-X[i], sense=s)
            x, _, flag, info = model.solve()
            its += info["iterations"]
            wrong += flag != 1 or not np.allclose(x, sol.x[i], atol=1e-7)
        k = X.shape[0] - 1
        print(f"  DAQP {name:22s} {1e3 * (time.perf_counter() - t0) / k:6.3f} ms a point, "
              f"{its / k:5.1f} iterations, {wrong} different answers")


def admm_guesses(d: dict, X: np.ndarray, sol, rhos: tuple[float, ...], checkpoints: tuple[int, ...]) -> None:
    """Share of exact guessed working sets and wrong rows a point after ``checkpoints`` ADMM iterations."""
    A, a, B, b, lb, ub = (d[k] for k in ("A", "a", "B", "b", "lb", "ub"))
    n, m = X.shape[1], A.shape[0]
    true = np.concatenate([sol.z_box != 0, sol.z[:, :m] != 0], axis=1)
    na, nb = np.linalg.norm(A, axis=1), np.linalg.norm(B, axis=1)
    C = np.vstack([A / na[:, None], B / nb[:, None], np.eye(n)])
    u = np.concatenate([a / na, b / nb, ub])
    lo = np.concatenate([np.full(m, -np.inf), b / nb, lb])
    for rho in rhos:
        R = np.full(C.shape[0], rho)
        R[m: m + B.shape[0]] = 1e3 * rho  # equality rows: OSQP's rule
        Ki = np.linalg.inv(np.eye(n) + C.T @ (R[:, None] * C))
        Z, Lam = np.clip(X @ C.T, lo, u), np.zeros((X.shape[0], C.shape[0]))
        out, spent = [], 0.0
        for it in range(1, max(checkpoints) + 1):
            t0 = time.perf_counter()
            Y = (X + (R * Z - Lam) @ C) @ Ki
            CY = Y @ C.T
            Zn = np.clip(CY + Lam / R, lo, u)
            Lam += R * (CY - Zn)
            Z = Zn
            spent += time.perf_counter() - t0
            if it in checkpoints:
                guess = np.concatenate([Lam[:, m + B.shape[0]:] != 0, Lam[:, :m] > 0], axis=1)
                out.append(f"{it}: {np.mean((guess == true).all(axis=1)):.0%} exact, "
                           f"{np.mean((guess != true).sum(axis=1)):.1f} wrong")
        print(f"  ADMM rho {rho:<4g} ({1e3 * spent / max(checkpoints):.3f} ms an iteration): " + "; ".join(out))


def main(argv: list[str] | None = None) -> None:
    from bench_layer import make_problem

    from polyproj.registry import get_backend

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=50)
    p.add_argument("--batch", type=int, default=256, help="points for the DAQP timings")
    p.add_argument("--admm-batch", type=int, default=16, help="points for the ADMM guesses")
    args = p.parse_args(argv)
    d = make_problem(args.batch, args.n, 2 * args.n, seed=1)
    solver = get_backend("daqp")
    arrays, norms = solver.projection_arrays(d["A"], d["a"], d["B"], d["b"], d["lb"], d["ub"])
    sol, _ = solver.solve_points(d["X"], arrays, norms)
    print(f"n {args.n}, m {2 * args.n}, one equality, box; working sets: {np.mean((sol.z != 0).sum(axis=1)):.1f} "
          f"rows and {np.mean((sol.z_box != 0).sum(axis=1)):.1f} bounds a point")
    daqp_timings(d["X"], arrays, sol)
    k = args.admm_batch
    admm_guesses(d, d["X"][:k], sol.take(np.arange(k)), (0.1, 0.3, 1.0, 3.0), (10, 20, 40, 80, 200))


if __name__ == "__main__":
    main()
