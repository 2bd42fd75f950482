"""The ``cupy`` backend's projections and ``device`` option, and projections on a device without float64
(2026-12-07 probe; each test failed before its fix).

There is no GPU here: a stand-in ``cupy`` module (put in ``sys.modules`` by ``monkeypatch``, removed after each
test) records what the backend asks of it; its "device arrays" are NumPy arrays of a subclass with CuPy's
``get()``, so the IPM runs on them as on NumPy and the tests see what went to the device and what came back.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import polyproj as pp
from polyproj.polydata import PolyData


class _OnDevice(np.ndarray):
    """An array the stand-in put "on the device": ``get()`` copies it back to a plain NumPy array (CuPy's API)."""

    def get(self) -> np.ndarray:
        return np.array(self)


@pytest.fixture
def fake_cupy(monkeypatch):
    """A stand-in ``cupy`` (two CUDA devices) that logs the arrays sent to it and the devices entered."""
    log: dict[str, list] = {"asarray": [], "device": []}
    fake = types.ModuleType("cupy")
    fake.__version__ = "0-stub"

    def asarray(a):
        log["asarray"].append(np.array(a))
        return np.asarray(a).view(_OnDevice)

    class Device:
        def __init__(self, i):
            self.id = int(i)

        def __enter__(self):
            log["device"].append(self.id)
            return self

        def __exit__(self, *exc):
            return False

    fake.asarray = asarray
    fake.cuda = types.SimpleNamespace(Device=Device, runtime=types.SimpleNamespace(getDeviceCount=lambda: 2))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return log


def _capped_box(n: int, c: float) -> pp.Polyhedron:
    """{y : sum(y) <= c, -1 <= y <= 1}."""
    return pp.Polyhedron(A=np.ones((1, n)), a=[c], lb=-np.ones(n), ub=np.ones(n))


def _capped_box_projection(x: np.ndarray, c: float) -> np.ndarray:
    """The projection onto :func:`_capped_box`, independently: clip(x - t, -1, 1), t >= 0 the least with
    sum <= c (KKT of the one coupling row), t by bisection in float64."""
    y = np.clip(x, -1.0, 1.0)
    if y.sum() <= c:
        return y
    lo, hi = 0.0, float(np.abs(x).max()) + 2.0
    for _ in range(200):
        t = 0.5 * (lo + hi)
        lo, hi = (t, hi) if np.clip(x - t, -1.0, 1.0).sum() > c else (lo, t)
    return np.clip(x - hi, -1.0, 1.0)


# ----------------------------------------------------------------------------- defect 1: backend="cupy"
def test_cupy_projections_of_numpy_points_go_to_the_device_and_come_back_as_numpy(fake_cupy):
    """pp.project(X, S, backend="cupy") inherited the ipm backend's solve_projections, which runs in X's own
    namespace: NumPy points were projected on the CPU, CuPy never called, ``device`` ignored. Now the points and
    the constraint data go to the device given, and the answer comes back as plain NumPy, exact after the polish."""
    rng = np.random.default_rng(0)
    n, c = 6, 1.0
    X = 2.0 * rng.standard_normal((8, n))
    r = pp.project(X, _capped_box(n, c), backend="cupy", device=1)
    assert any(a.shape == X.shape and np.array_equal(a, X) for a in fake_cupy["asarray"])  # the points were sent
    assert fake_cupy["device"] and set(fake_cupy["device"]) == {1}  # on the device asked for, only
    assert type(r.y) is np.ndarray and r.y.dtype == np.float64  # back on the host (get()), not a device array
    ref = np.array([_capped_box_projection(x, c) for x in X])
    assert np.abs(r.y - ref).max() <= 1e-9
    assert all(s is pp.Status.SOLVED for s in r.status) and bool(np.all(r.polished))


def test_cupy_projections_do_not_stop_early_as_capabilities_say(fake_cupy):
    """capabilities.early_stop is False for cupy, yet its solve_projections(rough=True) stopped at the ipm's
    rough tolerance (1e-4: points 5e-3 off here). It now runs to the unified tolerances and says so."""
    solver = pp.get_backend("cupy")
    assert not solver.capabilities.early_stop
    rng = np.random.default_rng(0)
    n, c = 6, 1.0
    X = 2.0 * rng.standard_normal((8, n))
    start = solver.solve_projections(X, PolyData.from_polyhedron(_capped_box(n, c)), rough=True)
    ref = np.array([_capped_box_projection(x, c) for x in X])
    assert not start.rough and start.accuracy == solver.settings["eps_abs"]
    assert type(start.y) is np.ndarray and np.abs(start.y - ref).max() <= 1e-6


@pytest.mark.parametrize("device", ["gpu0", -1, 1.5, True, [0]])
def test_cupy_device_option_is_checked_when_the_backend_is_built(fake_cupy, device):
    """device="gpu0" was accepted and failed at the first solve (a SolverError around int()'s ValueError)."""
    with pytest.raises(pp.SettingsError, match=r"option 'device' of backend 'cupy' must be an integer"):
        pp.get_backend("cupy", device=device)
    assert not fake_cupy["asarray"]  # refused before anything reached the device


def test_cupy_device_option_accepts_device_ids(fake_cupy):
    solver = pp.get_backend("cupy", device=1.0)  # an integral number, as every integer option takes it
    assert solver.backend_options["device"] == 1 and type(solver.backend_options["device"]) is int
    sol = pp.solve_qp(pp.QP(np.eye(3), -np.ones(3), np.ones((1, 3)), [-np.inf], [1.0]), backend=solver)
    assert np.allclose(sol.x, np.full(3, 1.0 / 3.0), atol=1e-7) and set(fake_cupy["device"]) == {1}


# ----------------------------------------------------------------------------- defect 2: no float64 on the device
@pytest.mark.parametrize("backend", ["ipm", "admm"])
def test_projection_on_a_device_without_float64_runs_in_float32(backend):
    """pp.project on array_api_strict's "no_float64" device (what torch's MPS is) raised the namespace's raw
    ValueError: the polyhedron's data were cast to float64 there. The projection now runs in float32 on that
    device, polished, to float32's accuracy against the float64 projection."""
    xs = pytest.importorskip("array_api_strict")
    dev, cpu = xs.Device("no_float64"), xs.Device("CPU_DEVICE")
    rng = np.random.default_rng(1)
    n, c = 10, 1.0
    X = (2.0 * rng.standard_normal((12, n))).astype(np.float32)
    r = pp.project(xs.asarray(X, device=dev), _capped_box(n, c), backend=backend)
    assert r.y.dtype == xs.float32 and r.y.device == dev
    y = np.asarray(r.y.to_device(cpu), dtype=np.float64)
    ref = np.array([_capped_box_projection(x, c) for x in X.astype(np.float64)])
    assert np.abs(y - ref).max() <= 1e-5
    assert all(s is pp.Status.SOLVED for s in r.status) and bool(xs.all(r.polished))


def test_projection_on_a_device_without_float64_with_equalities_matches_float64():
    """A random polytope with equality rows (its data float32 numbers): within float32's accuracy of the float64
    projection of another backend (DAQP on NumPy), every point polished."""
    xs = pytest.importorskip("array_api_strict")
    pytest.importorskip("daqp")
    dev, cpu = xs.Device("no_float64"), xs.Device("CPU_DEVICE")
    rng = np.random.default_rng(7)
    n, m, p = 12, 20, 2

    def f32(v):
        return np.asarray(v, dtype=np.float32).astype(np.float64)

    A, B, x0 = f32(rng.standard_normal((m, n))), f32(rng.standard_normal((p, n))), 0.3 * rng.standard_normal(n)
    poly = pp.Polyhedron(A=A, a=f32(A @ x0 + rng.uniform(0.1, 1.0, m)), B=B, b=f32(B @ x0), lb=-np.ones(n),
                         ub=np.ones(n))
    X = (2.0 * rng.standard_normal((10, n))).astype(np.float32)
    r = pp.project(xs.asarray(X, device=dev), poly, backend="ipm")
    ref = pp.project(X.astype(np.float64), poly, backend="daqp").y
    y = np.asarray(r.y.to_device(cpu), dtype=np.float64)
    assert r.y.dtype == xs.float32 and np.abs(y - ref).max() <= 1e-4
    assert bool(xs.all(r.polished)) and r.max_violation <= 1e-4
