"""The methods polyproj is compared with, as torch maps ``x -> y`` (every one differentiated by autograd).

- :func:`sinkhorn` — mHC's map onto doubly stochastic matrices: ``exp``, then alternating row and
  column normalisation (a fixed number of iterations, the first in the log domain; the last one normalises
  columns, so the row sums carry the error);
- :class:`LinSAT` — LinSATNet's ``linsat_layer`` (an entropic, Sinkhorn-type map onto a polytope with
  non-negative coefficients inside ``[0, 1]^n``), its constraint state built once;
- :class:`RadialMap` — an interior map in the manner of Soft-Radial (Schneider & Kuhn, arXiv 2602.03461),
  written from the paper's description: the input, restricted to the directions of the affine hull, is
  sent along the ray from an interior anchor ``z0`` to ``z0 + ρ(‖d‖) d / γ(d)``, ``γ`` the gauge of
  ``C − z0`` and ``ρ(r) = r / (1 + r)``; the image is the interior of ``C`` (``γ(y − z0) = ρ < 1``) and
  the Jacobian is of full rank (on the affine hull) wherever the gauge's maximising row is unique;
- :class:`QPLayer` — the Euclidean projection solved by a differentiable-optimisation library: qpth
  (OptNet), cvxpylayers (defaults) or Moreau (its CPU active-set solver, autograd as its docs show).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import ProblemError
from ..problem import Polyhedron

__all__ = ["LinSAT", "QPLayer", "RadialMap", "Rows", "sinkhorn"]


def sinkhorn(logits: torch.Tensor, iters: int) -> torch.Tensor:
    """``exp(logits)`` normalised ``iters`` times by rows, then columns (the first time in the log domain).

    ``logits`` is ``(..., k, k)``; the result has unit column sums and row sums within the method's
    error (reported by the applications as the violation of double stochasticity).
    """
    if iters < 1:
        return torch.exp(logits - logits.amax(dim=-1, keepdim=True))
    # the first row and column normalisation in logs (subtract each row's, then each column's logsumexp): exp of
    # logits -800 below the rest of their row or column underflows to a row or column of zeros, and dividing
    # it by its sum gave 0 / 0. After that round every entry is <= 1 and every row and column holds one >= 1/k²
    # (a column's largest entry is >= 1/k, a row's >= 1/k after the row step and the column sums are <= k); each
    # further division by sums in [1/k², k] keeps that, so the remaining rounds divide by sums that cannot be 0
    # — the same iterates as a log-domain loop throughout, at the plain loop's cost
    L = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    M = torch.exp(L - torch.logsumexp(L, dim=-2, keepdim=True))
    for _ in range(iters - 1):
        M = M / M.sum(dim=-1, keepdim=True)
        M = M / M.sum(dim=-2, keepdim=True)
    return M


@dataclass(frozen=True)
class Rows:
    """A polyhedron as ``G y <= h`` (bounds included as rows) and ``B y = b``, float64 NumPy."""

    G: np.ndarray
    h: np.ndarray
    B: np.ndarray
    b: np.ndarray

    @classmethod
    def of(cls, P: Polyhedron) -> Rows:
        """The rows of ``P``: its inequalities, then ``-y_i <= -lb_i`` and ``y_i <= ub_i`` where finite."""
        n = P.n
        G, h = [P.A_dense], [P.a]
        lo, hi = np.isfinite(P.lb), np.isfinite(P.ub)
        G += [-np.eye(n)[lo], np.eye(n)[hi]]
        h += [-P.lb[lo], P.ub[hi]]
        return cls(np.vstack(G), np.concatenate(h), P.B_dense.reshape(-1, n), np.asarray(P.b, float))

    def violation(self, Y: np.ndarray) -> np.ndarray:
        """Largest violation of each row of ``Y`` (batch, n)."""
        ineq = np.maximum(Y @ self.G.T - self.h, 0.0).max(axis=1, initial=0.0)
        eq = np.abs(Y @ self.B.T - self.b).max(axis=1, initial=0.0) if self.B.size else 0.0 * ineq
        return np.maximum(ineq, eq)


class LinSAT(torch.nn.Module):
    """LinSATNet's layer for ``A y <= b``, ``C y >= d``, ``E y = f`` (non-negative data), ``y in [0, 1]^n``.

    Parameters
    ----------
    n : number of variables.
    tau, max_iter : LinSATNet's temperature and iteration count (its defaults: 0.05, 100).
    **constraints : any of ``A, b, C, d, E, f`` as float64 arrays.
    """

    def __init__(self, n: int, tau: float = 0.05, max_iter: int = 100, **constraints: Any) -> None:
        super().__init__()
        from LinSATNet.linsat import init_constraints

        t = {k: torch.as_tensor(np.asarray(v, float), dtype=torch.float64) for k, v in constraints.items()}
        for M, v in (("A", "b"), ("C", "d"), ("E", "f")):  # absent ones empty in float64 (it makes them float32)
            t.setdefault(M, torch.zeros(0, n, dtype=torch.float64))
            t.setdefault(v, torch.zeros(0, dtype=torch.float64))
        self.state = init_constraints(n, **t)
        self.tau, self.max_iter = float(tau), int(max_iter)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """LinSATNet's map of the scores ``x`` (batch, n)."""
        from LinSATNet import linsat_layer

        return linsat_layer(x, constr_dict=self.state, tau=self.tau, max_iter=self.max_iter, no_warning=True)


class RadialMap(torch.nn.Module):
    """``u -> z0 + ρ(‖d‖) d / γ(d)``, ``d`` the part of ``u`` in the null space of ``B``.

    Parameters
    ----------
    rows : the set as :class:`Rows` (bounded, with an interior relative to ``B y = b``).
    anchor : a point with ``G z0 < h`` and ``B z0 = b`` (checked).
    """

    def __init__(self, rows: Rows, anchor: np.ndarray) -> None:
        super().__init__()
        z0 = np.asarray(anchor, float)
        slack = rows.h - rows.G @ z0
        if slack.min() <= 0 or (rows.B.size and np.abs(rows.B @ z0 - rows.b).max() > 1e-12):
            raise ProblemError("the anchor must be strictly inside the set")
        n = z0.size
        N = np.eye(n) if not rows.B.size else np.eye(n) - np.linalg.pinv(rows.B) @ rows.B
        self.register_buffer("z0", torch.tensor(z0))
        self.register_buffer("N", torch.tensor(N))  # orthogonal projector onto null(B)
        self.register_buffer("Gs", torch.tensor(rows.G / slack[:, None]))  # γ(d) = max(0, max_i (G d)_i / slack_i)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """The interior point of ``u`` (batch, n)."""
        d = u @ self.N
        # d at the rounding of u @ N (equal scores on a simplex) is zero, and the map z0 there (its limit): that
        # noise lies outside null(B) or along directions with γ <= 0, where no gauge bounds the step
        noise = 1e3 * torch.finfo(u.dtype).eps * torch.linalg.vector_norm(u, dim=-1, keepdim=True)
        d = torch.where(torch.linalg.vector_norm(d, dim=-1, keepdim=True) <= noise, torch.zeros_like(d), d)
        r = torch.linalg.vector_norm(d, dim=-1, keepdim=True)
        gauge = torch.clamp((d @ self.Gs.T).amax(dim=-1, keepdim=True), min=1e-300)
        return self.z0 + (r / (1.0 + r)) * d / gauge


class QPLayer(torch.nn.Module):
    """The Euclidean projection onto ``rows`` by a differentiable-optimisation library.

    Parameters
    ----------
    rows : the polyhedron.
    library : ``"qpth"`` (``QPFunction``, its defaults), ``"cvxpylayers"`` (``CvxpyLayer``, default
        solver arguments) or ``"moreau"`` (``moreau.torch.Solver``, active-set solver, autograd).
    """

    def __init__(self, rows: Rows, library: str) -> None:
        super().__init__()
        self.rows, self.library = rows, library
        self._moreau: dict[int, Any] = {}
        t = {k: torch.tensor(getattr(rows, k)) for k in ("G", "h", "B", "b")}
        self.G, self.h, self.B, self.b = t["G"], t["h"], t["B"], t["b"]
        if library == "cvxpylayers":
            import cvxpy as cp
            from cvxpylayers.torch import CvxpyLayer

            n = rows.G.shape[1]
            xp, y = cp.Parameter(n), cp.Variable(n)
            cons = [rows.G @ y <= rows.h] + ([rows.B @ y == rows.b] if rows.B.size else [])
            self.layer = CvxpyLayer(cp.Problem(cp.Minimize(0.5 * cp.sum_squares(y - xp)), cons), parameters=[xp],
                                    variables=[y])
        elif library not in ("qpth", "moreau"):
            raise ProblemError(f"unknown library {library!r}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The library's projection of ``x`` (batch, n)."""
        if self.library == "qpth":
            from qpth.qp import QPFunction

            Q = torch.eye(x.shape[-1], dtype=x.dtype)
            return QPFunction(verbose=-1)(Q, -x, self.G, self.h, self.B, self.b)
        if self.library == "cvxpylayers":
            return self.layer(x)[0]
        return self._moreau_solver(x.shape[0])(-x)

    def _moreau_solver(self, batch: int) -> Any:
        """Moreau's solver for this batch size (its batch size is fixed at construction): one per size."""
        if batch not in self._moreau:
            self._moreau[batch] = _MoreauProjection(self.rows, batch)
        return self._moreau[batch]


class _MoreauProjection:
    """``min ½yᵀy + qᵀy  s.t.  B y + s = b, s = 0;  G y + s = h, s >= 0`` with Moreau (moreau 0.4)."""

    def __init__(self, rows: Rows, batch: int) -> None:
        import moreau
        from moreau.torch import Solver

        M = np.vstack([rows.B, rows.G])  # the zero cone first, then the non-negative one
        rhs = np.concatenate([rows.b, rows.h])
        n, p = M.shape[1], rows.B.shape[0]

        def csr(A: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.tensor(np.r_[0, np.cumsum((A != 0).sum(1))]), torch.tensor(np.nonzero(A)[1])

        (P_ro, P_ci), (A_ro, A_ci) = csr(np.eye(n)), csr(M)
        cones = moreau.Cones(num_zero_cones=p, num_nonneg_cones=M.shape[0] - p)
        settings = moreau.Settings(solver="active_set", device="cpu", batch_size=batch, enable_grad=True)
        self.solver = Solver(n=n, m=M.shape[0], P_row_offsets=P_ro, P_col_indices=P_ci, A_row_offsets=A_ro,
                             A_col_indices=A_ci, cones=cones, settings=settings)
        self.P = torch.ones(batch, n, dtype=torch.float64)
        self.A = torch.tensor(M[M != 0], dtype=torch.float64).expand(batch, -1).contiguous()
        self.rhs = torch.tensor(rhs, dtype=torch.float64).expand(batch, -1).contiguous()

    def __call__(self, q: torch.Tensor) -> torch.Tensor:
        return self.solver.solve(self.P, self.A, q, self.rhs).x
