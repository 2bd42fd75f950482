"""DIF inputs: ``executor`` and ``progress`` act on every path of ``influence``; bad inputs give clear errors.

``influence(None, executor=ex)`` (the parameter changes ω) ran in process on both paths and ``influence(F,
progress=True)`` on the dense path drew no bar. A single Constraint or None as ``constraints``, ``top_k(None, k)``,
a boolean mask of candidates and indices such as ``inf`` or ``1e20`` gave raw or misleading errors.
"""

from __future__ import annotations

import warnings
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np
import pytest
import torch

import polyproj as pp
from polyproj.adapters.dif import DIF, ConstrainedProblem, Constraint, Loss, solve
from tests.dif_helpers import binding_least_squares, sq, untrained_tanh

pytestmark = pytest.mark.usefixtures("one_torch_thread")



@pytest.fixture(scope="module")
def setup():
    """Least squares (N = 40, d = 4) with a binding bound on θ₁ and a binding group-risk constraint with data."""
    prob, kkt, X, y = binding_least_squares(40)
    assert kkt.classification == {"cap": "binding", "group": "binding"}
    return prob, kkt, X, y


class _Counting(Executor):
    """An executor that counts the jobs it is given and runs them on a thread pool."""

    def __init__(self, pool: Executor) -> None:
        self.pool, self.jobs = pool, 0

    def submit(self, fn, /, *args, **kwargs):
        self.jobs += 1
        return self.pool.submit(fn, *args, **kwargs)


# ----------------------------------------------------------------------------- executor with test_fn=None
@pytest.mark.parametrize("method", ["dense", "matrix-free"])
def test_parameter_changes_run_on_the_executor(setup, method):
    """test_fn=None: the removals go to the executor in chunks (one job a chunk) and give the in-process ω."""
    prob, kkt, _, _ = setup
    dif = DIF(prob, kkt, method=method)
    groups = [{"objective": [i, i + 1], "group": [i % 10]} for i in range(0, 14, 2)]
    here_all, here_groups = dif.influence(None).numpy(), dif.influence(None, groups).numpy()
    assert here_all.shape == (40, 4) and here_groups.shape == (7, 4)
    np.testing.assert_allclose(here_groups[3], dif.delta_theta(groups[3]).numpy(), rtol=0, atol=1e-12)
    with ThreadPoolExecutor(2) as pool:
        ex = _Counting(pool)
        there_all = dif.influence(None, executor=ex, chunk_size=8).numpy()
        assert ex.jobs == 5  # 40 removals, 8 a chunk
        there_groups = dif.influence(None, groups, executor=ex, chunk_size=3).numpy()
        assert ex.jobs == 5 + 3
        there_empty = dif.influence(None, [], executor=ex)
    np.testing.assert_allclose(there_all, here_all, rtol=0, atol=1e-12)
    np.testing.assert_allclose(there_groups, here_groups, rtol=0, atol=1e-12)
    assert tuple(there_empty.shape) == (0, 4)


def test_parameter_changes_on_a_process_pool(setup):
    """A process pool gets the engine itself (pickled with its problem, whose functions are module-level)."""
    prob, kkt, _, _ = setup
    rems = [{"objective": [i]} for i in range(6)] + [{"group": [2, 3]}]
    with ProcessPoolExecutor(2) as pool:
        ex = _Counting(pool)
        for method in ("dense", "matrix-free"):
            dif = DIF(prob, kkt, method=method)
            np.testing.assert_allclose(dif.influence(None, rems, executor=ex, chunk_size=3).numpy(),
                                       dif.influence(None, rems).numpy(), rtol=0, atol=1e-12)
    assert ex.jobs == 2 * 3


def test_parameter_changes_on_threads_use_one_damping():
    """Matrix-free, damping='auto', no active constraint: the setup solves nothing, and the first solve for ω
    meets the negative curvature of an untrained tanh net and raises the damping. Each chunk raises it on its own
    copy of the engine (threads never set up the shared one), the engine takes the largest and computes every
    chunk again: the ω of a DIF built with that damping, on threads and in process."""
    prob, kkt, _, _ = untrained_tanh(30, 4)
    rems = [{"objective": [i]} for i in range(6)]
    with ThreadPoolExecutor(2) as pool:
        ex = _Counting(pool)
        threads = DIF(prob, kkt, method="matrix-free", damping="auto", rtol=1e-12)
        floor = threads.damping
        there = threads.influence(None, rems, executor=ex, chunk_size=2).numpy()
    assert threads.damping > floor and ex.jobs >= 2 * 3  # the chunks once with the floor, again with the raise
    here = DIF(prob, kkt, method="matrix-free", damping="auto", rtol=1e-12)
    np.testing.assert_allclose(here.influence(None, rems, chunk_size=2).numpy(), there, rtol=0, atol=1e-12)
    assert here.damping == threads.damping
    fixed = DIF(prob, kkt, method="matrix-free", damping=threads.damping, rtol=1e-12)
    np.testing.assert_allclose(fixed.delta_theta(rems).numpy(), there, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- progress on the dense path
@pytest.fixture
def bars(monkeypatch):
    """The descriptions of the progress bars drawn (``rich.progress.track``, as polyproj.runtime draws them), with
    stderr taken for a terminal (bars are drawn only there)."""
    import rich.console
    import rich.progress

    monkeypatch.setattr(rich.console.Console, "is_terminal", property(lambda self: True))
    drawn: list[str] = []
    track = rich.progress.track

    def spy(*args, **kwargs):
        drawn.append(kwargs.get("description"))
        return track(*args, **kwargs)

    monkeypatch.setattr(rich.progress, "track", spy)
    return drawn


@pytest.mark.parametrize("method", ["dense", "matrix-free"])
def test_progress_bar_on_every_path(setup, bars, method):
    """progress=True draws a bar over the chunks; None from 8 chunks; False never (the dense path drew none)."""
    prob, kkt, X, y = setup
    dif = DIF(prob, kkt, method=method)

    def F(th):
        return sq(th, (X[:5], y[:5])).mean()

    ref = dif.influence(F, progress=False).numpy()
    assert bars == []
    np.testing.assert_allclose(dif.influence(F, chunk_size=10, progress=True).numpy(), ref, rtol=1e-9, atol=1e-13)
    assert bars == ["DIF scores"]
    dif.influence(F, chunk_size=5)  # 8 chunks
    dif.influence(F, chunk_size=6)  # 7 chunks: no bar by default
    assert bars == ["DIF scores"] * 2
    dif.influence(None, chunk_size=20, progress=True)
    assert bars == ["DIF scores"] * 2 + ["DIF parameter changes"]


def test_progress_bar_and_a_shut_down_executor(setup, bars):
    """A probe: progress=True was ignored with an executor (its map returned before the bar), and a pool already
    shut down raised the pool's RuntimeError."""
    from concurrent.futures import ThreadPoolExecutor

    prob, kkt, X, y = setup
    dif = DIF(prob, kkt, method="dense")

    def F(th):
        return sq(th, (X[:5], y[:5])).mean()

    ref = dif.influence(F, progress=False).numpy()
    with ThreadPoolExecutor(2) as ex:
        np.testing.assert_allclose(dif.influence(F, executor=ex, chunk_size=10, progress=True).numpy(), ref,
                                   rtol=1e-9, atol=1e-13)
        assert bars == ["DIF scores"]
        dif.influence(F, executor=ex, chunk_size=10, progress=False)
        assert bars == ["DIF scores"]
    with pytest.raises(pp.ProblemError, match="executor refused the jobs.*shut down"):
        dif.influence(F, executor=ex)


# ----------------------------------------------------------------------------- bad inputs
def test_constraints_argument(setup):
    """One Constraint is a list of one, None no constraints; anything else names ``constraints``."""
    prob, _, X, y = setup
    cap = prob.constraints[0]
    one = ConstrainedProblem(torch.zeros(4), Loss(sq, (X, y)), cap)
    assert one.names == ("objective", "cap") and one.constraints == (cap,)
    assert ConstrainedProblem(torch.zeros(4), Loss(sq, (X, y)), None).m == 0
    assert ConstrainedProblem(torch.zeros(4), Loss(sq, (X, y)), constraints=None).names == ("objective",)
    for bad, match in ((3, "constraints must be a Constraint, a list of Constraint objects or None, got int"),
                       (Loss(sq, (X, y)), "constraints must be a Constraint.*got Loss"),
                       ("cap", "constraints must be a Constraint.*got str"),
                       ([cap, 3], "constraints must be Constraint objects, got int")):
        with pytest.raises(pp.ProblemError, match=match):
            ConstrainedProblem(torch.zeros(4), Loss(sq, (X, y)), bad)


def test_top_k_needs_a_test_function(setup):
    prob, kkt, _, _ = setup
    with pytest.raises(pp.ProblemError, match="top_k: test_fn must be a callable.*got NoneType"):
        DIF(prob, kkt).top_k(None, 3)


def test_top_k_candidates_as_a_boolean_mask(setup):
    """A mask selects the samples where it is True, as in a removal (it was read as the indices 0 and 1)."""
    prob, kkt, X, y = setup
    dif = DIF(prob, kkt)

    def F(th):
        return sq(th, (X[:5], y[:5])).mean()

    mask = np.zeros(40, dtype=bool)
    mask[[3, 8, 11, 20, 31]] = True
    idx, joint = dif.top_k(F, 2, candidates=mask)
    want_idx, want_joint = dif.top_k(F, 2, candidates=[3, 8, 11, 20, 31])
    np.testing.assert_array_equal(idx, want_idx)
    assert joint == want_joint and set(idx) <= {3, 8, 11, 20, 31}
    idx_t, _ = dif.top_k(F, 2, candidates=torch.as_tensor(mask))
    np.testing.assert_array_equal(idx_t, want_idx)
    with pytest.raises(pp.ProblemError, match=r"top_k: candidates: a boolean mask must have shape \(40,\)"):
        dif.top_k(F, 2, candidates=mask[:30])
    with pytest.raises(pp.ProblemError, match="top_k: candidates: indices must be integers, got 2.5"):
        dif.top_k(F, 2, candidates=[1, 2.5, 4])  # was truncated to 2
    with pytest.raises(pp.ProblemError, match="top_k: candidates: repeated indices"):
        dif.top_k(F, 2, candidates=[1, 4, 4])


@pytest.mark.parametrize(("index", "match"), [
    (np.inf, "indices must be finite integers, got inf"),
    (-np.inf, "indices must be finite integers, got -inf"),
    (np.nan, "indices must be finite integers, got nan"),
    (1e20, r"index 1e\+20 is out of range for 40 samples"),
    (-1e20, r"index -1e\+20 is out of range for 40 samples"),
    (10**20, r"index 1e\+20 is out of range for 40 samples"),  # a Python int beyond int64: an object array
    (45.0, "index 45 is out of range for 40 samples"),
    (None, "indices must be integers, got NoneType"),
])
def test_indices_without_an_int64_value(setup, index, match):
    """No int64 value (NumPy's cast gave −2⁶³ with a RuntimeWarning, reported as that index): a clear error."""
    prob, kkt, _, _ = setup
    dif = DIF(prob, kkt)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(pp.ProblemError, match=r"removal\['objective'\]: " + match):
            dif.delta_theta({"objective": [2, index]})
        with pytest.raises(pp.ProblemError, match="top_k: candidates: " + match):
            dif.top_k(lambda th: th.sum(), 1, candidates=[2, index])


def _scaled_first(th, b):
    return b[0] * th[0]


def _first(th):
    return th[0]


def test_a_refused_removal_is_numbered_in_the_callers_list_whatever_the_chunks():
    """Two binding constraints with the same gradient (LICQ fails): a removal that moves them inconsistently is
    refused. Chunked, the dense path numbered it within its chunk (#1 of the third chunk, not #5)."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(30, 3, dtype=torch.float64, generator=g)
    y = X @ torch.tensor([2.0, 1.0, -1.0], dtype=torch.float64)
    a = torch.ones(10, dtype=torch.float64)
    a[3], a[4] = 3.0, -1.0  # mean 1: the same constraint as θ₀ <= 0.7 at θ̄
    prob = ConstrainedProblem(torch.zeros(3), Loss(sq, (X, y)), [Constraint(_first, None, tau=0.7, name="c1"),
                                                                 Constraint(_scaled_first, (a,), tau=0.7, name="c2")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pp.PolyprojWarning)
        dif = DIF(prob, solve(prob), method="dense")
    rems = [{"objective": [i]} for i in range(5)] + [{"c2": [3]}] + [{"objective": [7]}]
    for chunk in (None, 2):
        with pytest.raises(pp.ProblemError, match=r"first: #5\)"):
            dif.influence(None, rems, chunk_size=chunk)


def test_kkt_status_edits_lambdas_lengths_perturbation_weights_and_non_finite_second_order_scores():
    """Probe, 2026-12-06: an edited ``KKTPoint.status`` was read as given (a binding row called inactive left out
    of the DIF QP, an unknown word taken for inactive); multipliers of the wrong length raised NumPy's ValueError;
    ``perturbed(removal, "a")`` ValueError, ``None`` TypeError, ``t = 2`` accepted (negative weights); order 2
    returned NaN where the test function is NaN at θ̄ + ω."""
    from dataclasses import replace

    from polyproj.adapters.dif import DIF, ConstrainedProblem, Constraint, Loss, solve

    torch.manual_seed(0)
    X, y = torch.randn(40, 3, dtype=torch.float64), torch.randn(40, dtype=torch.float64)

    def sq(theta, batch):
        xb, yb = batch
        return (xb @ theta - yb) ** 2 + 0.01 * (theta**2).sum()

    def cap(theta, batch):
        return batch[0] @ theta - 0.1

    prob = ConstrainedProblem(torch.zeros(3, dtype=torch.float64), Loss(sq, (X, y)),
                              [Constraint(cap, (torch.ones(1, 3, dtype=torch.float64),), name="cap")])
    kkt = solve(prob, tol=1e-12)
    assert kkt.status == ("binding",)
    for st in (("inactive",), ("bogus",), ("weakly_active",)):
        with pytest.raises(pp.ProblemError, match="status"):
            DIF(prob, replace(kkt, status=st))
    with pytest.raises(pp.ProblemError, match="multipliers"):
        DIF(prob, replace(kkt, lambdas=torch.zeros(2, dtype=torch.float64)))
    rem = {"objective": [3]}
    for t in ("a", None, 2.0, float("nan"), True):
        with pytest.raises(pp.ProblemError, match="t must be"):
            prob.perturbed(rem, t)
    prob.perturbed(rem, -0.5)  # upweighting is a perturbation too
    prob.perturbed(rem, np.float32(0.5))
    dif = DIF(prob, kkt)
    side = -float(torch.sign(dif.delta_theta(rem)[0]))
    assert side != 0.0

    def F(theta):  # finite at θ̄, NaN on the side the removal moves θ₀ to
        return torch.sqrt(side * (theta[0] - kkt.theta[0]) + 1e-12)

    assert torch.isfinite(dif.influence(F, [rem], order=1)).all()
    with pytest.raises(pp.ProblemError, match="not finite"):
        dif.influence(F, [rem], order=2)


def test_a_point_from_params_calls_weakly_active_is_accepted():
    """(review) ``from_params`` calls a row active by complementarity (λⱼ > mult_tol, |λⱼ gⱼ| <= tol) even below
    −active_tol; after its multiplier polish λⱼ <= mult_tol, the row is weakly active at g = −1e-5, and the status
    check refused the point the library had built itself."""
    from polyproj.adapters.dif import KKTPoint

    target = torch.tensor([1.0, 0.1 - 1e-5, 0.0], dtype=torch.float64)
    X = torch.ones(4, 1, dtype=torch.float64)

    def loss(theta, batch):
        return ((theta - target) ** 2).sum() * batch[0][:, 0]

    def c1(theta, batch):
        return theta[0:1] - 0.1

    def c2(theta, batch):
        return theta[1:2] - 0.1

    one = (torch.ones(1, 1, dtype=torch.float64),)
    prob = ConstrainedProblem(torch.zeros(3, dtype=torch.float64), Loss(loss, (X,)),
                              [Constraint(c1, one, name="c1"), Constraint(c2, one, name="c2")])
    theta = torch.tensor([0.1, 0.1 - 1e-5, 0.0], dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pp.PolyprojWarning)  # strict complementarity fails for c2: said, not the point
        kkt = KKTPoint.from_params(prob, theta, lambdas=torch.tensor([1.79, 0.05], dtype=torch.float64))
        assert kkt.status[1] == "weakly_active" and float(kkt.g[1]) < -kkt.active_tol
        DIF(prob, kkt)


def test_a_test_function_must_return_a_floating_tensor():
    """(probe) A test function returning a tuple ``(F,)``, a Python float, or an integer / boolean tensor was made
    a constant (no gradient), caught only by the zero-gradient warning: a ProblemError names what it returned."""
    prob, kkt, _, _ = binding_least_squares(40)
    dif = DIF(prob, kkt)
    removal = {"objective": [0]}
    for fn, what in ((lambda th: (th.sum(),), "tuple"), (lambda th: 1.5, "float"),
                     (lambda th: (th.sum() > 0), "floating"), (lambda th: th.sum().to(torch.int64), "floating")):
        with pytest.raises(pp.ProblemError, match=what):
            dif.influence(fn, [removal])
    assert torch.isfinite(dif.influence(lambda th: th.sum(), [removal])).all()
