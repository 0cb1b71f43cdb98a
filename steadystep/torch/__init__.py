"""``torch.optim.Optimizer`` drop-ins that step a whole model in one fused launch.

Import this module explicitly (``import steadystep.torch``); ``import steadystep`` never
imports torch.

>>> import torch, steadystep.torch
>>> model = torch.nn.Linear(4, 2)
>>> optimizer = steadystep.torch.AdamW(model.parameters(), lr=1e-3)
>>> model(torch.ones(3, 4)).sum().backward()
>>> optimizer.step(); optimizer.zero_grad()

On construction each parameter group's tensors are moved into one flat arena (per
device and dtype): ``p.data`` and ``p.grad`` become views of it, so autograd accumulates
straight into the arena and a step is one launch over every parameter. Each view keeps its
parameter's memory format (``channels_last`` stays so, also when set after construction).
The optimizer state uses torch's names (``exp_avg``, ``exp_avg_sq``, ``momentum_buffer``,
``step``...) as views of state arenas, so ``state_dict()``/``load_state_dict()`` round-trip
with torch's, and a copy of the optimizer object itself (``copy.deepcopy``, pickle,
``torch.save``) packs arenas of its own and continues as the original would.

What torch reads at every step, a step here reads too: a parameter given new storage
(``p.data = ...``, ``model.double()``, ``model.to("cuda")``) is brought back into the arena,
its state converted with it; a group whose ``params`` list was edited (appended to, popped,
reordered or replaced) is packed again; a state changed by hand (a buffer replaced,
``optimizer.state.clear()`` to restart, a count set) is read again. A model shared with
other processes after the optimizer was built (``model.share_memory()``) moves its arena into
shared memory, where steps keep writing; parameters already shared are refused (packing
would move them out of the other processes' sight: use torch.optim for Hogwild-style
training). A lazy module's parameters (``nn.LazyLinear``) may be given before its first
forward: the group is packed at the first step that finds them materialised. A frozen parameter
(``requires_grad=False``) is kept out of the arena and never stepped, as torch skips it;
freezing or unfreezing one packs the group again. Each parameter keeps its own step count,
as in torch: one unfrozen, added or reset mid-run counts from its first step (and starts
SGD's momentum buffer there); a group whose counts differ steps in runs of consecutive
parameters that share one (one launch each). A parameter whose gradient is None (never
computed, or set to None by ``model.zero_grad()`` or ``zero_grad(set_to_none=True)``) is
left alone, as torch leaves it: the group steps in one launch and that parameter's
elements, count and unstarted buffers are put back after it.

Differences from torch.optim, by design: ``zero_grad()`` defaults to ``set_to_none=False`` (torch's
to True): it zeroes the gradient arena, so the gradients stay arena views that autograd adds into,
and a parameter that then receives no gradient steps with a zero one, as under torch's
``zero_grad(set_to_none=False)``; pass ``set_to_none=True`` for models whose parameters are used
only some steps. A sparse gradient (``nn.Embedding(sparse=True)``) is added into the dense gradient
arena, so every optimizer takes it and steps as for the dense embedding (torch's Adam, AdamW and
RMSprop refuse sparse gradients). A parameter listed twice in a group is refused (torch steps it
twice per step, and warns that this will become an error). Under ``ZeroRedundancyOptimizer`` keep
``parameters_as_bucket_view=False`` (its default): its bucket views are moved back into the arena at
the first step, and it would broadcast stale buckets. The constructors take torch's arguments:
``foreach`` and ``fused`` change nothing (every step is fused), ``capturable=True`` and
``differentiable=True`` are refused. Step hooks and the profiler's ``Optimizer.step#...`` range work
as in torch; with neither in use, a step skips torch's wrapper around it (BENCHMARKS.md). Under
``torch.compile`` a step runs eagerly (a graph break).
"""

# by name for type checkers; the star brings the drop-ins made by optim.fused_step too
from steadystep.torch.optim import LARS, SGD, Adagrad, Adam, AdamW, Lion, RMSprop  # noqa: F401
from steadystep.torch.optim import *  # noqa: F403
from steadystep.torch.optim import DROP_INS
from steadystep.torch.low_bit import (
    Adagrad4bit,
    Adagrad8bit,
    Adam4bit,
    Adam8bit,
    AdamW4bit,
    AdamW8bit,
    Lion4bit,
    Lion8bit,
    RMSprop4bit,
    RMSprop8bit,
    SGD4bit,
    SGD8bit,
)

__all__ = [
    *DROP_INS,
    "Adagrad8bit",
    "Adam8bit",
    "AdamW8bit",
    "Lion8bit",
    "RMSprop8bit",
    "SGD8bit",
    "Adagrad4bit",
    "Adam4bit",
    "AdamW4bit",
    "Lion4bit",
    "RMSprop4bit",
    "SGD4bit",
]
