"""The main job, ``python -m steadystep demo``: N simulated workers train with decentralized
AdamW over every requested topology and mixing order, and a report compares them.

Two tasks, one module each: handwritten digits with an MLP (``--task digits``, the default:
`steadystep.demo.digits`) and a byte-level language model (``--task lm``:
`steadystep.demo.lm`, needs torch). What they share around training lives beside them:
the command line and the backends (``cli``), and the report's pieces (``report``).
"""

from __future__ import annotations

import sys
from typing import Optional

from steadystep.demo.cli import requested_task
from steadystep.demo.digits import (
    Data,
    Settings,
    consensus_figure,
    diagnose,
    learning_rate,
    load_digits,
    minibatches,
    parse,
    parser,
    plot,
    spectrum_figure,
    stratified_split,
    summary_table,
    train,
    write_report,
)

__all__ = [
    "Data",
    "Settings",
    "consensus_figure",
    "diagnose",
    "learning_rate",
    "load_digits",
    "main",
    "minibatches",
    "parse",
    "parser",
    "plot",
    "spectrum_figure",
    "stratified_split",
    "summary_table",
    "train",
    "write_report",
]


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m steadystep demo [flags]``: the task ``--task`` names (digits by default)."""
    argv = sys.argv[1:] if argv is None else argv
    if requested_task(argv) == "lm":
        from steadystep.demo import lm  # imports torch: only for this task

        return lm.main(argv)
    from steadystep.demo import digits

    return digits.main(argv)
