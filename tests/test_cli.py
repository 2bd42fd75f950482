"""The polyproj command: backends table and the demo (quick mode)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import polyproj as pp
from polyproj.cli import main


@pytest.mark.core
def test_backends_table(capsys):
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "proxsuite" in out and "yes" in out and "capabilities" in out
    if "cupy" not in __import__("polyproj").available_backends():
        # the install hint survives rich's markup ("[cupy]" is not a style tag)
        assert 'polyproj[cupy]' in out.replace("\n", "").replace("│", "").replace(" ", "")


@pytest.mark.core
def test_python_dash_m_runs_the_cli():
    out = subprocess.run([sys.executable, "-m", "polyproj", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("polyproj ")


def test_demo_quick_runs_and_checks():
    out = subprocess.run([sys.executable, "-m", "polyproj", "demo", "--quick"], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "HS-Jacobian" in out.stdout
    # quiet: no solver banner or log line (HiGHS printed its copyright on the first solve)
    for noise in ("Running HiGHS", "Copyright", "OSQP", "Polishing", "ProxQP"):
        assert noise not in out.stdout + out.stderr, noise


@pytest.mark.core
def test_check_rejects_a_non_positive_example_count(capsys):
    for value in ("-1", "0"):
        with pytest.raises(SystemExit) as info:
            main(["check", "proxsuite", "--examples", value])
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert "--examples must be a finite number > 0" in err and "Traceback" not in err



@pytest.mark.core
def test_check_passes_the_backends_tolerances(monkeypatch, capsys):
    """``polyproj check NAME --eps-abs E --eps-rel R`` checks the backend at those settings (cli_main read them,
    but the parser had no such options); bad values are refused like the other numbers."""
    import polyproj.testing.check as check

    seen = {}

    def fake(name, **kwargs):
        seen.update(kwargs, name=name)
        raise pp.PolyprojError("stop here")

    monkeypatch.setattr(check, "check_backend", fake)
    assert main(["check", "ipm", "--eps-abs", "1e-5", "--eps-rel", "1e-6"]) == 2
    assert seen["name"] == "ipm" and seen["eps_abs"] == 1e-5 and seen["eps_rel"] == 1e-6
    seen.clear()
    main(["check", "ipm"])
    assert "eps_abs" not in seen and "eps_rel" not in seen  # the backend's defaults
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(["check", "ipm", "--eps-abs", "-1"])
    assert info.value.code == 2 and "--eps-abs must be a finite number > 0" in capsys.readouterr().err


def test_check_and_bench_refuse_bad_input_cleanly(capsys, tmp_path):
    """A new user's trial: a negative --seed reported every property as an ERROR of the backend; a backend
    class whose constructor fails gave a TypeError traceback; an --out folder or an unwritable file failed
    after the run (IsADirectoryError, FileNotFoundError tracebacks). Each is now a one-line error first."""
    with pytest.raises(SystemExit) as info:
        main(["check", "ipm", "--seed", "-3"])
    assert info.value.code == 2 and "--seed must be in [0, " in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:  # torch.manual_seed takes none beyond 2**64 - 1: it failed mid-demo
        main(["demo", "--quick", "--seed", str(2**64)])
    assert info.value.code == 2 and "--seed must be in [0, " in capsys.readouterr().err
    assert main(["check", "tests.toy_backend:NeedsArgument", "--examples", "1"]) == 2
    err = capsys.readouterr().err
    assert "could not be set up: its constructor raised TypeError" in err and "Traceback" not in err
    with pytest.raises(SystemExit, match="is a folder"):
        main(["bench", "apps", "mhc", "--quick", "--out", str(tmp_path)])
    from polyproj.bench import unwritable

    assert unwritable(tmp_path / "sub" / "r.json") is None and (tmp_path / "sub").is_dir()
    assert "cannot write" in unwritable("/proc/polyproj_results.json")


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    """Ctrl-C in polyproj demo or bench apps printed raw KeyboardInterrupt tracebacks (the commands' own
    handlers keep what finished first)."""
    import polyproj.cli as cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_cmd_backends", interrupted)
    assert cli.main(["backends"]) == 130
    assert capsys.readouterr().err.strip() == "polyproj: interrupted"


def test_iter_problems_takes_one_name_as_a_string(tmp_path):
    """names="HS21" looped over its characters ('H.mat' not found)."""
    from pathlib import Path

    from polyproj.maros_meszaros import iter_problems

    folder = Path(__file__).resolve().parents[2] / "shared" / "data" / "maros_meszaros"
    if not (folder / "HS21.mat").exists():
        pytest.skip("the Maros–Meszaros folder is not beside the repository")
    assert [p.name for p in iter_problems(folder, names="HS21")] == ["HS21"]


def test_results_paths_that_are_not_regular_files_are_refused(tmp_path):
    """The results go to a temporary file moved onto --out, which replaced a FIFO, a symbolic link (its target
    untouched) and, run as root, /dev/null itself: refused before the run now."""
    import os

    from polyproj.bench import unwritable

    target = tmp_path / "target.json"
    target.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "symbolic link" in unwritable(link)
    assert "not a regular file" in unwritable(fifo)
    assert "not a regular file" in unwritable("/dev/null")
    assert unwritable(target) is None
    assert fifo.exists() and not fifo.is_file() and link.is_symlink()


def test_check_interrupted_prints_what_finished(monkeypatch, capsys):
    """Ctrl-C during `polyproj check` printed one line and dropped the finished checks: their table is printed
    now, and the exit status is 130."""
    from polyproj.cli import main
    from polyproj.testing import check

    real, calls = check.run_property, []

    def interrupted_second(name, *args, **kw):
        calls.append(name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(name, *args, **kw)

    monkeypatch.setattr(check, "run_property", interrupted_second)
    assert main(["check", "proxsuite", "--examples", "1"]) == 130
    captured = capsys.readouterr()
    assert calls[0] in captured.out and "conformance" in captured.out
    assert "interrupted after" in captured.err and "Traceback" not in captured.err
