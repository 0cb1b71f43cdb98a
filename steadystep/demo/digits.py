"""The digits job, ``python -m steadystep demo`` (the main job).

N simulated workers (default 8) learn scikit-learn's handwritten digits with a one-hidden-layer
MLP from [`steadystep.models`][steadystep.models], each on its own shard of the training set, with the
decentralized AdamW step of [`steadystep.decentral`][steadystep.decentral] over every requested topology and
mixing order. Every configuration sees the same initial model and the same minibatches, so
the runs differ only in how workers mix. At the end, the curvature diagnostics of
[`steadystep.diagnostics`][steadystep.diagnostics] are taken at the mean model x̄ of each run.

Output (``--output-dir``): ``report.json`` (settings, versions, device, per-step curves, final
metrics, diagnostics; the same seed gives the same numbers) and four PNG plots. Needs the
``demo`` extra: ``pip install "steadystep[demo]"``. With ``--backend mpi`` under
``mpiexec -n N``, or ``--backend torch`` under ``torchrun --nproc-per-node N``, every rank is
one worker (rank 0 prints and writes the report).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

import steadystep
from steadystep import curvature, decentral, diagnostics, dispatch, models
from steadystep.demo.cli import (
    ORDERS,
    COMPARED,
    TOPOLOGIES,
    BACKENDS,
    Parser,
    add_training_flags,
    chosen_device,
    fail,
    on_device,
    positive_int,
    prepare_output,
    rank_of,
    require_extras,
    settled,
    start_backend,
    train_each,
)
from steadystep.demo.report import device_description, format_estimate, save_figure
from steadystep.dispatch import use_target

__all__ = [
    "Data",
    "Settings",
    "consensus_figure",
    "diagnose",
    "learning_rate",
    "load_digits",
    "main",
    "minibatches",
    "parse",
    "parser",
    "plot",
    "spectrum_figure",
    "stratified_split",
    "summary_table",
    "train",
    "write_report",
]

if TYPE_CHECKING:
    from steadystep.decentral.ranked import RankAdamW

SPECTRUM_PROBES, SPECTRUM_STEPS = 4, 24  # the density at x̄: 96 H·v per configuration
HEADLINE = ("one-peer-exp", "awc")  # the configuration the accuracy target is about


@dataclass(frozen=True)
class Settings:
    workers: int = 8
    topology: str = "all"
    order: str = "both"
    steps: int = 200
    batch_size: int = 32
    lr: float = 2e-2
    min_lr: float = 1e-4
    warmup: int = 20
    schedule: str = "cosine"
    max_norm: Optional[float] = 1.0
    weight_decay: float = 1e-4
    hidden: int = 32
    activation: str = "tanh"
    dtype: str = "float32"
    device: str = "cpu"
    seed: int = 0
    eval_every: int = 10
    noise_samples: int = 32
    samples: Optional[int] = None
    probes: int = 32
    eigenvalues: int = 3
    output_dir: str = "steadystep-demo"
    backend: str = "local"
    progress: bool = True
    state_bits: int = 32

    @property
    def configurations(self) -> list[tuple[str, str]]:
        names = list(COMPARED) if self.topology == "all" else [self.topology]
        return [(name, order) for name in names for order in ORDERS[self.order]]


# -- command line ----------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    defaults = Settings()
    build = Parser(
        prog="steadystep demo",
        description="Decentralized training of N simulated workers on scikit-learn's digits: compares topologies "
        "and AWC/ATC mixing, reports mean-model accuracy, consensus distance and curvature diagnostics, and writes "
        "report.json and PNG plots.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = build.add_argument
    add(
        "--task",
        choices=["digits", "lm"],
        default="digits",
        help="digits: this MLP on scikit-learn's digits; lm: a byte transformer on the standard library's .py files "
        "(needs torch; `steadystep demo --task lm --help` lists its options)",
    )
    add_training_flags(build, defaults, warmup="counted in samples seen, as tokens")
    add(
        "--topology",
        choices=[*TOPOLOGIES, "all"],
        default=defaults.topology,
        help="mixing topology: complete averaging, one-peer exponential, alternating ring, or all three",
    )
    add("--batch-size", type=positive_int, default=defaults.batch_size, help="samples per worker per step")
    add("--schedule", choices=["cosine", "constant"], default=defaults.schedule, help="learning-rate schedule")
    add("--hidden", type=positive_int, default=defaults.hidden, help="hidden units of the MLP")
    add("--activation", choices=list(models.ACTIVATIONS), default=defaults.activation, help="hidden activation")
    add(
        "--device",
        choices=["cpu", "cuda", "auto"],
        default="auto",
        help="where the kernels run (auto: a GPU if usable)",
    )
    add(
        "--eval-every",
        type=positive_int,
        default=defaults.eval_every,
        help="steps between evaluations of the mean model",
    )
    add(
        "--eigenvalues",
        type=positive_int,
        default=defaults.eigenvalues,
        help="top Hessian eigenvalues at x̄ (Lanczos), marked on the spectrum plot",
    )
    add(
        "--samples",
        type=positive_int,
        default=argparse.SUPPRESS,
        help="use only the first SAMPLES of the 1797 digits (at least 50; for quick checks; default: all)",
    )
    add(
        "--backend",
        choices=["local", "mpi", "torch"],
        default=defaults.backend,
        help="local: all workers in this process as one [N, D] kernel; mpi: one worker per rank (run under "
        "mpiexec); torch: one worker per torch.distributed rank (run under torchrun)",
    )
    add("--no-progress", dest="progress", action="store_false", default=argparse.SUPPRESS, help="hide the progress bar")
    return build


def parse(argv: list[str]) -> Settings:
    arguments = settled(parser(), argv, samples=None)
    if arguments["samples"] is not None and arguments["samples"] < 50:
        fail(f"--samples must be at least 50 (a stratified split needs every digit twice), got {arguments['samples']}")
    arguments["device"] = chosen_device(arguments["device"])
    return Settings(**arguments)


# -- data and workers ------------------------------------------------------------------------------


@dataclass
class Data:
    train_features: np.ndarray
    train_labels: np.ndarray
    test_features: np.ndarray
    test_labels: np.ndarray


def load_digits(seed: int, dtype: Any, samples: Optional[int] = None) -> Data:
    """scikit-learn's digits (shipped in its wheel; the first ``samples`` of them when given):
    a stratified 80/20 split, standardised with the training set's statistics."""
    features, labels = _digits()
    features, labels = features[:samples], labels[:samples]
    train, test = stratified_split(labels, 0.2, np.random.default_rng(seed))
    mean = features[train].mean(axis=0)
    scale = features[train].std(axis=0)
    scale[scale == 0.0] = 1.0  # pixels that are blank in every training image stay 0
    standardised = ((features - mean) / scale).astype(dtype)
    return Data(standardised[train], labels[train], standardised[test], labels[test])


def _digits() -> tuple[np.ndarray, np.ndarray]:
    """The 1797 8×8 images (64 features, 0–16, float64) and their labels (int64).

    Read from the CSV inside scikit-learn's wheel without importing scikit-learn: its import
    (SciPy with it) took ~1.4 s of every demo run, the file 0.03 s. Where the file is not
    where scikit-learn has always kept it, its own loader reads it.
    """
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits as digits

        features, labels = digits(return_X_y=True)
        return features, labels.astype(np.int64)
    table = np.loadtxt(path, delimiter=",")
    return table[:, :-1], table[:, -1].astype(np.int64)


def stratified_split(
    labels: np.ndarray, test_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted row indices (train, test): ⌈fraction·n⌉ test rows, each class contributing its
    share (rounded down, the leftover rows going to the largest remainders), drawn at random."""
    classes, counts = np.unique(labels, return_counts=True)
    test_total = math.ceil(test_fraction * len(labels))
    shares = counts * test_total / len(labels)
    per_class = np.floor(shares).astype(np.int64)
    leftover = test_total - int(per_class.sum())
    per_class[np.argsort(per_class - shares, kind="stable")[:leftover]] += 1
    test = np.concatenate(
        [rng.permutation(np.flatnonzero(labels == label))[:count] for label, count in zip(classes, per_class)]
    )
    chosen = np.zeros(len(labels), bool)
    chosen[test] = True
    return np.flatnonzero(~chosen), np.flatnonzero(chosen)


def minibatches(settings: Settings, samples: int) -> np.ndarray:
    """[steps, N, B] rows of the training set: worker n draws from its own shard."""
    rng = np.random.default_rng(settings.seed + 1)
    shards = np.array_split(rng.permutation(samples), settings.workers)
    batches = np.empty((settings.steps, settings.workers, settings.batch_size), np.int64)
    for worker, shard in enumerate(shards):
        replace = settings.batch_size > len(shard)
        for step in range(settings.steps):
            batches[step, worker] = rng.choice(shard, settings.batch_size, replace=replace)
    return batches


class LocalWorkers:
    """All N workers in this process: one [N, D] arena, one batched kernel per step."""

    rank = 0

    def __init__(self, initial: np.ndarray, settings: Settings, topology: str, order: str, mask: np.ndarray):
        self.optimizer: decentral.DecentralizedAdamW | RankAdamW = decentral.DecentralizedAdamW(
            initial.copy(),
            topology=decentral.TOPOLOGIES[TOPOLOGIES[topology]](),
            order=order,
            lr=settings.lr,
            weight_decay=settings.weight_decay,
            max_norm=settings.max_norm,
            decay_mask=mask,
            target=settings.device,
            state_bits=settings.state_bits,
        )
        self.grads = self.optimizer._zeros()

    @property
    def params(self) -> Any:
        return self.optimizer.params

    def mine(self, batches: Any) -> Any:
        return batches

    def step(self, lr: float) -> None:
        self.optimizer.step(self.grads, lr=lr)

    def everyone(self, rows: Any) -> np.ndarray:
        return dispatch.host_array(rows)

    def mean_loss(self, losses: np.ndarray) -> float:
        return float(np.mean(losses))


class RankWorkers(LocalWorkers):
    """One worker per rank (MPI or torch.distributed): this process holds row ``rank`` of the
    [N, D] picture."""

    def __init__(self, initial: np.ndarray, settings: Settings, topology: str, order: str, mask: np.ndarray):
        options: dict[str, Any] = {}
        if settings.backend == "mpi":
            from steadystep.decentral.mpi import MPIAdamW as Worker
            from steadystep.decentral.mpi import cuda_aware

            options["host_staging"] = settings.device == "cuda" and not cuda_aware()  # a plain MPI: via the host
        else:
            from steadystep.torch.distributed import DistributedAdamW as Worker  # type: ignore[assignment]
        row = initial[rank_of(settings.backend)].copy()
        if settings.device == "cuda":
            row = on_device("cuda", {"row": row})["row"]
        self.optimizer = optimizer = Worker(
            row,
            topology=decentral.TOPOLOGIES[TOPOLOGIES[topology]](),
            order=order,
            lr=settings.lr,
            weight_decay=settings.weight_decay,
            max_norm=settings.max_norm,
            decay_mask=mask,
            target=settings.device,
            **options,
        )
        self.rank, self.comm = optimizer.rank, optimizer.comm
        self.grads = optimizer.local._zeros()

    @property
    def params(self) -> Any:
        return self.optimizer.params.reshape(1, -1)

    def mine(self, batches: Any) -> Any:
        return batches[self.rank : self.rank + 1]

    def step(self, lr: float) -> None:
        self.optimizer.step(self.grads.reshape(-1), lr=lr)

    def everyone(self, rows: Any) -> np.ndarray:
        return np.stack(self.comm.allgather(np.ascontiguousarray(dispatch.host_array(rows).reshape(-1))))

    def mean_loss(self, losses: np.ndarray) -> float:
        return float(np.mean(self.comm.allgather(float(losses[0]))))


# -- one configuration ------------------------------------------------------------------------------


def learning_rate(settings: Settings, step: int) -> float:
    if settings.schedule == "constant":
        return settings.lr
    samples_per_step = settings.workers * settings.batch_size
    return decentral.token_lr(
        step,
        workers=settings.workers,
        batch=settings.batch_size,
        context=1,
        warmup_tokens=settings.warmup * samples_per_step,
        total_tokens=settings.steps * samples_per_step,
        base_lr=settings.lr,
        min_lr=settings.min_lr,
    )


def train(
    settings: Settings,
    model: models.Model,
    data: Data,
    device_data: dict,
    batches: Any,
    initial: np.ndarray,
    topology: str,
    order: str,
    advance,
) -> dict:
    """One (topology, order) run: curves, final metrics of the mean model, its diagnostics."""
    workers_type = LocalWorkers if settings.backend == "local" else RankWorkers
    workers = workers_type(initial, settings, topology, order, model.decay_mask(initial.dtype))
    curves: dict[str, list] = {
        "step": [],
        "train_loss": [],
        "consensus_distance": [],
        "eval_step": [],
        "test_accuracy": [],
        "mean_model_train_loss": [],
    }
    for step in range(settings.steps):
        losses, _ = model.loss_and_grad(
            workers.params,
            device_data["train_features"],
            device_data["train_labels"],
            workers.mine(batches[step]),
            out=workers.grads,
        )
        workers.step(learning_rate(settings, step))
        everyone = workers.everyone(workers.params)
        curves["step"].append(step + 1)
        curves["train_loss"].append(workers.mean_loss(losses))
        curves["consensus_distance"].append(decentral.consensus_distance(everyone))
        if (step + 1) % settings.eval_every == 0 or step + 1 == settings.steps:
            mean = everyone.mean(axis=0)[None]
            curves["eval_step"].append(step + 1)
            curves["test_accuracy"].append(
                float(_evaluate(model, mean, data.test_features, data.test_labels, settings).accuracy[0])
            )
            curves["mean_model_train_loss"].append(
                float(_evaluate(model, mean, data.train_features, data.train_labels, settings).loss[0])
            )
        advance(curves["train_loss"][-1])
    final = {  # everyone: the workers after the last step
        "train_loss": curves["mean_model_train_loss"][-1],
        "test_accuracy": curves["test_accuracy"][-1],
        "worker_test_accuracy": _evaluate(
            model, everyone, data.test_features, data.test_labels, settings
        ).accuracy.tolist(),
        "consensus_distance": curves["consensus_distance"][-1],
    }
    report = {"topology": topology, "order": order, "curves": curves, "final": final}
    if workers.rank == 0:
        report["diagnostics"] = diagnose(settings, model, data, everyone)
    return report


def _evaluate(
    model: models.Model, rows: np.ndarray, features: np.ndarray, labels: np.ndarray, settings: Settings
) -> models.Evaluation:
    """Loss and accuracy of each row of ``rows`` ([K, D] host parameters) over all the samples."""
    with use_target(settings.device):
        return model.evaluate(np.ascontiguousarray(rows, features.dtype), features, labels)


def diagnose(settings: Settings, model: models.Model, data: Data, everyone: np.ndarray) -> dict:
    """Noise and consensus alignment at the mean model x̄, against the isotropic reference;
    the Hessian's top eigenvalues there (Lanczos) and its spectral density (SLQ)."""
    rng = np.random.default_rng(settings.seed + 2)
    mean = everyone.mean(axis=0).astype(everyone.dtype)
    features, labels = data.train_features, data.train_labels
    with use_target(settings.device):
        hvp = diagnostics.model_hvp(model, mean, features, labels)
        _, full = model.loss_and_grad(mean[None], features, labels)
        replace = settings.batch_size > len(labels)  # as the training batches do when a shard is smaller
        batches = np.stack(
            [rng.choice(len(labels), settings.batch_size, replace=replace) for _ in range(settings.noise_samples)]
        )
        _, sampled = model.loss_and_grad(np.tile(mean, (settings.noise_samples, 1)), features, labels, batches)
        noise = diagnostics.noise_alignment(hvp, full[0], sampled)
        reference = diagnostics.isotropic_reference(
            hvp, model.dim, vectors=settings.probes, seed=settings.seed, support=model.parameter_indices
        )
        consensus = diagnostics.consensus_alignment(hvp, everyone)
        support = model.parameter_indices
        top = curvature.top_eigenpairs(hvp, model.dim, k=min(settings.eigenvalues, len(support)), support=support)
        density = curvature.spectral_density(
            hvp,
            model.dim,
            probes=SPECTRUM_PROBES,
            steps=SPECTRUM_STEPS,
            points=300,
            seed=settings.seed,
            support=support,
        )
    kappa = diagnostics.anisotropy(noise.a_norm, reference)
    return {
        "noise": noise.to_dict(),
        "isotropic_reference": asdict(reference),
        "kappa": asdict(kappa),
        "consensus": consensus.to_dict(),
        "top_eigenpairs": top.to_dict(),
        "spectral_density": density.to_dict(),
    }


# -- output ------------------------------------------------------------------------------------------


def _versions() -> dict:
    from importlib.metadata import version

    import numba

    return {
        "steadystep": steadystep.__version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "scikit-learn": version("scikit-learn"),
    }


def write_report(directory: Path, settings: Settings, model: models.Model, data: Data, runs: list[dict]) -> Path:
    report = {
        "settings": asdict(settings),
        "model": {
            "features": model.features,
            "hidden": model.hidden,
            "classes": model.classes,
            "activation": model.activation,
            "parameters": int(len(model.parameter_indices)),
            "row_length": model.dim,
        },
        "data": {
            "name": "scikit-learn digits",
            "train_samples": len(data.train_labels),
            "test_samples": len(data.test_labels),
        },
        "versions": _versions(),
        "device": device_description(settings.device),
        "runs": runs,
    }
    path = directory / "report.json"
    path.write_text(json.dumps(report, indent=1, allow_nan=False))
    return path


def plot(directory: Path, runs: list[dict]) -> list[Path]:
    """curves.png (loss and test accuracy of x̄), consensus.png (log scale), alignment.png,
    spectrum.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    figure, (loss_axes, accuracy_axes) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for run in runs:
        label, curves = f"{run['topology']} · {run['order'].upper()}", run["curves"]
        loss_axes.plot(curves["eval_step"], curves["mean_model_train_loss"], label=label)
        accuracy_axes.plot(curves["eval_step"], curves["test_accuracy"], label=label)
    loss_axes.set(title="mean model x̄: training loss", xlabel="step", ylabel="cross-entropy", yscale="log")
    accuracy_axes.set(title="mean model x̄: test accuracy", xlabel="step", ylabel="accuracy", ylim=(0.5, 1.0))
    accuracy_axes.legend(fontsize=8)
    paths.append(save_figure(figure, directory / "curves.png"))

    paths.append(save_figure(consensus_figure(runs), directory / "consensus.png"))

    figure, axes = plt.subplots(figsize=(9, 4), constrained_layout=True)
    measures = [
        ("noise A_norm", lambda d: d["noise"]["a_norm"]),
        ("isotropic reference", lambda d: d["isotropic_reference"]),
        ("consensus A_norm", lambda d: d["consensus"]["a_norm"]),
    ]
    positions = np.arange(len(runs))
    width = 0.8 / len(measures)
    for k, (name, pick) in enumerate(measures):
        estimates = [pick(run["diagnostics"]) for run in runs]
        values = [estimate["value"] if estimate["value"] is not None else 0.0 for estimate in estimates]
        errors = [estimate["standard_error"] or 0.0 for estimate in estimates]
        axes.bar(positions + (k - 1) * width, values, width, yerr=errors, capsize=3, label=name)
    axes.set_xticks(positions, [f"{run['topology']}\n{run['order'].upper()}" for run in runs], fontsize=8)
    axes.set(
        title="curvature along the gradient noise and the consensus errors vs a random direction", ylabel="vᵀHv / ‖v‖²"
    )
    axes.legend(fontsize=8)
    paths.append(save_figure(figure, directory / "alignment.png"))
    paths.append(save_figure(spectrum_figure(runs), directory / "spectrum.png"))
    return paths


def spectrum_figure(runs: list[dict]) -> Any:
    """The Hessian's eigenvalue density at x̄ (log scale), one panel per configuration, its top
    eigenvalues marked."""
    import matplotlib.pyplot as plt

    columns = min(3, len(runs))
    rows = -(-len(runs) // columns)
    figure, grid = plt.subplots(
        rows, columns, figsize=(4 * columns, 3 * rows), sharex=True, squeeze=False, constrained_layout=True
    )
    for axes, run in zip(grid.flat, runs):
        density = run["diagnostics"]["spectral_density"]
        values = np.asarray(density["density"], dtype=float)
        axes.plot(density["grid"], values, color="C0")
        for index, eigenvalue in enumerate(run["diagnostics"]["top_eigenpairs"]["values"]):
            axes.axvline(
                eigenvalue, color="C3", linestyle="--", linewidth=0.8, label="top eigenvalues" if index == 0 else None
            )
        axes.set(
            title=f"{run['topology']} · {run['order'].upper()}",
            yscale="log",
            ylim=(values.max() * 1e-6, values.max() * 2),
        )
        axes.tick_params(labelsize=8)
    for axes in grid.flat[len(runs) :]:
        axes.set_visible(False)
    grid.flat[0].legend(fontsize=8)
    figure.supxlabel("Hessian eigenvalue at x̄")
    figure.supylabel("density (SLQ, Gaussian-broadened)")
    return figure


def consensus_figure(runs: list[dict]) -> Any:
    """The consensus distance on a log scale: one colour per topology, solid AWC, dashed ATC
    (so that no line hides another), the axis spanning the values that occur. An exact 0
    (complete averaging mixes the workers into one) has no place on a log axis: it is left
    out and said in the legend, rather than drawn at a floor far below every other value."""
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.5, 4), constrained_layout=True)
    colours = {topology: f"C{index}" for index, topology in enumerate(dict.fromkeys(run["topology"] for run in runs))}
    positive = [value for run in runs for value in run["curves"]["consensus_distance"] if value > 0]
    for run in runs:
        distance = np.asarray(run["curves"]["consensus_distance"], dtype=float)
        label = f"{run['topology']} · {run['order'].upper()}"
        if not (distance > 0).any():
            label += " (exactly 0)"
        axes.plot(
            run["curves"]["step"],
            np.where(distance > 0, distance, np.nan),
            label=label,
            color=colours[run["topology"]],
            linestyle="-" if run["order"] == "awc" else "--",
        )
    axes.set(title="consensus distance of the workers", xlabel="step", ylabel="mean‖xᵢ − x̄‖²", yscale="log")
    if positive:
        axes.set_ylim(min(positive) / 2, max(positive) * 2)
    axes.legend(fontsize=8)
    return figure


def summary_table(runs: list[dict]) -> Any:
    """Three tables that each fit an 80-column terminal with every number whole: the training
    results, the curvature along the noise at x̄, the Hessian's top eigenvalues there."""
    from rich import box
    from rich.console import Group
    from rich.table import Table

    def table(title: str, columns: tuple[str, ...]) -> Any:
        made = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for column in columns:
            made.add_column(column, justify="left" if column == "run" else "right", no_wrap=True)
        return made

    training = table(
        "mean model x̄ after training; consensus and its curvature vᵀHv/‖v‖²",
        ("run", "train loss", "test acc", "consensus", "consensus A_norm"),
    )
    noise = table(
        "curvature along the gradient noise at x̄ (± standard error)",
        ("run", "noise A", "noise A_norm", "isotropic", "κ"),
    )
    shown = min([4, *(len(run["diagnostics"]["top_eigenpairs"]["values"]) for run in runs)])
    spectrum = table("top eigenvalues of the Hessian at x̄ (Lanczos)", ("run", *("λ" + "₁₂₃₄"[i] for i in range(shown))))
    for run in runs:
        final, found = run["final"], run["diagnostics"]
        name = f"{run['topology']} {run['order'].upper()}"
        training.add_row(
            name,
            f"{final['train_loss']:.4f}",
            f"{final['test_accuracy']:.1%}",
            f"{final['consensus_distance']:.2g}",
            format_estimate(found["consensus"]["a_norm"]),
        )
        noise.add_row(
            name,
            format_estimate(found["noise"]["a"]),
            format_estimate(found["noise"]["a_norm"]),
            format_estimate(found["isotropic_reference"]),
            format_estimate(found["kappa"]),
        )
        spectrum.add_row(name, *(f"{value:#.4g}" for value in found["top_eigenpairs"]["values"][:shown]))
    return Group(training, noise, spectrum)


# -- entry point ----------------------------------------------------------------------------------------


def main(argv: Optional[list[str]] = None) -> int:
    """The digits job on the command line ``argv`` (``python -m steadystep demo ...``)."""
    argv = sys.argv[1:] if argv is None else argv
    settings = parse(argv)
    require_extras()
    rank, settings = start_backend(settings, argv)
    directory = prepare_output(settings.output_dir) if rank == 0 else Path(settings.output_dir)
    from rich.console import Console

    # Progress goes to stderr, so that a redirected table stays clean; under mpiexec both go to
    # stdout, as hydra forwards the two streams apart and would splice the table into the bar.
    console = Console(stderr=settings.backend == "local", quiet=rank != 0)
    results = Console(quiet=rank != 0, width=None if sys.stdout.isatty() else 140)
    started = time.perf_counter()
    dtype = np.dtype(settings.dtype)
    data = load_digits(settings.seed, dtype, settings.samples)
    if settings.workers > len(data.train_labels):
        fail(
            f"--workers {settings.workers} is more than the {len(data.train_labels)} training samples, and every "
            "worker needs a shard of its own: use fewer workers or more --samples"
        )
    model = models.mlp(data.train_features.shape[1], settings.hidden, 10, settings.activation)
    initial = model.init(settings.workers, seed=settings.seed, dtype=dtype)
    batches = minibatches(settings, len(data.train_labels))
    device_data = on_device(
        settings.device, {"train_features": data.train_features, "train_labels": data.train_labels, "batches": batches}
    )
    console.print(
        f"[bold]steadystep demo[/]: {settings.workers} workers · digits ({len(data.train_labels)} train / "
        f"{len(data.test_labels)} test) · MLP 64-{settings.hidden}-10 {settings.activation} · D = "
        f"{len(model.parameter_indices)} · {settings.steps} steps × {len(settings.configurations)} configurations "
        f"· {device_description(settings.device)}"
        + (
            f" · {BACKENDS[settings.backend]} backend, rank 0 of {settings.workers}"
            if settings.backend != "local"
            else ""
        )
    )
    runs = train_each(
        settings,
        console,
        rank,
        "loss {task.fields[loss]:.3f}",
        lambda topology, order, report: train(
            settings, model, data, device_data, device_data["batches"], initial, topology, order, report
        ),
    )
    if runs is None:
        return 1
    if rank != 0:
        return 0
    results.print(summary_table(runs))
    report = write_report(directory, settings, model, data, runs)
    pictures = plot(directory, runs)
    headline = next((run for run in runs if (run["topology"], run["order"]) == HEADLINE), runs[0])
    results.print(
        f"mean model, {headline['topology']} {headline['order'].upper()}: test accuracy "
        f"[bold]{headline['final']['test_accuracy']:.2%}[/] · wrote {report} and "
        f"{', '.join(path.name for path in pictures)} · {time.perf_counter() - started:.1f} s"
    )
    return 0
