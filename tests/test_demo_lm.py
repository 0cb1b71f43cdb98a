"""The language-model main job (demo --task lm) end to end, and its pieces against plain references."""

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")
pytest.importorskip("rich")

from steadystep import decentral, demo, lm  # noqa: E402
from steadystep.demo import lm as demo_lm  # noqa: E402
from steadystep.torch.decentral import DecentralizedTrainer  # noqa: E402
from tests.conftest import SIMULATOR  # noqa: E402

pytestmark = pytest.mark.skipif(SIMULATOR, reason="the demo's tests run on the CPU")

SMALL = [
    "--task",
    "lm",
    "--steps",
    "6",
    "--workers",
    "4",
    "--batch-size",
    "2",
    "--context",
    "16",
    "--width",
    "16",
    "--layers",
    "1",
    "--heads",
    "2",
    "--eval-every",
    "3",
    "--eval-windows",
    "8",
    "--validation-bytes",
    "4096",
    "--noise-samples",
    "3",
    "--probes",
    "2",
    "--sample-bytes",
    "12",
    "--no-progress",
]


# the tests that read small_run go to one xdist worker, which makes the run once for both
ONE_WORKER = pytest.mark.xdist_group("lm_small_run")


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("lm")
    assert demo.main([*SMALL, "--output-dir", str(directory)]) == 0
    return directory, json.loads((directory / "report.json").read_text())


@ONE_WORKER
def test_report_names_and_curves(small_run):
    directory, report = small_run
    assert report["task"] == "lm"
    assert [(run["topology"], run["order"]) for run in report["runs"]] == [("complete", "awc"), ("one-peer-exp", "awc")]
    corpus = lm.stdlib_corpus(0, 20)
    assert (
        report["data"]["validation_files"] == list(corpus.validation_files) and len(report["data"]["train_files"]) > 50
    )
    evaluated = lm.windows(corpus.validation[:4096], 16)[:, 1:]
    assert report["data"]["evaluated_validation_bytes"] == evaluated.size
    counts = np.bincount(evaluated.ravel(), minlength=256)
    frequencies = counts[counts > 0] / counts.sum()
    assert report["baseline"]["unigram_bits_per_byte"] == pytest.approx(
        -np.sum(frequencies * np.log2(frequencies)), rel=1e-12
    )
    for run in report["runs"]:
        curves, final = run["curves"], run["final"]
        assert curves["step"] == list(range(1, 7)) and curves["eval_step"] == [3, 6]
        assert curves["tokens"][-1] == 6 * 4 * 2 * 16
        assert 0 < final["validation_bits_per_byte"] < 9 and math.isfinite(final["consensus_distance"])
        assert final["ratio_to_unigram"] == pytest.approx(
            final["validation_bits_per_byte"] / report["baseline"]["unigram_bits_per_byte"]
        )
        assert curves["train_loss"][-1] < curves["train_loss"][0]  # learning from log2(256) = 8 bits
        assert run["sample"].startswith("def ") and len(run["diagnostics"]["noise"]["a"]["samples"]) == 3
        assert len(run["diagnostics"]["isotropic_reference"]["samples"]) == 2
    assert (directory / "validation.png").stat().st_size > 10_000 and (
        directory / "consensus.png"
    ).stat().st_size > 10_000


@ONE_WORKER
def test_the_complete_run_equals_the_same_loop_written_with_the_public_api(small_run):
    _, report = small_run
    settings = demo_lm.parse([*SMALL, "--device", "cpu"])
    corpus = lm.stdlib_corpus(0, 20)
    torch.manual_seed(0)
    model = lm.ByteTransformer(context=16, width=16, layers=1, heads=2)
    tokens = 4 * 2 * 16
    schedule = decentral.TokenSchedule(
        workers=4, batch=2, context=16, warmup_tokens=50 * tokens, total_tokens=6 * tokens, base_lr=8e-3
    )
    options = dict(topology=decentral.complete(), lr=schedule, weight_decay=0.1, max_norm=1.0)
    trainer = DecentralizedTrainer(model, 4, vmap=True, **options)  # vmapped, as the demo's (not "auto")
    for step in range(6):
        windows = torch.as_tensor(demo_lm.worker_batches(corpus.train, settings, step))
        trainer.step(windows[..., :-1], windows[..., 1:])
    bits = lm.bits_per_byte(trainer.mean_model(), lm.windows(corpus.validation[:4096], 16))
    assert report["runs"][0]["final"]["validation_bits_per_byte"] == bits
    assert report["runs"][0]["final"]["consensus_distance"] == trainer.consensus_distance()


def test_each_worker_reads_its_own_part_of_the_stream():
    settings = demo_lm.Settings(workers=4, batch_size=3, context=8)
    stream = np.arange(4000)  # every value its own position
    read = [[] for _ in range(4)]
    for step in range(5):
        windows = demo_lm.worker_batches(stream, settings, step)
        assert windows.shape == (4, 3, 9)
        for worker in range(4):
            for window in windows[worker]:
                assert np.array_equal(window, np.arange(window[0], window[0] + 9))
                assert 1000 * worker <= window[0] and window[-1] < 1000 * (worker + 1)  # its own shard
                read[worker].append(int(window[0]))
    for worker in range(4):  # window after window: each target predicted once
        assert read[worker] == [1000 * worker + 8 * k for k in range(15)]


def test_bits_per_byte_and_windows_against_plain_computations():
    torch.manual_seed(1)
    model = lm.ByteTransformer(context=8, width=16, layers=1, heads=2).double()
    stream = np.frombuffer(b"def f(x):\n    return x + 1\n" * 4, np.uint8)
    packed = lm.windows(stream, 8)
    assert packed.shape == ((len(stream) - 1) // 8, 9) and np.array_equal(packed[1], stream[8:17])
    logits = model(torch.as_tensor(packed[:, :-1])).detach().numpy()
    log_probabilities = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    chosen = np.take_along_axis(log_probabilities, packed[:, 1:, None], -1)
    assert lm.bits_per_byte(model, packed, batch=3) == pytest.approx(-chosen.mean() / math.log(2), rel=1e-12)
    assert lm.unigram_bits_per_byte(b"aaaa") == 0.0 and lm.unigram_bits_per_byte(bytes(range(256))) == 8.0
    with pytest.raises(ValueError, match="not one window of context \\+ 1 = 9"):
        lm.windows(stream[:8], 8)
    spread = lm.windows(stream, 8, count=3)
    assert len(spread) == 3 and np.array_equal(spread[0], packed[0]) and np.array_equal(spread[-1], packed[-1])


def test_the_transformer_is_causal():
    torch.manual_seed(0)
    model = lm.ByteTransformer(context=12, width=16, layers=2, heads=4).double()
    tokens = torch.randint(0, 256, (2, 12))
    changed = tokens.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 256
    before, after = model(tokens), model(changed)
    assert torch.equal(before[:, :7], after[:, :7]) and not torch.equal(before[:, 7:], after[:, 7:])


def test_bad_flags_fail_with_one_line(capsys):
    for flags, message in (
        (["--heads", "5"], "--heads 5 must divide --width 96"),
        (["--topology", "star"], "expected topologies among"),
        (["--warmup", "-1"], "--warmup must be non-negative"),
        (["--validation-bytes", "64"], "--validation-bytes 64 must exceed --context 64"),
    ):
        with pytest.raises(SystemExit) as raised:
            demo.main(["--task", "lm", *flags])
        assert raised.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(SystemExit) as raised:
        demo.main(["--task", "lm", "--help"])
    assert raised.value.code == 0 and "--context" in capsys.readouterr().out


def test_the_communication_comparison_reports_quality_against_bytes_sent(tmp_path, capsys):
    steps = ["--steps", "16", "--eval-every", "8"]
    flags = [flag for index, flag in enumerate(SMALL) if SMALL[index - 1] not in ("--steps", "--eval-every")]
    flags = [flag for flag in flags if flag not in ("--steps", "--eval-every")]
    assert demo.main([*flags, *steps, "--compare", "communication", "--output-dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    runs = {run["label"]: run for run in report["runs"]}
    assert list(runs) == list(demo_lm.COMMUNICATION)
    dense = runs["dense AWC"]["communication"]["bytes_per_worker"]
    payload = dense / 16  # one dense row to one peer a step
    assert runs["dense ring→ ATC"]["communication"]["bytes_per_worker"] == dense
    complete = 2 * (4 - 1) / 4  # a ring all-reduce of 4 workers: rows' worth per worker
    assert runs["complete ATC"]["communication"]["bytes_per_worker"] == pytest.approx(16 * complete * payload)
    # compressed gossip sends to every holder of a public copy: 2 of 4 workers over one-peer
    # exponential, 1 over the directed ring
    assert 1.75 < dense / runs["int8 ATC"]["communication"]["bytes_per_worker"] < 2
    assert 3.5 < dense / runs["int8 ring→ ATC"]["communication"]["bytes_per_worker"] < 4
    assert dense / runs["top-k 1% ring→"]["communication"]["bytes_per_worker"] > 10
    assert runs["avg every 4"]["communication"]["bytes_per_worker"] == pytest.approx(4 * complete * payload)
    assert runs["DiLoCo 16"]["communication"]["bytes_per_worker"] == pytest.approx(complete * payload)
    assert runs["DiLoCo 16 1-peer"]["communication"]["bytes_per_worker"] == pytest.approx(payload)
    for run in runs.values():
        assert run["diagnostics"] is None and 0 < run["final"]["validation_bits_per_byte"] < 9
        assert run["curves"]["bytes_per_worker"][-1] == run["communication"]["bytes_per_worker"]
        assert run["curves"]["train_loss"][-1] < run["curves"]["train_loss"][0]
    assert runs["int8 ATC"]["communication"]["compression"] == "int8"
    assert runs["DiLoCo 16"]["communication"]["outer"] == {"every": 16, "lr": 0.7, "momentum": 0.9}
    assert (tmp_path / "communication.png").stat().st_size > 10_000
    table = capsys.readouterr().out
    assert "fewer bytes" in table and "DiLoCo 16 1-peer" in table
    assert max(len(line) for line in table.splitlines()) <= 80


def test_the_outer_step_study_runs_each_setting_with_its_inner_lr(tmp_path):
    assert demo.main([*SMALL, "--compare", "outer", "--output-dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    runs = {run["label"]: run["communication"] for run in report["runs"]}
    assert list(runs) == list(demo_lm.OUTER)
    assert runs["complete, lr ½"]["lr"] == runs["complete ATC"]["lr"] / 2
    assert runs["H16 α1 μ.5"]["outer"] == {"every": 16, "lr": 1.0, "momentum": 0.5}
    assert (
        runs["avg 16, lr ½"]["outer"]["momentum"] == 0.0 and runs["avg 16, lr ½"]["lr"] == runs["complete, lr ½"]["lr"]
    )


def test_the_states_comparison_trains_with_float32_8bit_and_4bit_moments(tmp_path):
    assert demo.main([*SMALL, "--compare", "states", "--output-dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    runs = {run["label"]: run for run in report["runs"]}
    assert list(runs) == list(demo_lm.STATES)
    assert [run["communication"]["state_bits"] for run in runs.values()] == [32, 8, 4]
    first, *others = (runs[label]["final"]["validation_bits_per_byte"] for label in demo_lm.STATES)
    for other in others:  # another optimizer state, the same run
        assert first != other and abs(first - other) < 0.05 * first
