"""``polyproj bench solvers``: the Maros–Meszaros suite with qpbenchmark's methodology.

For every (problem, backend) pair the solve runs in its own child process with a hard timeout, so a
crashing or hanging solver costs one failure, not the run. A solve is a **success** when the backend
returns a solution (status SOLVED or SOLVED_INACCURATE) whose

- primal residual  ``max(0, Cx - u, l - Cx, x - ub, lb - x)``,
- dual residual    ``||Px + q + Cᵀz + z_box||_∞``,
- duality gap      ``|xᵀPx + qᵀx + uᵀz⁺ - lᵀz⁻ + ubᵀz_box⁺ - lbᵀz_box⁻|``

are all at most ``tol`` — computed by polyproj's own :class:`~polyproj.Solution` methods, with
``eps_abs = tol`` and ``eps_rel = 0`` given to the solver (qpbenchmark's definitions). Runtime
(wall-clock of ``backend.solve``, set-up included) is summarised by the shifted geometric mean

    sgm(t) = exp(mean(log(t_i + 10))) - 10,

failures charged the time limit; ``sgm rel`` divides by the best backend's value (1.0 = fastest).

Examples
--------
    polyproj bench solvers --data ../shared/data/maros_meszaros --tol 1e-6 --time-limit 10
    polyproj bench solvers --data DIR --backends osqp highs --problems HS21 QAFIRO
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import wait
from typing import Any

import numpy as np

__all__ = ["SolveRecord", "cli_main", "machine_description", "run_suite", "shifted_geometric_mean",
           "solve_one", "summarize"]

SHIFT = 10.0


@dataclass(frozen=True)
class SolveRecord:
    """Outcome of one (problem, backend) solve."""

    problem: str
    backend: str
    status: str
    success: bool
    runtime: float  # seconds, wall-clock of backend.solve (time limit charged on failure in summaries)
    primal: float
    dual: float
    gap: float
    iterations: int
    note: str = ""


def shifted_geometric_mean(values: Sequence[float], shift: float = SHIFT) -> float:
    """``exp(mean(log(v + shift))) - shift`` (qpbenchmark's runtime summary)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return float("nan")
    return float(np.exp(np.mean(np.log(v + shift))) - shift)


def unwritable(path: str | os.PathLike) -> str | None:
    """Why the results file ``path`` cannot be written (None when it can): checked before a long run.

    A folder, a parent that cannot be made, or a file that cannot be created (``/proc/x.json``: writable by
    its permissions, refused by the kernel) — found by creating the run's temporary file and removing it.
    """
    import stat
    from pathlib import Path

    path = Path(path)
    if path.is_dir():
        return f"{str(path)!r} is a folder; give the JSON file to write"
    # the results are written to a temporary file moved onto the path (a run stopped midway leaves the last
    # complete file): that replaces whatever the path is, so a symbolic link, a FIFO or a device (/dev/null as
    # root) would be replaced, not written through
    if path.is_symlink():
        return f"{str(path)!r} is a symbolic link; give the file it points to ({str(path.resolve())!r})"
    if path.exists() and not stat.S_ISREG(path.stat().st_mode):
        return f"{str(path)!r} is not a regular file (a device, a FIFO or a socket); give a JSON file to write"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = path.with_name(path.name + ".tmp")
        existed = probe.exists()
        with open(probe, "a"):
            pass
        if not existed:
            probe.unlink()
    except OSError as exc:
        return f"cannot write the results to {str(path)!r}: {exc.strerror or exc}"
    return None


def machine_description() -> dict[str, Any]:
    """Platform, CPU, Python and package versions (written into every results file)."""
    from .registry import backend_info

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return {"platform": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count(),
            "python": sys.version.split()[0], "numpy": np.__version__,
            "backends": {b.name: b.version for b in backend_info() if b.available}}


def _residual(fn) -> float:
    try:
        v = float(fn())
    except Exception:
        return float("inf")
    return v if math.isfinite(v) else float("inf")


def solve_one(mm: Any, backend: str, tol: float, time_limit: float) -> SolveRecord:
    """Solve one Maros–Meszaros problem with one backend (runs in the child process)."""
    from .registry import get_backend

    note = ""
    try:
        solver = get_backend(backend, eps_abs=tol, eps_rel=0.0, time_limit=time_limit)
        t0 = time.perf_counter()
        sol = solver.solve(mm.qp)
        runtime = time.perf_counter() - t0
    except Exception as exc:  # a broken backend is a failure of that backend, not of the run
        return SolveRecord(mm.name, backend, "exception", False, float(time_limit), math.inf, math.inf,
                           math.inf, 0, note=f"{type(exc).__name__}: {exc}"[:300])
    res = [_residual(f) for f in (sol.primal_residual, sol.dual_residual, sol.duality_gap)]
    ok = sol.status.ok and runtime <= time_limit and all(r <= tol for r in res)
    return SolveRecord(mm.name, backend, sol.status.value, bool(ok), runtime, *res, int(sol.iterations), note)


def _leave_ctrl_c_to_the_parent() -> None:
    """In a solve's child: SIGINT ignored (then unblocked: :func:`_start` blocked it across the fork).

    Ctrl-C is the parent's to handle (it kills the children and keeps what finished): a child that took it
    died with a traceback and was recorded as a failed solve.
    """
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _child(conn: Any, mm: Any, backend: str, tol: float, time_limit: float) -> None:
    _leave_ctrl_c_to_the_parent()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # solvers' C-level banners and logs would garble the progress bar
    os.dup2(devnull, 2)
    try:
        conn.send(asdict(solve_one(mm, backend, tol, time_limit)))
    finally:
        conn.close()


def _start(proc: Any) -> None:
    """``proc.start()`` with SIGINT blocked across the fork.

    A Ctrl-C that landed inside it was taken by the child or lost in the parent's after-fork hooks (the run
    went on and exited 0); blocked, it waits and is raised in the parent once the child exists.
    """
    import signal

    if not hasattr(signal, "pthread_sigmask"):
        proc.start()
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        proc.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _honour_ctrl_c() -> None:
    """Ctrl-C stops the run even when the parent process ignored or blocked SIGINT.

    Python installs no KeyboardInterrupt handler in a process started with SIGINT ignored, and the
    signal mask is inherited.
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _load(data: str, name: str, dense: bool) -> Any:
    """Load a problem; a non-convex P is kept (check_psd=False) so each backend can say so.

    With ``dense`` the matrices are converted to NumPy arrays (the dense subset is meant for
    dense solvers; ProxSuite then uses its dense backend).
    """
    from dataclasses import replace

    from .errors import ProblemError
    from .maros_meszaros import load_problem

    path = os.path.join(data, f"{name}.mat")
    try:
        mm = load_problem(path)
    except ProblemError:
        mm = load_problem(path, check_psd=False)
    return replace(mm, qp=mm.qp.dense()) if dense else mm


def run_suite(data: str, backends: Sequence[str], names: Sequence[str], tol: float, time_limit: float,
              jobs: int = 2, progress: Any = None, dense: bool = False) -> list[SolveRecord]:
    """Solve every problem with every backend, each solve in a child process with a hard timeout.

    ``dense`` converts every problem to dense matrices before the solves.

    The child is killed ``time_limit * 1.2 + 3`` seconds after its start; a killed or crashed
    child is recorded as a failure (status ``killed`` / ``crashed``).
    """
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    tasks = [(name, b) for name in names for b in backends]
    remaining = {name: len(backends) for name in names}
    cache: dict[str, Any] = {}
    running: dict[Any, tuple[Any, str, str, float]] = {}
    records: list[SolveRecord] = []
    hard = time_limit * 1.2 + 3.0

    def fail(name: str, b: str, status: str, note: str) -> SolveRecord:
        return SolveRecord(name, b, status, False, float(time_limit), math.inf, math.inf, math.inf, 0, note)

    def finish(name: str, rec: SolveRecord) -> None:
        records.append(rec)
        remaining[name] -= 1
        if remaining[name] == 0:
            cache.pop(name, None)
        if progress is not None:
            progress(rec)

    try:
        while tasks or running:
            while tasks and len(running) < max(1, jobs):
                name, b = tasks.pop(0)
                if name not in cache:
                    try:
                        cache[name] = _load(data, name, dense)
                    except Exception as exc:
                        finish(name, fail(name, b, "load_error", f"{type(exc).__name__}: {exc}"[:300]))
                        continue
                parent, child = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_child, args=(child, cache[name], b, tol, time_limit), daemon=True)
                _start(proc)
                child.close()
                running[parent] = (proc, name, b, time.monotonic() + hard)
            ready = wait(list(running), timeout=0.05)
            now = time.monotonic()
            for conn in list(running):
                proc, name, b, deadline = running[conn]
                if conn in ready:
                    try:
                        rec = SolveRecord(**conn.recv())
                    except (EOFError, OSError):
                        rec = fail(name, b, "crashed", f"child exited with code {proc.join(1) or proc.exitcode}")
                elif now > deadline:
                    proc.kill()
                    rec = fail(name, b, "killed", f"no answer after {hard:.1f} s")
                else:
                    continue
                proc.join(1)
                conn.close()
                del running[conn]
                finish(name, rec)
    finally:  # interrupted (KeyboardInterrupt) or failed: no child outlives the run
        for proc, *_ in running.values():
            proc.kill()
            proc.join(1)
    order = {(n, b): i for i, (n, b) in enumerate((n, b) for n in names for b in backends)}
    return sorted(records, key=lambda r: order[(r.problem, r.backend)])


def summarize(records: Sequence[SolveRecord], backends: Sequence[str], time_limit: float) -> dict[str, dict]:
    """Per backend: problems, successes, success rate (%), shifted geometric mean runtime (abs, rel)."""
    out: dict[str, dict] = {}
    for b in backends:
        recs = [r for r in records if r.backend == b]
        times = [r.runtime if r.success else time_limit for r in recs]
        ok = sum(r.success for r in recs)
        out[b] = {"problems": len(recs), "solved": ok, "success_rate": 100.0 * ok / max(len(recs), 1),
                  "sgm_runtime": shifted_geometric_mean(times)}
    best = min((v["sgm_runtime"] for v in out.values()), default=float("nan"))
    for v in out.values():
        v["sgm_runtime_rel"] = v["sgm_runtime"] / best if best > 0 else float("nan")
    return out


def _finite(obj: Any) -> Any:
    """Replace inf/NaN floats by None so that the JSON is standard."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _default_backends() -> list[str]:
    from .registry import available_backends

    return [b for b in available_backends() if b != "cupy"]


class _ResultsFile:
    """The JSON results file, rewritten as records come (at most every 2 s) and once at the end.

    An interrupted run (Ctrl-C) keeps every finished solve: the file then says ``"complete": false``.
    """

    def __init__(self, path: str, header: dict[str, Any], backends: Sequence[str], time_limit: float) -> None:
        self.path, self.header, self.backends, self.time_limit = path, header, list(backends), time_limit
        self.records: list[SolveRecord] = []
        self._last = 0.0
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def add(self, rec: SolveRecord) -> None:
        self.records.append(rec)
        if time.monotonic() - self._last > 2.0:
            self.write(complete=False)

    def write(self, complete: bool, records: Sequence[SolveRecord] | None = None) -> dict[str, dict]:
        recs = list(self.records if records is None else records)
        summary = summarize(recs, self.backends, self.time_limit)
        payload = {**self.header, "complete": complete, "summary": summary, "records": [asdict(r) for r in recs]}
        tmp = self.path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(_finite(payload), fh, indent=1)
        os.replace(tmp, self.path)
        self._last = time.monotonic()
        return summary


def _print_summary(console: Any, summary: dict[str, dict], subset: str, tol: float) -> None:
    from rich.table import Table

    table = Table(title=f"Maros–Meszaros {subset} subset, tol {tol:g} (qpbenchmark methodology)")
    for col in ("backend", "solved", "success rate (%)", "sgm runtime (s)", "sgm rel (1 = best)"):
        table.add_column(col, justify="right")
    for b, v in summary.items():
        table.add_row(b, f"{v['solved']}/{v['problems']}", f"{v['success_rate']:.1f}",
                      f"{v['sgm_runtime']:.4f}", f"{v['sgm_runtime_rel']:.3f}")
    console.print(table)


def cli_main(args: argparse.Namespace) -> int:
    """Run ``polyproj bench solvers`` (see the module docstring); 2 on bad input, 130 when interrupted."""
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .errors import PolyprojError
    from .maros_meszaros import SUBSETS, DataNotFound, list_problems
    from .registry import get_backend

    console = Console()
    backends = list(args.backends or _default_backends())
    def refuse(message: str) -> int:  # on stderr, as `check` and `bench apps` say theirs
        Console(stderr=True).print(f"[red]polyproj bench solvers: {escape(message)}[/red]", markup=True,
                                   highlight=False)
        return 2

    try:
        for b in backends:  # fail early and clearly on an unknown or unavailable name
            get_backend(b)
        # an absent or empty folder: DataNotFound; a file whose sizes cannot be read is run (and recorded as a
        # load error) rather than ending the benchmark, whose other problems are fine
        unreadable: list[str] = []
        names = list_problems(args.data, args.subset, unreadable=unreadable)
    except (PolyprojError, DataNotFound) as exc:
        return refuse(str(exc))
    if len(set(backends)) != len(backends):
        return refuse(f"--backends names a backend twice: {backends}")
    if args.problems and len(set(args.problems)) != len(args.problems):
        return refuse(f"--problems names a problem twice: {list(args.problems)}")
    if args.problems:
        missing = sorted(set(args.problems) - set(list_problems(args.data, "all", unreadable=[])) - set(unreadable))
        if missing:
            return refuse(f"unknown problem(s) {missing} in {args.data}")
        # --problems picks within the subset: the dense subset's problems are solved as dense matrices, and a
        # larger one densified took 24 GB (CONT-200) and was recorded as a crash
        outside = [p for p in args.problems if p not in names and p not in unreadable]
        if outside:
            nmax, mmax = SUBSETS[args.subset]
            return refuse(f"problem(s) {outside} are not in the {args.subset!r} subset (n <= {nmax:g}, m <= "
                          f"{mmax:g}); pass --subset all to solve them (sparse matrices)")
        names = list(args.problems)
    else:
        names = sorted(names + unreadable)
    tol, tl = float(args.tol), float(args.time_limit)
    out = args.out
    if out is None:
        suffix = "" if args.backends is None else "_" + "-".join(backends)
        out = os.path.join("benchmarks", "results", f"solvers_{tol:g}{suffix}.json")
    if (why := unwritable(out)) is not None:  # the default path too (a read-only working folder)
        return refuse(f"--out: {why}" if args.out is not None else f"{why} (the default --out; pass --out FILE)")
    jobs = int(getattr(args, "jobs", None) or min(2, os.cpu_count() or 1))
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread per solve: jobs solves share the cores
    _honour_ctrl_c()
    header = {"suite": "maros_meszaros", "subset": args.subset,
              "matrices": "dense" if args.subset == "dense" else "sparse", "tol": tol, "time_limit": tl,
              "shift": SHIFT, "jobs": jobs, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
              "machine": machine_description()}
    results = _ResultsFile(out, header, backends, tl)
    console.print(f"Maros–Meszaros ({args.subset}, {len(names)} problems) x {backends}: tol={tol:g}, "
                  f"time limit {tl:g} s, {jobs} parallel solve(s); results in {out}")
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as bar:
            task = bar.add_task("solving", total=len(names) * len(backends))

            def tick(rec: SolveRecord) -> None:
                results.add(rec)
                bar.update(task, advance=1, description=f"{rec.problem:>10} {rec.backend:>9} "
                           f"{'ok' if rec.success else rec.status}")

            records = run_suite(args.data, backends, names, tol, tl, jobs=jobs, progress=tick,
                                dense=args.subset == "dense")
    except KeyboardInterrupt:
        results.write(complete=False)
        console.print(f"[yellow]interrupted: {len(results.records)} finished solve(s) kept in {out}[/yellow]")
        return 130
    _print_summary(console, results.write(complete=True, records=records), args.subset, tol)
    console.print(f"results written to {out}")
    return 0
