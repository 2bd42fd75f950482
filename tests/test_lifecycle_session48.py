"""Process lifecycle of the layer (a probe, 2026-12-07; each failing before its fix): a fork while another thread
held the set cache's lock hung the child; a copied or unpickled Box made torch warn about read-only memory."""

from __future__ import annotations

import copy
import os
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import polyproj as pp  # noqa: E402
import polyproj.adapters.torch as pt  # noqa: E402


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_while_the_set_cache_is_locked_can_project():
    """The set cache's lock held at the fork (as by another thread in the middle of a lookup) is a new lock in
    the child: its layer call returns the parent's answer (it waited forever on the copied, held lock)."""
    rng = np.random.default_rng(0)
    n, m = 6, 10
    layer = pt.ProjectionLayer(rng.standard_normal((m, n)), a=np.ones(m), lb=-np.ones(n), ub=np.ones(n))
    x = torch.tensor(rng.standard_normal((3, n)))
    want = layer(x).detach().numpy()
    r, w = os.pipe()
    with pt._SETS._lock:  # held at the fork, as another thread would
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                import signal

                signal.alarm(30)  # a hang ends the child, and the test fails on its exit status
                got = layer(x).detach().numpy()
                code = 0 if np.array_equal(got, want) else 2
            finally:
                os.write(w, bytes([code]))
                os._exit(code)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    assert os.read(r, 1) == b"\x00" and os.WEXITSTATUS(status) == 0, status
    os.close(r)


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("clone", [copy.deepcopy, lambda b: pickle.loads(pickle.dumps(b))])
def test_a_copied_box_projects_torch_points_without_warnings(clone):
    box = pp.sets.Box(-np.ones(4), np.ones(4))
    x = torch.tensor([[2.0, -3.0, 0.5, 1.0], [0.0, 0.0, -0.5, 9.0]], dtype=torch.float64)
    pp.project(x, box)
    got = pp.project(x, clone(box))
    np.testing.assert_array_equal(np.asarray(got.y), np.clip(x.numpy(), -1, 1))


def test_a_scalar_bound_finds_its_set_again():
    """``lb=0.0`` made a new bound tensor per call, so the set cache (keyed by the tensors' identities) missed on
    every call, rebuilt the set and filled with dead entries. The constant is one tensor now: one entry, and the
    answers those of the tensor bound."""
    rng = np.random.default_rng(0)
    n = 6
    A = torch.tensor(rng.standard_normal((8, n)))
    a = torch.ones(8, dtype=torch.float64)
    x = torch.tensor(rng.standard_normal((3, n)))
    pt._SETS.clear()
    want = pt.project(x, A, a, lb=torch.zeros(n, dtype=torch.float64))
    for _ in range(5):
        got = pt.project(x, A, a, lb=0.0)
    assert len(pt._SETS._items) <= 2, len(pt._SETS._items)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-14)


@pytest.mark.parametrize("size", [4, 3000])  # the direct path and the pipeline
@pytest.mark.parametrize("clone", [copy.deepcopy, lambda r: pickle.loads(pickle.dumps(r))])
def test_a_recorded_result_pickles_and_its_copy_gives_the_same_backward(size, clone):
    """A result made with ``record=True`` (what ``vjp`` needs) held its array namespace, a module: pickle and
    deepcopy failed ("cannot pickle 'module' object"), e.g. sending it back from a process pool."""
    rng = np.random.default_rng(0)
    n = 8
    S = pp.sets.Polyhedral(pp.Polyhedron(A=rng.standard_normal((12, n)), a=np.ones(12), lb=-np.ones(n),
                                         ub=np.ones(n)))
    res = S.project_batch(rng.standard_normal((size, n)), record=True)
    G = rng.standard_normal((size, n))
    np.testing.assert_array_equal(np.asarray(S.vjp(clone(res), G)), np.asarray(S.vjp(res, G)))
