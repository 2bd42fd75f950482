"""A toy backend for registry tests: equality-constrained QPs solved from the KKT system."""

from __future__ import annotations

import time

import numpy as np

import polyproj as pp


class ToyKKTSolver(pp.QPSolver):
    """Solves QPs whose constraints are all equalities (and no bounds); anything else is an error status."""

    name = "toy"
    capabilities = pp.Capabilities(dense=True)
    options = {"shift": 0.0}

    def solve(self, qp, warm_start=None):
        t0 = time.perf_counter()
        P = qp.P.toarray() if hasattr(qp.P, "toarray") else qp.P
        C = qp.C.toarray() if hasattr(qp.C, "toarray") else qp.C
        if not np.all(qp.eq_mask) or qp.has_bounds:
            return self._nan_solution(qp, pp.Status.NUMERICAL_ERROR, self.name)
        m = qp.m
        K = np.block([[P, C.T], [C, np.zeros((m, m))]])
        sol = np.linalg.solve(K, np.concatenate([-qp.q, qp.u]))
        return pp.Solution(x=sol[: qp.n], z=sol[qp.n:], z_box=np.zeros(qp.n), status=pp.Status.SOLVED,
                           iterations=1, solve_time=time.perf_counter() - t0, backend=self.name, qp=qp)


class NeedsArgument(ToyKKTSolver):
    """A third-party class whose constructor fails (a required argument): ``polyproj check`` says so."""

    name = "needs_argument"

    def __init__(self, required, **settings):
        super().__init__(**settings)
