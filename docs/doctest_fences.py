"""A griffe extension for the API pages: the docstrings' doctest examples (``>>>`` lines and
their output, up to a blank line) become fenced ``pycon`` blocks, which Markdown would
otherwise read as nested block quotes."""

from __future__ import annotations

from typing import Any

import griffe


def fenced(text: str) -> str:
    lines, out, index = text.split("\n"), [], 0
    while index < len(lines):
        if lines[index].lstrip().startswith(">>>"):
            block = []
            while index < len(lines) and lines[index].strip():
                block.append(lines[index])
                index += 1
            out += ["```pycon", *block, "```"]
        else:
            out.append(lines[index])
            index += 1
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    def on_instance(self, **kwargs: Any) -> None:
        docstring = kwargs["obj"].docstring
        if docstring is not None and ">>>" in docstring.value:
            docstring.value = fenced(docstring.value)
