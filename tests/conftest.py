"""Shared fixtures: hypothesis profiles and the backend fixture parametrised over every backend."""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import polyproj as pp
from polyproj.sets.detect import recognise

# `ci` is bounded (make test); `dev` is long (make test-dev). HYPOTHESIS_PROFILE selects.
settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=500, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))



def _imports_torch_at_top(path: Path) -> bool:
    return any(line.startswith(("import torch", "from torch")) for line in path.read_text().splitlines())


#: modules that import torch at the top: not collected where torch is absent (make test-min); the
#: others skip with pytest.importorskip
collect_ignore = [] if importlib.util.find_spec("torch") else \
    sorted(p.name for p in Path(__file__).parent.glob("test_*.py") if _imports_torch_at_top(p))

#: CPU backends every test runs on (cupy needs a GPU and is tested by benchmarks/gpu_check.sh)
CPU_BACKENDS = [name for name in pp.available_backends() if name != "cupy"]


@pytest.fixture(params=CPU_BACKENDS)
def backend(request) -> str:
    """Name of each available CPU backend in turn."""
    return request.param


@pytest.fixture
def bench(tmp_path, monkeypatch):
    """``bench(name)``: a benchmark script imported afresh, its ``benchmarks/results`` moved to tmp_path."""
    import sys

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    common = importlib.import_module("common")
    monkeypatch.setattr(common, "RESULTS", tmp_path)

    def load(name):
        sys.modules.pop(name, None)
        return importlib.import_module(name)
    return load


def _projectors() -> dict:
    """Every set the Projector contract runs on (``polyproj.testing.check_projector``)."""
    rng = np.random.default_rng(5)
    A = rng.normal(size=(7, 5))
    P = pp.Polyhedron(A=A, a=A @ rng.normal(size=5) + rng.uniform(0.2, 1.0, 7), B=rng.normal(size=(1, 5)),
                      b=[0.3], lb=-2 * np.ones(5), ub=2 * np.ones(5))
    sets = {
        "simplex": lambda: pp.sets.Simplex(6),
        "simplex-total": lambda: pp.sets.Simplex(5, total=2.5),
        "box": lambda: pp.sets.Box(np.r_[-1.0, -np.inf, 0.0, 1.0], np.r_[1.0, 2.0, np.inf, 1.0]),
        "capped-simplex": lambda: pp.sets.CappedSimplex(6, total=2.0, upper=0.5),
        "birkhoff-3": lambda: pp.sets.Birkhoff(3),
        "birkhoff-4": lambda: pp.sets.Birkhoff(4),
        "matching-2x3": lambda: pp.sets.PartialMatching(2, 3, max_matches=1.5),
        "matching-3x3": lambda: pp.sets.PartialMatching(3, 3),
        # a Birkhoff polyhedron as a user may write it (rows reordered and scaled, a row sum left out),
        # recognised by pp.project: its multipliers are reported in that polyhedron's rows
        "recognised-birkhoff": lambda: recognise(pp.Polyhedron(B=_birkhoff_rows()[1:], b=_birkhoff_rhs()[1:],
                                                               lb=np.zeros(9))),
        # all 2k rows of a Birkhoff polytope (dependent: rank 2k - 1), through the generic path
        "birkhoff-2k-rows-generic": lambda: pp.sets.Polyhedral(
            pp.Polyhedron(B=_birkhoff_rows(), b=_birkhoff_rhs(), lb=np.zeros(9), allow_dependent_rows=True),
            "proxsuite"),
    }
    for name in ("proxsuite", "ipm", "admm"):
        if name in CPU_BACKENDS:
            sets[f"polyhedral-{name}"] = lambda name=name: pp.sets.Polyhedral(P, name)
    return sets


def _birkhoff_rows() -> np.ndarray:
    B = np.vstack([np.kron(np.eye(3), np.ones((1, 3))), np.kron(np.ones((1, 3)), np.eye(3))])
    return B[[3, 0, 5, 1, 4, 2]] * np.array([2.0, -1.0, 0.5, 3.0, 1.0, -2.0])[:, None]


def _birkhoff_rhs() -> np.ndarray:
    return np.array([2.0, -1.0, 0.5, 3.0, 1.0, -2.0])


#: set name -> factory
PROJECTORS = _projectors()


@pytest.fixture(params=sorted(PROJECTORS))
def projector(request) -> pp.Projector:
    """Each set of :data:`PROJECTORS` in turn."""
    return PROJECTORS[request.param]()


@pytest.fixture
def rng() -> np.random.Generator:
    """A seeded generator (tests are deterministic)."""
    return np.random.default_rng(12345)


@pytest.fixture
def shared_dir() -> str:
    """The shared/ folder beside the repository (Maros–Meszaros data)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "shared"))


@pytest.fixture
def mm_dir(shared_dir) -> str:
    """The Maros–Meszaros folder of shared/ (the test is skipped where it is absent)."""
    path = os.path.join(shared_dir, "data", "maros_meszaros")
    if not os.path.isdir(path):
        pytest.skip(f"Maros–Meszaros data not found at {path}")
    return path


# ----------------------------------------------------------------------------- DIF modules
# used with ``pytestmark = pytest.mark.usefixtures(...)`` by the DIF test modules (torch imported lazily:
# the core test run has no torch)
@pytest.fixture(scope="module")
def one_torch_thread():
    """torch.func on tiny tensors is dominated by thread contention on shared cores."""
    import torch

    old = torch.get_num_threads()
    from polyproj.runtime import set_torch_threads

    set_torch_threads(1)
    yield
    set_torch_threads(old)


@pytest.fixture(scope="module")
def quiet_polyproj_warnings():
    """Modules whose problems are degenerate on purpose: PolyprojWarning is expected there, not tested."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pp.PolyprojWarning)
        yield


@pytest.fixture(scope="module")
def study():
    """Small instance of the DIF regression study: equality, binding, weakly active and inactive constraints."""
    from polyproj.adapters.dif.study import make_regression_study

    return make_regression_study(n=80, d=8, n_test=50, seed=3)


def _mlp_sq(m, b):
    wd = sum((p ** 2).sum() for p in m.__dict__["_params"].values())
    return (m(b[0]).squeeze(-1) - b[1]) ** 2 + 1e-3 * wd


@pytest.fixture(scope="module")
def mlp():
    """A tanh MLP (d = 31) with a binding group-risk constraint and a weakly active bias cap."""
    import torch

    from polyproj.adapters.dif import ConstrainedProblem, Constraint, Loss, solve

    rng = np.random.default_rng(0)
    n = 60
    X = torch.as_tensor(rng.normal(size=(n, 3)))
    y = torch.as_tensor(np.sin(X.numpy() @ np.array([1.0, -1.0, 0.5])) + 0.1 * rng.normal(size=n))
    grp = np.flatnonzero(rng.random(n) < 0.35)
    y[grp] += 0.8
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
    gi = torch.as_tensor(grp)
    p0 = ConstrainedProblem(net, Loss(_mlp_sq, (X, y)))
    k0 = solve(p0, tol=1e-9)
    r0 = float(_mlp_sq(p0.wrap(k0.theta), (X[gi], y[gi])).mean())
    group = Constraint(_mlp_sq, (X[gi], y[gi]), tau=0.6 * r0, name="group")
    p1 = ConstrainedProblem(net, Loss(_mlp_sq, (X, y)), [group])
    k1 = solve(p1, theta0=k0.theta, tol=1e-11)
    cap = float(k1.theta[-1])
    prob = ConstrainedProblem(net, Loss(_mlp_sq, (X, y)),
                              [group, Constraint(lambda m: getattr(m, "2").bias.sum(), None, tau=cap, name="bias_cap")])
    kkt = solve(prob, theta0=k1.theta, lambdas0=np.r_[k1.lambdas.numpy(), 0.0], tol=1e-11)
    pos = {int(i): k for k, i in enumerate(grp)}
    removals = [{"objective": [i], "group": [pos[i]]} if i in pos else {"objective": [i]} for i in range(n)]
    return prob, kkt, removals, (X, y)
