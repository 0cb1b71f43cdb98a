"""The language-model main job: ``python -m steadystep demo --task lm``.

N simulated workers (default 8) train a small causal byte transformer
(`steadystep.lm.ByteTransformer`) on the standard library's own ``.py`` files with
[`steadystep.torch.decentral.DecentralizedTrainer`][steadystep.torch.decentral.DecentralizedTrainer]:
all workers' forward and backward passes vmapped into one, then clip + mix + AdamW in one kernel
launch. Each step every worker reads its own disjoint part of the training stream (N·B·C prediction
targets per step); the learning rate is warmup + cosine in tokens. Every configuration starts from
the same model and reads the same bytes, so runs differ only in how the workers mix. With
``--backend torch`` under ``torchrun --nproc-per-node N`` every rank is one worker
([`steadystep.torch.distributed.DistributedTrainer`][steadystep.torch.distributed.DistributedTrainer]),
and rank 0 reports the same numbers.

Reported: validation bits per byte of the mean model x̄ on the packed held-out files
against the unigram (byte-frequency) baseline of the same text, the consensus distance,
and the gradient-noise and consensus curvature alignment at x̄ (torch Hessian-vector
products: jvp of grad). Output: ``report.json``, ``validation.png``, ``consensus.png`` and a
sample of text written by each mean model. Needs torch and the ``demo`` extra.

``--compare communication`` asks how much communication the workers can do without (SPEC §8):
complete ATC and dense one-peer exponential AWC every step, CHOCO int8 over one-peer
exponential, dense, int8 and top-k 1 % gossip over the directed ring, periodic averaging every
4 steps and DiLoCo every 16 steps over complete averaging and over one peer. It reports each
run's validation bits per byte against the bytes each worker sent (the table, ``report.json``'s
``runs[i].communication``, ``communication.png``) and skips the curvature diagnostics.
``--compare outer`` runs local steps every 16 with other outer lr, momentum and inner lr.
``--compare states`` runs the headline one-peer exponential AWC with float32, 8-bit and 4-bit
moments (SPEC §9); ``--state-bits 8`` (or 4) runs any configuration with quantized moments.
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
from typing import Any, Optional

import numpy as np

import steadystep
from steadystep import compress, decentral, diagnostics
from steadystep.demo.cli import (
    ORDERS,
    COMPARED,
    TOPOLOGIES,
    start_backend,
    train_each,
    chosen_device,
    fail,
    Parser,
    add_training_flags,
    positive_int,
    prepare_output,
    require_extras,
    settled,
)
from steadystep.demo.report import device_description, format_estimate, save_figure

__all__ = [
    "Settings",
    "diagnose",
    "main",
    "parse",
    "parser",
    "plot",
    "summary_table",
    "train",
    "worker_batches",
    "write_report",
]

HEADLINE = ("one-peer-exp", "awc")  # the configuration the target is about, against complete AWC


@dataclass(frozen=True)
class Communication:
    """One run of ``--compare communication`` or ``outer``: its topology (a demo name), order,
    what DecentralizedTrainer takes for compressed gossip or local steps, and its learning rate
    as a multiple of ``--lr``."""

    topology: str
    order: str
    compression: Optional[compress.Compressor] = None
    consensus: float = 1.0
    outer: Optional[decentral.DiLoCo] = None
    lr_scale: float = 1.0  # of --lr, for the inner steps
    state_bits: int = 32  # the moments: float (32) or blockwise 8-bit (8) or 4-bit (4) codes


# label → run; the labels are the table's and the plot's
COMMUNICATION = {
    "complete ATC": Communication("complete", "atc"),
    "dense AWC": Communication("one-peer-exp", "awc"),
    # compressed gossip sends to every worker that keeps a public copy: τ = 3 of them over
    # one-peer exponential, one over the directed ring
    "int8 ATC": Communication("one-peer-exp", "atc", compress.int8()),
    "dense ring→ ATC": Communication("directed-ring", "atc"),
    "int8 ring→ ATC": Communication("directed-ring", "atc", compress.int8()),
    # top-k 1% drifts apart at γ = 0.2 and mixes too slowly at 0.01 (BENCHMARKS.md)
    "top-k 1% ring→": Communication("directed-ring", "atc", compress.top_k(0.01), consensus=0.05),
    "avg every 4": Communication("complete", "atc", outer=decentral.DiLoCo(every=4, lr=1.0, momentum=0.0)),
    "DiLoCo 16": Communication("complete", "atc", outer=decentral.DiLoCo(every=16)),
    "DiLoCo 16 1-peer": Communication("one-peer-exp", "atc", outer=decentral.DiLoCo(every=16)),
}

# what makes 16 local steps work (BENCHMARKS.md): the outer step's lr and momentum, the inner lr
OUTER = {
    "complete ATC": Communication("complete", "atc"),
    "DiLoCo 16": Communication("complete", "atc", outer=decentral.DiLoCo(every=16)),
    "H16 α1 μ.5": Communication("complete", "atc", outer=decentral.DiLoCo(every=16, lr=1.0, momentum=0.5)),
    "avg every 16": Communication("complete", "atc", outer=decentral.DiLoCo(every=16, lr=1.0, momentum=0.0)),
    "complete, lr ½": Communication("complete", "atc", lr_scale=0.5),
    "avg 16, lr ½": Communication(
        "complete", "atc", outer=decentral.DiLoCo(every=16, lr=1.0, momentum=0.0), lr_scale=0.5
    ),
}
# the optimizer state's size: the same run with float32, 8-bit and 4-bit moments (SPEC §9)
STATES = {
    "float32 moments": Communication("one-peer-exp", "awc"),
    "8-bit moments": Communication("one-peer-exp", "awc", state_bits=8),
    "4-bit moments": Communication("one-peer-exp", "awc", state_bits=4),
}
COMPARISONS = {"communication": COMMUNICATION, "outer": OUTER, "states": STATES}


@dataclass(frozen=True)
class Settings:
    workers: int = 8
    topology: str = "complete,one-peer-exp"
    order: str = "awc"
    steps: int = 800
    batch_size: int = 8
    context: int = 64
    width: int = 96
    layers: int = 2
    heads: int = 4
    lr: float = 8e-3
    min_lr: float = 0.0
    warmup: int = 50
    max_norm: Optional[float] = 1.0
    weight_decay: float = 0.1
    dtype: str = "float32"
    device: str = "cpu"
    seed: int = 0
    eval_every: int = 50
    eval_windows: int = 256
    validation_files: int = 20
    validation_bytes: Optional[int] = None
    noise_samples: int = 8
    probes: int = 8
    sample_bytes: int = 240
    output_dir: str = "steadystep-demo-lm"
    progress: bool = True
    backend: str = "local"
    compare: str = "topologies"
    state_bits: int = 32

    @property
    def configurations(self) -> list[tuple[str, str]]:
        """(topology, order) of each run; with --compare communication or outer, (label, order)."""
        if self.compare in COMPARISONS:
            return [(label, run.order) for label, run in COMPARISONS[self.compare].items()]
        names = list(COMPARED) if self.topology == "all" else self.topology.split(",")
        return [(name, order) for name in names for order in ORDERS[self.order]]

    @property
    def tokens_per_step(self) -> int:
        return self.workers * self.batch_size * self.context


# -- command line ------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    defaults = Settings()
    build = Parser(
        prog="steadystep demo --task lm",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Decentralized training of N simulated workers of a small byte transformer on the "
        "standard library's .py files: compares topologies and AWC/ATC, reports validation bits per byte of "
        "the mean model against the unigram baseline, consensus distance and curvature diagnostics.",
    )
    add = build.add_argument
    add("--task", choices=["lm"], default="lm", help=argparse.SUPPRESS)
    add_training_flags(build, defaults, warmup="counted as tokens: steps·N·B·C")
    add(
        "--topology",
        type=_topologies,
        default=defaults.topology,
        help=f"comma-separated topologies among {', '.join(TOPOLOGIES)}, or all",
    )
    add("--batch-size", type=positive_int, default=defaults.batch_size, help="windows per worker per step (B)")
    add("--context", type=positive_int, default=defaults.context, help="bytes per window (C)")
    add("--width", type=positive_int, default=defaults.width, help="transformer width")
    add("--layers", type=positive_int, default=defaults.layers, help="transformer blocks")
    add("--heads", type=positive_int, default=defaults.heads, help="attention heads (must divide the width)")
    add("--device", choices=["cpu", "cuda", "auto"], default="auto", help="where the model and kernels run")
    add("--eval-every", type=positive_int, default=defaults.eval_every, help="steps between validation estimates")
    add(
        "--eval-windows",
        type=positive_int,
        default=defaults.eval_windows,
        help="validation windows for the estimates during training (the final one reads all of them)",
    )
    add("--validation-files", type=positive_int, default=defaults.validation_files, help="held-out files")
    add(
        "--validation-bytes",
        type=positive_int,
        default=argparse.SUPPRESS,
        help="evaluate the final model on the first VALIDATION_BYTES of the held-out stream (default: all)",
    )
    add("--sample-bytes", type=int, default=defaults.sample_bytes, help="bytes of text generated by each mean model")
    add("--no-progress", dest="progress", action="store_false", default=argparse.SUPPRESS, help="hide the progress bar")
    add(
        "--compare",
        choices=["topologies", *COMPARISONS],
        default=defaults.compare,
        help="topologies: the --topology and --order runs; communication: dense, compressed (int8, top-k) and "
        "local-step (every 4, DiLoCo 16) runs against the bytes each worker sent; outer: what makes 16 local "
        "steps work (the outer lr and momentum, the inner lr); states: float32 against 8-bit and 4-bit moments",
    )

    add(
        "--backend",
        choices=["local", "torch"],
        default=defaults.backend,
        help="local: the N workers in this process; torch: one worker per torch.distributed rank, under "
        "torchrun --nproc-per-node N",
    )
    return build


def _topologies(text: str) -> str:
    names = list(COMPARED) if text == "all" else text.split(",")
    unknown = [name for name in names if name not in TOPOLOGIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected topologies among {', '.join(TOPOLOGIES)} (comma-separated) or all, got {text!r}"
        )
    return text


def parse(argv: list[str]) -> Settings:
    arguments = settled(parser(), argv, validation_bytes=None)
    if arguments["width"] % arguments["heads"]:
        fail(f"--heads {arguments['heads']} must divide --width {arguments['width']}")
    if arguments["validation_bytes"] is not None and arguments["validation_bytes"] <= arguments["context"]:
        fail(
            f"--validation-bytes {arguments['validation_bytes']} must exceed --context {arguments['context']} (one "
            "window and the byte after it)"
        )
    if arguments["compare"] in COMPARISONS and arguments["backend"] != "local":
        fail(f"--compare {arguments['compare']} runs in one process: leave out --backend")
    arguments["device"] = _torch_device(arguments["device"])
    return Settings(**arguments)


def _torch_device(choice: str) -> str:
    """cuda when torch and Numba both see a GPU (auto), as asked otherwise."""
    import torch

    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return "cpu"
    if not torch.cuda.is_available():
        fail("--device cuda: torch sees no GPU (a CPU build of torch?); try --device cpu")
    return chosen_device(choice)


# -- data ------------------------------------------------------------------------------------------------


def worker_batches(stream: np.ndarray, settings: Settings, step: int) -> np.ndarray:
    """[N, B, C + 1] windows for ``step``: worker i reads its own contiguous shard of the
    training stream from the start, window after window (wrapping around at its end)."""
    shard = len(stream) // settings.workers
    span = settings.context + 1
    per_shard = (shard - span) // settings.context + 1
    if per_shard < settings.batch_size:
        raise ValueError(
            f"each of the {settings.workers} workers' shards ({shard} bytes) holds fewer than "
            f"--batch-size {settings.batch_size} windows of {span} bytes"
        )
    index = (step * settings.batch_size + np.arange(settings.batch_size)) % per_shard
    starts = np.arange(settings.workers)[:, None] * shard + index[None, :] * settings.context
    return stream[starts[..., None] + np.arange(span)].astype(np.int64)


# -- one configuration ------------------------------------------------------------------------------------


def train(
    settings: Settings,
    corpus: Any,
    template: Any,
    evaluation: np.ndarray,
    final_windows: np.ndarray,
    topology: str,
    order: str,
    advance: Any,
) -> dict:
    import torch

    from steadystep import lm

    label, run = topology, COMPARISONS.get(settings.compare, {}).get(topology)
    schedule = decentral.TokenSchedule(
        workers=settings.workers,
        batch=settings.batch_size,
        context=settings.context,
        warmup_tokens=settings.warmup * settings.tokens_per_step,
        total_tokens=settings.steps * settings.tokens_per_step,
        base_lr=settings.lr * (run.lr_scale if run is not None else 1.0),
        min_lr=settings.min_lr,
    )
    options: dict[str, Any] = dict(state_bits=settings.state_bits)
    if run is not None:
        topology = run.topology
        options = dict(
            compression=run.compression,
            consensus=run.consensus,
            outer=run.outer,
            seed=settings.seed,
            state_bits=min(run.state_bits, settings.state_bits),
        )
    workers = Workers(
        settings,
        template,
        topology=decentral.TOPOLOGIES[TOPOLOGIES[topology]](),
        order=order,
        lr=schedule,
        weight_decay=settings.weight_decay,
        max_norm=settings.max_norm,
        vmap=True,  # plain matmuls, which vmap batches fastest; and ranks and one process then agree bit for bit
        **options,
    )
    curves: dict[str, list] = {
        "step": [],
        "tokens": [],
        "train_loss": [],
        "consensus_distance": [],
        "eval_step": [],
        "eval_tokens": [],
        "validation_bits_per_byte": [],
        "bytes_per_worker": [],
    }
    mean = None
    for step in range(settings.steps):
        windows = torch.as_tensor(worker_batches(corpus.train, settings, step), device=settings.device)
        losses = workers.step(windows[..., :-1], windows[..., 1:])
        trainer = workers.everyone()
        curves["step"].append(step + 1)
        curves["tokens"].append((step + 1) * settings.tokens_per_step)
        curves["train_loss"].append(float(losses.mean()) / math.log(2))
        curves["consensus_distance"].append(trainer.consensus_distance())
        if workers.rank == 0 and ((step + 1) % settings.eval_every == 0 or step + 1 == settings.steps):
            mean = trainer.mean_model(into=mean)
            curves["eval_step"].append(step + 1)
            curves["eval_tokens"].append((step + 1) * settings.tokens_per_step)
            curves["validation_bits_per_byte"].append(lm.bits_per_byte(mean, evaluation))
            curves["bytes_per_worker"].append(_bytes_sent(trainer))
        advance(curves["train_loss"][-1])
    if workers.rank != 0:  # rank 0 evaluates and reports
        return {}
    mean = trainer.mean_model(into=mean)
    final = {
        "validation_bits_per_byte": lm.bits_per_byte(mean, final_windows),
        "train_bits_per_byte": curves["train_loss"][-1],
        "consensus_distance": curves["consensus_distance"][-1],
    }
    prompt = b"def "
    sample = lm.generate(mean, prompt, settings.sample_bytes, seed=settings.seed) if settings.sample_bytes > 0 else b""
    return {
        "label": label if run is not None else f"{topology} {order.upper()}",
        "topology": topology,
        "order": order,
        "curves": curves,
        "final": final,
        "communication": {
            "bytes_per_worker": _bytes_sent(trainer),
            "compression": None if run is None or run.compression is None else run.compression.name,
            "consensus": 1.0 if run is None else run.consensus,
            "outer": None if run is None or run.outer is None else asdict(run.outer),
            "lr": schedule.base_lr,
            "state_bits": options["state_bits"],
        },
        "diagnostics": None if run is not None else diagnose(settings, trainer, corpus),
        "sample": (prompt + sample).decode("utf-8", errors="replace"),
    }


def _bytes_sent(trainer: Any) -> float:
    """What each worker has sent, on average (over ranks: the counts gathered from them)."""
    return float(np.mean(trainer.bytes_sent))


class Workers:
    """The N workers of a configuration: in this process (the in-process trainer), or one per
    torch.distributed rank, which steps its own row of the [N, B, C + 1] windows and gathers
    the run into the in-process trainer it equals for the measurements."""

    def __init__(self, settings: Settings, template: Any, **options: Any):
        from steadystep.torch.decentral import DecentralizedTrainer

        self.ranked: Any = None
        self.trainer: Any = None
        if settings.backend == "local":
            self.rank, self.trainer = 0, DecentralizedTrainer(template, settings.workers, **options)
        else:
            from steadystep.torch.distributed import DistributedTrainer

            options.pop("state_bits", None)  # 32: the ranks' moments (parse refuses 8 with ranks)
            self.ranked = DistributedTrainer(template, **options)
            self.rank = self.ranked.rank

    def step(self, inputs: Any, targets: Any) -> Any:
        """One step of every worker; their losses, [N]."""
        if self.ranked is None:
            return self.trainer.step(inputs, targets).losses
        import torch

        loss = self.ranked.step(inputs[self.rank], targets[self.rank]).losses
        return torch.tensor(self.ranked.comm.allgather(float(loss)), dtype=loss.dtype)

    def everyone(self) -> Any:
        """The in-process trainer: this run's, or the ranks' parameters and buffers gathered into one."""
        if self.ranked is not None:
            self.trainer = self.ranked.gather(into=self.trainer, moments=False)
        return self.trainer


def diagnose(settings: Settings, trainer: Any, corpus: Any) -> dict:
    """Noise and consensus alignment at x̄ (H of the loss over a fixed pool of training
    windows, the noise of B-window minibatches drawn from it), against the isotropic reference."""
    import torch

    rng = np.random.default_rng(settings.seed + 2)
    pool_size = max(4 * settings.batch_size, 64)
    starts = rng.choice(len(corpus.train) - settings.context - 1, pool_size, replace=False)
    pool = torch.as_tensor(
        corpus.train[starts[:, None] + np.arange(settings.context + 1)].astype(np.int64), device=settings.device
    )
    inputs, targets = pool[:, :-1], pool[:, 1:]
    hvp = trainer.hvp(inputs, targets)
    full = trainer.gradient(inputs, targets).to("cpu", torch.float64).numpy()
    sampled = []
    for _ in range(settings.noise_samples):
        chosen = torch.as_tensor(rng.choice(pool_size, settings.batch_size, replace=False), device=settings.device)
        sampled.append(trainer.gradient(inputs[chosen], targets[chosen]).to("cpu", torch.float64).numpy())
    noise = diagnostics.noise_alignment(hvp, full, np.stack(sampled))
    dim = trainer.params.shape[1]
    reference = diagnostics.isotropic_reference(
        hvp, dim, vectors=settings.probes, seed=settings.seed, batch=4, support=trainer.parameter_indices
    )
    consensus = diagnostics.consensus_alignment(hvp, trainer.params.to("cpu", torch.float64).numpy())
    return {
        "noise": noise.to_dict(),
        "isotropic_reference": asdict(reference),
        "kappa": asdict(diagnostics.anisotropy(noise.a_norm, reference)),
        "consensus": consensus.to_dict(),
    }


# -- output -------------------------------------------------------------------------------------------------


def write_report(
    directory: Path,
    settings: Settings,
    corpus: Any,
    parameters: int,
    baseline: float,
    validation_bytes: int,
    runs: list[dict],
    seconds: float,
) -> Path:
    from importlib.metadata import version

    import numba
    import torch

    report = {
        "task": "lm",
        "settings": asdict(settings),
        "model": {
            "kind": "causal byte transformer",
            "context": settings.context,
            "width": settings.width,
            "layers": settings.layers,
            "heads": settings.heads,
            "vocabulary": 256,
            "parameters": parameters,
        },
        "data": {
            "name": "Python standard library .py files",
            "root": corpus.root,
            "train_bytes": int(len(corpus.train)),
            "validation_bytes": int(len(corpus.validation)),
            "evaluated_validation_bytes": validation_bytes,
            "train_files": list(corpus.train_files),
            "validation_files": list(corpus.validation_files),
        },
        "baseline": {"unigram_bits_per_byte": baseline},
        "versions": {
            "steadystep": steadystep.__version__,
            "python": platform.python_version(),
            "numpy": np.__version__,
            "numba": numba.__version__,
            "torch": torch.__version__,
            "matplotlib": version("matplotlib"),
        },
        "device": device_description(settings.device)
        if settings.device == "cpu"
        else f"cuda: {torch.cuda.get_device_name()}",
        "seconds": seconds,
        "runs": runs,
    }
    for run in runs:
        run["final"]["ratio_to_unigram"] = run["final"]["validation_bits_per_byte"] / baseline
    path = directory / "report.json"
    path.write_text(json.dumps(report, indent=1, allow_nan=False))
    return path


def plot(directory: Path, runs: list[dict], baseline: float) -> list[Path]:
    """validation.png (bits per byte of x̄ against tokens seen) and consensus.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.5, 4), constrained_layout=True)
    for run in runs:
        axes.plot(
            run["curves"]["eval_tokens"],
            run["curves"]["validation_bits_per_byte"],
            label=_legend(run),
        )
    axes.axhline(baseline, color="grey", linestyle="--", label="unigram baseline")
    axes.set(title="mean model x̄: validation bits per byte", xlabel="tokens seen (all workers)", ylabel="bits per byte")
    axes.legend(fontsize=8)
    paths = [save_figure(figure, directory / "validation.png")]
    figure, axes = plt.subplots(figsize=(6.5, 4), constrained_layout=True)
    for run in runs:
        distance = np.maximum(np.asarray(run["curves"]["consensus_distance"]), 1e-30)
        axes.plot(run["curves"]["tokens"], distance, label=_legend(run))
    axes.set(title="consensus distance  mean‖xᵢ − x̄‖²", xlabel="tokens seen (all workers)", yscale="log")
    axes.legend(fontsize=8)
    paths.append(save_figure(figure, directory / "consensus.png"))
    if any(run["diagnostics"] is None for run in runs):  # --compare communication
        figure, axes = plt.subplots(figsize=(6.5, 4), constrained_layout=True)
        for run in runs:
            sent = np.maximum(np.asarray(run["curves"]["bytes_per_worker"]), 1.0)
            (line,) = axes.plot(sent, run["curves"]["validation_bits_per_byte"], alpha=0.6)
            axes.plot(
                max(run["communication"]["bytes_per_worker"], 1.0),
                run["final"]["validation_bits_per_byte"],
                "o",
                color=line.get_color(),
                label=run["label"],
            )
        axes.axhline(baseline, color="grey", linestyle="--", label="unigram baseline")
        axes.set(
            title="mean model x̄ over training: validation bits per byte against bytes sent",
            xlabel="bytes sent per worker",
            ylabel="bits per byte",
            xscale="log",
        )
        axes.legend(fontsize=8)
        paths.append(save_figure(figure, directory / "communication.png"))
    return paths


def _legend(run: dict) -> str:
    """A run's name in the plots: its label in a comparison, else its topology and order."""
    if run["diagnostics"] is None:  # --compare communication or outer
        return run["label"]
    return f"{run['topology']} · {run['order'].upper()}"


def summary_table(runs: list[dict], baseline: float) -> Any:
    """Fits 80 columns; κ and the standard errors' details are in report.json."""
    from rich import box
    from rich.table import Table

    table = Table(
        title=f"mean model x̄ on the held-out files; unigram baseline {baseline:.3f} bits/byte",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    if any(run["diagnostics"] is None for run in runs):  # --compare communication
        dense = max(run["communication"]["bytes_per_worker"] for run in runs)
        for column in ("run", "bits/byte", "× unigram", "consensus", "MB sent", "fewer bytes"):
            table.add_column(column, justify="left" if column == "run" else "right", no_wrap=True)
        for run in runs:
            final, sent = run["final"], run["communication"]["bytes_per_worker"]
            table.add_row(
                run["label"],
                f"{final['validation_bits_per_byte']:.3f}",
                f"{final['validation_bits_per_byte'] / baseline:.3f}",
                f"{final['consensus_distance']:.2g}",
                f"{sent / 1e6:.1f}",
                f"{dense / sent:.1f}×" if sent else "",
            )
        return table
    for column in ("topology", "order", "bits/byte", "× unigram", "consensus", "noise\nA_norm", "consensus\nA_norm"):
        table.add_column(column, justify="left" if column in ("topology", "order") else "right", no_wrap=True)
    for run in runs:
        final, found = run["final"], run["diagnostics"]
        table.add_row(
            run["topology"],
            run["order"].upper(),
            f"{final['validation_bits_per_byte']:.3f}",
            f"{final['validation_bits_per_byte'] / baseline:.3f}",
            f"{final['consensus_distance']:.2g}",
            format_estimate(found["noise"]["a_norm"]),
            format_estimate(found["consensus"]["a_norm"]),
        )
    return table


# -- entry point ----------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    try:
        import torch
    except ImportError:
        fail('--task lm needs torch: pip install "steadystep[torch]" (or torch itself)')
    settings = parse(argv)
    require_extras()
    rank, settings = start_backend(settings, argv)
    directory = prepare_output(settings.output_dir) if rank == 0 else Path(settings.output_dir)
    from rich.console import Console

    from steadystep import lm

    console = Console(stderr=True, quiet=rank != 0)
    results = Console(width=None if sys.stdout.isatty() else 80, quiet=rank != 0)
    started = time.perf_counter()
    corpus = lm.stdlib_corpus(settings.seed, settings.validation_files)
    validation = corpus.validation[: settings.validation_bytes]
    final_windows = lm.windows(validation, settings.context)
    evaluation = lm.windows(validation, settings.context, settings.eval_windows)
    baseline = lm.unigram_bits_per_byte(final_windows[:, 1:].astype(np.uint8).tobytes())
    torch.manual_seed(settings.seed)
    template = lm.ByteTransformer(settings.context, settings.width, settings.layers, settings.heads)
    template = template.to(device=settings.device, dtype=getattr(torch, settings.dtype))
    parameters = sum(p.numel() for p in template.parameters())
    console.print(
        f"[bold]steadystep demo --task lm[/]: {settings.workers} workers · byte transformer "
        f"({settings.layers}×{settings.width}, {parameters:,} parameters) · stdlib .py files "
        f"({len(corpus.train) / 1e6:.2f} MB train / {len(validation) / 1e6:.2f} MB validation) · "
        f"{settings.steps} steps × {settings.tokens_per_step:,} tokens × {len(settings.configurations)} "
        f"configurations · {settings.device}"
        + (f" · torch.distributed backend, rank 0 of {settings.workers}" if settings.backend != "local" else "")
    )
    runs = train_each(
        settings,
        console,
        rank,
        "{task.fields[loss]:.3f} bits/byte",
        lambda topology, order, report: train(
            settings, corpus, template, evaluation, final_windows, topology, order, report
        ),
    )
    if runs is None:
        return 1
    if rank != 0:
        return 0
    seconds = time.perf_counter() - started
    results.print(summary_table(runs, baseline))
    report = write_report(
        directory, settings, corpus, parameters, baseline, int(final_windows[:, 1:].size), runs, seconds
    )
    pictures = plot(directory, runs, baseline)
    headline = next((run for run in runs if (run["topology"], run["order"]) == HEADLINE), runs[0])
    results.print(f"sample from x̄ ({headline['topology']} {headline['order'].upper()}):")
    results.print(headline["sample"], markup=False, highlight=False, soft_wrap=True)
    results.print(
        f"mean model, {headline['topology']} {headline['order'].upper()}: "
        f"[bold]{headline['final']['validation_bits_per_byte']:.3f}[/] bits/byte = "
        f"{headline['final']['validation_bits_per_byte'] / baseline:.3f} × unigram · wrote {report} and "
        f"{', '.join(path.name for path in pictures)} · {time.perf_counter() - started:.1f} s"
    )
    return 0
