"""What a notebook shows: the HTML tables of optimizers, topologies, trainers and reports hold
the object's settings, escaped; and the library never prints (only its command-line entry
points do), so that a notebook's output is the user's own."""

from __future__ import annotations

import ast
from html.parser import HTMLParser

import numpy as np
import pytest

from steadystep import decentral, diagnostics
from tests.conftest import SIMULATOR
from tests.helpers import ROOT


class _Table(HTMLParser):
    """The caption and the (header, cell) rows of one HTML table, as text."""

    def __init__(self, markup: str):
        super().__init__()
        self.caption, self.rows, self._cell, self._open = "", [], None, None
        self.feed(markup)

    def handle_starttag(self, tag, attrs):
        if tag in ("caption", "th", "td"):
            self._open, self._cell = tag, ""
        elif tag == "tr":
            self.rows.append([])

    def handle_endtag(self, tag):
        if tag == "caption":
            self.caption = self._cell
        elif tag in ("th", "td"):
            self.rows[-1].append(self._cell)
        self._open = None

    def handle_data(self, data):
        if self._open:
            self._cell += data


def table(value) -> tuple[str, dict[str, str]]:
    parsed = _Table(value._repr_html_())
    assert all(len(row) == 2 for row in parsed.rows), parsed.rows
    return parsed.caption, {name: cell for name, cell in parsed.rows if name}


def test_topologies_show_their_rule():
    caption, rows = table(decentral.one_peer_exponential())
    assert caption == "Topology" and rows["name"] == "one_peer_exponential"
    for t in range(3):  # the peers the rule gives, not a copy of them
        assert rows[f"peers of 8 workers, t = {t}"] == str(decentral.one_peer_exponential().peers(8, t).tolist())
    assert rows["peers of 8 workers, t = 0"] == "[7, 0, 1, 2, 3, 4, 5, 6]"
    assert table(decentral.complete())[1]["mixing"].startswith("W = 11ᵀ/N")
    assert table(decentral.from_matrix(np.full((3, 3), 1 / 3), name="<thirds>"))[1] == {
        "name": "<thirds>",  # escaped in the markup, so the parser reads it back as text
        "mixing": "a fixed 3 × 3 W",
    }
    assert "<thirds>" not in decentral.from_matrix(np.eye(2), name="<thirds>")._repr_html_()
    assert table(decentral.from_matrix(lambda t: np.eye(2)))[1]["mixing"] == "W_t, a function of t"


def test_decentralized_adamw_shows_its_state(target):
    params = np.ones((4, 6), np.float32)
    optimizer = decentral.DecentralizedAdamW(
        params, topology=decentral.ring(), lr=0.01, max_norm=1.0, decay_mask=np.ones(6), target=target
    )
    optimizer.step(np.ones_like(params))
    caption, rows = table(optimizer)
    assert caption == "DecentralizedAdamW"
    assert rows["workers"] == "4" and rows["parameters per worker"] == "6" and rows["dtype"] == "float32"
    assert rows["target"] == target and rows["topology"] == "ring" and rows["steps taken (t)"] == "1"
    assert rows["lr"] == "0.01" and rows["max_norm"] == "1.0" and rows["decay_mask"] == "given"


@pytest.mark.skipif(SIMULATOR, reason="torch on the CPU")
def test_torch_optimizers_and_the_trainer_show_their_groups():
    torch = pytest.importorskip("torch")
    import steadystep.torch as drop_ins
    from steadystep.torch.decentral import DecentralizedTrainer

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2, bias=False))
    optimizer = drop_ins.AdamW(
        [{"params": model[0].parameters()}, {"params": model[1].parameters(), "lr": 0.5}], lr=1e-3
    )
    caption, rows = table(optimizer)
    assert caption == "AdamW" and rows["steps taken"] == "none yet"
    assert rows["param_groups[0]"] == "2 tensors, 15 elements (float32 on cpu)"
    assert rows["param_groups[1]"] == "1 tensors, 6 elements (float32 on cpu)"
    options = [cell for name, cell in _Table(optimizer._repr_html_()).rows if not name]
    assert options[0].startswith("lr=0.001, betas=(0.9, 0.999)") and options[1].startswith("lr=0.5,")
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    optimizer.step()
    assert table(optimizer)[1]["steps taken"] == "2"
    assert "steps taken" not in table(drop_ins.SGD(model.parameters(), lr=0.1))[1]  # SGD keeps no count

    trainer = DecentralizedTrainer(model, 4, topology=decentral.one_peer_exponential())
    caption, rows = table(trainer)
    assert caption == "DecentralizedTrainer" and rows["module"] == "Sequential" and rows["workers"] == "4"
    assert rows["parameters per worker"] == "21 in 3 tensors" and rows["steps taken (t)"] == "0"


def test_reports_show_their_fields():
    report = diagnostics.ConsensusAlignment(
        a=diagnostics.Estimate(0.5, 0.1),
        a_norm=diagnostics.Estimate(None, None),
        mean_error_norm=1.5,
        consensus_distance=2.0,
    )
    assert table(report) == (
        "ConsensusAlignment",
        {"a": "0.5 ± 0.1", "a_norm": "undefined", "mean_error_norm": "1.5", "consensus_distance": "2.0"},
    )


# the command-line entry points, whose output is the point
PRINTING = {"__main__.py", "demo/__init__.py", "demo/cli.py", "demo/digits.py", "demo/lm.py", "codegen.py", "warmup.py"}


def _print_calls(tree: ast.AST) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"
    ]


@pytest.mark.skipif(SIMULATOR, reason="reads the sources")
def test_the_library_never_prints():
    printing = []
    for path in sorted((ROOT / "steadystep").rglob("*.py")):
        if str(path.relative_to(ROOT / "steadystep")) in PRINTING or "_generated" in path.parts:
            continue
        printing += [f"{path.relative_to(ROOT)}:{node.lineno}" for node in _print_calls(ast.parse(path.read_text()))]
    assert printing == [], "use warnings.warn (or logging) instead of print in library code"


@pytest.mark.skipif(SIMULATOR, reason="reads the sources")
def test_the_warmup_prints_only_from_its_command_line():
    tree = ast.parse((ROOT / "steadystep" / "warmup.py").read_text())
    printing = {
        function.name for function in ast.walk(tree) if isinstance(function, ast.FunctionDef) and _print_calls(function)
    }
    assert printing <= {"main", "show"}
