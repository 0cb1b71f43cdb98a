"""A small mutation run: one-line changes a wrong formula or default would make, each applied
to the source, the tests that should notice it run, and the source restored. A mutant that
passes its tests survived: some property is not tested. Not part of the default suite (each
mutant is a pytest run); run it after changing a formula's tests:

    python ci/mutants.py            # every mutant
    python ci/mutants.py --list     # their names
    python ci/mutants.py NAME ...   # some

Exit status 1 when a mutant survived. Mutants of the Python layer only: a generated kernel
changes with its formula (steadystep/kernels/) and needs `python -m steadystep.codegen` first.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the checkout
    original: str  # must occur exactly once
    mutated: str
    tests: tuple[str, ...]  # pytest arguments: the tests that should kill it


MUTANTS = [
    Mutant(
        "hutch++ default sketch",
        "steadystep/curvature.py",
        "sketch = min(op.size, 32) if sketch is None",
        "sketch = min(op.size, 31) if sketch is None",
        ("tests/test_curvature.py",),
    ),
    Mutant(
        "density width: 1% of the spread",
        "steadystep/curvature.py",
        "max(0.01 * (high - low),",
        "max(0.02 * (high - low),",
        ("tests/test_curvature.py",),
    ),
    Mutant(
        "density width: its floor",
        "steadystep/curvature.py",
        "1e-4 * max(abs(low), abs(high))",
        "1e-3 * max(abs(low), abs(high))",
        ("tests/test_curvature.py",),
    ),
    Mutant(
        "density width: all nodes zero",
        "steadystep/curvature.py",
        "_SMALLEST_WIDTH) if high or low else 0.01",
        "_SMALLEST_WIDTH) if high or low else 0.1",
        ("tests/test_curvature.py",),
    ),
    Mutant(
        "consensus alignment: mean of the error norms",
        "steadystep/diagnostics.py",
        "return ConsensusAlignment(a, a_norm, float(np.mean(norms)),",
        "return ConsensusAlignment(a, a_norm, float(np.sqrt(np.mean(norms**2))),",
        ("tests/test_diagnostics.py",),
    ),
    Mutant(
        "consensus distance: mean of squared norms",
        "steadystep/decentral.py",
        "return float(np.mean(np.sum(consensus_errors(params) ** 2, axis=1)))",
        "return float(np.mean(np.sqrt(np.sum(consensus_errors(params) ** 2, axis=1))) ** 2)",
        ("tests/test_decentral.py",),
    ),
    Mutant(
        "standard error: s/sqrt(n)",
        "steadystep/diagnostics.py",
        "np.std(values, ddof=1) / math.sqrt(len(values))",
        "np.std(values, ddof=0) / math.sqrt(len(values))",
        ("tests/test_diagnostics.py", "tests/test_curvature.py"),
    ),
    Mutant(
        "one-peer period: bit_length(N - 1)",
        "steadystep/decentral.py",
        "period = (workers - 1).bit_length()",
        "period = max((workers - 1).bit_length(), 3)",
        ("tests/test_decentral.py",),
    ),
    Mutant(
        "ring: the previous worker at even steps",
        "steadystep/decentral.py",
        "(np.arange(workers) + (-1 if t % 2 == 0 else 1)) % workers",
        "(np.arange(workers) + (1 if t % 2 == 0 else -1)) % workers",
        ("tests/test_decentral.py",),
    ),
    Mutant(
        "Rademacher probes: ±1",
        "steadystep/diagnostics.py",
        "rng.choice(np.array([-1.0, 1.0]), size=(count, length))",
        "rng.choice(np.array([-1.0, 1.0, 1.0]), size=(count, length))",
        ("tests/test_diagnostics.py", "tests/test_curvature.py"),
    ),
]


def run(mutant: Mutant) -> bool:
    """Whether the mutant's tests fail (it is killed); the source is restored in any case."""
    path = ROOT / mutant.path
    source = path.read_text()
    if source.count(mutant.original) != 1:
        raise SystemExit(f"{mutant.name}: {mutant.original!r} is not once in {mutant.path}; update the mutant")
    try:
        path.write_text(source.replace(mutant.original, mutant.mutated))
        command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-n", "0", *mutant.tests]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    finally:
        path.write_text(source)
    return result.returncode != 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutants to run (all by default)")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    arguments = parser.parse_args(argv)
    if arguments.list:
        print("\n".join(mutant.name for mutant in MUTANTS))
        return 0
    chosen = [mutant for mutant in MUTANTS if not arguments.names or mutant.name in arguments.names]
    survivors = []
    for mutant in chosen:
        started = time.perf_counter()
        killed = run(mutant)
        print(
            f"{'killed  ' if killed else 'SURVIVED'} {time.perf_counter() - started:6.1f} s  {mutant.name}", flush=True
        )
        if not killed:
            survivors.append(mutant.name)
    print(
        f"{len(chosen) - len(survivors)} of {len(chosen)} killed" + (f"; survivors: {survivors}" if survivors else "")
    )
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
