"""``python -m steadystep warmup`` compiles what a job's first steps need: in the warmup's
process the job then takes no kernel it did not already hold, and a process started afterwards,
with the same NUMBA_CACHE_DIR, compiles nothing (Numba's compile events say so)."""

from __future__ import annotations

import inspect

import pytest

from steadystep import optim
from steadystep import warmup as warm
from tests.conftest import SIMULATOR
from tests.helpers import run_python

# A job's first steps: the torch drop-in (a small model, so the serial kernel) with and without
# GradScaler, a large functional AdamW step (the parallel kernel) and a decentralized step.
FIRST_STEPS = """
import torch
import steadystep.torch
from steadystep import decentral, optim

model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
optimizer = steadystep.torch.AdamW(model.parameters(), lr=1e-3)
model(torch.randn(8, 16)).sum().backward()
optimizer.step()
scaler = torch.amp.GradScaler("cpu")
scaler.scale(model(torch.randn(8, 16)).sum()).backward()
scaler.step(optimizer)
scaler.update()
param, grad, exp_avg, exp_avg_sq = (np.full(200_000, value, np.float32) for value in (1.0, 0.5, 0.0, 0.0))
optim.adamw(param, grad, exp_avg, exp_avg_sq, step=1)
rows = np.ones((4, 1000), np.float32)
decentral.DecentralizedAdamW(rows, topology=decentral.one_peer_exponential()).step(np.ones_like(rows))
"""

# Every kernel a process takes, loaded from Numba's cache or compiled (``taken``), and those
# it compiles (``compiled``, from Numba's compile events).
RECORDED = """
import numpy as np
from numba.core import dispatcher, event

taken, compiled = [], []
compile_ = dispatcher.Dispatcher.compile


def take(self, signature):
    held = len(self.overloads)
    entry = compile_(self, signature)
    if len(self.overloads) > held:
        taken.append(self.py_func.__qualname__)
    return entry


dispatcher.Dispatcher.compile = take


class Compiles(event.Listener):
    def on_start(self, e):
        compiled.append(e.data["dispatcher"].py_func.__qualname__)

    def on_end(self, e):
        pass


event.register("numba:compile", Compiles())
"""


@pytest.mark.skipif(SIMULATOR, reason="the CPU cache; the simulator compiles nothing")
def test_after_the_warmup_a_job_compiles_nothing():
    """The warmup runs in the suite's own cache (one that other tests fill), so what it covers
    is read in its own process: after it, the job takes no kernel, loaded or compiled, that the
    warmup had not taken. A second process then shows the cache serves them: it compiles none."""
    pytest.importorskip("torch")
    warmed = run_python(
        RECORDED
        + "from steadystep import warmup\n"
        + "assert warmup.main(['--dtypes', 'float32']) == 0\n"
        + "taken.clear()\n"
        + FIRST_STEPS
        + "print(sorted(set(taken)))\n"
        # the check can fail: a row function the warmup leaves out is taken
        + "from steadystep import numerical_stability\n"
        + "numerical_stability.softmax(np.ones((3, 5), np.float32))\n"
        + "print(sorted(set(taken)))\n",
        timeout=600,
    )
    assert warmed.returncode == 0, warmed.stderr
    assert f"warming up into {warm.cache_directory()}" in warmed.stdout
    assert "torch.AdamW under GradScaler" in warmed.stdout and "decentral.DecentralizedAdamW" in warmed.stdout
    after_warmup, after_softmax = warmed.stdout.strip().splitlines()[-2:]
    assert after_warmup == "[]"
    assert "'softmax_f32_rows'" in after_softmax

    job = run_python(RECORDED + FIRST_STEPS + "print(sorted(set(taken)))\nprint(sorted(set(compiled)))", timeout=600)
    assert job.returncode == 0, job.stderr
    taken, compiled = job.stdout.strip().splitlines()[-2:]
    assert "'adamw_f32_step'" in taken  # it took the kernels: from the cache
    assert compiled == "[]"


# the functions of steadystep.optim that train no parameters (a new optimizer is none of them)
NOT_TRAINING = {
    "accumulate",
    "fused_step",
    "clip_grad_norm",
    "ema",
    "found_nonfinite",
    "step_seed",
    "sum_of_squares",
    "update_loss_scale",
}


# The in-process warmup and the torch-less one in a subprocess compile the same float64 kernels
# into the same cache: on one pytest worker, one after the other, the second loads them.
SAME_CACHE = pytest.mark.xdist_group("warmup_cache")


@SAME_CACHE
def test_warmup_runs_each_job_on_the_target(target):
    seen = []
    warmed = warm.warmup([target], ["float64", "float32"], torch=False, progress=seen.append)
    assert warmed == seen  # progress hears of each job as it finishes
    sizes = [64] if target == "cuda" else [64, 1 << 16]
    names = {job.name for job in warmed}
    assert {
        "optim.adamw",
        "optim.adamw under GradScaler",
        "optim.clip_grad_norm",
        "decentral.DecentralizedAdamW",
    } <= names
    # every functional training step of steadystep.optim, read from the module, not a list
    # kept by hand (one kept by hand had missed optim.lars)
    steps = {name for name in optim.__all__ if inspect.isfunction(getattr(optim, name))} - NOT_TRAINING
    assert {f"optim.{name}" for name in steps} <= names and "optim.lars" in names
    assert not any(name.startswith("torch.") for name in names)  # torch=False
    assert [(job.dtype, job.size) for job in warmed] == [
        (dtype, size) for dtype in ("float64", "float32") for size in sizes for _ in names
    ]
    assert {job.target for job in warmed} == {target}
    assert all(job.seconds >= 0 for job in warmed)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"targets": ["tpu"]}, "targets must be some of cpu, cuda; got tpu"),
        ({"targets": []}, "targets must be some of cpu, cuda; got none"),
        (
            {"dtypes": ["float32", "int8"]},
            "dtypes must be some of float32, float64, bfloat16, float16; got float32, int8",
        ),
    ],
)
def test_bad_choices_are_refused_before_anything_runs(options, message):
    seen = []
    with pytest.raises(ValueError, match=message):
        warm.warmup(**options, progress=seen.append)
    assert seen == []


@pytest.mark.skipif(SIMULATOR, reason="this process has the simulator as its GPU")
def test_cuda_without_a_gpu_says_where_to_run_it():
    from numba import cuda

    if cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="targets include cuda: .* Run the warmup on a GPU node"):
        warm.warmup(["cpu", "cuda"], progress=None)


@SAME_CACHE
@pytest.mark.skipif(SIMULATOR, reason="imports only")
def test_without_torch_half_precision_and_the_drop_ins_are_refused():
    code = """
import sys
sys.modules["torch"] = None  # as if it were not installed
from steadystep.warmup import warmup
for options in ({"torch": True}, {"dtypes": ["bfloat16"], "torch": False}):
    try:
        warmup(**options, progress=None)
    except ModuleNotFoundError as error:
        print(error)
print(len(warmup(dtypes=["float64"], progress=None)))  # torch left out by default: no error
"""
    result = run_python(code, timeout=600)
    assert result.stdout.splitlines() == [
        "warming up the torch drop-ins needs torch: pip install torch, or leave it out",
        "warming up bfloat16 (NumPy has no such dtype) needs torch: pip install torch, or leave it out",
        "26",  # 13 jobs (7 training steps, 3 of them also under GradScaler, clipping, 2 decentralized) × 2 sizes
    ], result.stderr


@pytest.mark.skipif(SIMULATOR, reason="the command line")
def test_the_command_line_reports_bad_choices(capsys):
    assert warm.main(["--targets", "cpu,gpu"]) == 2
    assert "steadystep warmup: error: targets must be some of cpu, cuda; got cpu, gpu" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit:
        warm.main(["--help"])
    assert exit.value.code == 0
    assert "NUMBA_CACHE_DIR" in capsys.readouterr().out
