"""What both demo jobs share around their training: the command line (one-line errors with
exit code 2, checked argument types, the flags both take), the device, the output directory,
the extras, and the backend that gives one worker per rank under ``mpiexec`` or ``torchrun``."""

from __future__ import annotations

import argparse
import atexit
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, ClassVar, Optional, Protocol, TypeVar

import numpy as np

__all__ = [
    "BACKENDS",
    "LAUNCHERS",
    "ORDERS",
    "TOPOLOGIES",
    "COMPARED",
    "Job",
    "Launch",
    "Parser",
    "add_training_flags",
    "checked",
    "chosen_device",
    "cuda_driver_present",
    "fail",
    "free_port",
    "non_negative_float",
    "not_installed",
    "on_device",
    "positive_float",
    "positive_int",
    "prepare_output",
    "rank_of",
    "requested_task",
    "require_extras",
    "settled",
    "start_backend",
    "train_each",
]

# the flags' names of the topologies and mixing orders both jobs train with
TOPOLOGIES = {
    "complete": "complete",
    "one-peer-exp": "one_peer_exponential",
    "ring": "ring",
    "directed-ring": "directed_ring",
}
COMPARED = ("complete", "one-peer-exp", "ring")  # what "--topology all" compares
ORDERS = {"awc": ("awc",), "atc": ("atc",), "both": ("awc", "atc")}


class Parser(argparse.ArgumentParser):
    """argparse with errors as one line and exit code 2 (no usage dump, no traceback)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        fail(message)


def fail(message: str) -> None:
    print(f"steadystep demo: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def checked(convert: Any, accept: Any, requirement: str) -> Any:
    """An argparse type: ``convert`` the text, then refuse values ``accept`` rejects."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {requirement}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"must be {requirement}, got {text}")
        return value

    return parse


positive_int = checked(int, lambda value: value >= 1, "at least 1")


positive_float = checked(float, lambda value: value > 0 and math.isfinite(value), "a positive finite number")


non_negative_float = checked(float, lambda value: value >= 0 and math.isfinite(value), "a non-negative finite number")


def add_training_flags(build: argparse.ArgumentParser, defaults: Any, warmup: str) -> None:
    """The flags both jobs take, with their defaults from the job's settings (``warmup``: how
    the job counts its warmup steps)."""
    add = build.add_argument
    add(
        "--workers",
        type=positive_int,
        default=defaults.workers,
        help="simulated workers N (with --backend mpi or torch: the ranks)",
    )
    add(
        "--order",
        choices=list(ORDERS),
        default=defaults.order,
        help="awc: mix, then step from the mixed model; atc: step, then mix; both: run each",
    )
    add("--steps", type=positive_int, default=defaults.steps, help="training steps per configuration")
    add("--lr", type=positive_float, default=defaults.lr, help="peak learning rate")
    add("--min-lr", type=non_negative_float, default=defaults.min_lr, help="learning rate at the end of the cosine")
    add("--warmup", type=int, default=defaults.warmup, help=f"linear warmup steps ({warmup})")
    add("--max-norm", type=non_negative_float, default=defaults.max_norm, help="per-worker clipping norm (0: off)")
    add("--weight-decay", type=non_negative_float, default=defaults.weight_decay, help="AdamW weight decay (matrices)")
    add("--dtype", choices=["float32", "float64"], default=defaults.dtype, help="parameter dtype")
    add(
        "--state-bits",
        type=int,
        choices=[32, 8, 4],
        default=defaults.state_bits,
        help="the AdamW moments: float (32), blockwise 8-bit codes with a float32 scale per 256 (8) or 4-bit "
        "codes with one per 128 (4); quantized: in one process, float32 parameters",
    )
    add("--seed", type=int, default=defaults.seed, help="seed of the data split, the model, minibatches and probes")
    add(
        "--noise-samples",
        type=positive_int,
        default=defaults.noise_samples,
        help="minibatch gradients for the noise alignment",
    )
    add("--probes", type=positive_int, default=defaults.probes, help="Rademacher vectors for the isotropic reference")
    add("--output-dir", default=defaults.output_dir, help="where report.json and the plots go")


def train_each(
    settings: Any, console: Any, rank: int, loss_column: str, train: Callable[[str, str, Callable[[float], Any]], dict]
) -> Optional[list[dict]]:
    """``train(topology, order, report)`` for each of the settings' configurations, under one
    progress bar each on rank 0 (``loss_column`` formats ``report``'s loss); the runs, or None
    when training diverged (said on ``console``)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from steadystep import decentral

    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(loss_column),
        TimeRemainingColumn(),
    ]
    runs = []
    with Progress(*columns, console=console, disable=not settings.progress or rank != 0) as progress:
        for topology, order in settings.configurations:
            task = progress.add_task(f"{topology:>12} {order.upper()}", total=settings.steps, loss=float("nan"))

            def report(loss: float, task: Any = task) -> None:
                progress.update(task, advance=1, loss=loss)

            try:
                runs.append(train(topology, order, report))
            except decentral.NonFiniteGradientError as error:
                console.print(f"[red]training diverged[/]: {error} (try a smaller --lr or --max-norm)")
                return None
    return runs


def settled(build: argparse.ArgumentParser, argv: list[str], **absent: Any) -> dict[str, Any]:
    """The flags both jobs share, checked: ``absent`` fills flags left out (argparse's
    SUPPRESS), --warmup must be ≥ 0, --max-norm 0 means no clipping."""
    arguments = {"progress": True, **absent, **vars(build.parse_args(argv))}
    del arguments["task"]
    if arguments["warmup"] < 0:
        fail(f"--warmup must be non-negative, got {arguments['warmup']}")
    if arguments["max_norm"] == 0.0:
        arguments["max_norm"] = None
    if arguments["state_bits"] != 32 and (
        arguments.get("backend", "local") != "local" or arguments["dtype"] != "float32"
    ):
        fail(
            f"--state-bits {arguments['state_bits']} runs in one process with float32 parameters: leave out "
            "--backend and --dtype"
        )
    return arguments


def chosen_device(choice: str) -> str:
    if choice == "cpu" or (choice == "auto" and not cuda_driver_present()):
        return "cpu"
    try:
        from steadystep.cuda.runtime import require_cuda

        usable = require_cuda().is_available()
    except Exception as error:  # no numba-cuda, no driver: only an error when asked for explicitly
        if choice == "cuda":
            fail(
                f"--device cuda: the CUDA target is not usable here ({error}); "
                "install steadystep[cuda] on a GPU machine"
            )
        return "cpu"
    if choice == "cuda" and not usable:
        fail("--device cuda: no usable GPU found (try --device cpu)")
    return "cuda" if usable else "cpu"


def cuda_driver_present() -> bool:
    """Whether a GPU could be here, without importing Numba's CUDA support (~0.8 s, a tenth
    of a warm demo, on the many machines without one): the simulator, a driver Numba was
    pointed at, or the CUDA driver library on the loader's path."""
    import ctypes.util

    from numba import config

    if config.ENABLE_CUDASIM or os.environ.get("NUMBA_CUDA_DRIVER"):
        return True
    return any(ctypes.util.find_library(name) for name in ("cuda", "nvcuda"))


def prepare_output(path: str) -> Path:
    directory = Path(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / ".steadystep-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        fail(f"--output-dir {path!r} is not writable ({error.strerror or error})")
    return directory


def require_extras() -> None:
    missing = [name for name in ("sklearn", "matplotlib", "rich") if not_installed(name)]
    if missing:
        fail(f'the demo needs {", ".join(missing)}: pip install "steadystep[demo]"')


def not_installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is None


def requested_task(argv: list[str]) -> str:
    """The --task the command line asks for (digits unless it says lm)."""
    for index, word in enumerate(argv):
        if word == "--task" and index + 1 < len(argv):
            return argv[index + 1]
        if word.startswith("--task="):
            return word.split("=", 1)[1]
    return "digits"


BACKENDS = {"mpi": "MPI", "torch": "torch.distributed"}


LAUNCHERS = {
    "mpi": "mpiexec -n 8 python -m steadystep demo --backend mpi",
    "torch": "torchrun --nproc-per-node 8 -m steadystep demo --backend torch",
}


class Launch(Protocol):
    """What `start_backend()` reads of a job's settings (the digits job's and the language model's):
    a dataclass."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def backend(self) -> str: ...

    @property
    def workers(self) -> int: ...

    @property
    def device(self) -> str: ...


Job = TypeVar("Job", bound=Launch)


def start_backend(settings: Job, argv: list[str]) -> tuple[int, Job]:
    """With one worker per rank, the world size is the worker count (the --workers flag must
    agree or be left alone)."""
    if settings.backend == "local":
        return 0, settings
    if settings.backend == "mpi":
        try:
            from mpi4py import MPI
        except ImportError:
            fail('--backend mpi needs mpi4py: pip install "steadystep[mpi]" and run under mpiexec -n N')
        size = MPI.COMM_WORLD.Get_size()
        from steadystep.decentral.mpi import local_rank
    else:
        import torch.distributed as dist

        from steadystep.torch.distributed import local_rank  # type: ignore[assignment]

        if not dist.is_initialized():
            if "RANK" not in os.environ:  # not started by torchrun: a world of one
                os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
            # GPU rows travel over NCCL, zero-copy; the settings and reports over gloo
            dist.init_process_group("cpu:gloo,cuda:nccl" if settings.device == "cuda" else "gloo")
            # left before the interpreter exits: gloo's threads still running then abort the process
            atexit.register(dist.destroy_process_group)
        size = dist.get_world_size()
    launcher = "mpiexec" if settings.backend == "mpi" else "torchrun"
    if any(word.startswith("--workers") for word in argv) and settings.workers != size:
        fail(f"--workers {settings.workers} but {launcher} started {size} ranks; they must agree")
    if size == 1:  # started without a launcher, most likely: one worker trains alone, and mixing does nothing
        print(
            f"warning: --backend {settings.backend} with one {BACKENDS[settings.backend]} rank: one worker trains "
            f"alone, with no one to mix with. Start it with one rank per worker: {LAUNCHERS[settings.backend]}",
            file=sys.stderr,
        )
    if settings.device == "cuda":  # one GPU per rank on each machine, not all on its first
        from steadystep.cuda.runtime import require_cuda

        cuda = require_cuda()
        cuda.select_device(local_rank() % len(cuda.gpus))
        if settings.backend == "torch":
            import torch

            torch.cuda.set_device(local_rank() % torch.cuda.device_count())
    from dataclasses import replace

    settings = replace(settings, workers=size)
    return rank_of(settings.backend), settings


def rank_of(backend: str) -> int:
    """This process's rank (0 for the local backend)."""
    if backend == "mpi":
        from mpi4py import MPI

        return MPI.COMM_WORLD.Get_rank()
    if backend == "torch":
        import torch.distributed as dist

        return dist.get_rank()
    return 0


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def on_device(device: str, arrays: dict) -> dict:
    """The training data, moved to the GPU once (the kernels then read it zero-copy)."""
    if device == "cpu":
        return arrays
    from steadystep.cuda.runtime import require_cuda

    cuda = require_cuda()
    return {name: cuda.to_device(np.ascontiguousarray(value)) for name, value in arrays.items()}
