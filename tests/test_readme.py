"""The snippets of the README and the documentation pages (docs/) run as written, each in a
fresh namespace, in a scratch directory."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SIMULATOR
from tests.rank_worker import launcher, rank_environment

pytestmark = pytest.mark.skipif(SIMULATOR, reason="the README's snippets run on the CPU")

ROOT_DIR = Path(__file__).resolve().parent.parent
README = (ROOT_DIR / "README.md").read_text()
PAGES = {"README.md": README} | {
    str(path.relative_to(ROOT_DIR)): path.read_text() for path in sorted((ROOT_DIR / "docs").rglob("*.md"))
}


def snippet(page: str, heading: str) -> str:
    section = PAGES[page].split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


BLOCKS = [(page, block) for page, text in PAGES.items() for block in re.findall(r"```python\n(.*?)```", text, re.S)]
# Scripts for torchrun, run as their comment says (two ranks): the first under torchrun itself,
# the others under the suite's light launcher (tests/spawn_ranks.py: torchrun's environment,
# ranks forked from a process that has imported torch), which saves each a torchrun and two
# imports of torch.
TORCHRUN_SCRIPTS = [index for index, (_, block) in enumerate(BLOCKS) if "init_process_group" in block]


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[f"{page}-{n}" for n, (page, _) in enumerate(BLOCKS)])
def test_every_python_block_of_the_readme_and_the_docs_runs_as_written(index, tmp_path, monkeypatch):
    """Each block on its own, as a reader pastes it into a fresh interpreter (the fused-steps
    block failed: layout.mask() is float32, its buffers float64)."""
    page, block = BLOCKS[index]
    if "torch" in block:
        pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    if index in TORCHRUN_SCRIPTS:
        script = tmp_path / "train.py"
        script.write_text(block)
        if index == TORCHRUN_SCRIPTS[0]:
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        else:
            command = launcher("torch", 2)
        command.append(str(script))
        environment = rank_environment()
        result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment, cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        assert sorted(path.name for path in tmp_path.glob("run.rank*.npz")) == ["run.rank0.npz", "run.rank1.npz"]
        return
    exec(compile(block, f"{page}, python block {index}", "exec"), {})


def test_ci_runs_the_readmes_test_command_verbatim():
    """CI reads the README's second quick-start command (linters first, then both test runs)
    from under its comment, and runs its parts one after another as timed phases."""
    *_, comment, command = re.search(r"```bash\n(.*?)```", README, re.S).group(1).strip().splitlines()
    assert "ruff check && ruff format --check" in command and "NUMBA_ENABLE_CUDASIM=1 python -m pytest" in command
    ci = (ROOT_DIR / ".ci" / "run").read_text()
    reading = re.search(r"command=\$\((.*)\)", ci).group(1)
    assert comment.startswith(re.search(r"'\^(.*?)'", reading).group(1))
    found = subprocess.run(["bash", "-c", reading], capture_output=True, text=True, cwd=ROOT_DIR, check=True)
    assert found.stdout.strip() == command
    assert "sed 's/ && /\\n/g'" in ci and 'eval "$part"' in ci  # each part of the command, as written


def test_the_readme_and_the_docs_have_their_python_blocks():
    assert sum(page == "README.md" for page, _ in BLOCKS) >= 1 and len(BLOCKS) >= 6


def test_the_readme_stays_short_and_links_the_docs():
    """What it is, the two commands, a taste and where to read on: the rest lives in docs/."""
    assert len(README.encode()) <= 8 * 1024
    for page in re.findall(r"\]\((docs/[^)]+\.md)\)", README):
        assert (ROOT_DIR / page).is_file(), page


def test_benchmarks_md_holds_one_current_table_per_script():
    """BENCHMARKS.md is the scripts' latest tables, each headed by its command, with the
    machine and date; the history lives in git. Other pages link to it instead of quoting it."""
    text = (ROOT_DIR / "BENCHMARKS.md").read_text()
    assert len(text.encode()) <= 15 * 1024
    # the machine of the CPU tables, with its versions and date (a table run elsewhere names its own)
    machine = r"\*\*Machine for the CPU tables below\*\* \(one names its own\): .*Python 3\.\d+.*numba [\d.]+"
    machine += r".*\d{4}-\d\d-\d\d"
    assert re.search(machine, text, re.S)
    scripts = {path.stem for path in (ROOT_DIR / "benchmarks").glob("*.py")} - {"__init__", "common"}
    headings = re.findall(r"^## .*$", text, re.M)
    for script in scripts:
        assert any(f"benchmarks.{script}`" in heading for heading in headings), f"no table for benchmarks/{script}.py"
    assert "](" not in text, "the docs site includes the page, where relative links break: name pages instead"


def test_the_torch_model_trainer_snippet_runs(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    page = "docs/guide/decentralized.md"
    exec(compile(snippet(page, "Decentralized training of torch models"), page, "exec"), namespace)
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
