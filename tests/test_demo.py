"""The main job end to end: report.json schema and values, plots, determinism, bad flags."""

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")
pytest.importorskip("rich")

import steadystep  # noqa: E402
from steadystep import decentral, demo, models  # noqa: E402
from steadystep.demo import cli, digits  # noqa: E402
from steadystep.demo.report import format_estimate  # noqa: E402
from tests.conftest import SIMULATOR  # noqa: E402

SMALL = [
    "--steps",
    "12",
    "--eval-every",
    "4",
    "--workers",
    "4",
    "--batch-size",
    "8",
    "--hidden",
    "8",
    "--noise-samples",
    "4",
    "--probes",
    "4",
    "--no-progress",
]


def run_demo(tmp_path, *flags, name="out"):
    directory = tmp_path / name
    assert demo.main([*SMALL, *flags, "--output-dir", str(directory)]) == 0
    return directory, json.loads((directory / "report.json").read_text())


# the tests that read full_run go to one xdist worker, which makes the run once for all of them
ONE_WORKER = pytest.mark.xdist_group("demo_full_run")


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    if SIMULATOR:
        pytest.skip("CPU run; the simulator test below runs its own")
    return run_demo(tmp_path_factory.mktemp("demo"), "--device", "cpu")


@ONE_WORKER
def test_report_has_every_configuration_with_consistent_curves(full_run):
    _, report = full_run
    assert [(run["topology"], run["order"]) for run in report["runs"]] == [
        (topology, order) for topology in ("complete", "one-peer-exp", "ring") for order in ("awc", "atc")
    ]
    assert report["settings"]["steps"] == 12 and report["model"]["parameters"] == 64 * 8 + 8 + 8 * 10 + 10
    assert set(report["versions"]) >= {"steadystep", "numpy", "numba", "python", "scikit-learn"}
    assert report["device"].startswith("cpu")
    assert report["data"] == {"name": "scikit-learn digits", "train_samples": 1437, "test_samples": 360}
    for run in report["runs"]:
        curves, final = run["curves"], run["final"]
        assert curves["step"] == list(range(1, 13)) and curves["eval_step"] == [4, 8, 12]
        assert len(curves["train_loss"]) == 12 and len(curves["consensus_distance"]) == 12
        assert final["test_accuracy"] == curves["test_accuracy"][-1]
        assert final["train_loss"] == curves["mean_model_train_loss"][-1]
        assert curves["train_loss"][-1] < curves["train_loss"][0] < 3.0  # learning from about ln 10
        assert 0.0 <= final["test_accuracy"] <= 1.0 and len(final["worker_test_accuracy"]) == 4
        diagnostics = run["diagnostics"]
        assert (
            len(diagnostics["noise"]["a"]["samples"]) == 4 and len(diagnostics["isotropic_reference"]["samples"]) == 4
        )
        kappa = diagnostics["noise"]["a_norm"]["value"] / diagnostics["isotropic_reference"]["value"]
        assert diagnostics["kappa"]["value"] == pytest.approx(kappa, rel=1e-12)
    complete_atc = report["runs"][1]
    assert complete_atc["curves"]["consensus_distance"] == [0.0] * 12  # mixing last with W = 11ᵀ/N: identical workers
    assert complete_atc["diagnostics"]["consensus"]["a_norm"]["value"] is None


@ONE_WORKER
def test_curves_equal_the_same_loop_written_with_the_public_api(full_run, tmp_path):
    """An independent re-run of one configuration: model + DecentralizedAdamW by hand."""
    _, report = full_run
    settings = demo.parse([*SMALL, "--device", "cpu", "--output-dir", str(tmp_path)])
    data = demo.load_digits(0, np.float32)
    model = models.mlp(64, 8, 10)
    batches = demo.minibatches(settings, len(data.train_labels))
    workers = decentral.DecentralizedAdamW(
        model.init(4, seed=0),
        topology=decentral.ring(),
        order="atc",
        lr=2e-2,
        weight_decay=1e-4,
        max_norm=1.0,
        decay_mask=model.decay_mask(),
    )
    losses = []
    for step in range(12):
        loss, grads = model.loss_and_grad(workers.params, data.train_features, data.train_labels, batches[step])
        workers.step(grads, lr=demo.learning_rate(settings, step))
        losses.append(float(np.mean(loss)))
    ring_atc = report["runs"][5]
    assert ring_atc["curves"]["train_loss"] == losses
    evaluation = model.evaluate(
        decentral.mean_model(workers.params).astype(np.float32)[None], data.test_features, data.test_labels
    )
    assert ring_atc["final"]["test_accuracy"] == float(evaluation.accuracy[0])
    assert ring_atc["final"]["consensus_distance"] == decentral.consensus_distance(workers.params)


@pytest.mark.parametrize("bits", [8, 4])
def test_state_bits_gives_the_workers_quantized_moments(bits, tmp_path):
    """--state-bits 8 or 4 reaches DecentralizedAdamW (whose quantized step tests/test_quantization.py checks)."""
    settings = demo.parse([*SMALL, "--state-bits", str(bits), "--device", "cpu", "--output-dir", str(tmp_path)])
    model = models.mlp(64, 8, 10)
    workers = digits.LocalWorkers(model.init(4, seed=0), settings, "ring", "awc", model.decay_mask())
    assert settings.state_bits == bits and workers.optimizer.state_bits == bits
    assert workers.optimizer.exp_avg.codes.dtype == np.uint8 and workers.optimizer.exp_avg.bits == bits


@ONE_WORKER
def test_plots_are_real_pictures(full_run):
    from matplotlib.image import imread

    directory, _ = full_run
    for name in ("curves.png", "consensus.png", "alignment.png", "spectrum.png"):
        pixels = imread(directory / name)
        assert pixels.ndim == 3 and pixels.shape[0] > 300 and pixels.shape[1] > 500
        colours = np.unique(pixels.reshape(-1, pixels.shape[2]).round(2), axis=0)
        assert len(colours) > 20  # lines, bars and text, not a blank canvas


@ONE_WORKER
def test_every_number_of_the_tables_shows_whole_in_an_80_column_terminal(full_run):
    """One table of ten columns was cut to '0.15…' at 80 columns (and some columns at 120)."""
    from rich.console import Console

    _, report = full_run
    for width in (80, 120):
        console = Console(width=width, record=True, color_system=None)
        console.print(demo.summary_table(report["runs"]))
        text = console.export_text()
        assert "…" not in text and max(map(len, text.splitlines())) <= width
        for run in report["runs"]:
            found = run["diagnostics"]
            for estimate in (
                found["noise"]["a"],
                found["noise"]["a_norm"],
                found["isotropic_reference"],
                found["kappa"],
            ):
                assert format_estimate(estimate) in text
            assert f"{run['final']['train_loss']:.4f}" in text and f"{run['final']['consensus_distance']:.2g}" in text


@pytest.mark.parametrize(
    "value, error, shown",
    [
        (0.00222, 0.0007, "0.0022±0.0007"),
        (60.8, 12.0, "61±10"),
        (37.9, 7.0, "38±7"),
        (0.146, 0.0096, "0.146±0.010"),
        (-0.5, 0.03, "-0.50±0.03"),
        (2.0, None, "2"),
        (None, None, "—"),
        (3e-9, 1e-10, "3e-09±1e-10"),
    ],
)
def test_an_estimate_shows_its_value_to_the_place_of_its_error(value, error, shown):
    assert format_estimate({"value": value, "standard_error": error}) == shown


@ONE_WORKER
def test_the_consensus_plot_spans_the_values_that_occur_and_tells_every_line_apart(full_run):
    """Complete averaging's exact 0 was clamped to 1e-30, squeezing every other line into the top
    quarter; AWC and ATC of one topology could hide each other; the axis had no label."""
    import matplotlib

    matplotlib.use("Agg")
    _, report = full_run
    figure = demo.consensus_figure(report["runs"])
    axes = figure.axes[0]
    positive = [v for run in report["runs"] for v in run["curves"]["consensus_distance"] if v > 0]
    low, high = axes.get_ylim()
    assert min(positive) / 10 <= low <= min(positive) and max(positive) <= high <= max(positive) * 10
    assert axes.get_ylabel()
    styles = {(line.get_color(), line.get_linestyle()) for line in axes.get_lines()}
    assert len(styles) == len(report["runs"])  # no two lines drawn alike
    assert any("exactly 0" in text.get_text() for text in axes.get_legend().get_texts())  # complete ATC


def test_the_mpi_backend_with_one_rank_warns_and_a_contradicting_worker_count_is_refused(capsys):
    pytest.importorskip("mpi4py")
    rank, settings = cli.start_backend(demo.Settings(backend="mpi", device="cpu", workers=8), [])
    assert (rank, settings.workers) == (0, 1)
    assert "--backend mpi with one MPI rank" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.start_backend(demo.Settings(backend="mpi", device="cpu", workers=8), ["--workers", "8"])
    assert "--workers 8 but mpiexec started 1 ranks" in capsys.readouterr().err


@ONE_WORKER
def test_same_seed_gives_an_identical_report(full_run, tmp_path):
    _, report = full_run
    _, again = run_demo(tmp_path, "--device", "cpu")
    assert again["settings"].pop("output_dir") != report["settings"]["output_dir"]
    assert again == {
        **report,
        "settings": {name: value for name, value in report["settings"].items() if name != "output_dir"},
    }


@ONE_WORKER
def test_another_seed_gives_another_run(full_run, tmp_path):
    _, report = full_run
    _, other = run_demo(tmp_path, "--device", "cpu", "--seed", "1", "--topology", "ring", "--order", "awc")
    assert other["runs"][0]["curves"]["train_loss"] != report["runs"][4]["curves"]["train_loss"]


def test_default_configuration_reaches_the_accuracy_target(tmp_path):
    """The defaults' headline (one-peer exponential, AWC) must reach ≥ 93% for the mean model."""
    if SIMULATOR:
        pytest.skip("CPU run")
    directory = tmp_path / "default"
    assert (
        demo.main(
            [
                "--topology",
                "one-peer-exp",
                "--order",
                "awc",
                "--device",
                "cpu",
                "--no-progress",
                "--output-dir",
                str(directory),
            ]
        )
        == 0
    )
    report = json.loads((directory / "report.json").read_text())
    assert report["settings"]["steps"] == 200 and report["settings"]["workers"] == 8
    assert report["runs"][0]["final"]["test_accuracy"] >= 0.93


def test_digits_equal_scikit_learns_loader_with_or_without_its_file(monkeypatch):
    """The CSV in scikit-learn's wheel gives what scikit-learn's loader gives; where the file
    cannot be found, the loader itself is used."""
    from sklearn.datasets import load_digits

    expected_features, expected_labels = load_digits(return_X_y=True)
    for spec_found in (True, False):
        if not spec_found:
            monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None)
        features, labels = digits._digits()
        np.testing.assert_array_equal(features, expected_features)
        np.testing.assert_array_equal(labels, expected_labels)
        assert features.dtype == np.float64 and labels.dtype == np.int64


@pytest.mark.slow  # starts processes of its own
def test_digits_import_stays_out_of_the_demo():
    """Reading the digits must not import scikit-learn (its import cost ~1.4 s per run)."""
    code = "import sys; from steadystep import demo; demo.load_digits(0, 'float32'); print('sklearn' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=300), st.floats(0.05, 0.95), st.integers(0, 2**32 - 1))
def test_stratified_split_takes_each_class_its_share(labels, fraction, seed):
    labels = np.array(labels)
    train, test = demo.stratified_split(labels, fraction, np.random.default_rng(seed))
    assert len(test) == math.ceil(fraction * len(labels))
    assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(len(labels)))
    assert np.all(np.diff(train) > 0) and np.all(np.diff(test) > 0)
    for label in np.unique(labels):
        share = np.count_nonzero(labels == label) * len(test) / len(labels)
        assert math.floor(share) <= np.count_nonzero(labels[test] == label) <= math.floor(share) + 1
    again = demo.stratified_split(labels, fraction, np.random.default_rng(seed))
    assert all(np.array_equal(a, b) for a, b in zip((train, test), again))


def test_features_are_standardised_like_scikit_learns_scaler():
    from sklearn.preprocessing import StandardScaler

    data = demo.load_digits(3, np.float64)
    features, labels = digits._digits()
    train, test = demo.stratified_split(labels, 0.2, np.random.default_rng(3))
    scaler = StandardScaler().fit(features[train])
    np.testing.assert_allclose(data.train_features, scaler.transform(features[train]), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(data.test_features, scaler.transform(features[test]), rtol=1e-12, atol=1e-12)
    assert np.array_equal(data.train_labels, labels[train]) and np.array_equal(data.test_labels, labels[test])
    assert np.bincount(data.test_labels).min() >= 35  # 360 test images, 10 classes of 174–183


BAD_FLAGS = [
    (["--topology", "star"], "--topology: invalid choice: 'star'"),
    (["--workers", "0"], "--workers: must be at least 1"),
    (["--steps", "0"], "--steps: must be at least 1"),
    (["--steps", "-3"], "--steps: must be at least 1"),
    (["--lr", "nan"], "--lr: must be a positive finite number"),
    (["--samples", "10"], "--samples must be at least 50"),
    (
        ["--samples", "50", "--workers", "64", "--output-dir", "{tmp}"],
        "--workers 64 is more than the 40 training samples",
    ),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["--state-bits", "2"], "--state-bits: invalid choice: 2"),
    (["--state-bits", "8", "--dtype", "float64"], "--state-bits 8 runs in one process with float32 parameters"),
]


@pytest.mark.parametrize("flags, message", BAD_FLAGS, ids=[" ".join(flags) for flags, _ in BAD_FLAGS])
def test_bad_flags_exit_2_with_one_line(flags, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as raised:
        demo.main([flag.format(tmp=tmp_path) for flag in flags])
    assert raised.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and message in error and error.startswith("steadystep demo: error:")


def test_a_batch_larger_than_the_training_set_is_drawn_with_replacement(tmp_path):
    """--batch-size above the 48 training samples of --samples 60: the training batches and the
    diagnostics' noise batches draw with replacement (the noise ones used to raise)."""
    _, report = run_demo(
        tmp_path,
        "--device",
        "cpu",
        "--samples",
        "60",
        "--batch-size",
        "64",
        "--steps",
        "2",
        "--topology",
        "ring",
        "--order",
        "awc",
    )
    assert report["settings"]["batch_size"] == 64
    noise = report["runs"][0]["diagnostics"]["noise"]
    assert len(noise["a"]["samples"]) == 4 and noise["a_norm"]["value"] > 0  # draws differ from the full gradient


def test_unwritable_output_directory_exits_2_before_training(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as raised:
        demo.main([*SMALL, "--output-dir", str(blocker / "inside"), "--device", "cpu"])
    assert raised.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--output-dir" in error and "not writable" in error


@pytest.mark.slow  # starts processes of its own
def test_command_line_entry_points_without_traceback(tmp_path):
    """`python -m steadystep demo`: real processes, real exit codes, no traceback."""
    if SIMULATOR:
        pytest.skip("CPU run")
    bad = subprocess.run([sys.executable, "-m", "steadystep", "demo", "--workers", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and bad.stderr.count("\n") == 1
    help_text = subprocess.run([sys.executable, "-m", "steadystep", "demo", "--help"], capture_output=True, text=True)
    assert help_text.returncode == 0
    for flag in (
        "--workers",
        "--topology",
        "--order",
        "--steps",
        "--batch-size",
        "--lr",
        "--schedule",
        "--max-norm",
        "--device",
        "--seed",
        "--output-dir",
        "--backend",
    ):
        assert flag in help_text.stdout
    version = subprocess.run([sys.executable, "-m", "steadystep", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith(f"steadystep {steadystep.__version__} (numba ")
    unknown = subprocess.run([sys.executable, "-m", "steadystep", "frobnicate"], capture_output=True, text=True)
    assert unknown.returncode == 2 and "unknown command" in unknown.stderr
    catalog_help = subprocess.run(
        [sys.executable, "-m", "steadystep", "catalog", "--help"], capture_output=True, text=True
    )
    assert catalog_help.returncode == 0 and catalog_help.stdout.startswith("usage: steadystep [catalog")
    script = shutil.which("steadystep", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if script is None:
        pytest.skip("the steadystep console script is not installed (pip install -e .)")
    assert subprocess.run([script, "demo", "--steps", "0"], capture_output=True, text=True).returncode == 2


def test_cuda_device_without_a_gpu_is_one_line(capsys):
    if SIMULATOR:
        pytest.skip("the simulator counts as a GPU")
    from numba import cuda

    if cuda.is_available():
        pytest.skip("a real GPU is present")
    with pytest.raises(SystemExit) as raised:
        demo.main(["--device", "cuda"])
    assert raised.value.code == 2 and capsys.readouterr().err.startswith("steadystep demo: error: --device cuda")


@pytest.mark.skipif(SIMULATOR, reason="the simulator counts as a GPU")
@pytest.mark.parametrize("driver", [None, "libcuda.so.1"])
def test_auto_device_imports_cuda_support_only_where_a_driver_is(driver, monkeypatch):
    import ctypes.util

    from steadystep.cuda import runtime

    asked = []

    class NoGpu:
        @staticmethod
        def is_available():
            return False

    monkeypatch.delenv("NUMBA_CUDA_DRIVER", raising=False)
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: driver)
    monkeypatch.setattr(runtime, "require_cuda", lambda: asked.append(True) or NoGpu)
    assert cli.chosen_device("auto") == "cpu"
    assert asked == ([True] if driver else [])


def test_the_demo_runs_on_the_cuda_target(target, tmp_path, monkeypatch):
    """--device cuda end to end: data and batches on the device, the same numbers as the CPU,
    the curvature diagnostics included (on a short spectrum: each simulated H·v takes ~0.4 s)."""
    if target != "cuda":
        pytest.skip("the CUDA run needs the CUDA target")
    monkeypatch.setattr(digits, "SPECTRUM_PROBES", 1)
    monkeypatch.setattr(digits, "SPECTRUM_STEPS", 6)
    tiny = [
        "--workers",
        "2",
        "--batch-size",
        "4",
        "--steps",
        "2",
        "--hidden",
        "2",
        "--probes",
        "2",
        "--noise-samples",
        "2",
        "--eval-every",
        "1",
        "--topology",
        "ring",
        "--order",
        "awc",
        "--samples",
        "60",
        "--no-progress",
        "--dtype",
        "float64",
        "--eigenvalues",
        "1",
    ]
    assert demo.main([*tiny, "--device", "cuda", "--output-dir", str(tmp_path / "gpu")]) == 0
    assert demo.main([*tiny, "--device", "cpu", "--output-dir", str(tmp_path / "cpu")]) == 0
    gpu = json.loads((tmp_path / "gpu" / "report.json").read_text())
    cpu = json.loads((tmp_path / "cpu" / "report.json").read_text())
    assert gpu["device"].startswith("cuda")
    np.testing.assert_allclose(
        gpu["runs"][0]["curves"]["train_loss"], cpu["runs"][0]["curves"]["train_loss"], rtol=1e-12
    )
    assert gpu["runs"][0]["final"]["test_accuracy"] == cpu["runs"][0]["final"]["test_accuracy"]
    on_gpu, on_cpu = _leaves(gpu["runs"][0]["diagnostics"]), _leaves(cpu["runs"][0]["diagnostics"])
    assert on_gpu.keys() == on_cpu.keys() and "top_eigenpairs.values" in on_gpu and "spectral_density.nodes" in on_gpu
    for name, value in on_gpu.items():  # every diagnostic number, the eigenvalues and the spectrum included
        np.testing.assert_allclose(value, on_cpu[name], rtol=1e-9, atol=1e-12, err_msg=name)


def _leaves(report: dict, prefix: str = "") -> dict:
    """A report's numbers (and lists of numbers) by dotted name."""
    found = {}
    for name, value in report.items():
        if isinstance(value, dict):
            found.update(_leaves(value, f"{prefix}{name}."))
        elif isinstance(value, (int, float, list)) and not isinstance(value, bool):
            found[prefix + name] = value
    return found


def test_both_jobs_train_each_configuration_and_stop_at_a_divergence_saying_so():
    """cli.train_each, which both jobs train through: every configuration in order, each
    reporting its losses to the progress bar; a non-finite gradient stops the loop with advice."""
    from types import SimpleNamespace

    from rich.console import Console

    settings = SimpleNamespace(configurations=[("ring", "awc"), ("complete", "atc")], steps=2, progress=True)
    console = Console(record=True, width=200)

    def train(topology, order, report):
        report(1.5)
        report(1.25)
        return {"topology": topology, "order": order}

    runs = cli.train_each(settings, console, 0, "loss {task.fields[loss]:.3f}", train)
    assert runs == [{"topology": "ring", "order": "awc"}, {"topology": "complete", "order": "atc"}]

    def diverging(topology, order, report):
        if order == "atc":
            raise decentral.NonFiniteGradientError([1], 0)
        return {"topology": topology}

    assert cli.train_each(settings, console, 0, "loss {task.fields[loss]:.3f}", diverging) is None
    said = console.export_text()
    assert "training diverged: non-finite gradient on worker(s) [1] at step 0" in said
    assert "try a smaller --lr or --max-norm" in said
