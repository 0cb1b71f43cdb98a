"""The README's snippets that promise to run, run (each in a fresh namespace, in a scratch directory)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SIMULATOR
from tests.helpers import ROOT

pytestmark = pytest.mark.skipif(SIMULATOR, reason="the README's snippets run on the CPU")

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def snippet(heading: str) -> str:
    section = README.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_every_python_block_of_the_readme_runs_as_written(index, tmp_path, monkeypatch):
    """Each block on its own, as a reader pastes it into a fresh interpreter (the fused-steps
    block failed: layout.mask() is float32, its buffers float64)."""
    if "torch" in BLOCKS[index]:
        pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    if "init_process_group" in BLOCKS[index]:  # a script for torchrun, run as its comment says (two ranks)
        script = tmp_path / "train.py"
        script.write_text(BLOCKS[index])
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
        environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment, cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        assert sorted(path.name for path in tmp_path.glob("run.rank*.npz")) == ["run.rank0.npz", "run.rank1.npz"]
        return
    exec(compile(BLOCKS[index], f"README.md, python block {index}", "exec"), {})


def test_ci_runs_the_readmes_test_command_verbatim():
    """CI runs the README's second quick-start command (linters first, then both test runs)."""
    command = re.search(r"```bash\n(.*?)```", README, re.S).group(1).strip().splitlines()[-1]
    ci = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text()
    assert "ruff check && ruff format --check" in command and command in ci


def test_the_readme_has_its_python_blocks():
    assert len(BLOCKS) >= 6


def test_the_torch_model_trainer_snippet_runs(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(snippet("Decentralized training of torch models"), "README.md", "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.t == 1 and namespace["result"].losses.shape == (8,)
    assert (tmp_path / "run.npz").is_file()
    again = type(trainer)(
        namespace["model"],
        8,
        topology=trainer.topology,
        lr=namespace["schedule"],
        weight_decay=0.1,
        max_norm=1.0,
        consensus=trainer.consensus,
    )
    again.load(tmp_path / "run.npz")
    assert again.t == 1 and bool((again.params == trainer.params).all())
    assert "tensor(" in capsys.readouterr().out
