"""Checkpoints written by an earlier steadystep still load and continue bit for bit.

tests/data/checkpoints holds files written by commit 20ca9da (before steadystep.decentral
became a package) with tests/data/checkpoints/make.py: a flat run and a torch-module run saved
after two steps, and where each stood two steps later. Loaded today and stepped with the same
gradients and batches, each must reach those bits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from steadystep import decentral
from tests.conftest import SIMULATOR

pytestmark = pytest.mark.skipif(SIMULATOR, reason="host checkpoints")

DATA = Path(__file__).resolve().parent / "data" / "checkpoints"
WORKERS, WIDTH = 4, 9


def gradient(t: int) -> np.ndarray:
    return np.random.default_rng(100 + t).normal(size=(WORKERS, WIDTH))


def flat_run() -> decentral.DecentralizedAdamW:
    start = np.random.default_rng(0).normal(size=(WORKERS, WIDTH))
    mask = np.array([1, 1, 0, 1, 1, 1, 0, 1, 1], np.float64)
    return decentral.DecentralizedAdamW(
        start,
        topology=decentral.one_peer_exponential(),
        order="atc",
        lr=0.05,
        weight_decay=0.01,
        max_norm=1.0,
        decay_mask=mask,
        consensus=0.8,
    )


def module():
    import torch

    torch.manual_seed(0)
    layers = [torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Tanh(), torch.nn.Linear(4, 2)]
    return torch.nn.Sequential(*layers).double()


def trainer_run():
    from steadystep.torch.decentral import DecentralizedTrainer

    return DecentralizedTrainer(module(), 3, topology=decentral.ring(), lr=0.05, weight_decay=0.01, max_norm=1.0)


def batch(t: int):
    import torch

    generator = torch.Generator().manual_seed(200 + t)
    inputs = torch.randn(3, 5, 3, generator=generator, dtype=torch.float64)
    return inputs, torch.randint(0, 2, (3, 5), generator=generator)


def test_a_flat_checkpoint_of_an_earlier_release_continues_bit_for_bit():
    resumed = decentral.DecentralizedAdamW.load(DATA / "decentral_t2.npz")
    assert (resumed.t, resumed.order, resumed.consensus, resumed.topology.name) == (
        2,
        "atc",
        0.8,
        "one_peer_exponential",
    )
    assert resumed.extra == {"note": "saved by 20ca9da"}
    np.testing.assert_array_equal(resumed.arrays["seen"], np.arange(3.0))
    for t in range(2, 4):
        resumed.step(gradient(t))
    expected = np.load(DATA / "decentral_t4_expected.npz")
    for name in ("params", "exp_avg", "exp_avg_sq"):
        np.testing.assert_array_equal(getattr(resumed, name), expected[name], err_msg=name)


def test_the_flat_run_of_today_reaches_the_same_bits():
    """The file's bits are today's too: a fresh run of the same settings, stepped four times,
    ends where the resumed one does (so the test above compares like with like)."""
    run = flat_run()
    for t in range(4):
        run.step(gradient(t))
    expected = np.load(DATA / "decentral_t4_expected.npz")
    np.testing.assert_array_equal(run.params, expected["params"])


def test_a_torch_trainer_checkpoint_of_an_earlier_release_continues_bit_for_bit():
    pytest.importorskip("torch")
    resumed = trainer_run()
    assert resumed.load(DATA / "trainer_t2.npz") == {"note": "saved by 20ca9da"}
    assert resumed.t == 2
    for t in range(2, 4):
        resumed.step(*batch(t))
    expected = np.load(DATA / "trainer_t4_expected.npz")
    for index, rows in enumerate(resumed.rows):
        np.testing.assert_array_equal(rows.numpy(), expected[f"rows{index}"])
    for name, stacked in resumed.buffers.items():
        np.testing.assert_array_equal(stacked.numpy(), expected[f"buffer/{name}"], err_msg=name)
