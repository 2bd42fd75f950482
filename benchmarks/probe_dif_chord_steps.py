"""Probe: do more chord-Newton corrections bring DIF's far removals to their retrained values?

DIF's second order is one chord-Newton step on the removed problem's KKT residual (H and the active rows of
θ̄, shortened by backtracking). On the fairness study (``benchmarks/dif_fairness.py``) the removals where that
step is shortened or dropped are the ones that keep the pooled r below 0.95. This probe applies the same
step up to ``--steps`` times in a row (each from the previous step's point and multipliers, each globalised
the same way) and prints, per removal, the test-loss change after each step against the retrained truth:
whether a cheap higher order would close the gap.

Needs a trained study cache of ``dif_fairness.py`` (``--cache``: the directory holding ``seed0_…``; kkt.npz,
H.npy and truth.jsonl in it)::

    .venv/bin/python benchmarks/probe_dif_chord_steps.py --cache /tmp/polyproj_dif_fairness --removals 56 94 95 98

Measured 2026-12-06 on the cache of ``dif_fairness_rerun.json`` (13 removals whose correction is shortened or
dropped): the steps stall (step length 0 after 2-5 steps on most); g15 stays at −2.97e-3 against a retrained
−1.76e-4, g18 reaches 7.2e-4 of 1.05e-3, s56 1.7e-4 of 5.0e-4. The retraining of those removals needed the exact
Hessian at the new point (Newton-MINRES) or an augmented-Lagrangian detour, not H̄'s chord steps.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dif_fairness as study

from polyproj.adapters.dif.second_order import correction, step_length


def main(argv=None) -> int:
    ap = study.probe_parser(__doc__)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args(argv)
    st, rows = study.probe_removals(args)
    prob, F, F0, kkt, dif = st.prob, st.F, st.F0, st.kkt, st.dif
    for key, removed, first, t0 in rows:
        omega, dlam = first.omega.numpy(), first.multipliers
        changes, lengths = [float(F(prob.wrap(kkt.theta + first.omega))) - F0], []
        for _ in range(args.steps):
            step = correction(dif, removed, omega, dlam)
            t, _ = step_length(dif, removed, omega, step)
            lengths.append(t)
            if t == 0.0:
                break
            lam = step.start + t * (step.lambdas - step.start)
            omega, dlam = omega + t * step.delta, lam - dif.lin.lam
            changes.append(float(F(prob.wrap(kkt.theta + torch.as_tensor(omega)))) - F0)
        print(json.dumps({"removal": key, "retrained": st.truth[key]["dF"], "after_each_step": changes,
                          "step_lengths": lengths, "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
