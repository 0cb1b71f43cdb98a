"""A torch module with one worker per torch.distributed rank (torchrun, gloo), DistributedTrainer,
against the in-process DecentralizedTrainer with N workers."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import SIMULATOR
from tests.helpers import ROOT, run_python
from tests.launches import Launches
from tests.rank_worker import launch as launch_ranks
from tests.rank_worker import launcher, rank_environment

pytestmark = [
    pytest.mark.skipif(SIMULATOR, reason="the ranks run in subprocesses (the simulator's run is below)"),
    pytest.mark.xdist_group("distributed_trainer"),
]
pytest.importorskip("torch.distributed")

import torch  # noqa: E402

from steadystep.torch.decentral import DecentralizedTrainer  # noqa: E402
from steadystep.torch.distributed import join_trainer_checkpoint, split_trainer_checkpoint  # noqa: E402
from tests.trainer_worker import batch, communication_state, model, options, simulate  # noqa: E402

WORKER = Path(__file__).with_name("trainer_worker.py")


def launch(ranks: int, out: Path, *arguments: str, **settings) -> subprocess.CompletedProcess:
    return launch_ranks("torch", ranks, out, *arguments, script=WORKER, **settings)


TOPOLOGIES = ["one_peer_exponential", "ring", "complete", "sparse"]
RANKS = Launches(WORKER, launch_ranks)
MATCH = {  # AWC with an adaptive γ, ATC with a fixed one
    (topology, order): RANKS.case(3, "--topology", topology, "--order", order, *["--adaptive"][: order == "awc"])
    for topology in TOPOLOGIES
    for order in ("awc", "atc")
}
FOUR = {
    topology: RANKS.case(4, "--topology", topology, "--adaptive") for topology in ("one_peer_exponential", "complete")
}
BATCH_NORM = RANKS.case(3, "--topology", "ring", "--batch-norm")
ONE_RANK = RANKS.case(1, "--topology", "one_peer_exponential", "--adaptive")
POISON = RANKS.case(3, "--topology", "ring", "--poison", "1", "1")
BAD_BATCH = RANKS.case(3, "--topology", "complete", "--bad-batch", "2", "1")
ODD = {option: RANKS.case(3, "--topology", "ring", option, "1") for option in ("--odd-max-norm", "--odd-model")}
RESUME = RANKS.case(3, "--topology", "one_peer_exponential", "--resume-at", "1", "--adaptive")
CUDA = RANKS.case(3, "--topology", "sparse", "--target", "cuda", simulator=True)
CUDA_COMMUNICATION = {
    what: RANKS.case(
        3, "--topology", "ring", "--communication", what, "--steps", "2", "--target", "cuda", simulator=True
    )
    for what in ("int8", "diloco")
}
COMMUNICATION = {  # compressed gossip and outer steps: (topology, order, what), 3 ranks, 4 steps
    case: RANKS.case(
        3,
        *("--topology", case[0], "--order", case[1], "--communication", case[2], "--steps", "4"),
        *["--adaptive"][: case[1] == "awc"],
    )
    for case in [
        ("ring", "atc", "int8"),
        ("one_peer_exponential", "awc", "int8"),
        ("complete", "awc", "diloco"),
        ("base_2_graph", "atc", "diloco"),
    ]
}
COMMUNICATION_RESUMED = {
    what: RANKS.case(3, "--topology", "ring", "--communication", what, "--steps", "4", "--resume-at", "3")
    for what in ("int8", "diloco")
}


def found(out: Path) -> dict:
    with np.load(out / "gathered.npz") as archive:
        return dict(archive)


def assert_matches(out: Path, expected: DecentralizedTrainer, exact: bool) -> None:
    """What rank 0 gathered after the run is the in-process trainer's state: parameters,
    moments, buffers, step, mean model and consensus distance."""
    ours = found(out)
    size = expected.workers
    reference = {
        "params": expected.params.numpy(),
        "exp_avg": np.concatenate([o.exp_avg for o in expected.optimizers], axis=1),
        "buffers": np.concatenate(
            [np.zeros((size, 0))] + [b.reshape(size, -1).numpy().astype(np.float64) for b in expected.buffers.values()],
            axis=1,
        ),
        "state": communication_state(expected),
    }
    assert int(ours["t"]) == expected.t
    np.testing.assert_array_equal(ours["bytes_sent"], expected.bytes_sent)  # what the communicators sent
    for name, value in reference.items():
        if exact:
            assert ours[name].tobytes() == value.tobytes(), name
        else:
            np.testing.assert_allclose(ours[name], value, rtol=1e-8, atol=1e-12, err_msg=name)
    mean = expected.mean_model()
    # x̄ summed over the ranks in float64, in another order than torch's mean: within rounding
    np.testing.assert_allclose(
        ours["mean"], torch.nn.utils.parameters_to_vector(mean.parameters()).detach().numpy(), rtol=1e-8, atol=1e-14
    )
    np.testing.assert_allclose(ours["distance"], expected.consensus_distance(), rtol=1e-8)


@pytest.mark.parametrize("order", ["awc", "atc"])
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_ranks_match_the_in_process_trainer(topology, order):
    """Every topology and order: AWC with an adaptive γ, ATC with a fixed one; a token-budget
    learning rate, two classes of hyper-parameters, a frozen parameter, whole-model clipping.
    Bit for bit where the operations are the same (complete averaging sums in another order)."""
    result = MATCH[topology, order].run("torch")
    assert result.returncode == 0, result.stdout + result.stderr
    expected = simulate(3, topology, order, 3, adaptive=order == "awc")
    assert_matches(result.out, expected, exact=topology != "complete")


@pytest.mark.parametrize("topology", ["one_peer_exponential", "complete"])
def test_four_ranks_match_the_in_process_trainer(topology):
    result = FOUR[topology].run("torch")
    assert result.returncode == 0, result.stdout + result.stderr
    assert_matches(result.out, simulate(4, topology, "awc", 3, adaptive=True), exact=topology != "complete")


def test_buffers_start_from_rank_0_and_stay_each_ranks_own():
    """BatchNorm's running statistics: broadcast from rank 0, then updated by each rank's own
    batches, never mixed. (vmap's batch-norm rule sums in another order over N workers than over
    one: within rounding.)"""
    result = BATCH_NORM.run("torch")
    assert result.returncode == 0, result.stdout + result.stderr
    expected = simulate(3, "ring", "awc", 3, batch_norm=True)
    assert_matches(result.out, expected, exact=False)
    mean_buffers = np.concatenate([b.reshape(-1).numpy().astype(np.float64) for b in expected.mean_model().buffers()])
    np.testing.assert_allclose(found(result.out)["mean_buffers"], mean_buffers, rtol=1e-8)


def test_one_rank_is_the_in_process_trainer_with_one_worker():
    result = ONE_RANK.run("torch")
    assert result.returncode == 0, result.stdout + result.stderr
    assert_matches(result.out, simulate(1, "one_peer_exponential", "awc", 3, adaptive=True), exact=True)


def test_a_non_finite_loss_on_one_rank_stops_every_rank_with_nothing_written():
    result = POISON.run("torch")
    assert result.returncode != 0
    for rank in range(3):
        assert (
            f"rank {rank}: NonFiniteGradientError: non-finite loss on worker(s) [1] at step 1; nothing was updated "
            "(params unchanged: True)" in result.stdout
        ), result.stdout + result.stderr


def test_a_bad_batch_on_one_rank_raises_there_and_stops_the_others():
    result = BAD_BATCH.run("torch")
    assert result.returncode != 0
    assert "rank 2: ValueError: Expected input batch_size (6) to match target batch_size (5)" in result.stdout, (
        result.stdout + result.stderr
    )
    for rank in (0, 1):
        assert f"rank {rank}: RankError: step 1 failed on rank(s) [2]" in result.stdout
    assert result.stdout.count("(params unchanged: True)") == 3


@pytest.mark.parametrize(
    ("option", "named"), [("--odd-max-norm", "max_norm: rank 0 0.5, rank 1 0.6"), ("--odd-model", "parameters:")]
)
def test_ranks_with_other_settings_or_modules_are_refused_on_every_rank(option, named):
    result = ODD[option].run("torch")
    assert result.returncode != 0
    for rank in range(3):
        line = next(line for line in result.stdout.splitlines() if line.startswith(f"rank {rank}:"))
        assert "every rank must run with the same settings" in line and named in line, result.stdout


@pytest.mark.parametrize("topology, order, what", list(COMMUNICATION))
def test_compressed_gossip_and_outer_steps_over_ranks_match_the_in_process_trainer(topology, order, what):
    """CHOCO int8 (adaptive γ for AWC) and DiLoCo every 2 steps with top-k pseudo-gradients, for
    every class of parameters: parameters, moments, public copies or outer state and bytes sent
    equal the in-process trainer's, bit for bit (DiLoCo over complete averaging, compressed:
    payloads to all, summed in the in-process order)."""
    result = COMMUNICATION[topology, order, what].run("torch")
    assert result.returncode == 0, result.stdout + result.stderr
    expected = simulate(3, topology, order, 4, adaptive=order == "awc", communication=what)
    assert found(result.out)["state"].size > 0
    assert_matches(result.out, expected, exact=True)


@pytest.mark.parametrize("what", list(COMMUNICATION_RESUMED))
def test_compressed_gossip_and_outer_steps_over_ranks_resume_bit_for_bit(what):
    result = COMMUNICATION_RESUMED[what].run("torch")
    assert result.returncode == 0, result.stdout + result.stderr
    assert_matches(result.out, simulate(3, "ring", "awc", 4, communication=what), exact=True)


def test_save_and_load_per_rank_resume_bit_for_bit():
    """Saved at step 1, loaded into trainers built from other weights: the run of 3 steps."""
    result = RESUME.run("torch")
    assert result.returncode == 0, result.stdout + result.stderr
    names = sorted(path.name for path in result.out.glob("checkpoint*"))
    assert names == [f"checkpoint.rank{r}.npz" for r in range(3)]
    assert_matches(result.out, simulate(3, "one_peer_exponential", "awc", 3, adaptive=True), exact=True)


def in_process(size: int, topology: str = "one_peer_exponential") -> DecentralizedTrainer:
    module = model(0)
    return DecentralizedTrainer(module, size, **options(module, topology, "awc", size, adaptive=True))


def step(trainer: DecentralizedTrainer, t: int) -> None:
    inputs, targets = zip(*(batch(rank, t) for rank in range(trainer.workers)))
    trainer.step(torch.stack(inputs), torch.stack(targets))


def test_a_run_moves_from_ranks_to_one_process_and_back(tmp_path):
    """2 steps on 3 ranks, joined into the in-process trainer's file; 1 step there, split again;
    2 more steps on 3 ranks: where 5 steps of the in-process trainer end, bit for bit."""
    two_steps = ("--topology", "one_peer_exponential", "--adaptive", "--steps", "2")
    result = launch(3, tmp_path, *two_steps, "--save-at-end", str(tmp_path / "ranks"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert join_trainer_checkpoint(tmp_path / "ranks", tmp_path / "joined.npz") == tmp_path / "joined.npz"
    here = in_process(3)
    assert here.load(tmp_path / "joined.npz") == {}
    assert here.t == 2
    step(here, 2)
    here.save(tmp_path / "here.npz", extra={"moved": True})
    paths = split_trainer_checkpoint(tmp_path / "here.npz", tmp_path / "split")
    assert paths == [tmp_path / f"split.rank{rank}.npz" for rank in range(3)]
    result = launch(3, tmp_path, *two_steps, "--resume-from", str(tmp_path / "split"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert_matches(tmp_path, simulate(3, "one_peer_exponential", "awc", 5, adaptive=True), exact=True)


def test_each_kind_of_file_is_refused_where_the_other_is_expected(tmp_path):
    whole = in_process(3)
    step(whole, 0)
    whole.save(tmp_path / "whole.npz")
    split_trainer_checkpoint(tmp_path / "whole.npz", tmp_path / "run")
    with pytest.raises(ValueError, match="is rank 0's file of a run of 3 ranks: join the ranks' files"):
        in_process(3).load(tmp_path / "run.rank0.npz")
    with pytest.raises(ValueError, match="not the checkpoint of an in-process DecentralizedTrainer"):
        split_trainer_checkpoint(tmp_path / "run.rank0.npz", tmp_path / "again")
    (tmp_path / "single.rank0.npz").write_bytes((tmp_path / "whole.npz").read_bytes())
    with pytest.raises(ValueError, match="not a rank's checkpoint"):
        join_trainer_checkpoint(tmp_path / "single", tmp_path / "joined.npz")
    (tmp_path / "run.rank2.npz").write_bytes((tmp_path / "run.rank1.npz").read_bytes())  # rank 1's file twice
    with pytest.raises(ValueError, match="not one save of a DistributedTrainer's ranks"):
        join_trainer_checkpoint(tmp_path / "run", tmp_path / "joined.npz")
    assert not (tmp_path / "joined.npz").exists()


def test_a_rank_refuses_the_in_process_trainers_file_and_says_what_to_do(tmp_path):
    in_process(2).save(tmp_path / "whole.rank0.npz")
    code = f"""
import os, socket
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(probe.getsockname()[1]))
import torch.distributed as dist
dist.init_process_group("gloo")
from steadystep.torch.distributed import DistributedTrainer
from tests.trainer_worker import model, options
module = model(0)
trainer = DistributedTrainer(module, **options(module, "one_peer_exponential", "awc", 1, True))
try:
    trainer.load({str(tmp_path / "whole")!r})
except ValueError as error:
    print(error)
print(trainer.t)
dist.destroy_process_group()
"""
    result = run_python(code)
    assert "is the checkpoint of an in-process trainer of 2 workers: split it into files per rank" in result.stdout, (
        result.stdout + result.stderr
    )
    assert result.stdout.splitlines()[-1] == "0"


def test_without_a_process_group_the_trainer_says_what_to_call():
    code = """
import torch
from steadystep import decentral
from steadystep.torch.distributed import DistributedTrainer
try:
    DistributedTrainer(torch.nn.Linear(2, 2), topology=decentral.ring())
except RuntimeError as error:
    print(error)
"""
    result = run_python(code)
    assert "torch.distributed is not initialised: call torch.distributed.init_process_group('gloo')" in result.stdout


def test_cuda_target_on_the_simulator_matches_the_in_process_trainer():
    """target='cuda': the kernels of the CUDA target (Numba's simulator) step every rank."""
    result = CUDA.run("torch")
    assert result.returncode == 0, result.stdout + result.stderr
    assert_matches(result.out, simulate(3, "sparse", "awc", 3), exact=False)


@pytest.mark.parametrize("what", list(CUDA_COMMUNICATION))
def test_compressed_gossip_and_outer_steps_on_the_simulator_match_the_in_process_trainer(what):
    """The ranks' public copies and outer state where the rows live: the CUDA target's kernels."""
    result = CUDA_COMMUNICATION[what].run("torch")
    assert result.returncode == 0, result.stdout + result.stderr
    assert_matches(result.out, simulate(3, "ring", "awc", 2, communication=what), exact=False)


def test_the_language_model_demo_with_one_worker_per_rank_matches_the_local_demo(tmp_path):
    """`torchrun --nproc-per-node 4 -m steadystep demo --task lm --backend torch`: rank 0 writes
    the report, with the in-process run's numbers: every one bit for bit for a one-peer
    topology (the curves, the final bits per byte, the curvature diagnostics, the sample);
    within float32 rounding for complete averaging (summed in another order)."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("rich")
    from steadystep import demo
    from tests.test_demo_lm import SMALL

    job = [*SMALL, "--topology", "one-peer-exp,complete", "--device", "cpu"]
    # the local run first: the kernels it compiles are the ones the ranks then load from the cache.
    # On one torch thread, as each rank (OMP_NUM_THREADS=1): a matmul's sums may be split by threads
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert demo.main([*job, "--output-dir", str(tmp_path / "local")]) == 0
    finally:
        torch.set_num_threads(threads)
    environment = rank_environment()
    command = [*launcher("torch", 4), "-m", "steadystep", "demo", *job, "--backend", "torch"]
    result = subprocess.run(
        [*command, "--output-dir", str(tmp_path / "ranks")],
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("wrote") == 1  # only rank 0 reports
    ours, local = (json.loads((tmp_path / name / "report.json").read_text()) for name in ("ranks", "local"))
    assert (ours["settings"]["backend"], ours["settings"]["workers"]) == ("torch", 4)
    one_peer, complete = ours["runs"]
    assert one_peer["topology"] == "one-peer-exp" and complete["topology"] == "complete"
    for name in ("curves", "final", "diagnostics", "sample"):
        assert one_peer[name] == local["runs"][0][name], name
    for name, values in complete["curves"].items():
        np.testing.assert_allclose(values, local["runs"][1]["curves"][name], rtol=1e-5, err_msg=name)
    assert math.isclose(
        complete["final"]["validation_bits_per_byte"],
        local["runs"][1]["final"]["validation_bits_per_byte"],
        rel_tol=1e-5,
    )


def test_the_gpu_checks_nccl_script_passes_its_dry_run_over_gloo(tmp_path):
    """ci/nccl_check.py (run by ci/gpu_check.sh on a GPU, over NCCL) with --cpu: the same checks
    on host rows over gloo, so that the script a GPU machine runs has run here."""
    environment = rank_environment()
    command = [*launcher("torch", 1), str(ROOT / "ci" / "nccl_check.py"), "--cpu"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAILED" not in result.stdout and "nccl_check: all passed on cpu" in result.stdout


def test_a_compressed_trainers_run_is_not_split_into_ranks_yet(tmp_path):
    module = model(0)
    trainer = DecentralizedTrainer(module, 3, **options(module, "ring", "atc", 3, adaptive=False, communication="int8"))
    trainer.save(tmp_path / "here.npz")
    with pytest.raises(ValueError, match="cannot move between one process and ranks yet"):
        split_trainer_checkpoint(tmp_path / "here.npz", tmp_path / "split")
