"""``python -m steadystep``: the catalog, then every worked example with its result.

``python -m steadystep demo`` runs the main job (see `steadystep.demo`);
``python -m steadystep warmup`` compiles the common kernels ahead (see [`steadystep.warmup`][steadystep.warmup]).
"""

from __future__ import annotations

import sys

import steadystep
from steadystep.examples import EXAMPLES
from steadystep.registry import positional


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
        arguments = _brief(positional(example.module, example.function, example.args))
        print(f"  {mark} [{source}] {example.module}.{example.function}({arguments}) = {result!r}   ({example.note})")
        if not matches:
            print(f"       expected {example.expected!r}")
    print(f"\n{len(EXAMPLES) - failures} of {len(EXAMPLES)} examples give the documented value")
    return 1 if failures else 0


USAGE = """usage: steadystep [catalog | demo [options] | warmup [options] | --version]

  catalog   every formula with its math, then the worked examples and their results (the default)
  demo      decentralized training on scikit-learn's digits, with a report and plots
            (steadystep demo --help lists its options); demo --task lm: a byte transformer
            on the standard library's .py files (needs torch; demo --task lm --help)
  warmup    compile the common kernels into Numba's cache (NUMBA_CACHE_DIR) ahead of a job
            (steadystep warmup --help lists the targets and dtypes)"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv else "catalog"
    if command == "demo":
        from steadystep.demo import main as demo

        return demo(argv[1:])
    if command == "warmup":
        from steadystep.warmup import main as warm

        return warm(argv[1:])
    if command in ("-h", "--help") or (command == "catalog" and argv[1:] in (["-h"], ["--help"])):
        print(USAGE)
        return 0
    if command in ("-V", "--version"):  # what a bug report needs: this package and what it runs on
        import numba
        import numpy

        print(
            f"steadystep {steadystep.__version__} (numba {numba.__version__}, numpy {numpy.__version__}, "
            f"Python {sys.version.split()[0]})"
        )
        return 0
    if command != "catalog" or len(argv) > 1:
        print(f"steadystep: error: unknown command {' '.join(argv)!r}\n{USAGE}", file=sys.stderr)
        return 2
    show_catalog()
    return run_examples()


if __name__ == "__main__":
    sys.exit(main())
