"""``polyproj bench apps {portfolio,matching,mhc}``: every method × seed trained, one fresh process per run.

An application module (:mod:`~polyproj.apps.portfolio`, :mod:`~polyproj.apps.matching`,
:mod:`~polyproj.apps.mhc`) gives ``TITLE``, ``METRIC``, ``METHODS``, ``config(quick)``,
``variants(cfg)`` and ``run(method, variant, seed, cfg, session) -> RunRecord``. Each run goes to a
fresh ``spawn`` process (so that its peak memory is its own and nothing of an earlier run is reused);
the JSON file is rewritten after every run (an interrupted run keeps what finished), then the table is
printed and the plots are drawn. This module imports no torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

from .measure import PeakMemory, Session
from .records import RunRecord, summarise

__all__ = ["APPS", "Refused", "add_arguments", "cli_main", "run_all"]

APPS = {"portfolio": "polyproj.apps.portfolio", "matching": "polyproj.apps.matching", "mhc": "polyproj.apps.mhc"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``polyproj bench apps``."""
    from ..cli import _positive

    p.add_argument("app", choices=sorted(APPS), help="the application")
    p.add_argument("--quick", action="store_true", help="the small preset (a few minutes on 2 cores)")
    p.add_argument("--seeds", type=_positive(int, "--seeds"), default=None,
                   help="seeds 0..K-1 per method (default 3; --quick: 1)")
    p.add_argument("--out", default=None, help="JSON results file (default benchmarks/results/apps_<app>[_quick].json)")
    p.add_argument("--methods", nargs="+", default=None, help="only these methods (default: the app's list)")
    p.add_argument("--variants", nargs="+", default=None, help="only these variants (portfolio: constraint sets)")
    p.add_argument("--epochs", type=_positive(int, "--epochs"), default=None,
                   help="override the preset's number of epochs")
    p.add_argument("--threads", type=_positive(int, "--threads"), default=1,
                   help="torch intra-op threads of every run (default 1)")
    p.add_argument("--in-process", action="store_true",
                   help="run in this process (no memory isolation, no --timeout)")
    p.add_argument("--timeout", type=_positive(float, "--timeout"), default=3600.0,
                   help="seconds per training run before it is stopped (each run in its own process; not "
                   "applied with --in-process)")
    p.add_argument("--no-plot", action="store_true", help="skip the plots")


def _child(conn: Any, app: str, method: str, variant: str, seed: int, cfg: Any, threads: int) -> None:
    try:
        conn.send(("ok", _run_here(app, method, variant, seed, cfg, threads).to_json()))
    except BaseException as exc:  # a failing method is a row of the table, not the end of the benchmark
        conn.send(("error", f"{type(exc).__name__}: {exc}"[:500]))
    finally:
        conn.close()


def _run_here(app: str, method: str, variant: str, seed: int, cfg: Any, threads: int) -> RunRecord:
    from rich.console import Console

    from .training import set_threads

    set_threads(threads)
    mod = importlib.import_module(APPS[app])
    return mod.run(method, variant, seed, cfg, Session(Console(), PeakMemory()))


def _in_process(app: str, method: str, variant: str, seed: int, cfg: Any, threads: int) -> RunRecord:
    """:func:`_run_here`, a failing method a row of the table (as in its own process), not the end of the run."""
    try:
        return _run_here(app, method, variant, seed, cfg, threads)
    except Exception as exc:  # Ctrl-C (KeyboardInterrupt) still ends the run
        return RunRecord(method, seed, variant, status=f"{type(exc).__name__}: {exc}"[:500])


def _isolated(app: str, method: str, variant: str, seed: int, cfg: Any, threads: int, timeout: float) -> RunRecord:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, app, method, variant, seed, cfg, threads))
    proc.start()
    child.close()
    try:
        got = parent.recv() if parent.poll(timeout) else ("error", f"timeout after {timeout:g} s")
    except EOFError:
        proc.join(5.0)  # its exit code (a signal: negative) is known once it is joined
        code = proc.exitcode
        how = "was still running" if code is None else f"by signal {-code}" if code < 0 else f"with exit code {code}"
        got = ("error", f"the run's process ended before its result ({how})")
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
    kind, value = got
    if kind == "ok":
        return RunRecord.from_json(value)
    return RunRecord(method, seed, variant, status=value)


def _finite(obj: Any) -> Any:
    """NaN / inf as ``null`` (standard JSON)."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _write(path: Path, header: dict[str, Any], records: list[RunRecord], complete: bool) -> None:
    groups = list(dict.fromkeys(r.variant for r in records))
    summary = {g: [dataclasses.asdict(s) for s in summarise([r for r in records if r.variant == g])] for g in groups}
    payload = {**header, "complete": complete, "summary": summary, "records": [r.to_json() for r in records]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_finite(payload), indent=1) + "\n")
    os.replace(tmp, path)


class Refused(SystemExit):
    """A command line refused before any run: exit status 2, as argparse, ``check`` and ``bench solvers``.

    Not 1, which says that a run failed. The message goes to stderr when raised (:func:`_refuse`) and is the
    exception's ``str``.
    """

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _refuse(message: str) -> Refused:
    """The :class:`Refused` of ``message``, printed to stderr (``raise _refuse(...)``)."""
    print(message, file=sys.stderr)
    return Refused(message)


def _check_writable(path: Path) -> None:
    """Fail before the first training run, not after it, when the results file cannot be written."""
    from ..bench import unwritable

    why = unwritable(path)
    if why is not None:
        raise _refuse(f"polyproj: {why}")


def run_all(args: argparse.Namespace, console: Any) -> tuple[Path, list[RunRecord], Any, Any]:
    """Run every (variant, method, seed) of ``args``; returns the JSON path, the records, the module, the config."""
    from ..bench import machine_description

    try:  # the apps train torch models (this module imports no torch: the CLI's own guard never saw it)
        mod = importlib.import_module(APPS[args.app])
    except ModuleNotFoundError as exc:
        raise _refuse(f"polyproj: bench apps {args.app} needs {exc.name!r}, which is not installed ({exc}); "
                      "pip install 'polyproj[bench]'") from None
    cfg = mod.config(args.quick)
    if args.epochs is not None:
        cfg = dataclasses.replace(cfg, epochs=int(args.epochs))
    methods = list(args.methods or mod.METHODS)
    unknown = [m for m in methods if m not in mod.METHODS]
    if unknown:
        raise _refuse(f"polyproj: unknown method(s) {unknown} for {args.app}; choose from {list(mod.METHODS)}")
    if len(set(methods)) != len(methods):  # a repeat was run again and counted as more seeds
        raise _refuse(f"polyproj: --methods names a method twice: {methods}")
    known = list(mod.variants(cfg))
    every = list(dict.fromkeys([*mod.variants(mod.config(False)), *known]))  # the full preset's and the quick one's
    unknown = [v for v in (args.variants or []) if v not in every]
    if unknown:  # an app of one unnamed variant ("") has none to choose: it was listed as ['']
        named = [v for v in every if v]
        raise _refuse(f"polyproj: unknown variant(s) {unknown} for {args.app}; "
                      + (f"choose from {named}" if named else f"{args.app} has no variants (drop --variants)"))
    elsewhere = [v for v in (args.variants or []) if v not in known]
    if elsewhere:  # valid, but not in this preset (simplex with --quick)
        preset, hint = ("--quick", "run them without --quick") if args.quick else ("full", "add --quick")
        raise _refuse(f"polyproj: variant(s) {elsewhere} of {args.app} are not in the {preset} preset (its "
                      f"variants: {known}); {hint}")
    variants = [v for v in known if args.variants is None or v in args.variants]
    seeds = range(args.seeds if args.seeds is not None else (1 if args.quick else 3))
    path = Path(args.out or f"benchmarks/results/apps_{args.app}{'_quick' if args.quick else ''}.json")
    _check_writable(path)
    header = {"app": args.app, "title": mod.TITLE, "metric": mod.METRIC, "quick": bool(args.quick),
              "config": dataclasses.asdict(cfg), "methods": methods, "variants": variants, "seeds": list(seeds),
              "torch_threads": args.threads, "isolated": not args.in_process,
              "command": "polyproj " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["bench"] else "",
              "machine": machine_description(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    records: list[RunRecord] = []
    for variant in variants:
        for seed in seeds:
            for method in methods:
                if args.in_process:
                    rec = _in_process(args.app, method, variant, seed, cfg, args.threads)
                else:
                    rec = _isolated(args.app, method, variant, seed, cfg, args.threads, args.timeout)
                records.append(rec)
                console.print(_line(rec, mod.METRIC))
                _write(path, header, records, complete=False)
    header["load_average_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    _write(path, header, records, complete=True)
    return path, records, mod, cfg


def _line(r: RunRecord, metric: str) -> str:
    where = f"{r.variant}/" if r.variant else ""
    if r.status != "ok":
        return f"[red]{where}{r.method} seed {r.seed}: {r.status}[/red]"
    return (f"{where}{r.method} seed {r.seed}: {metric} {r.test_metric:.4g}, train loss {r.train_loss:.4g}, "
            f"violation {r.max_violation:.2g}, {r.time_s:.1f} s, {r.peak_mem_mb:.0f} MiB")


def _fmt(s: Any, digits: int = 3) -> str:
    if s.n == 0:
        return "—"
    if s.n == 1:
        return f"{s.mean:.{digits}g}"
    return f"{s.mean:.{digits}g} ± {s.std:.2g}"


def print_table(console: Any, records: list[RunRecord], mod: Any) -> None:
    """One rich table per variant: mean ± standard deviation over seeds; violation: the largest."""
    from rich.table import Table

    for variant in dict.fromkeys(r.variant for r in records):
        table = Table(title=f"{mod.TITLE}{f' — {variant}' if variant else ''} (mean ± std over seeds)")
        for col in ("method", "seeds", "max violation", "train loss", mod.METRIC, f"{mod.METRIC} range",
                    "time (s)", "peak mem (MiB)"):
            table.add_column(col, justify="left" if col == "method" else "right", no_wrap=True)
        for s in summarise([r for r in records if r.variant == variant]):
            sp = s.spreads
            rng = "—" if sp["test_metric"].n == 0 else f"[{sp['test_metric'].min:.3g}, {sp['test_metric'].max:.3g}]"
            viol = "—" if sp["max_violation"].n == 0 else f"{sp['max_violation'].max:.1e}"
            runs = f"{s.runs - s.failed}" + (f" ([red]{s.failed} failed[/red])" if s.failed else "")
            table.add_row(s.method, runs, viol, _fmt(sp["train_loss"], 4), _fmt(sp["test_metric"]), rng,
                          _fmt(sp["time_s"]), _fmt(sp["peak_mem_mb"]))
        console.print(table)


def cli_main(args: argparse.Namespace) -> int:
    """Entry point of ``polyproj bench apps``."""
    from rich.console import Console

    from ..bench import _honour_ctrl_c

    if not args.no_plot:  # before the training runs, not after them
        from .plots import plotting_unavailable

        why = plotting_unavailable()
        if why is not None:
            raise _refuse(f"polyproj: the plots need matplotlib, which cannot be imported ({why}); install it "
                          "(pip install matplotlib) or pass --no-plot")
    _honour_ctrl_c()  # Ctrl-C / SIGINT stops the run also when it was started with SIGINT ignored (`cmd &`)
    console = Console() if sys.stdout.isatty() else Console(width=160)  # a log file gets the whole table
    path, records, mod, _ = run_all(args, console)
    print_table(console, records, mod)
    console.print(f"results: {path}")
    if not args.no_plot:
        from .plots import plot_runs

        for p in plot_runs(records, mod.TITLE, mod.METRIC, path.with_suffix("")):
            console.print(f"plot: {p}")
    return 0 if not any(r.failed for r in records) else 1  # the table's rule: a diverged run fails too
