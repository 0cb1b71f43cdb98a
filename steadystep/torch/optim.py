"""The torch.optim drop-ins, one class each (SGD, Adam, AdamW, RMSprop, Adagrad, LARS, Lion),
over the base class they share: the arena each parameter group is packed into, the state
torch.optim's scripts and schedulers read, and one fused launch a step. What they do, and how
to use them: [`steadystep.torch`][steadystep.torch]."""

from __future__ import annotations

import functools
import importlib
import inspect
import itertools
import operator
import sys
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Optional, cast

import numpy as np

try:
    import torch
except ImportError as error:  # not a dependency of steadystep itself
    raise ImportError(
        "steadystep.torch needs torch: pip install 'steadystep[torch]' (or torch itself, CPU or CUDA build)"
    ) from error

from steadystep import _arrays, _html, checks, optim
from steadystep._bookkeeping import Parameters, ParameterState, Runs, State
from steadystep.arena import Arena, Layout


_NON_NEGATIVE = (
    "lr",
    "eps",
    "weight_decay",
    "momentum",
    "alpha",
    "lr_decay",
    "initial_accumulator_value",
    "trust_coefficient",
)
_FLAGS = ("maximize", "amsgrad", "centered", "nesterov", "stochastic_rounding")
_CHECKED = _NON_NEGATIVE + _FLAGS + ("betas", "dampening")  # what _check_options reads


def _outside(tensors: list[Any], arena: Arena) -> list[int]:
    """Indices of ``tensors`` that are None or no longer live at their place in ``arena`` (given
    new storage since packing). Empty tensors hold nothing to lose (and report any address).

    Runs twice per step over every tensor of a group: the common answer (all in place) is one
    list comparison of the data pointers, read by a C-level map (faster than checking each in
    Python)."""
    places = _places(arena)
    try:
        if list(map(_DATA_POINTER, tensors)) == places:
            return []
    except (TypeError, RuntimeError):  # a None among them, or a sparse gradient (no storage)
        pass
    return [
        index
        for index, (tensor, place) in enumerate(zip(tensors, places))
        if tensor is None or tensor.layout is not torch.strided or (tensor.data_ptr() != place and tensor.numel())
    ]


def _places(arena: Arena) -> list[int]:
    """The data pointer at which each tensor of ``arena`` starts. An arena's buffer moves only
    with its storage, views and all: ``model.share_memory()`` (or handing the model to
    another process) moves it into shared memory, where the parameters stay its views."""
    base = arena.buffer.data_ptr()
    kept = _PLACES.get(arena)
    if kept is None or kept[0] != base:
        itemsize = arena.buffer.element_size()
        kept = _PLACES[arena] = base, [base + offset * itemsize for offset in arena.layout.offsets]
    return kept[1]


_PLACES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_DATA_POINTER = torch.Tensor.data_ptr
_GRAD = operator.attrgetter("grad")
_REQUIRES_GRAD = operator.attrgetter("requires_grad")
_IS_LAZY = torch.nn.parameter.is_lazy


def _copy_gradient(view: Any, gradient: Any) -> None:
    if gradient.layout is torch.strided:
        view.copy_(gradient)
    else:  # a sparse gradient (an Embedding's, sparse=True): added into the dense arena
        view.zero_().add_(gradient)


def _indices(indices: list[int]) -> str:
    shown = ", ".join(map(str, indices[:5])) + (", ..." if len(indices) > 5 else "")
    return f"parameter{'s' if len(indices) > 1 else ''} {shown}"


def _eager_under_torch_compile(function: Callable[..., Any]) -> Any:
    """``torch.compiler.disable(function)``, made at the first call that finds torch's compiler
    loaded: the decorator imports ``torch._dynamo`` (seconds), and no program that has not
    loaded it can be compiling."""
    disabled: list[Callable[..., Any]] = []

    @functools.wraps(function)
    def step_eagerly(*args: Any, **kwargs: Any) -> Any:
        if "torch._dynamo" not in sys.modules:
            return function(*args, **kwargs)
        if not disabled:
            disabled.append(torch.compiler.disable(function))
        return disabled[0](*args, **kwargs)

    return step_eagerly


@dataclass
class _GroupState:
    """What an optimizer keeps of one parameter group beside torch's own dict."""

    arenas: tuple[Arena, Arena] | None = None  # the parameters' and gradients' (None: nothing to train)
    members: list[Any] = field(default_factory=list)  # the parameters in the arena
    # the group's list as it was packed (kept, so its id stays its own), the list's count of
    # changes, and each parameter's requires_grad flag
    packed_as: tuple[Parameters, int, list[bool]] | None = None
    # the state names the group's options use, the flat state buffers and the step counts, checked
    # once and reused until load_state_dict replaces the state or an option changes the names
    # (checking every view each step cost more than the step), and the runs the counts cut
    checked: tuple[tuple[str, ...], dict[str, Any], np.ndarray, Runs | None] | None = None
    decay_mask: Any = None  # LARS's per-tensor flags, built once
    state_buffers: dict[str, Arena] = field(default_factory=dict)  # the flat buffer behind each state name
    # per state name, which parameters' buffers were made from nothing (no value loaded or kept)
    # and not stepped yet, where any were: torch starts such a buffer from the step's own value
    # (SGD's momentum), parameter by parameter
    new_buffers: dict[str, np.ndarray] = field(default_factory=dict)
    # the runs SGD last cut by those flags, with the layout and flags they came from: a parameter
    # left without a gradient keeps its flag from step to step, and runs cut anew (new views)
    # would have every step validated again
    start_runs: tuple[Any, np.ndarray, Runs | None] | None = None
    # once the group has taken an AMP step: the host counts they replaced, the counts beside the
    # parameters (one per parameter, as each state["step"] is its own tensor in torch) and a view
    # of the first
    counts: tuple[np.ndarray, Any, Any] | None = None
    amp: tuple[Any, Any] | None = None  # GradScaler's inverse scale and flag in the parameters' dtype


def _key(group: dict[str, Any]) -> int:
    """Groups are identified by their list of parameters, which load_state_dict hands on to the
    group dicts it makes; a list replaced (``group["params"] = [...]``) makes a new group."""
    return id(group["params"])


class _FusedOptimizer(torch.optim.Optimizer):
    """Shared machinery: arenas per group, state as arena views, one functional step per group.

    Under ``torch.amp.GradScaler`` a step needs no host synchronisation, as torch's fused
    optimizers: the scaler hands over its scale and found-inf flag instead of reading the flag
    to skip the step, the kernel unscales the gradients as it reads them and changes nothing
    on an overflow, and from then on the group's step counts live beside its parameters,
    advanced on the device only for the steps taken.
    """

    _step_supports_amp_scaling = True  # GradScaler sets self.grad_scale and self.found_inf for step()
    _kernel_advances_count = False  # Adam's kernel advances a count on the device itself (its bias corrections read it)
    _started_buffers: tuple[
        str, ...
    ] = ()  # state that starts otherwise than from zeros (SGD's b ← d): new ones are flagged
    _keeps_count = True  # state["step"] per parameter, as torch's (not SGD's: it keeps none)

    def __init__(
        self,
        params: Iterable[Any],
        defaults: dict[str, Any],
        *,
        stochastic_rounding: bool = False,
        seed: int = 0,
        **implementation_flags: Optional[bool],
    ):
        _check_params(params)
        defaults = {**defaults, "stochastic_rounding": stochastic_rounding, "seed": seed}
        _check_options(defaults)  # as torch's constructors do: a bad value fails here, not at the first step
        _check_implementation_flags(**implementation_flags)
        self._start_bookkeeping()
        super().__init__(params, defaults)

    def _start_bookkeeping(self) -> None:
        """What the optimizer keeps beside torch's own attributes, empty."""
        self._groups: dict[int, _GroupState] = {}  # by _key(group)
        # steps taken by this object, for stochastic rounding's random bits (a resumed run's
        # optimizer counts from 0 again: its bits differ from an uninterrupted run's)
        self._rounding_steps = 0
        self._rounding: Optional[int] = None
        self._state_changes = -1  # self.state's count of changes after the last step (see _adopt_state)
        self._checked_options: list[tuple] = []  # each group's numbers as the last step checked them

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A copy (``copy.deepcopy``, pickle, ``torch.save`` of the optimizer object): torch
        hands over only its defaults, state and groups. The copy packs its own parameters into
        arenas of its own; the state's values are copied in at its first step, as after
        ``load_state_dict``, so it continues as the original would."""
        super().__setstate__(state)
        self._start_bookkeeping()
        for group in self.param_groups:
            self._pack(group)

    # -- arenas -------------------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        params = param_group["params"]
        if not isinstance(params, set):  # torch refuses a set by name
            param_group["params"] = params = [params] if isinstance(params, torch.Tensor) else list(params)
            _check_each_once(params)
        _check_options({**self.defaults, **param_group}, f"param_groups[{len(self.param_groups)}]: ")
        super().add_param_group(param_group)
        self._pack(self.param_groups[-1])

    def _pack(self, group: dict[str, Any]) -> tuple[Arena, Arena] | None:
        """Pack the group's trainable parameters into an arena (None when it has none)."""
        _check_each_once(group["params"])
        if type(group["params"]) is not Parameters:  # from add_param_group, or a list the user put in
            group["params"] = Parameters(group["params"])
            self._forget_replaced_groups()
        held = self._held(group)
        if any(
            map(_IS_LAZY, group["params"])
        ):  # a lazy module's (nn.LazyLinear) before its first forward: no shape yet
            held.packed_as = None  # so the first step that finds them materialised packs the group
            held.members, held.arenas = [], None
            return None
        held.packed_as = group["params"], group["params"].changes, list(map(_REQUIRES_GRAD, group["params"]))
        parameters = held.members = [p for p in group["params"] if p.requires_grad]
        for parameter in group["params"]:
            if not parameter.requires_grad:  # frozen: no gradient, as in torch (a view would keep the old arena alive)
                parameter.grad = None
        # What was built for the old arena goes with it; _flat_state copies the state's
        # current views into buffers laid out like the new one.
        held.checked = held.decay_mask = None
        held.state_buffers.clear()
        if not parameters:
            held.arenas = None
            return None
        kinds: dict[tuple, list[int]] = {}
        for index, parameter in enumerate(parameters):
            if parameter.is_meta:  # deferred initialisation: nothing to pack yet
                raise ValueError(
                    f"parameter {index} of a group is on the meta device; build the optimizer once the "
                    "model holds its values (after to_empty() and its initialisation, or "
                    "load_state_dict(..., assign=True))"
                )
            if parameter.device.type == "cpu" and parameter.is_shared():  # CUDA tensors always say they are
                raise ValueError(
                    f"parameter {index} of a group lives in shared memory (model.share_memory(), or a "
                    "model handed to another process), where other processes read or train it; an "
                    "arena would move it out of their sight. Build the optimizer before sharing the "
                    "model (the arena is then what is shared), or use torch.optim"
                )
            if type(parameter.data) is not torch.Tensor:  # e.g. FSDP2's and tensor parallelism's DTensor shards
                raise TypeError(
                    f"parameter {index} of a group is a {type(parameter.data).__name__}; steadystep "
                    "optimizers step plain tensors (a DTensor's shards live outside one arena): use "
                    "torch.optim for FSDP2 or tensor-parallel models"
                )
            kinds.setdefault((str(parameter.device), str(parameter.dtype).removeprefix("torch.")), []).append(index)
        if len(kinds) != 1:
            found = "; ".join(
                f"{_indices(indices)} on {device} in {dtype}" for (device, dtype), indices in kinds.items()
            )
            raise ValueError(
                f"a parameter group must live on one device with one dtype (one arena); this one has {found}. "
                "Give each kind a group of its own: [{'params': [...]}, {'params': [...]}]"
            )
        dtype = parameters[0].dtype
        if dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
            advice = "use torch.optim for complex parameters" if dtype.is_complex else "cast the model first"
            raise TypeError(
                f"the parameters are {dtype}; steadystep optimizers step float32, float64, bfloat16 or float16 "
                f"parameters. {advice}"
            )
        with torch.no_grad():
            arena = Arena.pack([p.detach() for p in parameters])
            grads = arena.zeros_like()
            for parameter, view, grad_view in zip(parameters, arena.views, grads.views):
                if parameter.grad is not None:  # a gradient that is None stays so: the step skips it, as torch's
                    _copy_gradient(grad_view, parameter.grad)
                    parameter.grad = grad_view
                parameter.data = view
        held.arenas = (arena, grads)
        return arena, grads

    def _forget_replaced_groups(self) -> None:
        """Drop what was kept for parameter lists no group holds any more (replaced by the
        user): their arenas would otherwise stay alive with the optimizer."""
        live = {_key(group) for group in self.param_groups}
        self._groups = {key: held for key, held in self._groups.items() if key in live}

    def _held(self, group: dict[str, Any]) -> _GroupState:
        """What this optimizer keeps of ``group`` (an empty record for a group it has not seen)."""
        return self._groups.setdefault(_key(group), _GroupState())

    def _packed(self, group: dict[str, Any]) -> tuple[Arena, Arena] | None:
        """The group's parameter and gradient arenas, re-packed first if its parameters changed
        since (added, removed, reordered, replaced; frozen or unfrozen). None: nothing in the
        group is trainable. One C-level pass over the group's flags."""
        params, held = group["params"], self._held(group)
        packed = held.packed_as
        if (
            packed is None
            or packed[0] is not params
            or packed[1] != params.changes
            or list(map(_REQUIRES_GRAD, params)) != packed[2]
        ):
            return self._pack(group)
        return held.arenas

    def _trainable(self, group: dict[str, Any]) -> list[Any]:
        return self._groups[_key(group)].members

    def _layout(self, group: dict[str, Any]) -> Layout:
        """The layout of a group being stepped (packed by step() just before)."""
        arenas = self._groups[_key(group)].arenas
        assert arenas is not None, "a group being stepped has its parameters in an arena"
        return arenas[0].layout

    def _reclaim_parameters(self, group: dict[str, Any], arena: Arena, grads: Arena) -> tuple[Arena, Arena]:
        """Bring parameters given new storage since packing (``p.data = ...``, ``model.double()``,
        ``model.to("cuda")``) back into the arena: otherwise the step would update the arena
        while the model reads the new tensor, and training would silently stop."""
        parameters = self._trainable(group)
        moved = _outside(parameters, arena)
        if not moved:
            return arena, grads
        if all(
            (parameters[i].shape, parameters[i].stride(), parameters[i].dtype, parameters[i].device)
            == (arena.views[i].shape, arena.views[i].stride(), arena.views[i].dtype, arena.views[i].device)
            for i in moved
        ):
            for index in moved:
                arena.views[index].copy_(parameters[index].detach())
                parameters[index].data = arena.views[index]
            return arena, grads
        for index in moved:
            state = self.state.get(parameters[index], {})
            if parameters[index].shape != arena.views[index].shape and any(
                state.get(name) is not None for name in self._state_names(group)
            ):
                raise ValueError(
                    f"parameter {index} of a group changed shape from {tuple(arena.views[index].shape)} "
                    f"to {tuple(parameters[index].shape)} after it was stepped, so its optimizer state "
                    "no longer fits; build a new optimizer for the reshaped model"
                )
        packed = self._pack(group)
        assert packed is not None, "a group with parameters to bring back has trainable ones"
        return packed

    def _gather_grads(self, group: dict[str, Any], grads: Arena) -> list[int]:
        """Bring gradients that autograd or the user replaced back into the arena; return the
        parameters whose gradient is None (``model.zero_grad()`` and no gradient since), which
        this step leaves as torch does: unchanged, their gradient None."""
        parameters = self._trainable(group)
        missing, views, gradients = [], [], []
        places = _places(grads)
        for index in _outside(list(map(_GRAD, parameters)), grads):
            view = grads.views[index]
            if view.data_ptr() != places[index]:  # ``p.grad.data = ...`` (as Module.to does) re-pointed it
                view = grads.views[index] = grads.view(index)
            gradient = parameters[index].grad
            if gradient is None:
                view.zero_()
                missing.append(index)
            else:
                if gradient.layout is torch.strided:
                    views.append(view)
                    gradients.append(gradient)
                else:
                    _copy_gradient(view, gradient)
                parameters[index].grad = view  # the next backward accumulates into the arena
        # One call: after model.zero_grad() every gradient is a fresh tensor, and copying them
        # one by one into new views took three times as long.
        if views:
            torch._foreach_copy_(views, gradients)
        return missing

    def _set_aside(
        self, group: dict[str, Any], arena: Arena, state: dict[str, Any], steps: np.ndarray, missing: list[int]
    ) -> tuple[list, Any, Any]:
        """What the step would change for the parameters without a gradient: their parameters'
        and state's elements, their counts (on the device under GradScaler) and, for SGD,
        whether their momentum buffers are still to start. One fused launch steps the whole
        group; these few are put back after it (rare: an unused module under set-to-None)."""
        kept = []
        for buffer in (arena.buffer, *(flat for flat in state.values() if flat is not None)):
            for index in missing:
                start, stop = arena.layout.extent(index)
                kept.append((buffer[start:stop], buffer[start:stop].clone()))
        counts = self._held(group).counts
        before = counts[1].clone() if counts is not None and counts[0] is steps else torch.from_numpy(steps.copy())
        return kept, before, {name: new.copy() for name, new in self._held(group).new_buffers.items()}

    def _put_back(
        self,
        group: dict[str, Any],
        arena: Arena,
        steps: np.ndarray,
        missing: list[int],
        kept: list,
        before: Any,
        new_buffers: dict[str, np.ndarray],
    ) -> None:
        """Undo the step for the parameters without a gradient (see _set_aside)."""
        for view, values in kept:
            view.copy_(values)
        held = self._held(group)
        if held.checked is None:  # SGD's step was skipped (an overflow) and its new buffers unmade
            return
        counts = held.counts
        if counts is not None and counts[0] is steps:  # on the device: read back once, to cut the runs
            counts[1][missing] = before[missing].to(counts[1])
            now = counts[1].cpu().numpy()
        else:
            steps[missing] = before[missing].numpy()
            now = steps
        parameters = self._trainable(group)
        for name, new in new_buffers.items():  # buffers not started stay so (None, as in torch) until a gradient comes
            flags = np.zeros_like(new)
            flags[missing] = new[missing]
            if flags.any():
                held.new_buffers[name] = flags
                for parameter in itertools.compress(parameters, flags):
                    self.state[parameter][name] = None
        names, buffers, _, runs = held.checked
        cut = Runs.of(now, arena.layout)
        if (runs and (runs.first, runs.end)) != (
            cut and (cut.first, cut.end)
        ):  # the same runs keep their checked views
            held.checked = names, buffers, steps, cut

    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        """The state buffers this group's options use, under torch's names (as torch, no
        buffer for an option that is off: SGD without momentum keeps none)."""
        raise NotImplementedError

    def _state(self, group: dict[str, Any], arena: Arena) -> tuple[dict[str, Any], np.ndarray]:
        """The group's flat state buffers (self.state[p] holds views of them under torch's
        names) and its parameters' step counts."""
        names = self._state_names(group)
        held = self._held(group)
        checked = held.checked
        if checked is not None and checked[0] == names:
            return checked[1:3]
        if not self._keeps_count:  # SGD: its count stays here, out of the state (torch's SGD keeps none)
            steps = np.array(
                [
                    float(any(self.state[parameter].get(name) is not None for name in names))
                    for parameter in self._trainable(group)
                ],
                np.float32,
            )
            buffers = {name: self._flat_state(group, arena, name) for name in names}
            held.checked = names, buffers, steps, Runs.of(steps, arena.layout)
            return buffers, steps
        for parameter in self._trainable(group):
            state = self.state[parameter]
            if "step" not in state:  # new, or loaded from torch.optim.SGD (which keeps no count)
                stepped = any(state.get(name) is not None for name in names)
                state["step"] = torch.tensor(1.0 if stepped else 0.0)
        buffers = {name: self._flat_state(group, arena, name) for name in names}
        # The step counts become 0-d views of one NumPy-backed tensor, so one NumPy add (a tenth
        # of torch's own add) advances them all.
        steps = np.array([float(self.state[parameter]["step"]) for parameter in self._trainable(group)], np.float32)
        shared = torch.from_numpy(steps)
        for index, parameter in enumerate(self._trainable(group)):
            self.state[parameter]["step"] = shared[index]
        held.checked = names, buffers, steps, Runs.of(steps, arena.layout)
        return buffers, steps

    def state_dict(self) -> dict[str, Any]:
        state_dict = super().state_dict()
        # torch hands out the state's own dicts: plain copies of them keep a checkpoint free of
        # steadystep's classes (loadable with torch.load(weights_only=True), and by torch.optim)
        state_dict["state"] = {index: dict(entry) for index, entry in state_dict["state"].items()}
        return state_dict

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        for held in self._groups.values():  # the loaded tensors are copied into the arenas on the next step
            held.checked = None
            held.new_buffers.clear()

    def _flat_state(self, group: dict[str, Any], arena: Arena, name: str) -> Any:
        """The flat buffer behind state ``name``; (re)built when missing or when
        load_state_dict replaced the views with tensors of its own."""
        parameters, held = self._trainable(group), self._held(group)
        flat = held.state_buffers.get(name)
        views = [self.state[p].get(name) for p in parameters]
        if flat is not None and all(v is not None and v.data_ptr() == w.data_ptr() for v, w in zip(views, flat.views)):
            return flat.buffer
        for index, (view, loaded) in enumerate(zip(arena.views, views)):
            if loaded is not None and loaded.shape != view.shape:  # torch's own copy error named no one
                raise ValueError(
                    f"the state's {name} of parameter {index} in a group has shape {tuple(loaded.shape)}, "
                    f"the parameter {tuple(view.shape)}: the loaded state_dict is another model's"
                )
        flat = arena.zeros_like(self._initial_value(name, group))
        for parameter, view, loaded in zip(parameters, flat.views, views):
            if loaded is not None:  # torch stores None for buffers an option leaves unused
                view.copy_(loaded)
            self.state[parameter][name] = view
        new = np.array([loaded is None for loaded in views])
        if new.any() and name in self._started_buffers:
            held.new_buffers[name] = new
        else:  # flags left from another layout (a re-pack) would cut this one wrongly
            held.new_buffers.pop(name, None)
        held.state_buffers[name] = flat
        return flat.buffer

    def _unmake(self, group: dict[str, Any], name: str) -> None:
        """Forget the new parts of state buffer ``name``, made for a step that was then skipped:
        those parameters' state holds None until a step is taken (as torch's, which has no
        buffer yet; a checkpoint must not hand on a buffer that was never started), and the
        next step makes them anew."""
        held = self._held(group)
        for parameter, new in zip(self._trainable(group), held.new_buffers.pop(name)):
            if new:
                self.state[parameter][name] = None
        held.checked = None
        held.state_buffers.pop(name, None)

    def _initial_value(self, name: str, group: dict[str, Any]) -> float:
        return 0.0

    @staticmethod
    def _advance(steps: np.ndarray) -> int:
        # One NumPy add for every parameter's count (see _state), not a loop of 0-d tensor additions.
        steps += 1
        return int(steps[-1])

    # Dynamo cannot trace Numba's launches: under torch.compile (``torch.compile(optimizer.step)``
    # or a compiled training step) the step runs as it is, a graph break, as torch's own
    # optimizers' zero_grad does. The guard costs next to nothing.
    @_eager_under_torch_compile
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """One fused step of every parameter group (``closure``: re-evaluates the loss, as in torch)."""
        # torch wraps every optimizer's step in a profiler range and its step hooks: a third of
        # a 400k-parameter model's step (BENCHMARKS.md), the range costing it even with no
        # profiler running. This step goes through torch's own wrapper whenever anything would
        # see the difference: a profiler running or a step hook registered.
        if _observed(self):
            return _TORCH_WRAPPED_STEP(self, closure)
        return self._step(closure)

    step.hooked = True  # torch's Optimizer.__init__ wraps a step without this mark

    def _step(self, closure: Optional[Callable[[], Any]]) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():  # as torch: the closure computes gradients even when called under no_grad
                loss = closure()
        # Without autograd, as torch.no_grad() would run it; set_grad_enabled called as a
        # function costs less than the decorator's context objects.
        grad_enabled = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
        try:
            if not isinstance(self.state, State) or self.state.changes != self._state_changes:
                self._adopt_state()
            # Every group's numbers first: one edited since (group["lr"] = -0.1) fails the step
            # with nothing written, rather than after the groups before it have stepped. Numbers
            # seen before are not checked again (one C-level read of them, a tenth of the checks).
            options = [tuple(map(group.get, _CHECKED)) for group in self.param_groups]
            if _differ(options, self._checked_options):
                for index, group in enumerate(self.param_groups):
                    _check_options(group, f"param_groups[{index}]: ")
                self._checked_options = options
            # Every group is packed and checked before any steps (what this changes, moving
            # values into arenas, changes no value): a group that fails (a parameter reshaped,
            # half a model converted) fails the step with nothing written.
            ready = []
            for group in self.param_groups:
                packed = self._packed(group)
                if packed is None:  # every parameter of the group is frozen
                    continue
                arena, grads = self._reclaim_parameters(group, *packed)
                missing = self._gather_grads(group, grads)
                if len(missing) == len(self._trainable(group)):  # no gradient at all: torch skips the group
                    continue
                ready.append((group, arena, grads, missing, *self._state(group, arena)))
            for group, arena, *_ in ready:
                if group.get("stochastic_rounding") and arena.buffer.dtype != torch.bfloat16:
                    raise ValueError(
                        f"param_groups[{self.param_groups.index(group)}] asks for stochastic_rounding, which "
                        f"applies to bfloat16 parameters; its parameters are {arena.buffer.dtype}"
                    )
            self._rounding_steps += 1
            for group, arena, grads, missing, state, steps in ready:
                self._rounding = self._rounding_seed(group)
                set_aside = self._set_aside(group, arena, state, steps, missing) if missing else None
                grad_scale, found_inf = self._amp_arguments(group, arena.buffer)
                count = self._count(group, arena, steps, grad_scale, found_inf)
                self._fused_step(group, arena.buffer, grads.buffer, state, count, grad_scale, found_inf)
                stepped = self._trainable(group)
                if set_aside is not None:
                    self._put_back(group, arena, steps, missing, *set_aside)
                    skipped = set(missing)
                    stepped = [p for index, p in enumerate(stepped) if index not in skipped]
                _arrays.increment_versions(stepped)  # as torch's in-place step does
            self._state_changes = cast(State, self.state).changes  # the step's own changes included
        finally:
            torch.set_grad_enabled(grad_enabled)
        return loss

    def _rounding_seed(self, group: dict[str, Any]) -> Optional[int]:
        """The functional step's ``rounding_seed`` for ``group``: None (round to nearest) unless
        the group asks for stochastic rounding; else drawn from its seed, the optimizer's count
        of steps and the group's place, so that every step and group rounds with bits of its own."""
        if not group.get("stochastic_rounding"):
            return None
        return optim.step_seed(group["seed"], self._rounding_steps) + self.param_groups.index(group)

    def _adopt_state(self) -> None:
        """Take ``self.state`` as it now is: torch's (a new optimizer's, a loaded one's) or as the
        user changed it since the last step (an entry deleted or replaced, ``state = {}``, a
        tensor put in place of a view). Its dicts start counting their changes, and this step
        checks the flat buffers against them again, copying in what was put there."""
        if type(self.state) is not State:
            self.state = State(self.state)
        for parameter, entry in self.state.items():  # dicts the user put in: counted from now on
            if type(entry) is not ParameterState or entry.owner is not self.state:
                dict.__setitem__(self.state, parameter, ParameterState(self.state, entry))
        for held in self._groups.values():
            held.checked = None

    def _from_scaler(self) -> tuple[Any, Any]:
        """The scale and found-inf flag GradScaler set on this optimizer for the step (or None)."""
        return getattr(self, "grad_scale", None), getattr(self, "found_inf", None)

    def _amp_arguments(self, group: dict[str, Any], param: Any) -> tuple[Any, Any]:
        """GradScaler's scale (inverted: the kernel multiplies) and flag, in the parameters' dtype
        on their device, copied on the device into one-element tensors kept per group."""
        scale, found_inf = self._from_scaler()
        if scale is None and found_inf is None:
            return None, None
        held = self._held(group)
        kept = held.amp
        dtype = _counted_in(param)
        if kept is None or kept[0].dtype != dtype or kept[0].device != param.device:
            kept = held.amp = (param.new_ones(1, dtype=dtype), param.new_zeros(1, dtype=dtype))
        inverse, flag = kept
        if scale is not None:
            inverse.copy_(scale).reciprocal_()
        if found_inf is not None:
            flag.copy_(found_inf)
        return (inverse if scale is not None else None), (flag if found_inf is not None else None)

    def _count(self, group: dict[str, Any], arena: Arena, steps: np.ndarray, grad_scale: Any, found_inf: Any) -> Any:
        """This step's count: the host count advanced (an int) or, once the group has taken an
        AMP step (GradScaler's ``grad_scale`` or ``found_inf`` given), the counts beside the
        parameters, advanced on the device unless ``found_inf`` is set (Adam's kernel advances
        the first itself: its bias corrections read it)."""
        held = self._held(group)
        kept = held.counts
        if kept is None or kept[0] is not steps:  # none yet, or replaced since (a load, a re-pack)
            if grad_scale is None and found_inf is None:
                return self._advance(steps)
            # Counts of the parameters' dtype on their device, which the parameters' state["step"]
            # view: read back on the host, a count would cost the synchronisation.
            parameters = self._trainable(group)
            counts = torch.tensor(steps, dtype=_counted_in(arena.buffer), device=arena.buffer.device)
            for index, parameter in enumerate(parameters if self._keeps_count else ()):
                self.state[parameter]["step"] = counts[index]
            kept = held.counts = steps, counts, counts[:1]
        counts = kept[1]
        if self._kernel_advances_count:
            return kept[2]
        counts.add_(1 if found_inf is None else found_inf == 0)
        return counts

    def _by_count(self, group: dict[str, Any], step: Any, *buffers: Any) -> list[tuple[Any, list[Any]]]:
        """The step's count with ``buffers`` (flat, of the group's layout; None stays None), or,
        when the group's parameters have different counts (some unfrozen, added or reset
        mid-run, or loaded so from torch.optim, which keeps a count per parameter), one such
        pair per run of consecutive parameters sharing a count, the buffers cut to that run:
        then each run steps with its own count, as in torch. Counts on the device come as
        one-element views of the group's counts."""
        held = self._groups[_key(group)]
        assert held.checked is not None  # _state checked the group before its step
        _, _, steps, runs = held.checked
        if runs is None:
            return [(step, list(buffers))]
        if isinstance(step, int):
            counts = [int(steps[first]) for first in runs.first]
        else:  # counts on the device: the group has taken an AMP step
            assert held.counts is not None
            counts = runs.first_counts(held.counts[1])
        return list(zip(counts, runs.cut(list(buffers))))

    @staticmethod
    def _host_count(step: Any) -> int:
        """The count as a number; a count on the device is read back (a synchronisation), and
        after a skipped first step (count 0) the kernel changes nothing anyway."""
        return step if isinstance(step, int) else max(int(step[0].item()), 1)

    @_eager_under_torch_compile
    def _repr_html_(self) -> str:
        """What Jupyter shows: each group's tensors and options, and the steps taken."""
        rows: list[tuple[str, object]] = []
        for index, group in enumerate(self.param_groups):
            params = group["params"]
            places = ", ".join(sorted({f"{str(p.dtype).removeprefix('torch.')} on {p.device}" for p in params}))
            elements = sum(p.numel() for p in params)
            rows.append(
                (f"param_groups[{index}]", f"{len(params)} tensors, {elements:,} elements ({places or 'none'})")
            )
            options = ", ".join(f"{name}={value!r}" for name, value in group.items() if name != "params")
            rows.append(("", options))
        if self._keeps_count:  # SGD keeps no count
            counts = [float(state["step"]) for state in self.state.values() if "step" in state]
            rows.append(("steps taken", f"{int(max(counts))}" if counts else "none yet"))
        return _html.table(type(self).__name__, rows)

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zero every gradient in place: they stay views of the gradient arena, which the next
        backward adds into (torch's ``zero_grad(set_to_none=False)``; the default here, where
        torch's is True). ``set_to_none=True`` sets them to None, as torch's default does: a
        parameter that then gets no gradient (an unused module, an expert no token was routed
        to) is not stepped, at the price of a copy into the arena at the step and autograd's
        fresh gradients beside the arena until then."""
        if set_to_none:
            for group in self.param_groups:
                for parameter in group["params"]:
                    parameter.grad = None
            return
        for group in self.param_groups:
            packed = self._packed(group)
            if packed is None:
                continue
            grads = packed[1]
            grads.buffer.zero_()
            parameters = self._trainable(group)
            for index in _outside(list(map(_GRAD, parameters)), grads):  # e.g. converted by Module.to
                parameters[index].grad = None

    def _fused_step(
        self,
        group: dict[str, Any],
        param: Any,
        grad: Any,
        state: dict[str, Any],
        step: Any,
        grad_scale: Any,
        found_inf: Any,
    ) -> None:
        """One launch over the group (``step``: see _count; ``grad_scale``, ``found_inf``: GradScaler's, or None)."""
        raise NotImplementedError


_TORCH_WRAPPED_STEP = torch.optim.Optimizer.profile_hook_step(_FusedOptimizer._step)
# torch's registries of global step hooks (module-level dicts, filled in place) and its
# profiler switch; if a torch version keeps them elsewhere, every step takes torch's wrapper
_GLOBAL_STEP_HOOKS = [
    getattr(importlib.import_module("torch.optim.optimizer"), name, None)
    for name in ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks")
]
_PROFILING = getattr(torch._C._autograd, "_profiler_enabled", lambda: True)


def _counted_in(param: Any) -> Any:
    """The dtype of the counts and of GradScaler's numbers beside ``param``: its own, float32
    beside half precision (as torch's state["step"]; a bfloat16 count is exact only to 256)."""
    return torch.float32 if param.dtype in (torch.bfloat16, torch.float16) else param.dtype


def _observed(optimizer: _FusedOptimizer) -> bool:
    """Whether a profiler or a step hook would see the step (then torch's wrapper runs it)."""
    return bool(
        _PROFILING()
        or optimizer._optimizer_step_pre_hooks
        or optimizer._optimizer_step_post_hooks
        or any(hooks is None or hooks for hooks in _GLOBAL_STEP_HOOKS)
    )


def _differ(options: list[tuple], checked: list[tuple]) -> bool:
    """Whether the groups' numbers differ from those checked; a new NumPy array of betas each
    step compares element by element (its truth value is an error), and counts as changed."""
    try:
        return bool(options != checked)
    except (ValueError, RuntimeError):
        return True


def _check_params(params: Any) -> None:
    """What torch.optim's constructors take: an iterable of tensors, or of dicts (parameter groups)."""
    if isinstance(params, (torch.Tensor, str, bytes, dict)) or not isinstance(params, Iterable):
        raise TypeError(
            "params must be an iterable of tensors or of dicts (parameter groups), such as "
            f"model.parameters() or [{{'params': ...}}, ...]; got {type(params).__name__}"
        )


def _check_options(options: dict[str, Any], where: str = "") -> None:
    """torch's constructor checks, on the defaults or on a group's own numbers (``where``
    says which group in the message)."""
    try:
        checks.non_negative(**{name: options[name] for name in _NON_NEGATIVE if name in options})
        if "betas" in options:
            checks.betas(options["betas"])
        if "nesterov" in options:
            checks.sgd_options(options["momentum"], options["dampening"], options["nesterov"])
        if "alpha" in options:
            checks.in_range("alpha", options["alpha"], 0.0, 1.0)
        for name in _FLAGS:
            if name in options:
                checks.flag(name, options[name])
        if "seed" in options:
            checks.count("seed", options["seed"])
    except (TypeError, ValueError) as error:
        raise type(error)(f"{where}{error}") from None


def _check_each_once(params: list[Any]) -> None:
    """A parameter listed twice in a group would get two places in the arena, and the model
    would train only one of them. torch.optim steps it twice per step and warns that this will
    become an error; steadystep refuses it now, before anything is packed."""
    first: dict[int, int] = {}
    for index, parameter in enumerate(params):
        parameter = parameter[1] if isinstance(parameter, tuple) else parameter  # (name, parameter): named_parameters()
        earlier = first.setdefault(id(parameter), index)
        if earlier != index:
            raise ValueError(
                f"parameter {index} of a group is parameter {earlier} again (shape "
                f"{tuple(parameter.shape)}); pass each parameter once, e.g. list(dict.fromkeys(params))"
            )


def _check_implementation_flags(
    foreach: Optional[bool] = None,
    fused: Optional[bool] = None,
    capturable: Optional[bool] = False,
    differentiable: Optional[bool] = False,
) -> None:
    """torch.optim's implementation switches. ``foreach`` and ``fused`` are accepted, so that
    code written for torch runs unchanged, and change nothing (every step is one fused
    launch); the two that steadystep cannot honour are refused."""
    if capturable:
        raise ValueError(
            "capturable=True is not supported: steadystep launches its kernels on the default stream, "
            "which a CUDA graph cannot capture; drop capturable"
        )
    if differentiable:
        raise ValueError(
            "differentiable=True is not supported: steadystep's steps update tensors in place, "
            "outside autograd; keep torch.optim for differentiating through the step"
        )


class SGD(_FusedOptimizer):
    """torch.optim.SGD, fused."""

    _started_buffers = ("momentum_buffer",)
    _keeps_count = False

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach: Optional[bool] = None,
        differentiable: bool = False,
        fused: Optional[bool] = None,
        stochastic_rounding: bool = False,
        seed: int = 0,
    ):
        super().__init__(
            params,
            dict(
                lr=lr,
                momentum=momentum,
                dampening=dampening,
                weight_decay=weight_decay,
                nesterov=nesterov,
                maximize=maximize,
            ),
            foreach=foreach,
            fused=fused,
            differentiable=differentiable,
            stochastic_rounding=stochastic_rounding,
            seed=seed,
        )

    def _state_names(self, group):
        return ("momentum_buffer",) if group["momentum"] != 0.0 else ()

    def _fused_step(self, group, param, grad, state, step, grad_scale, found_inf):
        # SGD's count only says whether a momentum buffer starts here (b ← d, as torch does for
        # a buffer it has not got): on step 1, when momentum was turned on since, or for a
        # parameter unfrozen, added or reset since; the parameters are then stepped in runs
        held = self._held(group)
        new = held.new_buffers.get("momentum_buffer")
        if new is not None and found_inf is not None and found_inf.item():  # read once per new buffer, not per step
            self._unmake(group, "momentum_buffer")  # skipped: the buffers start at the first step taken
            return
        buffers = [param, grad, state.get("momentum_buffer")]
        runs = None if new is None else self._runs_by_start(group, new)
        if new is None or runs is None:
            parts = [(new is not None, buffers)]
        else:
            parts = list(zip([bool(new[first]) for first in runs.first], runs.cut(buffers)))
        for starts, (param_part, grad_part, buffer_part) in parts:
            optim.sgd(
                param_part,
                grad_part,
                buffer_part,
                step=1 if starts else 2,
                lr=group["lr"],
                momentum=group["momentum"],
                dampening=group["dampening"],
                weight_decay=group["weight_decay"],
                nesterov=group["nesterov"],
                maximize=group["maximize"],
                grad_scale=grad_scale,
                found_inf=found_inf,
                rounding_seed=self._rounding,
            )
        if new is not None:  # the started buffers are the state's (one left without a gradient held None)
            views = held.state_buffers["momentum_buffer"].views
            for parameter, view in itertools.compress(zip(self._trainable(group), views), new):
                self.state[parameter]["momentum_buffer"] = view
        held.new_buffers.pop("momentum_buffer", None)

    def _runs_by_start(self, group: dict[str, Any], new: np.ndarray) -> Runs | None:
        """The runs of parameters whose buffers start (or not) together, cut once per pattern."""
        layout = self._layout(group)
        held = self._held(group)
        kept = held.start_runs
        if kept is None or kept[0] is not layout or not np.array_equal(kept[1], new):
            kept = held.start_runs = layout, new.copy(), Runs.of(new, layout)
        return kept[2]


class Adam(_FusedOptimizer):
    """torch.optim.Adam, fused. As in torch, a group's ``decoupled_weight_decay`` (also from
    a loaded state) makes it AdamW, and ``amsgrad`` keeps ``max_exp_avg_sq``.

    Under ``torch.amp.GradScaler`` the kernel also advances the count on the device, as its
    bias corrections read it.
    """

    _kernel_advances_count = True

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        foreach: Optional[bool] = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: Optional[bool] = None,
        decoupled_weight_decay: bool = False,
        stochastic_rounding: bool = False,
        seed: int = 0,
    ):
        super().__init__(
            params,
            dict(
                lr=lr,
                betas=betas,
                eps=eps,
                weight_decay=weight_decay,
                amsgrad=amsgrad,
                maximize=maximize,
                decoupled_weight_decay=decoupled_weight_decay,
            ),
            foreach=foreach,
            fused=fused,
            capturable=capturable,
            differentiable=differentiable,
            stochastic_rounding=stochastic_rounding,
            seed=seed,
        )

    def _state_names(self, group):
        return ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if group.get("amsgrad") else ("exp_avg", "exp_avg_sq")

    def _fused_step(self, group, param, grad, state, step, grad_scale, found_inf):
        update = optim.adamw if group.get("decoupled_weight_decay") else optim.adam
        for count, buffers in self._by_count(
            group, step, param, grad, state["exp_avg"], state["exp_avg_sq"], state.get("max_exp_avg_sq")
        ):
            update(
                *buffers,
                step=count,
                lr=group["lr"],
                betas=group["betas"],
                eps=group["eps"],
                weight_decay=group["weight_decay"],
                amsgrad=bool(group.get("amsgrad")),
                maximize=group["maximize"],
                grad_scale=grad_scale,
                found_inf=found_inf,
                rounding_seed=self._rounding,
            )
        if not isinstance(step, int):  # the kernel advanced the first count of each run: the others follow
            held = self._groups[_key(group)]
            assert held.counts is not None and held.checked is not None  # an AMP step, checked
            counts, runs = held.counts[1], held.checked[3]
            for first, end in zip(runs.first, runs.end) if runs is not None else [(0, len(counts))]:
                counts[first + 1 : end].copy_(counts[first : first + 1].expand(end - first - 1))


class AdamW(Adam):
    """torch.optim.AdamW, fused."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: Optional[bool] = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: Optional[bool] = None,
        stochastic_rounding: bool = False,
        seed: int = 0,
    ):
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            foreach=foreach,
            maximize=maximize,
            capturable=capturable,
            differentiable=differentiable,
            fused=fused,
            decoupled_weight_decay=True,
            stochastic_rounding=stochastic_rounding,
            seed=seed,
        )


class RMSprop(_FusedOptimizer):
    """torch.optim.RMSprop, fused."""

    def __init__(
        self,
        params,
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
        capturable: bool = False,
        foreach: Optional[bool] = None,
        maximize: bool = False,
        differentiable: bool = False,
        *,
        stochastic_rounding: bool = False,
        seed: int = 0,
    ):
        super().__init__(
            params,
            dict(
                lr=lr,
                alpha=alpha,
                eps=eps,
                weight_decay=weight_decay,
                momentum=momentum,
                centered=centered,
                maximize=maximize,
            ),
            foreach=foreach,
            capturable=capturable,
            differentiable=differentiable,
            stochastic_rounding=stochastic_rounding,
            seed=seed,
        )

    def _state_names(self, group):
        return (
            ("square_avg",)
            + ("grad_avg",) * bool(group["centered"])
            + ("momentum_buffer",) * bool(group["momentum"] > 0.0)
        )

    def _fused_step(self, group, param, grad, state, step, grad_scale, found_inf):
        optim.rmsprop(
            param,
            grad,
            state["square_avg"],
            state.get("grad_avg"),
            state.get("momentum_buffer"),
            lr=group["lr"],
            alpha=group["alpha"],
            eps=group["eps"],
            weight_decay=group["weight_decay"],
            momentum=group["momentum"],
            centered=group["centered"],
            maximize=group["maximize"],
            grad_scale=grad_scale,
            found_inf=found_inf,
            rounding_seed=self._rounding,
        )


class Adagrad(_FusedOptimizer):
    """torch.optim.Adagrad, fused (the state is named ``sum``, as in torch)."""

    def __init__(
        self,
        params,
        lr: float = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
        foreach: Optional[bool] = None,
        *,
        maximize: bool = False,
        differentiable: bool = False,
        fused: Optional[bool] = None,
        stochastic_rounding: bool = False,
        seed: int = 0,
    ):
        super().__init__(
            params,
            dict(
                lr=lr,
                lr_decay=lr_decay,
                weight_decay=weight_decay,
                initial_accumulator_value=initial_accumulator_value,
                eps=eps,
                maximize=maximize,
            ),
            foreach=foreach,
            fused=fused,
            differentiable=differentiable,
            stochastic_rounding=stochastic_rounding,
            seed=seed,
        )
        # torch's Adagrad makes every parameter's state here, frozen ones too: a state_dict taken
        # before the first step holds them (the first step copies them into the state arena)
        for group in self.param_groups:
            for parameter in group["params"]:
                if not _IS_LAZY(parameter):
                    self.state[parameter]["step"] = torch.tensor(0.0)
                    self.state[parameter]["sum"] = torch.full_like(
                        parameter.detach(), initial_accumulator_value, memory_format=torch.preserve_format
                    )

    def _state_names(self, group):
        return ("sum",)

    def _initial_value(self, name, group):
        return group["initial_accumulator_value"]

    def _fused_step(self, group, param, grad, state, step, grad_scale, found_inf):
        # the count only matters with lr_decay: then a count on the device is read back
        runs = (
            self._by_count(group, step, param, grad, state["sum"])
            if group["lr_decay"]
            else [(1, [param, grad, state["sum"]])]
        )
        for count, buffers in runs:
            optim.adagrad(
                *buffers,
                step=self._host_count(count),
                lr=group["lr"],
                lr_decay=group["lr_decay"],
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=group["maximize"],
                grad_scale=grad_scale,
                found_inf=found_inf,
                rounding_seed=self._rounding,
            )


class LARS(_FusedOptimizer):
    """LARS with a per-tensor trust ratio (weight decay on tensors with ndim ≥ 2)."""

    def __init__(
        self,
        params,
        lr: float = 1e-1,
        trust_coefficient: float = 1e-3,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        eps: float = 1e-8,
        *,
        maximize: bool = False,
        stochastic_rounding: bool = False,
        seed: int = 0,
    ):
        super().__init__(
            params,
            dict(
                lr=lr,
                trust_coefficient=trust_coefficient,
                momentum=momentum,
                weight_decay=weight_decay,
                eps=eps,
                maximize=maximize,
            ),
            stochastic_rounding=stochastic_rounding,
            seed=seed,
        )

    def _state_names(self, group):
        return ("momentum_buffer",) if group["momentum"] != 0.0 else ()

    def _fused_step(self, group, param, grad, state, step, grad_scale, found_inf):
        layout = self._layout(group)
        held = self._held(group)
        mask = held.decay_mask
        if mask is None:  # built once: a host array, as optim.lars reads each tensor's flag from it
            # in the dtype the step computes in: NumPy has no bfloat16, and a half step computes in float32
            mask = layout.mask(dtype=np.float64 if param.dtype == torch.float64 else np.float32)
            held.decay_mask = mask
        optim.lars(
            param,
            grad,
            state.get("momentum_buffer"),
            layout=layout,
            lr=group["lr"],
            trust_coefficient=group["trust_coefficient"],
            momentum=group["momentum"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=group["maximize"],
            decay_mask=mask,
            grad_scale=grad_scale,
            found_inf=found_inf,
            rounding_seed=self._rounding,
        )


class Lion(_FusedOptimizer):
    """Lion (sign update, decoupled weight decay), fused."""

    def __init__(
        self,
        params,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        *,
        maximize: bool = False,
        stochastic_rounding: bool = False,
        seed: int = 0,
    ):
        super().__init__(
            params,
            dict(lr=lr, betas=betas, weight_decay=weight_decay, maximize=maximize),
            stochastic_rounding=stochastic_rounding,
            seed=seed,
        )

    def _state_names(self, group):
        return ("exp_avg",)

    def _fused_step(self, group, param, grad, state, step, grad_scale, found_inf):
        optim.lion(
            param,
            grad,
            state["exp_avg"],
            lr=group["lr"],
            betas=group["betas"],
            weight_decay=group["weight_decay"],
            maximize=group["maximize"],
            grad_scale=grad_scale,
            found_inf=found_inf,
            rounding_seed=self._rounding,
        )


def drop_in(function: Callable[..., None]) -> type[torch.optim.Optimizer]:
    """The torch.optim drop-in of a functional step made by ``optim.fused_step``: its
    constructor takes ``(params, <hyperparameters as declared, with their defaults>, *,
    maximize=False, stochastic_rounding=False, seed=0)`` and torch's implementation flags; its
    state is the step's other buffers under their own names, zeros before the first step,
    with a count per parameter as torch keeps. Every such step gets its drop-in here, by the
    name its catalog entry gives (``optim.FUSED``, read when this module is imported).
    """
    step = getattr(function, "step", None)
    if step is None or step.drop_in is None:
        raise ValueError(
            f"{getattr(function, '__name__', function)!r} is not a step made by optim.fused_step from a "
            "catalog entry with a drop_in name; write its drop-in as a _FusedOptimizer by hand"
        )
    hyperparameters = dict(step.hyperparameters)
    state_names = tuple(step.buffers[2:])

    def __init__(
        self: _FusedOptimizer,
        params: Iterable[Any],
        *args: float,
        maximize: bool = False,
        stochastic_rounding: bool = False,
        seed: int = 0,
        foreach: Optional[bool] = None,
        fused: Optional[bool] = None,
        capturable: Optional[bool] = False,
        differentiable: Optional[bool] = False,
        **kwargs: float,
    ) -> None:
        numbers = inspect.Signature(
            [
                inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
                for name, default in hyperparameters.items()
            ]
        ).bind(*args, **kwargs)
        numbers.apply_defaults()
        checks.non_negative(**numbers.arguments)
        _FusedOptimizer.__init__(
            self,
            params,
            {**numbers.arguments, "maximize": maximize},
            stochastic_rounding=stochastic_rounding,
            seed=seed,
            foreach=foreach,
            fused=fused,
            capturable=capturable,
            differentiable=differentiable,
        )

    def _state_names(self: _FusedOptimizer, group: dict[str, Any]) -> tuple[str, ...]:
        return state_names

    def _fused_step(self: _FusedOptimizer, group, param, grad, state, step, grad_scale, found_inf) -> None:
        function(
            param,
            grad,
            *(state[name] for name in state_names),
            **{name: group[name] for name in hyperparameters},
            maximize=group["maximize"],
            grad_scale=grad_scale,
            found_inf=found_inf,
            rounding_seed=self._rounding,
        )

    return type(
        step.drop_in,
        (_FusedOptimizer,),
        {
            "__init__": __init__,
            "_state_names": _state_names,
            "_fused_step": _fused_step,
            "__doc__": f"The drop-in of optim.{step.name} (optim.fused_step), fused.\n\n{function.__doc__ or ''}",
            "__module__": __name__,
            "__qualname__": step.drop_in,
        },
    )


# the drop-ins of the steps made from their catalog entry alone (optim.fused_step)
_MADE = {function.step.drop_in: drop_in(function) for function in optim.FUSED.values()}  # type: ignore[attr-defined]
globals().update(_MADE)

# every drop-in, by name (steadystep.torch re-exports them; the warmup steps each)
DROP_INS = ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "LARS", "Lion", *_MADE)

__all__ = ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "LARS", "Lion", "DROP_INS", "drop_in"]
__all__ += list(_MADE)
