"""The notebooks run top to bottom in a fresh kernel, as stored.

No bound on their time, which the machines' speed and load decide; a cell gets ten minutes, so
that a hang fails instead of stalling CI."""

from pathlib import Path

import pytest

from tests.conftest import SIMULATOR

pytestmark = pytest.mark.skipif(SIMULATOR, reason="the notebooks run on the CPU")

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
KernelManager = pytest.importorskip("jupyter_client").KernelManager

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_the_six_notebooks_are_there():
    assert [path.name for path in NOTEBOOKS] == [
        "01_quickstart.ipynb",
        "02_decentralized_training.ipynb",
        "03_curvature_diagnostics.ipynb",
        "04_decentralized_torch_model.ipynb",
        "05_communication.ipynb",
        "06_optimizer_state_bits.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_notebook_is_stored_without_outputs_and_runs(path, tmp_path):
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(not cell.outputs and cell.execution_count is None for cell in code), (
        "clear the outputs before committing"
    )
    # The kernel's channels as Unix sockets in the test's own folder: over TCP, the ports the
    # client picks can be taken by another process before the kernel binds them (a kernel of the
    # other pytest worker's, a rank's port), and the kernel then never answers.
    manager = KernelManager(kernel_name="python3", transport="ipc", ip=str(tmp_path / "kernel"))
    nbclient.NotebookClient(
        notebook, timeout=600, km=manager, resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    errors = [output for cell in code for output in cell.outputs if output.output_type == "error"]
    assert not errors
    assert any(
        output.output_type in ("stream", "execute_result", "display_data") for cell in code for output in cell.outputs
    )
