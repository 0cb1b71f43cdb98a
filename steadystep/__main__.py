"""``python -m steadystep``: the catalog, then every worked example with its result."""

from __future__ import annotations

import sys

import steadystep
from steadystep.examples import EXAMPLES


def show_catalog() -> None:
    module = None
    for entry in steadystep.catalog():
        if entry["module"] != module:
            module = entry["module"]
            print(f"\n{module}")
        print(f"  {entry['function']}({', '.join(entry['parameters'])})  {entry['description']}")
        print(f"      {entry['formula']}")


def _brief(args: list) -> str:
    """Arguments as typed in Python, with long lists shortened (100,000 × 0.1)."""
    shown = []
    for arg in args:
        if isinstance(arg, list) and len(arg) > 8 and len(set(arg)) == 1:
            shown.append(f"[{arg[0]!r}] * {len(arg):_}")
        else:
            shown.append(repr(arg))
    return ", ".join(shown)


def run_examples() -> int:
    print("\nworked examples (CPU, float64)")
    failures = 0
    for example in EXAMPLES:
        result = steadystep.execute(example.module, example.function, example.args)["result"]
        matches = result == example.expected
        failures += not matches
        mark = "ok  " if matches else "DIFF"
        source = "seed" if example.from_seed else "spec"
        print(f"  {mark} [{source}] {example.module}.{example.function}({_brief(example.args)}) = {result!r}   ({example.note})")
        if not matches:
            print(f"       expected {example.expected!r}")
    print(f"\n{len(EXAMPLES) - failures} of {len(EXAMPLES)} examples give the documented value")
    return 1 if failures else 0


def main() -> int:
    show_catalog()
    return run_examples()


if __name__ == "__main__":
    sys.exit(main())
