"""The HTML tables Jupyter shows for steadystep's objects (``_repr_html_``): one caption, one
row per field, every text escaped."""

from __future__ import annotations

import html
from collections.abc import Iterable


def table(caption: str, rows: Iterable[tuple[str, object]]) -> str:
    cells = "".join(
        f"<tr><th style='text-align:left'>{html.escape(str(name))}</th><td style='text-align:left'>"
        f"{html.escape(str(value))}</td></tr>"
        for name, value in rows
    )
    return f"<table><caption>{html.escape(caption)}</caption>{cells}</table>"
