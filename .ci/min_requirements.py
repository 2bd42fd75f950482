"""Print dependencies of pyproject.toml pinned to their declared floors (``>=`` -> ``==``).

``make test-min`` installs the core ones into a separate environment, so that the floors are tested, not
just declared; ``make test-floors`` adds the solver extras named after ``--extras`` (``--extras osqp,daqp``).
"""

import argparse
import pathlib
import re
import sys

ap = argparse.ArgumentParser()
ap.add_argument("pyproject", nargs="?", default="pyproject.toml")
ap.add_argument("--extras", default="", help="comma-separated optional-dependency groups pinned too")
args = ap.parse_args()
text = pathlib.Path(args.pyproject).read_text()


def listed(key: str) -> list[str]:
    """The strings of the list ``key = [...]`` (at a line's start; tomllib is Python 3.11+, the floor is 3.10)."""
    block = re.search(rf"^{re.escape(key)}\s*=\s*\[(.*?)\]", text, re.S | re.M)
    if block is None:
        sys.exit(f"no {key} = [...] in {args.pyproject}")
    lines = [line.split("#", 1)[0] for line in block.group(1).splitlines()]  # comments may quote strings
    return re.findall(r'"([^"]+)"', "\n".join(lines))


specs = listed("dependencies")
for extra in filter(None, args.extras.split(",")):
    specs += listed(extra)
pins = []
for spec in specs:
    if ";" in spec or spec.startswith("polyproj["):
        sys.exit(f"{spec!r}: a marker or a nested extra has no single floor to pin")
    name, sep, floor = spec.partition(">=")
    if not sep:
        sys.exit(f"dependency {spec!r} declares no floor (>=)")
    name = re.sub(r"\[.*\]", "", name).strip()  # dask[distributed] -> dask
    pins.append(f"{name}=={floor.split(',')[0].strip()}")
print(" ".join(pins))
