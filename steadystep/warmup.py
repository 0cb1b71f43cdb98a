"""Compile the common kernels ahead of a job, into Numba's on-disk cache.

``python -m steadystep warmup`` (or [`warmup()`][steadystep.warmup.warmup]) runs every optimizer step once on tiny
arrays of each asked dtype, on each asked target: the functional steps of
[`steadystep.optim`][steadystep.optim] (plain and with GradScaler's scale and flag), the torch drop-ins of
[`steadystep.torch`][steadystep.torch] when torch is installed (plain and under ``torch.amp.GradScaler``),
gradient clipping and the decentralized step. On the CPU each runs at two sizes, as a call
from ``PARALLEL_MIN`` elements also runs the launch of its loop's parts at once (and the
parallel sums of squares). A process started
afterwards finds these kernels compiled and loads them, instead of compiling on its first step.

Numba keeps its cache beside the package's files (``__pycache__``), or in the user's cache
directory when those are read-only; ``NUMBA_CACHE_DIR`` puts it anywhere. For containers and
clusters: set ``NUMBA_CACHE_DIR`` to a directory every node reads, run the warmup once (on a
node of the same CPU type: the CPU kernels are compiled for the host's CPU; on a GPU node for
the CUDA kernels), and keep the package at the same path on every node (the cache is keyed by
the source files' paths and modification times, so a reinstall makes it compile again).

>>> from steadystep.warmup import warmup
>>> warmed = warmup(dtypes=["float32"], torch=False)
>>> [(job.name, job.dtype, job.size) for job in warmed][:2]
[('optim.adagrad', 'float32', 64), ('optim.adam', 'float32', 64)]
"""

from __future__ import annotations

import inspect

import argparse
import importlib.util
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from steadystep import decentral, optim
from steadystep.arena import Layout
from steadystep.cuda.runtime import require_cuda

__all__ = ["DTYPES", "TARGETS", "Warmed", "cache_directory", "main", "warmup"]

TARGETS = ("cpu", "cuda")
DTYPES = ("float32", "float64", "bfloat16", "float16")
HALF = ("bfloat16", "float16")


@dataclass(frozen=True)
class Warmed:
    """One job of the warmup: what ran, where, in which dtype, on how many elements, and the
    seconds it took (compilation or loading from the cache included)."""

    name: str
    target: str
    dtype: str
    size: int
    seconds: float


def cache_directory() -> str:
    """Where Numba reads and writes its cache in this process."""
    from numba.core import config

    if config.CACHE_DIR:
        return str(config.CACHE_DIR)
    return "beside the package's files (__pycache__), or the user's cache directory if those are read-only"


class _Arrays:
    """Arrays of one dtype on one target: NumPy (or Numba device arrays) for float32 and float64,
    torch tensors for half precision (NumPy has no bfloat16)."""

    def __init__(self, target: str, dtype: str):
        self.target, self.dtype = target, dtype
        if dtype in HALF:
            import torch

            self.torch = torch
            self.device = "cuda" if target == "cuda" else "cpu"

    def full(self, size: int, value: float) -> Any:
        if self.dtype in HALF:
            return self.torch.full((size,), value, dtype=getattr(self.torch, self.dtype), device=self.device)
        host = np.full(size, value, np.dtype(self.dtype))
        return require_cuda().to_device(host) if self.target == "cuda" else host

    def scalar(self, value: float) -> Any:
        """GradScaler's scale or flag: float32 beside half-precision parameters, as in torch."""
        if self.dtype in HALF:
            return self.torch.full((1,), value, dtype=self.torch.float32, device=self.device)
        return self.full(1, value)


# What a warm call of a functional step takes beyond (param, grad, its required state): the
# options that reach its common kernel, and the optional state those options use. Every other
# training step of optim.__all__ runs with its defaults (test_warmup checks that none is missed).
_OPTIONS: dict[str, dict[str, Any]] = {
    "sgd": {"step": 1, "momentum": 0.9},
    "adam": {"step": 1},
    "adamw": {"step": 1},
    "adagrad": {"step": 1},
    "lars": {"lr": 1e-3, "momentum": 0.9},
}
_OPTIONAL_STATE = {"sgd": ("momentum_buffer",), "lars": ("momentum_buffer",)}
_UNDER_GRADSCALER = ("sgd", "adam", "adamw")  # the steps torch's GradScaler is most used with


def _training_steps() -> list[str]:
    """The functional training steps of steadystep.optim: those taking (param, grad, ...)."""
    return [
        name
        for name in optim.__all__
        if callable(getattr(optim, name))
        and list(inspect.signature(getattr(optim, name)).parameters)[:2] == ["param", "grad"]
    ]


def _state(name: str) -> int:
    """How many state arrays the warm call of ``name`` passes after (param, grad)."""
    parameters = list(inspect.signature(getattr(optim, name)).parameters.values())[2:]
    required = [p for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty]
    return len(required) + len(_OPTIONAL_STATE.get(name, ()))


def _functional_steps(arrays: _Arrays, size: int) -> dict[str, Callable[[], Any]]:
    def plain(function: Callable[..., None], count: int, **options: Any) -> Callable[[], None]:
        def run() -> None:
            state = [arrays.full(size, 0.0) for _ in range(count)]
            function(arrays.full(size, 1.0), arrays.full(size, 0.25), *state, **options)

        return run

    def scaled(function: Callable[..., None], count: int, **options: Any) -> Callable[[], None]:
        """Also the variant that reads GradScaler's inverse scale and found-inf flag."""
        return plain(function, count, grad_scale=arrays.scalar(0.5), found_inf=arrays.scalar(0.0), **options)

    jobs: dict[str, Callable[[], Any]] = {}
    for name in _training_steps():
        options = dict(_OPTIONS.get(name, {}))
        if name == "lars":  # one tensor: the trust ratio's per-tensor norms over the whole row
            options["layout"] = Layout.whole(size)
        function, count = getattr(optim, name), _state(name)
        jobs[f"optim.{name}"] = plain(function, count, **options)
        if name in _UNDER_GRADSCALER:
            jobs[f"optim.{name} under GradScaler"] = scaled(function, count, **options)
    jobs["optim.clip_grad_norm"] = lambda: optim.clip_grad_norm(arrays.full(size, 0.25), 1.0)
    return jobs


def _torch_steps(arrays: _Arrays, size: int) -> dict[str, Callable[[], Any]]:
    import torch

    import steadystep.torch as drop_ins
    from steadystep.torch.optim import DROP_INS

    dtype = getattr(torch, arrays.dtype)
    device = "cuda" if arrays.target == "cuda" else "cpu"

    def run(name: str, scaler: bool) -> Callable[[], None]:
        def steps() -> None:
            parameter = torch.nn.Parameter(torch.ones(size, dtype=dtype, device=device))
            optimizer = getattr(drop_ins, name)([parameter], lr=1e-3)
            parameter.grad = torch.full_like(parameter, 0.25)
            optimizer.step()
            if scaler:
                grad_scaler = torch.amp.GradScaler(device, init_scale=2.0)
                grad_scaler.scale(parameter.sum()).backward()
                grad_scaler.step(optimizer)
                grad_scaler.update()

        return steps

    # the float32-state drop-ins (the 8-bit ones keep float32 moments below 4096 elements)
    jobs = {f"torch.{name}": run(name, scaler=False) for name in DROP_INS}
    if arrays.dtype not in HALF:  # GradScaler unscales float32 and float64 gradients only
        for name in ("SGD", "Adam", "AdamW"):
            jobs[f"torch.{name} under GradScaler"] = run(name, scaler=True)
    return jobs


def _decentralized_steps(arrays: _Arrays, size: int) -> dict[str, Callable[[], Any]]:
    workers = 4
    width = max(1, size // workers)

    def run(**options: Any) -> Callable[[], None]:
        def step() -> None:
            rows = arrays.full(workers * width, 1.0)
            grads = arrays.full(workers * width, 0.25)
            optimizer = decentral.DecentralizedAdamW(
                rows.reshape(workers, width), topology=decentral.one_peer_exponential(), **options
            )
            optimizer.step(grads.reshape(workers, width))

        return step

    return {"decentral.DecentralizedAdamW": run(), "decentral.DecentralizedAdamW with max_norm": run(max_norm=1.0)}


def _torch_on_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _sizes(target: str) -> list[int]:
    """The sizes a target's calls take different code at: the CPU's whole loop in one call
    below PARALLEL_MIN elements and its parts at once from there; one kernel on a GPU."""
    if target == "cuda":
        return [64]
    from steadystep.cpu.backend import PARALLEL_MIN

    return [64, PARALLEL_MIN]


def _check(asked: Iterable[str], known: Sequence[str], name: str) -> list[str]:
    chosen = list(dict.fromkeys(asked))
    unknown = [value for value in chosen if value not in known]
    if unknown or not chosen:
        raise ValueError(f"{name} must be some of {', '.join(known)}; got {', '.join(chosen) or 'none'}")
    return chosen


def warmup(
    targets: Iterable[str] = ("cpu",),
    dtypes: Iterable[str] = ("float32",),
    *,
    torch: Optional[bool] = None,
    progress: Optional[Callable[[Warmed], None]] = None,
) -> list[Warmed]:
    """Run the common steps once per target, dtype and size, so that their kernels are
    compiled into Numba's cache ([`cache_directory()`][steadystep.warmup.cache_directory]); returns what ran, with
    its seconds.

    ``targets``: "cpu" and/or "cuda" (a GPU must be present: the CUDA kernels are compiled
    for it). ``dtypes``: float32, float64, bfloat16, float16 (half precision needs torch).
    ``torch``: also the torch drop-ins (default: when torch is installed). ``progress``, when given, is
    called with each finished job.
    """
    targets = _check(targets, TARGETS, "targets")
    dtypes = _check(dtypes, DTYPES, "dtypes")
    has_torch = importlib.util.find_spec("torch") is not None
    if torch is None:
        torch = has_torch
    if (torch or set(dtypes) & set(HALF)) and not has_torch:
        needs = "the torch drop-ins" if torch else f"{', '.join(set(dtypes) & set(HALF))} (NumPy has no such dtype)"
        raise ModuleNotFoundError(f"warming up {needs} needs torch: pip install torch, or leave it out")
    if "cuda" in targets:
        try:
            require_cuda()
        except RuntimeError as error:
            raise RuntimeError(
                f"targets include cuda: {error} Run the warmup on a GPU node (the CUDA kernels are "
                "compiled for the GPU they run on), or warm up the cpu target only."
            ) from None
        if has_torch and set(dtypes) & set(HALF) and not _torch_on_gpu():
            raise RuntimeError("half precision on the cuda target takes torch CUDA tensors, but torch sees no GPU")
    warmed = []
    for target in targets:
        for dtype in dtypes:
            arrays = _Arrays(target, dtype)
            for size in _sizes(target):
                jobs = {} if dtype in HALF else _functional_steps(arrays, size)
                if torch and (target == "cpu" or _torch_on_gpu()):
                    jobs.update(_torch_steps(arrays, size))
                jobs.update(_decentralized_steps(arrays, size))
                for name, job in jobs.items():
                    start = time.perf_counter()
                    job()
                    done = Warmed(name, target, dtype, size, time.perf_counter() - start)
                    warmed.append(done)
                    if progress is not None:
                        progress(done)
    return warmed


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m steadystep warmup [--targets cpu,cuda] [--dtypes float32,...] [--no-torch]``."""
    parser = argparse.ArgumentParser(
        prog="steadystep warmup",
        description="Compile the common kernels into Numba's cache (NUMBA_CACHE_DIR), so that a job's "
        "first step loads them instead of compiling.",
    )
    parser.add_argument("--targets", default="cpu", help="comma-separated: cpu, cuda (default: cpu)")
    parser.add_argument(
        "--dtypes", default="float32", help="comma-separated: float32, float64, bfloat16, float16 (default: float32)"
    )
    parser.add_argument("--no-torch", action="store_true", help="leave out the torch drop-ins")
    arguments = parser.parse_args(argv)

    def show(job: Warmed) -> None:
        print(f"  {job.target:<4} {job.dtype:<8} {job.size:>7,} {job.name:<44} {job.seconds:6.2f} s", flush=True)

    print(f"warming up into {cache_directory()}")
    start = time.perf_counter()
    try:
        warmed = warmup(
            arguments.targets.split(","),
            arguments.dtypes.split(","),
            torch=False if arguments.no_torch else None,
            progress=show,
        )
    except (ValueError, ModuleNotFoundError, RuntimeError) as error:
        print(f"steadystep warmup: error: {error}", file=sys.stderr)
        return 2
    print(f"{len(warmed)} steps in {time.perf_counter() - start:.1f} s")
    return 0
