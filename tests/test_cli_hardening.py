"""The benchmark commands and scripts refuse bad input before a long run and keep the published results:
``polyproj bench solvers`` (a problem outside its subset, an unwritable default --out), ``polyproj bench apps``
(SIGINT ignored at start, matplotlib missing, a failing method in process, repeated methods, a variant outside
the quick preset), the Maros–Meszaros loader (empty folder, malformed files, a bad subset with names), the
smoke runs of the benchmark scripts (``*_quick`` names), ``bench_projection.py --out`` and ``bench_overhead.py``."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.io

import polyproj as pp
from polyproj import bench
from polyproj.maros_meszaros import DataNotFound, iter_problems, list_problems, load_problem

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


@pytest.fixture
def mm_dir(shared_dir):
    path = os.path.join(shared_dir, "data", "maros_meszaros")
    if not os.path.isfile(os.path.join(path, "HS21.mat")):
        pytest.skip(f"Maros–Meszaros data not found at {path}")
    return path


def _args(mm_dir, out, **kw):
    base = dict(data=mm_dir, backends=["ipm"], tol=1e-6, time_limit=1.0, subset="dense", problems=None,
                out=None if out is None else str(out), jobs=1)
    base.update(kw)
    return argparse.Namespace(**base)


# --------------------------------------------------------------------------- polyproj bench solvers
@pytest.mark.core
def test_bench_refuses_a_named_problem_outside_its_subset(mm_dir, tmp_path, capsys):
    """--problems CONT-200 with the default --subset dense was densified (23.9 GB) and recorded as a crash: a
    named problem outside the subset is refused, naming it and the subset."""
    dense, small = list_problems(mm_dir, "dense"), list_problems(mm_dir, "small")
    big = next((p for p in ("QSEBA", "QSTANDAT", "LASER") if p in list_problems(mm_dir, "all")), None)
    medium = next((p for p in ("KSIP", "DUAL3") if p in dense and p not in small), None)
    if big is None or medium is None:
        pytest.skip("the usual Maros–Meszaros problems are not all in the folder")
    out = tmp_path / "x.json"
    assert bench.cli_main(_args(mm_dir, out, problems=["HS21", big])) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert big in said and "'dense' subset" in said and "--subset all" in said and "HS21" not in said
    assert bench.cli_main(_args(mm_dir, out, subset="small", problems=[medium])) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert medium in said and "'small' subset" in said and "Traceback" not in said
    assert not out.exists()


@pytest.mark.core
def test_bench_checks_the_default_out_before_running(mm_dir, monkeypatch, capsys):
    """Without --out in a folder where benchmarks/results cannot be made: a PermissionError traceback."""
    if not os.path.isdir("/proc/self"):
        pytest.skip("needs /proc (a folder nothing can be created in)")
    monkeypatch.chdir("/proc")
    assert bench.cli_main(_args(mm_dir, None, problems=["HS21"])) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "cannot write the results to 'benchmarks/results/solvers_1e-06_ipm.json'" in said
    assert "pass --out FILE" in said and "Traceback" not in said


# --------------------------------------------------------------------------- polyproj bench apps
def test_bench_apps_stops_on_sigint_when_started_ignoring_it(tmp_path):
    """`polyproj bench apps ... &` in a script starts with SIGINT ignored: kill -INT did nothing (bench solvers
    already re-armed Ctrl-C). The run stands in for training: it sends itself SIGINT and waits."""
    code = ("import os, signal, sys, time\n"
            "import polyproj.apps.runner as runner\n"
            "from polyproj.cli import main\n"
            "def run_all(args, console):\n"
            f"    open({str(tmp_path / 'sent')!r}, 'w').write(repr(time.time()))\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n"
            "    time.sleep(8)\n"
            "    raise SystemExit('not interrupted')\n"
            "runner.run_all = run_all\n"
            "sys.exit(main(['bench', 'apps', 'mhc', '--quick', '--no-plot', '--out', "
            f"{str(tmp_path / 'a.json')!r}]))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert run.returncode == 130, run.stderr[-2000:]
    # prompt: timed from the signal, not from the child's start (its imports take seconds on a loaded machine)
    sent = float((tmp_path / "sent").read_text())
    assert run.stderr.strip() == "polyproj: interrupted" and time.time() - sent < 8


def test_bench_apps_checks_matplotlib_before_training(tmp_path, monkeypatch):
    """Without matplotlib every run was trained, then the plots died with ModuleNotFoundError."""
    import polyproj.apps.runner as runner
    from polyproj.cli import main

    def trained(*a, **k):
        raise AssertionError("trained before finding that the plots cannot be drawn")

    monkeypatch.setattr(runner, "run_all", trained)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ModuleNotFoundError
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(SystemExit, match="the plots need matplotlib.*--no-plot"):
        main(["bench", "apps", "mhc", "--quick", "--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


def test_bench_apps_in_process_failure_is_a_row(tmp_path, monkeypatch, capsys):
    """--in-process: one failing method ended the run with its traceback (a row in the subprocess mode)."""
    pytest.importorskip("torch")
    import polyproj.apps.runner as runner
    from polyproj.cli import main

    def boom(app, method, *a):
        raise RuntimeError(f"boom in {method}")

    monkeypatch.setattr(runner, "_run_here", boom)
    out = tmp_path / "x.json"
    assert main(["bench", "apps", "mhc", "--quick", "--in-process", "--no-plot", "--methods", "polyproj",
                 "sinkhorn20", "--out", str(out)]) == 1
    data = json.loads(out.read_text())
    assert data["complete"] and [r["status"] for r in data["records"]] == [
        "RuntimeError: boom in polyproj", "RuntimeError: boom in sinkhorn20"]
    with pytest.raises(SystemExit):
        main(["bench", "apps", "--help"])
    assert "not applied with --in-process" in " ".join(capsys.readouterr().out.split())


def test_bench_apps_refuses_repeated_methods_and_says_which_preset(tmp_path, monkeypatch):
    """--methods fixed fixed ran it twice and counted two seeds; --quick --variants simplex said 'unknown variant'
    (simplex is a variant of the full preset)."""
    pytest.importorskip("torch")
    import polyproj.apps.runner as runner
    from polyproj.cli import main

    def trained(*a, **k):
        raise AssertionError("trained")

    monkeypatch.setattr(runner, "_run_here", trained)
    monkeypatch.setattr(runner, "_isolated", trained)
    out = str(tmp_path / "x.json")
    with pytest.raises(SystemExit, match="names a method twice"):
        main(["bench", "apps", "mhc", "--quick", "--in-process", "--no-plot", "--methods", "polyproj", "polyproj",
              "--out", out])
    with pytest.raises(SystemExit, match=r"\['simplex'\] of portfolio are not in the --quick preset"):
        main(["bench", "apps", "portfolio", "--quick", "--no-plot", "--variants", "simplex", "--out", out])
    with pytest.raises(SystemExit, match=r"unknown variant\(s\) \['nosuch'\]"):
        main(["bench", "apps", "portfolio", "--quick", "--no-plot", "--variants", "simplex", "nosuch", "--out", out])
    assert not (tmp_path / "x.json").exists()


# --------------------------------------------------------------------------- the Maros–Meszaros loader
@pytest.mark.core
def test_loader_refuses_an_empty_folder_and_a_bad_subset(mm_dir, tmp_path):
    """An empty folder gave [] (and iter_problems nothing) without a word; subset="tiny" with names was ignored."""
    for call in (lambda: list_problems(tmp_path), lambda: iter_problems(tmp_path),
                 lambda: iter_problems(tmp_path, names=["HS21"])):
        with pytest.raises(DataNotFound, match=f"no Maros–Meszaros .mat files in '{tmp_path}'"):
            list(call())
    with pytest.raises(pp.PolyprojError, match="unknown subset 'tiny'"):
        iter_problems(mm_dir, subset="tiny", names=["HS21"])
    with pytest.raises(pp.PolyprojError, match="unknown subset 'tiny'"):
        list_problems(mm_dir, subset="tiny")


@pytest.mark.core
def test_loader_names_a_malformed_file(mm_dir, tmp_path):
    """Readable .mat files with wrong contents gave IndexError, ValueError, or an error without the file name."""
    d = {k: v for k, v in scipy.io.loadmat(os.path.join(mm_dir, "HS21.mat")).items() if not k.startswith("__")}
    cases = {"lshort": ({"l": np.zeros((1, 1))}, "l has shape (1,), expected (3,)"),
             "emptyn": ({"n": np.zeros((0, 0))}, "n must be one number"),
             "Pstring": ({"P": "hello"}, "not a valid Maros–Meszaros problem: ValueError"),
             "nwrong": ({"n": np.array([[5]])}, "P has shape (2, 2), expected (5, 5)"),
             "qnan": ({"q": np.full((2, 1), np.nan)}, "q contains NaN")}
    for name, (change, said) in cases.items():
        path = tmp_path / f"{name}.mat"
        scipy.io.savemat(path, {**d, **change})
        with pytest.raises(pp.ProblemError) as info:
            load_problem(path)
        assert f"{name}.mat" in str(info.value) and said in str(info.value), str(info.value)
    with pytest.raises(pp.ProblemError, match="emptyn.mat"):  # list_problems reads n and m of every file
        list_problems(tmp_path)
    assert load_problem(os.path.join(mm_dir, "HS21.mat")).qp.n == 2


# --------------------------------------------------------------------------- the benchmark scripts
def test_quick_runs_keep_the_published_results(bench, tmp_path):
    """--quick replaced warm_start.json, batch_cpu.json and dif_regression.json: now *_quick, with "quick": true."""
    pytest.importorskip("torch")
    assert bench("bench_warm_start").main(["--quick"]) == 0
    assert bench("bench_batch").main(["--quick", "--sizes", "20", "--batches", "1", "--solvers", "ipm-numpy",
                                       "--repeats", "1"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batch_cpu_quick.json", "warm_start_quick.json"]
    for name in ("batch_cpu_quick", "warm_start_quick"):
        assert json.loads((tmp_path / f"{name}.json").read_text())["quick"] is True
    assert bench("bench_warm_start").main(["--quick", "--out", str(tmp_path / "sub" / "w.json")]) == 0
    assert json.loads((tmp_path / "sub" / "w.json").read_text())["rows"]  # --out as a path


def test_dif_regression_quick_has_its_own_name(bench, monkeypatch):
    """The whole quick study takes ~40 s: its arguments are checked up to the first step."""
    pytest.importorskip("torch")
    mod = bench("dif_regression")
    seen = []

    class Stop(Exception):
        pass

    real = argparse.ArgumentParser.parse_args

    def parse(self, *a, **k):
        seen.append(real(self, *a, **k))
        return seen[-1]

    def stop(threads):
        raise Stop

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse)
    monkeypatch.setattr(mod, "set_torch_threads", stop)
    for argv, name in ((["--quick"], "dif_regression_quick"), ([], "dif_regression"),
                       (["--quick", "--name", "mine"], "mine_quick")):
        with pytest.raises(Stop):
            mod.main(argv)
        assert seen[-1].name == name


def test_bench_layer_quick_writes_layer_quick(tmp_path):
    """bench_layer.py --quick replaced the headline of results/layer.json (a subprocess: it pins its cores)."""
    pytest.importorskip("torch")
    code = ("import sys; from pathlib import Path\n"
            f"sys.path.insert(0, {str(BENCH)!r})\n"
            "import bench_layer\n"
            f"bench_layer.RESULTS = Path({str(tmp_path)!r})\n"
            "sys.exit(bench_layer.main(['--quick', '--only', 'batch', '--batches', '1', '--methods', 'polyproj', "
            "'--no-memory']))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "RAYON_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert not (tmp_path / "layer.json").exists()
    data = json.loads((tmp_path / "layer_quick.json").read_text())
    assert data["quick"] is True and data["runs"]["sweep_batch"]["quick"] is True


def test_bench_projection_takes_out(bench, tmp_path):
    """bench_projection.py had no --out: every trial replaced results/projection.json."""
    mod = bench("bench_projection")
    small = ["--repeats", "1", "--batch", "4", "--n", "5", "--m", "4"]
    assert mod.main([*small, "--out", str(tmp_path / "sub" / "p.json")]) == 0
    assert mod.main([*small, "--out", "trial"]) == 0  # a name: benchmarks/results/trial.json
    assert mod.main([*small, "--out", str(tmp_path / "sub" / "run1")]) == 0  # as bench_batch's --out in ab_speed.sh
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub", "trial.json"]
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["p.json", "run1.json"]
    assert len(json.loads((tmp_path / "sub" / "p.json").read_text())["rows"]) == 4


def test_bench_overhead_refuses_bad_input_before_timing(bench, mm_dir, tmp_path, monkeypatch, capsys):
    """--problems NOPE: DataNotFound traceback; --backends piqp: KeyError; an unwritable --out: after all the
    timing; every problem over --max-time: bare NaN in the JSON."""
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))  # the script sets a default
    mod = bench("bench_overhead")
    out = str(tmp_path / "o.json")
    for extra, said in ((["--problems", "NOPE"], "unknown problem(s) ['NOPE']"),
                        (["--backends", "piqp"], "no direct path for backend(s) ['piqp']"),
                        (["--problems", "HS21", "--out", "/proc/polyproj_overhead.json"], "--out: cannot write"),
                        (["--data", str(tmp_path)], "no Maros–Meszaros .mat files")):
        args = ["--data", mm_dir, "--out", out, *extra] if "--data" not in extra else ["--out", out, *extra]
        assert mod.main(args) == 2, extra
        assert said in capsys.readouterr().err, extra
    assert not list(tmp_path.iterdir())
    assert mod.main(["--data", mm_dir, "--problems", "HS21", "--backends", "proxsuite", "--max-time", "1e-9",
                     "--repeats", "1", "--out", out]) == 0

    def no_nan(word):
        raise AssertionError(f"{word} in the JSON")

    data = json.loads(Path(out).read_text(), parse_constant=no_nan)
    assert data["summary"]["proxsuite"]["problems"] == 0 and data["summary"]["proxsuite"]["geomean_ratio"] is None
