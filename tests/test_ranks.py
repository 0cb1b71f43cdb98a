"""A run's checkpoint moves between one process and one worker per rank (steadystep.ranks)."""

import numpy as np
import pytest

from steadystep import decentral, ranks
from tests.conftest import SIMULATOR

pytestmark = pytest.mark.skipif(SIMULATOR, reason="checkpoint files: the CPU target")


def _run(topology: decentral.Topology, steps: int, width: int = 23) -> decentral.DecentralizedAdamW:
    rng = np.random.default_rng(5)
    workers = decentral.DecentralizedAdamW(
        rng.normal(size=(4, width)),
        topology=topology,
        order="atc",
        lr=0.03,
        betas=(0.8, 0.99),
        eps=1e-7,
        weight_decay=0.1,
        max_norm=2.0,
        decay_mask=rng.integers(0, 2, width),
        consensus=0.7,
    )
    for _ in range(steps):
        workers.step(rng.normal(size=(4, width)))
    workers.extra = {"epoch": 3}
    return workers


def test_split_then_joined_is_the_same_optimizer_and_continues_bit_for_bit(tmp_path):
    original = _run(decentral.one_peer_exponential(), 3)
    paths = ranks.split_checkpoint(original, tmp_path / "run")
    assert [path.name for path in paths] == [f"run.rank{rank}.npz" for rank in range(4)]
    rank_file = decentral.DecentralizedAdamW.load(paths[2])  # what a rank's worker resumes from
    assert rank_file.extra == {
        "world_size": 4,
        "topology": "one_peer_exponential",
        "order": "atc",
        "consensus": 0.7,
        "epoch": 3,
    }
    assert rank_file.params.tobytes() == original.params[2:3].tobytes() and rank_file.t == 3
    joined = ranks.join_checkpoint(tmp_path / "run")
    assert repr(joined) == repr(original) and joined.extra == {"epoch": 3}
    grads = np.random.default_rng(9).normal(size=original.params.shape)
    for workers in (original, joined):
        workers.step(grads)
    for name in ("params", "exp_avg", "exp_avg_sq", "decay"):
        assert getattr(joined, name).tobytes() == getattr(original, name).tobytes(), name


def test_joining_asks_for_a_topology_saved_by_name_only_and_refuses_files_of_two_saves(tmp_path):
    weights = lambda t: np.full((4, 4), 0.25)  # noqa: E731 - a topology that is a function of t
    ranks.split_checkpoint(_run(decentral.from_matrix(weights, "uniform"), 1), tmp_path / "run")
    with pytest.raises(ValueError, match="the run used the topology 'uniform'; pass it as topology="):
        ranks.join_checkpoint(tmp_path / "run")
    assert ranks.join_checkpoint(tmp_path / "run", topology=decentral.from_matrix(weights, "uniform")).t == 1
    ranks.split_checkpoint(_run(decentral.ring(), 2), tmp_path / "other")
    (tmp_path / "other.rank1.npz").write_bytes((tmp_path / "run.rank1.npz").read_bytes())
    with pytest.raises(ValueError, match="are not of one save"):
        ranks.join_checkpoint(tmp_path / "other", topology=decentral.ring())
