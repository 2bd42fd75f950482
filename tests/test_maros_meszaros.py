"""Maros–Meszaros loader, the small problems solved by every backend, and ``polyproj bench solvers``."""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import pytest
import scipy.io

import polyproj as pp
from polyproj import bench
from polyproj.maros_meszaros import DataNotFound, in_subset, iter_problems, list_problems, load_problem

HERE = os.path.dirname(os.path.abspath(__file__))
MM_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "data", "maros_meszaros"))
SMALL = list_problems(MM_DIR, "small") if os.path.isdir(MM_DIR) else []
CPU_BACKENDS = [b for b in pp.available_backends() if b != "cupy"]

# measured, not loosened: OSQP 1.1 hits max_iter (also 1e5) on QSHARE2B; qpbenchmark reports the same
# and our batched IPM stalls on QSHARE2B with a dual residual near 3e-3 (issue 4's note)
KNOWN_FAILURES = {
    ("osqp", "QSHARE2B"): "OSQP does not converge on QSHARE2B (max_iter)",
    ("ipm", "QSHARE2B"): "the batched IPM stalls on QSHARE2B (dual residual ~3e-3 at max_iter)",
    # polyproj's ADMM (a first-order method without a solution polish; its role is the projection
    # start): measured MAX_ITER at 50,000 iterations on these four, residual 1e-5 to 20
    **{("admm", p): "the ADMM does not reach 1e-6 in 50,000 iterations on this problem"
       for p in ("DUALC8", "HS268", "QSHARE2B", "S268")},
}
SETTINGS = {"osqp": {"max_iter": 50_000}, "admm": {"max_iter": 50_000}}


@pytest.mark.core
def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(DataNotFound, match="maros_meszaros_qpbenchmark"):
        list_problems(tmp_path / "nope")
    with pytest.raises(DataNotFound, match="not found"):
        load_problem(tmp_path / "NOPE.mat")
    with pytest.raises(pp.PolyprojError, match="unknown subset"):
        in_subset(1, 1, "tiny")


@pytest.mark.core
def test_subsets(mm_dir):
    dense, small, everything = (list_problems(mm_dir, s) for s in ("dense", "small", "all"))
    assert set(small) <= set(dense) <= set(everything)
    assert len(everything) == len([f for f in os.listdir(mm_dir) if f.endswith(".mat")])
    for name in everything:
        d = scipy.io.loadmat(os.path.join(mm_dir, f"{name}.mat"), variable_names=["n", "m"])
        n, m = int(d["n"].item()), int(d["m"].item())
        assert (name in dense) == (n <= 1000 and m <= 10000)
        assert (name in small) == (n <= 100 and m <= 1000)


@pytest.mark.parametrize("name", ["HS21", "QAFIRO", "CVXQP1_S", "DUALC1"])
def test_bound_rows_become_bounds_without_changing_the_problem(mm_dir, name, rng):
    path = os.path.join(mm_dir, f"{name}.mat")
    split, raw = load_problem(path), load_problem(path, split_bounds=False)
    d = scipy.io.loadmat(path)
    assert raw.qp.m == int(d["m"].item()) and split.qp.m <= raw.qp.m and split.n == raw.n
    assert split.r == pytest.approx(float(np.asarray(d["r"]).item()))
    sol = pp.get_backend("proxsuite", eps_abs=1e-9).solve(split.qp)
    for x in [sol.x, *(sol.x + 0.1 * rng.standard_normal(split.n) for _ in range(5))]:
        assert split.qp.objective(x) == pytest.approx(raw.qp.objective(x))
        assert split.qp.primal_violation(x) == pytest.approx(raw.qp.primal_violation(x), abs=1e-12)


@pytest.mark.core
@pytest.mark.parametrize("name", SMALL)
def test_small_problem_solved_by_every_backend(mm_dir, name, backend):
    """n <= 100: every backend reaches primal, dual residual and duality gap <= 1e-6 (our residual code)."""
    if (backend, name) in KNOWN_FAILURES:
        pytest.xfail(KNOWN_FAILURES[(backend, name)])
    qp = load_problem(os.path.join(mm_dir, f"{name}.mat")).qp.dense()
    sol = pp.get_backend(backend, eps_abs=1e-6, eps_rel=0.0, time_limit=10.0, **SETTINGS.get(backend, {})).solve(qp)
    res = sol.residuals()
    assert sol.status.ok, (name, backend, sol.status)
    assert max(res.values()) <= 1e-6, (name, backend, res)


@pytest.mark.core
def test_iter_problems(mm_dir):
    got = [mm.name for mm in iter_problems(mm_dir, names=["HS21", "HS35"])]
    assert got == ["HS21", "HS35"]


# --------------------------------------------------------------------------- bench
@pytest.mark.core
def test_shifted_geometric_mean():
    assert bench.shifted_geometric_mean([1.0, 1.0]) == pytest.approx(1.0)
    # exp(mean(log([10, 1010]))) - 10 = sqrt(10 * 1010) - 10
    assert bench.shifted_geometric_mean([0.0, 1000.0]) == pytest.approx(np.sqrt(10 * 1010) - 10)
    assert np.isnan(bench.shifted_geometric_mean([]))


def _args(mm_dir, out, **kw):
    base = dict(data=mm_dir, backends=None, tol=1e-6, time_limit=10.0, subset="dense", problems=None,
                out=str(out), jobs=2)
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.mark.core
def test_bench_cli_end_to_end(mm_dir, tmp_path):
    out = tmp_path / "res.json"
    rc = bench.cli_main(_args(mm_dir, out, backends=CPU_BACKENDS, problems=["HS21", "QAFIRO"]))
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["machine"]["cpu_count"] and data["tol"] == 1e-6
    assert len(data["records"]) == 2 * len(CPU_BACKENDS)
    hs21 = [r for r in data["records"] if r["problem"] == "HS21"]
    assert all(r["success"] for r in hs21), hs21
    for b in CPU_BACKENDS:
        assert data["summary"][b]["problems"] == 2
    # success is decided by our residuals: recompute one record
    rec = hs21[0]
    assert max(rec["primal"], rec["dual"], rec["gap"]) <= 1e-6


class _Hangs(pp.QPSolver):
    name = "hangs"

    def solve(self, qp, warm_start=None):
        time.sleep(3600)


class _Crashes(pp.QPSolver):
    name = "crashes"

    def solve(self, qp, warm_start=None):
        os._exit(3)


class _Raises(pp.QPSolver):
    name = "raises"

    def solve(self, qp, warm_start=None):
        raise RuntimeError("boom")


def test_bench_survives_hanging_crashing_and_raising_backends(mm_dir):
    for cls in (_Hangs, _Crashes, _Raises):
        pp.register_backend(cls.name, cls, overwrite=True)
    try:
        t0 = time.monotonic()
        recs = bench.run_suite(mm_dir, ["hangs", "crashes", "raises", "proxsuite"], ["HS21"], tol=1e-6,
                               time_limit=0.5, jobs=2)
        assert time.monotonic() - t0 < 30
    finally:
        for cls in (_Hangs, _Crashes, _Raises):
            pp.unregister_backend(cls.name)
    by = {r.backend: r for r in recs}
    assert by["hangs"].status == "killed" and not by["hangs"].success
    assert by["crashes"].status == "crashed" and not by["crashes"].success
    assert by["raises"].status == "exception" and "boom" in by["raises"].note
    assert by["proxsuite"].success
    summary = bench.summarize(recs, ["hangs", "proxsuite"], time_limit=0.5)
    assert summary["hangs"]["sgm_runtime"] == pytest.approx(0.5)  # failures charged the time limit


@pytest.mark.core
def test_bench_unknown_problem_and_backend(mm_dir, tmp_path, capsys):
    assert bench.cli_main(_args(mm_dir, tmp_path / "x.json", problems=["NOPE"])) == 2
    assert bench.cli_main(_args(mm_dir, tmp_path / "x.json", backends=["nope"])) == 2
    out = capsys.readouterr().err
    assert "no backend named 'nope'" in out and "Traceback" not in out
    assert bench.cli_main(_args(str(tmp_path / "absent"), tmp_path / "x.json")) == 2


@pytest.mark.core
def test_bench_refuses_before_running(mm_dir, tmp_path, capsys):
    """An --out folder, a data folder without .mat files, a .mat file as --data, a backend named twice: refused
    up front with exit code 2 (was: a traceback after the whole run, an empty table and exit 0, ...)."""
    assert bench.cli_main(_args(mm_dir, tmp_path, problems=["HS21"])) == 2
    assert bench.cli_main(_args(str(tmp_path), tmp_path / "x.json")) == 2
    assert bench.cli_main(_args(str(tmp_path / "absent"), tmp_path / "x.json")) == 2
    mat = next(p for p in __import__("os").listdir(mm_dir) if p.endswith(".mat"))
    assert bench.cli_main(_args(__import__("os").path.join(mm_dir, mat), tmp_path / "x.json")) == 2
    assert bench.cli_main(_args(mm_dir, tmp_path / "x.json", backends=["ipm", "ipm"])) == 2
    out = " ".join(capsys.readouterr().err.split())  # rich wraps the lines
    for said in ("is a folder", "no Maros–Meszaros .mat files", "is a file", "names a backend twice"):
        assert said in out, said
    assert "Traceback" not in out and not list(tmp_path.iterdir())


@pytest.mark.parametrize(("flag", "value"), [("--time-limit", "0"), ("--tol", "-1"), ("--tol", "nan"),
                                             ("--jobs", "0"), ("--time-limit", "inf"), ("--jobs", "two")])
@pytest.mark.core
def test_bench_rejects_bad_numbers(mm_dir, flag, value, capsys):
    from polyproj.cli import main

    with pytest.raises(SystemExit) as info:
        main(["bench", "solvers", "--data", mm_dir, flag, value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and ("> 0" in err or "must be a number" in err)


def test_interrupted_bench_keeps_the_finished_results(mm_dir, tmp_path):
    """SIGINT while a solve runs: the solves that finished are in the JSON file, marked incomplete."""
    import signal
    import subprocess
    import sys

    out = tmp_path / "partial.json"
    cmd = [sys.executable, "-m", "polyproj", "bench", "solvers", "--data", mm_dir, "--problems", "HS21", "HS35",
           "--backends", "proxsuite", "tests.test_maros_meszaros:_Hangs", "--time-limit", "60", "--jobs", "1",
           "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (out.exists() and json.loads(out.read_text())["records"]):
            time.sleep(0.2)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=30)
    finally:
        proc.kill()
    data = json.loads(out.read_text())
    assert rc == 130, proc.stderr.read()[-2000:]
    assert data["complete"] is False
    assert [(r["problem"], r["backend"]) for r in data["records"]] == [("HS21", "proxsuite")]
    assert data["records"][0]["success"]


def test_an_unreadable_problem_file_is_named(tmp_path):
    """A truncated .mat file in the folder failed with scipy's raw MatReadError (a traceback from
    `polyproj bench solvers`): a ProblemError naming the file."""
    from polyproj.maros_meszaros import list_problems, load_problem

    bad = tmp_path / "HS21.mat"
    bad.write_text("garbage")
    with pytest.raises(pp.ProblemError, match="HS21.mat' is not a readable Maros–Meszaros .mat file"):
        load_problem(bad)
    with pytest.raises(pp.ProblemError, match="HS21.mat"):
        list_problems(tmp_path, "all")


@pytest.mark.core
def test_an_unreadable_neighbour_does_not_stop_the_benchmark(mm_dir, tmp_path, capsys):
    """One unreadable .mat in the folder ended `bench solvers` (rc 2, nothing solved) even when --problems named
    only readable ones; without --problems it is run and recorded as a load error. A size of inf raised
    OverflowError; a file not named .mat lost its last 4 characters; a list as subset raised TypeError."""
    import shutil

    from polyproj.cli import main

    data = tmp_path / "mm"
    data.mkdir()
    shutil.copy(os.path.join(mm_dir, "HS21.mat"), data / "HS21.mat")
    (data / "BROKEN.mat").write_bytes(b"")
    bad: list[str] = []
    assert list_problems(data, "all", unreadable=bad) == ["HS21"] and bad == ["BROKEN"]
    with pytest.raises(pp.ProblemError, match="BROKEN.mat"):
        list_problems(data, "all")
    out = tmp_path / "one.json"
    assert main(["bench", "solvers", "--data", str(data), "--subset", "all", "--problems", "HS21",
                 "--backends", "ipm", "--out", str(out)]) == 0
    assert [(r["problem"], r["status"]) for r in json.loads(out.read_text())["records"]] == [("HS21", "solved")]
    out = tmp_path / "all.json"
    main(["bench", "solvers", "--data", str(data), "--subset", "all", "--backends", "ipm", "--out", str(out)])
    got = {r["problem"]: r["status"] for r in json.loads(out.read_text())["records"]}
    assert got == {"HS21": "solved", "BROKEN": "load_error"}
    capsys.readouterr()
    d = scipy.io.loadmat(os.path.join(mm_dir, "HS21.mat"))
    d["n"] = np.array([[np.inf]])
    scipy.io.savemat(tmp_path / "INF.mat", {k: v for k, v in d.items() if not k.startswith("__")})
    with pytest.raises(pp.ProblemError, match="n must be a non-negative integer"):
        load_problem(tmp_path / "INF.mat")
    shutil.copy(os.path.join(mm_dir, "HS21.mat"), tmp_path / "hs21_copy")
    assert load_problem(tmp_path / "hs21_copy").name == "hs21_copy"
    with pytest.raises(pp.PolyprojError, match="unknown subset"):
        list_problems(data, ["dense"])


@pytest.mark.core
def test_bench_refuses_a_problem_named_twice(mm_dir, tmp_path, capsys):
    """--problems HS21 HS21 ran it twice and counted 2 problems, 2 solved (--backends already refused repeats)."""
    from polyproj.cli import main

    assert main(["bench", "solvers", "--data", mm_dir, "--backends", "ipm", "--problems", "HS21", "HS21",
                 "--out", str(tmp_path / "x.json")]) == 2
    assert "names a problem twice" in capsys.readouterr().err


def test_bench_children_leave_ctrl_c_to_the_parent():
    """A SIGINT that landed inside the fork of a solve's child was taken by the child (a traceback, the solve
    recorded as failed) or lost in the parent's after-fork hooks (the run went on and exited 0). The parent
    blocks it across the fork; the child ignores it."""
    import multiprocessing as mp
    import signal

    from polyproj import bench

    class Probe:  # stands in for a Process: what the signal mask is while it starts
        def start(self):
            self.blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, set())

    probe = Probe()
    bench._start(probe)
    assert probe.blocked and signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)

    def in_child(conn):
        bench._leave_ctrl_c_to_the_parent()
        conn.send(signal.getsignal(signal.SIGINT) is signal.SIG_IGN
                  and signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set()))

    proc = ctx.Process(target=in_child, args=(child,))
    bench._start(proc)
    assert parent.recv() is True
    proc.join(5)
