"""Print the core dependencies of pyproject.toml pinned to their declared floors (``>=`` -> ``==``).

``make test-min`` installs these into a separate environment, so that the floors are tested,
not just declared.
"""

import pathlib
import re
import sys

text = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml").read_text()
block = re.search(r"^dependencies\s*=\s*\[(.*?)\]", text, re.S | re.M)
if block is None:
    sys.exit("no dependencies = [...] in pyproject.toml")
pins = []
for spec in re.findall(r'"([^"]+)"', block.group(1)):
    name, sep, floor = spec.partition(">=")
    if not sep:
        sys.exit(f"dependency {spec!r} declares no floor (>=)")
    pins.append(f"{name.strip()}=={floor.split(',')[0].strip()}")
print(" ".join(pins))
