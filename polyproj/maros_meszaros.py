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

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.io
import scipy.sparse as sp

from .errors import PolyprojError, ProblemError
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


_WHERE = "get the .mat files from https://github.com/qpsolvers/maros_meszaros_qpbenchmark (data/)"


def _folder(folder: str | os.PathLike) -> str:
    """The folder as a string; absent, a file, or without any ``.mat`` file: DataNotFound naming it."""
    folder = os.fspath(folder)
    if os.path.isfile(folder):
        raise DataNotFound(f"{folder!r} is a file; pass the folder that holds the Maros–Meszaros .mat files")
    if not os.path.isdir(folder):
        raise DataNotFound(f"Maros–Meszaros folder {folder!r} not found; {_WHERE} and pass their folder")
    if not any(f.endswith(".mat") for f in os.listdir(folder)):  # a wrong folder, not an empty subset
        raise DataNotFound(f"no Maros–Meszaros .mat files in {folder!r}; {_WHERE} and pass their folder")
    return folder


def _check_subset(subset: str) -> None:
    if not isinstance(subset, str) or subset not in SUBSETS:  # a list raised TypeError (unhashable)
        raise PolyprojError(f"unknown subset {subset!r}; choose one of {sorted(SUBSETS)}")


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


def _size(path: str, d: dict[str, Any], key: str) -> int:
    """The size ``d[key]`` (n or m) of the file: one non-negative integer, else a ProblemError naming the file."""
    from .errors import ProblemError

    v = np.asarray(d[key])
    try:
        value = float(v.item())
    except (TypeError, ValueError):  # empty, several values, a string
        raise ProblemError(f"{path!r}: {key} must be one number (the problem's size), got an array of shape "
                           f"{v.shape} and dtype {v.dtype}") from None
    if not (math.isfinite(value) and value >= 0 and value == int(value)):  # int(inf) raised OverflowError
        raise ProblemError(f"{path!r}: {key} must be a non-negative integer (the problem's size), got {value:g}")
    return int(value)


def _sizes(path: str) -> tuple[int, int]:
    d = _loadmat(path, ["n", "m"])
    return _size(path, d, "n"), _size(path, d, "m")


def in_subset(n: int, m: int, subset: str) -> bool:
    """True when a problem of size (n, m) belongs to ``subset`` (``dense``, ``small`` or ``all``)."""
    _check_subset(subset)
    nmax, mmax = SUBSETS[subset]
    return n <= nmax and m <= mmax


def list_problems(folder: str | os.PathLike, subset: str = "all", *, unreadable: list[str] | None = None) -> list[str]:
    """Sorted names of the problems in ``folder`` that belong to ``subset``.

    ``unreadable``: a list that receives the names of the files whose sizes cannot be read (instead of a
    ProblemError for the first of them; a benchmark reports them as load errors and runs the others).

    Raises
    ------
    DataNotFound
        When the folder is absent or holds no ``.mat`` file (the message says where to get the data).
    ProblemError
        When a file is not a readable Maros–Meszaros problem (the message names it).
    PolyprojError
        When ``subset`` is not one of :data:`SUBSETS`.
    """
    _check_subset(subset)
    folder = _folder(folder)
    names = []
    for fname in sorted(os.listdir(folder)):
        if fname.endswith(".mat"):
            try:
                n, m = _sizes(os.path.join(folder, fname))
            except ProblemError:
                if unreadable is None:
                    raise
                unreadable.append(fname[:-4])
                continue
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


def _arrays(path: str, d: dict[str, Any]) -> tuple:
    """P, q, A, l, u, r of the file as float64, their sizes checked against n and m (ProblemError naming it)."""
    from .errors import ProblemError

    n, m = _size(path, d, "n"), _size(path, d, "m")
    try:
        P = sp.csc_matrix(d["P"], dtype=np.float64)
        q = np.asarray(d["q"], dtype=np.float64).reshape(-1)
        A = sp.csr_matrix(d["A"], dtype=np.float64)
        l = np.asarray(d["l"], dtype=np.float64).reshape(-1)
        u = np.asarray(d["u"], dtype=np.float64).reshape(-1)
        r = np.asarray(d.get("r", 0.0), dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as exc:  # a string or a cell array where numbers belong
        raise ProblemError(f"{path!r} is not a valid Maros–Meszaros problem: {type(exc).__name__}: {exc}") from None
    wrong = [f"{k} has shape {got}, expected {want}"
             for k, got, want in (("P", P.shape, (n, n)), ("q", q.shape, (n,)), ("A", A.shape, (m, n)),
                                  ("l", l.shape, (m,)), ("u", u.shape, (m,)))
             if got != want]
    if r.size > 1:
        wrong.append(f"r has {r.size} values, expected one")
    if wrong:
        raise ProblemError(f"{path!r} is not a consistent Maros–Meszaros problem (n = {n}, m = {m}): "
                           + "; ".join(wrong))
    return n, m, P, q, A, l, u, float(r[0]) if r.size else 0.0


def load_problem(path: str | os.PathLike, split_bounds: bool = True, check_psd: bool = True) -> MarosMeszaros:
    """Read one ``.mat`` file into a :class:`MarosMeszaros` record (its ``qp`` is a sparse QP).

    Raises
    ------
    DataNotFound
        When the file is absent.
    ProblemError
        When the file is not a readable, consistent Maros–Meszaros problem, or (``check_psd``) its P is not
        positive semidefinite; the message names the file.
    """
    from .errors import ProblemError

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise DataNotFound(f"Maros–Meszaros problem file {path!r} not found")
    n, m, P, q, A, l, u, r = _arrays(path, _loadmat(path))
    P = ((P + P.T) * 0.5).tocsc()  # stored symmetric up to rounding; make it exactly so
    lb = ub = None
    if split_bounds:
        A, l, u, lb, ub = _split_bounds(A, l, u, n)
    try:
        qp = QP(P=P, q=q, C=sp.csc_matrix(A), l=l, u=u, lb=lb, ub=ub, check_psd=check_psd)
    except ProblemError as exc:  # NaN data, l > u, a non-convex P: say which file
        raise type(exc)(f"{path!r}: {exc}") from None
    base = os.path.basename(path)
    return MarosMeszaros(name=base[:-4] if base.endswith(".mat") else base, qp=qp, r=r, n=n, m=m)


def iter_problems(folder: str | os.PathLike, subset: str = "all", names: list[str] | None = None,
                  **kwargs) -> Iterator[MarosMeszaros]:
    """Yield the problems of ``folder`` in ``subset`` (or exactly ``names``) in name order.

    The folder and ``subset`` are checked when it is called (DataNotFound, PolyprojError), not at the first
    problem; ``subset`` is checked with ``names`` too.
    """
    _check_subset(subset)
    folder = _folder(folder)
    if isinstance(names, str):  # one name, not its characters
        names = [names]
    chosen = list_problems(folder, subset) if names is None else list(names)
    return (load_problem(os.path.join(folder, f"{name}.mat"), **kwargs) for name in chosen)
