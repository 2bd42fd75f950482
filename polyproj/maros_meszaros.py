"""Maros–Meszaros convex QP test set: read a folder of ``.mat`` files into :class:`~polyproj.QP`.

Each ``NAME.mat`` (the format of ``qpsolvers/maros_meszaros_qpbenchmark`` and
``osqp/osqp_benchmarks``) holds ``minimize ½xᵀPx + qᵀx + r  s.t.  l <= A x <= u`` with ``P``, ``A``
sparse and infinite bounds written as ±1e20. Rows of ``A`` with a single non-zero equal to 1 are
variable bounds; by default they become ``lb``/``ub`` of the QP (``split_bounds=True``), as
qpbenchmark does, which leaves the problem and its residuals unchanged.

Subsets (as in qpbenchmark): ``"dense"`` is n <= 1000 and m <= 10000 (m counted in the file, bound
rows included); ``"small"`` is n <= 100 and m <= 1000 (what the unit tests solve); ``"all"``.

Examples
--------
The folder is wherever the ``.mat`` files are (here the project's shared data, relative to the
repository root):

>>> from polyproj.maros_meszaros import list_problems, load_problem
>>> names = list_problems("../shared/data/maros_meszaros", subset="small")  # doctest: +SKIP
>>> mm = load_problem("../shared/data/maros_meszaros/HS21.mat")  # doctest: +SKIP
>>> (mm.qp.n, mm.qp.m)  # doctest: +SKIP
(2, 1)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.io
import scipy.sparse as sp

from .errors import PolyprojError
from .problem import QP

__all__ = ["SUBSETS", "DataNotFound", "MarosMeszaros", "in_subset", "iter_problems", "list_problems",
           "load_problem"]

#: subset name -> (max n, max m)
SUBSETS: dict[str, tuple[float, float]] = {"dense": (1000, 10000), "small": (100, 1000),
                                           "all": (np.inf, np.inf)}


class DataNotFound(PolyprojError, FileNotFoundError):
    """The Maros–Meszaros folder (or a problem file) is absent."""


@dataclass(frozen=True)
class MarosMeszaros:
    """One problem of the set.

    Attributes
    ----------
    name : str
    qp : QP
        ``min ½xᵀPx + qᵀx  s.t.  l <= Cx <= u, lb <= x <= ub`` (objective constant in ``r``).
    r : float
        Constant term of the objective.
    n, m : int
        Sizes as stored in the file (``m`` counts the bound rows).
    """

    name: str
    qp: QP = field(repr=False)
    r: float
    n: int
    m: int


def _folder(folder: str | os.PathLike) -> str:
    folder = os.fspath(folder)
    if os.path.isfile(folder):
        raise DataNotFound(f"{folder!r} is a file; pass the folder that holds the Maros–Meszaros .mat files")
    if not os.path.isdir(folder):
        raise DataNotFound(
            f"Maros–Meszaros folder {folder!r} not found; get the .mat files from "
            "https://github.com/qpsolvers/maros_meszaros_qpbenchmark (data/) and pass their folder"
        )
    return folder


def _loadmat(path: str, names: list[str] | None = None) -> dict[str, Any]:
    """The variables of a ``.mat`` file; an unreadable file or a missing variable is a ProblemError naming it."""
    from .errors import ProblemError

    try:
        d = scipy.io.loadmat(path, variable_names=names)
    except Exception as exc:  # scipy's MatReadError, ValueError, OSError on a truncated or foreign file
        raise ProblemError(f"{path!r} is not a readable Maros–Meszaros .mat file: {type(exc).__name__}: "
                           f"{exc}") from None
    missing = [k for k in (names or ["n", "m", "P", "q", "A", "l", "u"]) if k not in d]
    if missing:
        raise ProblemError(f"{path!r} lacks the variable(s) {missing} of a Maros–Meszaros problem")
    return d


def _sizes(path: str) -> tuple[int, int]:
    d = _loadmat(path, ["n", "m"])
    return int(np.asarray(d["n"]).item()), int(np.asarray(d["m"]).item())


def in_subset(n: int, m: int, subset: str) -> bool:
    """True when a problem of size (n, m) belongs to ``subset`` (``dense``, ``small`` or ``all``)."""
    if subset not in SUBSETS:
        raise PolyprojError(f"unknown subset {subset!r}; choose one of {sorted(SUBSETS)}")
    nmax, mmax = SUBSETS[subset]
    return n <= nmax and m <= mmax


def list_problems(folder: str | os.PathLike, subset: str = "all") -> list[str]:
    """Sorted names of the problems in ``folder`` that belong to ``subset``.

    Raises
    ------
    DataNotFound
        When the folder is absent (the message says where to get the data).
    """
    folder = _folder(folder)
    names = []
    for fname in sorted(os.listdir(folder)):
        if fname.endswith(".mat"):
            n, m = _sizes(os.path.join(folder, fname))
            if in_subset(n, m, subset):
                names.append(fname[:-4])
    return names


def _split_bounds(A: sp.csr_matrix, l: np.ndarray, u: np.ndarray, n: int):
    """Move rows ``l_i <= x_j <= u_i`` (one non-zero, equal to 1) of A into variable bounds."""
    nnz = np.diff(A.indptr)
    single = np.flatnonzero(nnz == 1)
    single = single[A.data[A.indptr[single]] == 1.0]
    lb, ub = np.full(n, -np.inf), np.full(n, np.inf)
    cols = A.indices[A.indptr[single]]
    np.maximum.at(lb, cols, l[single])
    np.minimum.at(ub, cols, u[single])
    if np.any(lb > ub):  # crossing bounds from several rows: keep them as rows (infeasible problem)
        return A, l, u, None, None
    keep = np.setdiff1d(np.arange(A.shape[0]), single)
    return A[keep], l[keep], u[keep], lb, ub


def load_problem(path: str | os.PathLike, split_bounds: bool = True, check_psd: bool = True) -> MarosMeszaros:
    """Read one ``.mat`` file into a :class:`MarosMeszaros` record (its ``qp`` is a sparse QP)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise DataNotFound(f"Maros–Meszaros problem file {path!r} not found")
    d = _loadmat(path)
    n, m = int(np.asarray(d["n"]).item()), int(np.asarray(d["m"]).item())
    P = sp.csc_matrix(d["P"], dtype=np.float64)
    P = ((P + P.T) * 0.5).tocsc()  # stored symmetric up to rounding; make it exactly so
    q = np.asarray(d["q"], dtype=np.float64).reshape(-1)
    A = sp.csr_matrix(d["A"], dtype=np.float64)
    l = np.asarray(d["l"], dtype=np.float64).reshape(-1)
    u = np.asarray(d["u"], dtype=np.float64).reshape(-1)
    r = float(np.asarray(d.get("r", 0.0)).reshape(-1)[0]) if np.size(d.get("r", 0.0)) else 0.0
    lb = ub = None
    if split_bounds:
        A, l, u, lb, ub = _split_bounds(A, l, u, n)
    qp = QP(P=P, q=q, C=sp.csc_matrix(A), l=l, u=u, lb=lb, ub=ub, check_psd=check_psd)
    return MarosMeszaros(name=os.path.basename(path)[:-4], qp=qp, r=r, n=n, m=m)


def iter_problems(folder: str | os.PathLike, subset: str = "all", names: list[str] | None = None,
                  **kwargs) -> Iterator[MarosMeszaros]:
    """Yield the problems of ``folder`` in ``subset`` (or exactly ``names``) in name order."""
    folder = _folder(folder)
    if isinstance(names, str):  # one name, not its characters
        names = [names]
    chosen = list_problems(folder, subset) if names is None else list(names)
    for name in chosen:
        yield load_problem(os.path.join(folder, f"{name}.mat"), **kwargs)
