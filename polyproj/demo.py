"""``polyproj demo``: the showcase, one section per capability.

Each entry of ``SECTIONS`` is ``(title, "module:function")``; a section function takes
``(console, quick: bool, seed: int)`` and raises on a failed check, so the demo doubles as a
smoke test (``make demo`` fails loudly when something is wrong).
"""

from __future__ import annotations

import argparse
import importlib
import time

import numpy as np

__all__ = ["SECTIONS", "main", "projection_section"]

SECTIONS: list[tuple[str, str]] = [
    ("Exact projection with every backend, and the HS-Jacobian", "polyproj.demo:projection_section"),
    ("DIF: influence under constraints vs leave-one-out", "polyproj.adapters.dif.demo:dif_section"),
    ("Training a network through the exact projection layer (torch)", "polyproj.adapters.torch_demo:training_section"),
]

#: the extra that installs what a section's module imports (a section whose module cannot import is skipped, named)
EXTRAS: dict[str, str] = {
    "polyproj.adapters.dif.demo:dif_section": "dif",
    "polyproj.adapters.torch_demo:training_section": "torch",
}


def random_polytope(n: int, m: int, p: int, rng: np.random.Generator):
    """A random bounded polytope with an interior point (used by the demo and benchmarks)."""
    from .problem import Polyhedron

    x0 = rng.normal(size=n)
    A = rng.normal(size=(m, n))
    a = A @ x0 + rng.uniform(0.1, 1.0, size=m)
    B = rng.normal(size=(p, n))
    return Polyhedron(A=A, a=a, B=B, b=B @ x0, lb=x0 - 2.0, ub=x0 + 2.0)


def projection_section(console, quick: bool, seed: int) -> None:
    """Project a batch with every available backend; agreement, feasibility, HS-Jacobian check."""
    from rich.table import Table

    from .api import project
    from .projection import hs_jacobian, hs_vjp
    from .registry import available_backends

    rng = np.random.default_rng(seed)
    n, m, batch = (20, 40, 16) if quick else (50, 100, 128)
    P = random_polytope(n, m, 1, rng)
    X = 3.0 * rng.normal(size=(batch, n))
    table = Table(title=f"projection of {batch} points onto a random polytope (n={n}, m={m}, 1 equality, bounds)")
    for col in ("backend", "time [ms]", "max violation", "polished", "max |y - y_ref|"):
        table.add_column(col)
    ref = None
    for name in available_backends():
        if name == "cupy":
            continue
        t0 = time.perf_counter()
        res = project(X, P, backend=name)
        dt = time.perf_counter() - t0
        ref = res.y if ref is None else ref
        table.add_row(name, f"{1e3 * dt:.1f}", f"{res.max_violation:.1e}", f"{int(res.polished.sum())}/{batch}",
                      f"{np.max(np.abs(res.y - ref)):.1e}")
        if res.max_violation > 1e-9 or np.max(np.abs(res.y - ref)) > 1e-7:
            raise AssertionError(f"backend {name} disagrees or is infeasible")
    console.print(table)
    # HS-Jacobian vs central finite differences at the first point
    res = project(X[:1], P)
    J = hs_jacobian(P, res.active[0])
    h = 1e-6
    fd = np.stack([(project(X[0] + h * e, P).y - project(X[0] - h * e, P).y) / (2 * h) for e in np.eye(n)], axis=1)
    v = rng.normal(size=n)
    err_fd = float(np.max(np.abs(fd - J)))
    err_vjp = float(np.max(np.abs(hs_vjp(P, res.active[0], v) - J @ v)))
    console.print(f"HS-Jacobian at a point with {int(res.active[0].sum())} active rows: "
                  f"max |J - finite differences| = {err_fd:.1e}, max |hs_vjp - J v| = {err_vjp:.1e}")
    if err_fd > 1e-6 or err_vjp > 1e-10:
        raise AssertionError("HS-Jacobian check failed")


def main(args: argparse.Namespace) -> int:
    """Run every section of the demo; a section whose optional packages are not installed is skipped with a note."""
    from rich.console import Console
    from rich.markup import escape
    from rich.rule import Rule

    console = Console()
    for title, path in SECTIONS:
        console.print(Rule(title))
        mod_name, _, fn = path.partition(":")
        t0 = time.perf_counter()
        try:  # the sections import their optional packages at import or when they run
            getattr(importlib.import_module(mod_name), fn)(console, bool(args.quick), int(args.seed))
        except ModuleNotFoundError as exc:
            if not exc.name or exc.name.partition(".")[0] == "polyproj":  # polyproj's own module: a bug, not skipped
                raise
            extra = EXTRAS.get(path, "all")
            console.print("[yellow]skipped[/yellow]: " + escape(f"this section needs {exc.name!r}, which is not "
                                                                f"installed (pip install 'polyproj[{extra}]')"))
            continue
        console.print(f"[dim]({time.perf_counter() - t0:.1f} s)[/dim]")
    return 0
