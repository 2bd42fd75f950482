"""The ``polyproj`` command: ``backends``, ``check``, ``bench``, ``demo``.

``python -m polyproj`` runs it too.
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _cmd_backends(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from .registry import backend_info

    table = Table(title="polyproj backends")
    for col in ("name", "available", "version", "capabilities", "source"):
        table.add_column(col)
    for row in backend_info():  # names and versions are third parties' text: escaped, never read as markup
        avail = "[green]yes[/green]" if row.available else f"[red]no[/red]: {escape(row.reason)}"
        table.add_row(escape(row.name), avail, escape(row.version), ", ".join(row.capabilities), escape(row.source))
    Console().print(table)
    return 0


def _delegate(path: str, args: argparse.Namespace) -> int:
    """Run ``module:function(args)``; a feature not installed is a clear error, not a traceback."""
    mod_name, _, fn = path.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        print(f"polyproj: this command needs {exc.name!r}: {exc}", file=sys.stderr)
        return 2
    return int(getattr(mod, fn)(args) or 0)


def _positive(kind: type, what: str, zero: bool = False):
    """An argparse type: a finite number of ``kind`` greater than 0 (>= 0 with ``zero``; a clear error otherwise)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            whole = " (a whole number)" if kind is int else ""
            raise argparse.ArgumentTypeError(f"{what} must be a number{whole}, got {text!r}") from None
        if not (math.isfinite(value) and (value >= 0 if zero else value > 0)):
            raise argparse.ArgumentTypeError(f"{what} must be a finite number > 0{' or 0' if zero else ''}, got {text}")
        return value

    return parse


def _seed(text: str) -> int:
    """An argparse type: a whole number in [0, 2**63 - 1] (NumPy's, hypothesis's and torch's seeds).

    torch takes none beyond 2**64 - 1: a larger seed failed in the middle of ``polyproj demo``.
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seed must be a whole number, got {text!r}") from None
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"--seed must be in [0, {SEED_MAX}], got {value}")
    return value


#: the largest --seed (torch.manual_seed takes a 64-bit integer)
SEED_MAX = 2**63 - 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``polyproj`` command."""
    from ._version import __version__

    parser = argparse.ArgumentParser(prog="polyproj", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"polyproj {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("backends", help="list backends: availability, version, capabilities")
    p.set_defaults(func=_cmd_backends)

    p = sub.add_parser("demo", help="run the showcase")
    p.add_argument("--quick", action="store_true", help="smaller sizes (used by the tests)")
    p.add_argument("--seed", type=_seed, default=0)
    p.set_defaults(func=lambda a: _delegate("polyproj.demo:main", a))

    p = sub.add_parser("check", help="run the property and conformance suites on a backend or a set")
    p.add_argument("backend", help="registered name or module:Class of a backend; or module:attr of a set (a "
                                   "Projector or Polyhedron, or a function of no arguments that builds one)")
    p.add_argument("--examples", type=_positive(int, "--examples"), default=None,
                   help="hypothesis examples per property (>= 1, default 20; max(1, N // 2) for qp_contract_sparse, "
                        "infeasibility, projection_contract, hs_contains_b)")
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument("--timeout", type=_positive(float, "--timeout"), default=900.0,
                   help="seconds each property may take before it is reported as an error (default 900)")
    # tolerances >= 0: eps_rel = 0 is every backend's default, eps_abs = 0 HiGHS's documented choice (both 0: the
    # backend's own SettingsError)
    p.add_argument("--eps-abs", dest="eps_abs", type=_positive(float, "--eps-abs", zero=True), default=None,
                   help="the backend's absolute tolerance, >= 0 (its default otherwise); the contract's tolerance "
                        "follows it: max(1e-6, 100 eps_abs)")
    p.add_argument("--eps-rel", dest="eps_rel", type=_positive(float, "--eps-rel", zero=True), default=None,
                   help="the backend's relative tolerance, >= 0 (its default otherwise)")
    p.set_defaults(func=lambda a: _delegate("polyproj.testing.check:cli_main", a))

    p = sub.add_parser("bench", help="benchmarks")
    bsub = p.add_subparsers(dest="bench", required=True)
    s = bsub.add_parser("solvers", help="Maros–Meszaros suite (qpbenchmark methodology)")
    s.add_argument("--data", required=True, help="folder of Maros–Meszaros .mat files")
    s.add_argument("--backends", nargs="+", default=None)
    s.add_argument("--tol", type=_positive(float, "--tol"), default=1e-6, help="residual tolerance (> 0)")
    s.add_argument("--time-limit", type=_positive(float, "--time-limit"), default=10.0, help="seconds per solve (> 0)")
    s.add_argument("--subset", choices=["dense", "all", "small"], default="dense")
    s.add_argument("--problems", nargs="+", default=None,
                   help="only these problem names (within --subset; --subset all for the large ones)")
    s.add_argument("--out", default=None, help="JSON results file")
    s.add_argument("--jobs", type=_positive(int, "--jobs"), default=None,
                   help="parallel solves (>= 1; default min(2, cores))")
    s.set_defaults(func=lambda a: _delegate("polyproj.bench:cli_main", a))
    s = bsub.add_parser("apps", help="the projection layer in the papers' applications (portfolio, matching, mhc)")
    from .apps.runner import add_arguments

    add_arguments(s)
    s.set_defaults(func=lambda a: _delegate("polyproj.apps.runner:cli_main", a))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``polyproj`` command."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:  # the commands keep what finished (their own handlers ran): a line, not a traceback
        print("polyproj: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
