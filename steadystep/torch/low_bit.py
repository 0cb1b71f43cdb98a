"""The 8-bit drop-ins (bitsandbytes' names): ``AdamW8bit``, ``Adam8bit``, ``Lion8bit``,
``SGD8bit``, ``RMSprop8bit``, ``Adagrad8bit``; and their 4-bit twins (torchao's names for the
first two): ``AdamW4bit``, ``Adam4bit``, ``Lion4bit``, ``SGD4bit``, ``RMSprop4bit``,
``Adagrad4bit``. Each steps like its float32 drop-in, with every moment of a tensor of at least
``min_8bit_size`` elements (4096) held as 8-bit codes with one float32 absmax per block of 256,
or as 4-bit codes (two a byte) with one per block of 128 (SPEC §9, `steadystep.quantization`);
smaller tensors keep float32 moments. AdamW's state then takes 2.03 bytes a parameter instead
of 8 (4 bits: 1.06).

>>> import torch, steadystep.torch
>>> model = torch.nn.Linear(256, 64)
>>> optimizer = steadystep.torch.AdamW8bit(model.parameters(), lr=1e-3)
>>> model(torch.ones(3, 256)).sum().backward()
>>> optimizer.step(); optimizer.zero_grad()
>>> optimizer.state[model.weight]["state1"].dtype, optimizer.state[model.bias]["state1"].dtype
(torch.uint8, torch.float32)

The state is bitsandbytes' layout, under its names: per parameter ``step`` (an int), ``state1``
(and ``state2``: codes in the parameter's shape, or float32 moments), ``absmax1``/``absmax2``
and ``qmap1``/``qmap2`` (the dynamic maps), and ``state_dict()`` wraps the 8-bit tensors as
bitsandbytes does, so a checkpoint moves between the two either way (``AdamW8bit`` with
bitsandbytes' ``AdamW8bit``; bitsandbytes' ``Adam8bit`` decays decoupled, as AdamW does, where
this ``Adam8bit`` adds the decay to the gradient as torch's Adam). The 4-bit drop-ins keep the
same names, with ``state1``/``state2`` the flat packed codes (⌈n/2⌉ bytes, torchao's packing:
the first element in the high nibble) and the 16-entry maps of `quantization.state_map`; torchao
keeps its states as tensor subclasses, not a state_dict of plain tensors, so there is no file
to exchange with it (its ``codes``, ``scale`` and ``qmap`` are these tensors, for a tensor whose
size is a multiple of 128).

Unlike the float32 drop-ins, these step each parameter in its own launch (as bitsandbytes
does): the codes of a tensor are its own blocks. Parameter groups, LR schedulers,
``GradScaler`` (its usual path: it unscales the gradients and skips a step with inf or NaN)
and bfloat16/float16 parameters work as with torch.optim. A gradient that would make a moment
inf or NaN is refused with nothing written; under ``GradScaler`` such steps are skipped.
``stochastic_rounding=True`` rounds each new moment to one of its two neighbouring codes with
probabilities that keep it unbiased, instead of to the nearest.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any, Optional

import torch
from torch.utils.weak import WeakIdKeyDictionary

from steadystep import checks, optim, quantization

__all__ = [
    "Adagrad4bit",
    "Adagrad8bit",
    "Adam4bit",
    "Adam8bit",
    "AdamW4bit",
    "AdamW8bit",
    "Lion4bit",
    "Lion8bit",
    "RMSprop4bit",
    "RMSprop8bit",
    "SGD4bit",
    "SGD8bit",
]

QUANT_STATE_KEY = "__bnb_optimizer_quant_state__"  # where bitsandbytes' state_dict keeps the 8-bit tensors
_QUANTIZED_KEYS = ("state1", "state2", "absmax1", "absmax2", "qmap1", "qmap2")


class _Optimizer8bit(torch.optim.Optimizer):
    """What the 8-bit and 4-bit drop-ins share: the per-parameter state in bitsandbytes' layout,
    one functional step per parameter, and state_dict in bitsandbytes' form."""

    function: Callable[..., None]  # the functional step of steadystep.optim
    signed: tuple[bool, ...]  # per state (state1, state2): whether it takes either sign
    counted = True  # whether the functional step takes the step count
    bits = 8  # the codes' width

    def __init__(
        self,
        params: Iterable[Any],
        defaults: dict[str, Any],
        *,
        min_8bit_size: int = quantization.MIN_8BIT_SIZE,
        stochastic_rounding: bool = False,
        seed: int = 0,
    ) -> None:
        if not isinstance(min_8bit_size, int) or min_8bit_size < 0:
            raise ValueError(f"min_8bit_size must be an int >= 0; got {min_8bit_size!r}")
        self.min_8bit_size = min_8bit_size
        self.stochastic_rounding = bool(stochastic_rounding)
        self.seed = seed
        self.quantized_states: WeakIdKeyDictionary = WeakIdKeyDictionary()
        super().__init__(params, defaults)

    def options(self, group: dict[str, Any]) -> dict[str, Any]:
        """The functional step's keyword arguments from a parameter group."""
        raise NotImplementedError

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.quantized_states = WeakIdKeyDictionary()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())
        state.pop("quantized_states", None)
        state.pop("maps", None)
        return state

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """One step of every parameter that has a gradient; ``closure`` recomputes the loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            options = self.options(group)
            for param in group["params"]:
                if param.grad is not None:
                    self.step_parameter(param, options)
        return loss

    def step_parameter(self, param: torch.Tensor, options: dict[str, Any]) -> None:
        assert param.grad is not None
        if param.grad.is_sparse:
            raise TypeError(f"{type(self).__name__} does not take sparse gradients")
        state = self.state[param]
        if not state:
            self.initial_state(param, state)
        count = state["step"] + 1
        grad = param.grad.detach()
        data = param.detach()
        flat = data.view(-1) if data.is_contiguous() else data.reshape(-1).clone()
        flat_grad = grad.reshape(-1)
        counted = dict(step=count) if self.counted else {}
        if state["state1"].dtype == torch.uint8:
            moments = self.quantized(param, state)
            type(self).function(flat, flat_grad, *moments, **options, **counted)
        else:
            moments = [state[name].view(-1) for name in self.state_names()]
            if flat.dtype == torch.float32:
                type(self).function(flat, flat_grad, *moments, **options, **counted)
            else:  # a small half-precision tensor: its float32 moments step float32 copies
                wide = flat.float()
                type(self).function(wide, flat_grad.float(), *moments, **options, **counted)
                flat.copy_(wide)
        if not data.is_contiguous():
            data.copy_(flat.view_as(data))
        state["step"] = count

    def state_names(self) -> tuple[str, ...]:
        return ("state1", "state2")[: len(self.signed)]

    def initial_state(self, param: torch.Tensor, state: dict[str, Any]) -> None:
        """bitsandbytes' initial state: zeros, quantized from ``min_8bit_size`` elements."""
        state["step"] = 0
        size = param.numel()
        for index, (name, signed) in enumerate(zip(self.state_names(), self.signed), start=1):
            if size >= max(self.min_8bit_size, 1):
                zeros = quantization.zeros(size, signed=signed, bits=self.bits, like=param.detach(), row_length=size)
                state[name] = self.stored_codes(zeros.codes, param)
                state[f"absmax{index}"] = zeros.absmax
                state[f"qmap{index}"] = self.shared_map(signed, zeros.qmap)
            else:
                state[name] = torch.zeros_like(param, dtype=torch.float32, memory_format=torch.contiguous_format)

    def stored_codes(self, codes: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        """How the state keeps a parameter's codes: in its shape (8 bits, bitsandbytes'), or
        flat (4 bits: two a byte)."""
        return codes.view(param.shape) if self.bits == 8 else codes.view(-1)

    def shared_map(self, signed: bool, qmap: torch.Tensor) -> torch.Tensor:
        """One map tensor per kind and device for every parameter (as bitsandbytes shares its own)."""
        maps = self.__dict__.setdefault("maps", {})
        return maps.setdefault((signed, qmap.device), qmap)

    def quantized(self, param: torch.Tensor, state: dict[str, Any]) -> list[quantization.QuantizedState]:
        """The parameter's quantized states over its state tensors, made (and checked) once per set
        of tensors."""
        tensors = tuple(
            state[f"{part}{index}"] for index in range(1, len(self.signed) + 1) for part in ("state", "absmax", "qmap")
        )
        kept = self.quantized_states.get(param)
        if kept is not None and len(kept[0]) == len(tensors) and all(a is b for a, b in zip(kept[0], tensors)):
            return kept[1]
        states = []
        for index in range(len(self.signed)):
            codes, absmax, qmap = tensors[3 * index : 3 * index + 3]
            states.append(
                quantization.QuantizedState(
                    codes.view(-1),
                    absmax,
                    qmap,
                    row_length=param.numel(),
                    rounding_seed=self.seed + index if self.stochastic_rounding else None,
                    updates=state["step"],
                )
            )
        self.quantized_states[param] = (tensors, states)
        return states

    def state_dict(self) -> dict[str, Any]:
        """torch's state_dict, with each parameter's quantized tensors under bitsandbytes' key."""
        saved = super().state_dict()
        saved["state"] = {key: _wrapped(value) for key, value in saved["state"].items()}
        return saved

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state_dict of this class or of bitsandbytes' counterpart; every parameter's state
        is checked (codes, absmax and maps that fit the parameter, of this optimizer's width;
        quantized or float32, never both) before anything changes."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups) or any(
            len(saved["params"]) != len(group["params"]) for saved, group in zip(saved_groups, self.param_groups)
        ):
            raise ValueError("state_dict has other parameter groups than this optimizer (their number or sizes)")
        parameters = dict(
            zip(
                itertools.chain.from_iterable(group["params"] for group in saved_groups),
                itertools.chain.from_iterable(group["params"] for group in self.param_groups),
            )
        )
        states = {}
        for key, saved in state_dict["state"].items():
            if key not in parameters:
                raise ValueError(f"state_dict holds state for parameter {key!r}, which no group lists")
            states[parameters[key]] = self.checked_state(parameters[key], _unwrapped(saved), key)
        groups = []
        for saved, group in zip(saved_groups, self.param_groups):
            merged = {**group, **{name: value for name, value in saved.items() if name != "params"}}
            merged["params"] = group["params"]
            groups.append(merged)
        self.state.clear()
        self.state.update(states)
        self.param_groups[:] = groups
        self.quantized_states = WeakIdKeyDictionary()

    def checked_state(self, param: torch.Tensor, saved: dict[str, Any], key: Any) -> dict[str, Any]:
        """One parameter's saved state, on the parameter's device, refused unless it fits."""
        where = f"state_dict's state for parameter {key!r}"
        state: dict[str, Any] = {"step": int(saved.get("step", 0))}
        kinds = set()
        for index, (name, signed) in enumerate(zip(self.state_names(), self.signed), start=1):
            if name not in saved:
                raise ValueError(f"{where} has no {name!r}")
            value = saved[name]
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"{where}: {name} must be a tensor; got {type(value).__name__}")
            if value.dtype == torch.uint8:
                kinds.add("quantized")
                stored = quantization.code_bytes(param.numel(), bits=self.bits)
                if value.numel() != stored:
                    raise ValueError(
                        f"{where}: {name} must hold {stored} bytes of {self.bits}-bit codes for the parameter's "
                        f"{param.numel()} elements; it holds {value.numel()} ({type(self).__name__} keeps "
                        f"{self.bits}-bit codes)"
                    )
                if f"absmax{index}" not in saved or f"qmap{index}" not in saved:
                    raise ValueError(f"{where}: {self.bits}-bit {name} needs absmax{index} and qmap{index}")
                parts = {part: saved[f"{part}{index}"] for part in ("absmax", "qmap")}
                entries = 2**self.bits
                if not isinstance(parts["qmap"], torch.Tensor) or parts["qmap"].numel() != entries:
                    raise ValueError(
                        f"{where}: qmap{index} must be a map of {entries} values ({type(self).__name__} keeps "
                        f"{self.bits}-bit codes)"
                    )
                # copies, as torch's load_state_dict makes: the caller's tensors stay theirs
                codes = value.to(param.device, copy=True).contiguous()
                absmax = parts["absmax"].to(param.device, copy=True)
                qmap = parts["qmap"].to(param.device, copy=True)
                try:
                    checked = quantization.QuantizedState(
                        codes.view(-1), absmax.reshape(-1), qmap, row_length=param.numel()
                    )
                except (TypeError, ValueError) as error:
                    raise ValueError(f"{where}: {name}: {error}") from None
                if signed and not checked.signed:
                    raise ValueError(f"{where}: {name} takes either sign but qmap{index} starts at 0")
                state.update(
                    {name: self.stored_codes(codes, param), f"absmax{index}": absmax.reshape(-1), f"qmap{index}": qmap}
                )
            elif value.dtype == torch.float32:
                if value.numel() != param.numel():
                    raise ValueError(f"{where}: {name} must be a tensor of {param.numel()} elements, as the parameter")
                kinds.add("float32")
                if not torch.isfinite(value).all():
                    raise ValueError(f"{where}: {name} holds inf or NaN")
                state[name] = value.to(param.device).reshape(param.shape).clone()
            else:
                raise ValueError(f"{where}: {name} must be uint8 codes or float32 moments; got {value.dtype}")
        if len(kinds) > 1:
            raise ValueError(f"{where} mixes quantized and float32 states for one tensor; give them in one form")
        return state


def _wrapped(state: dict[str, Any]) -> dict[str, Any]:
    """A parameter's state with its 8-bit tensors (and moments) under bitsandbytes' key."""
    state = dict(state)
    inner = {key: state.pop(key) for key in _QUANTIZED_KEYS if key in state}
    if inner:
        state[QUANT_STATE_KEY] = inner
    return state


def _unwrapped(state: dict[str, Any]) -> dict[str, Any]:
    state = dict(state)
    state.update(state.pop(QUANT_STATE_KEY, {}))
    return state


class AdamW8bit(_Optimizer8bit):
    """torch.optim.AdamW with 8-bit moments (bitsandbytes' AdamW8bit): ``exp_avg`` in state1
    (signed map), ``exp_avg_sq`` in state2 (the map from 0)."""

    function = staticmethod(optim.adamw)
    signed = (True, False)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        maximize: bool = False,
        min_8bit_size: int = quantization.MIN_8BIT_SIZE,
        stochastic_rounding: bool = False,
        seed: int = 0,
    ) -> None:
        checks.non_negative(lr=lr, eps=eps, weight_decay=weight_decay)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, maximize=maximize)
        super().__init__(
            params, defaults, min_8bit_size=min_8bit_size, stochastic_rounding=stochastic_rounding, seed=seed
        )

    def options(self, group: dict[str, Any]) -> dict[str, Any]:
        return dict(
            lr=group["lr"],
            betas=tuple(group["betas"]),
            eps=group["eps"],
            weight_decay=group["weight_decay"],
            maximize=group.get("maximize", False),
        )


class Adam8bit(AdamW8bit):
    """torch.optim.Adam with 8-bit moments: the decay is added to the gradient (L2), as in torch."""

    function = staticmethod(optim.adam)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        **options: Any,
    ) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, **options)


class Lion8bit(_Optimizer8bit):
    """Lion with an 8-bit momentum (bitsandbytes' Lion8bit)."""

    function = staticmethod(optim.lion)
    signed = (True,)
    counted = False

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        *,
        maximize: bool = False,
        min_8bit_size: int = quantization.MIN_8BIT_SIZE,
        stochastic_rounding: bool = False,
        seed: int = 0,
    ) -> None:
        checks.non_negative(lr=lr, weight_decay=weight_decay)
        defaults = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay, maximize=maximize)
        super().__init__(
            params, defaults, min_8bit_size=min_8bit_size, stochastic_rounding=stochastic_rounding, seed=seed
        )

    def options(self, group: dict[str, Any]) -> dict[str, Any]:
        return dict(
            lr=group["lr"],
            betas=tuple(group["betas"]),
            weight_decay=group["weight_decay"],
            maximize=group.get("maximize", False),
        )


class SGD8bit(_Optimizer8bit):
    """torch.optim.SGD with an 8-bit momentum buffer (bitsandbytes' SGD8bit); momentum must be > 0."""

    function = staticmethod(optim.sgd)
    signed = (True,)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        momentum: float,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        min_8bit_size: int = quantization.MIN_8BIT_SIZE,
        stochastic_rounding: bool = False,
        seed: int = 0,
    ) -> None:
        checks.non_negative(lr=lr, weight_decay=weight_decay)
        if not momentum > 0:
            raise ValueError(f"SGD8bit keeps a momentum buffer: momentum must be > 0; got {momentum!r} (use SGD)")
        defaults = dict(
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
            maximize=maximize,
        )
        super().__init__(
            params, defaults, min_8bit_size=min_8bit_size, stochastic_rounding=stochastic_rounding, seed=seed
        )

    def options(self, group: dict[str, Any]) -> dict[str, Any]:
        return {name: group[name] for name in ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize")}


class RMSprop8bit(_Optimizer8bit):
    """torch.optim.RMSprop (no momentum, not centered) with an 8-bit square average."""

    function = staticmethod(optim.rmsprop)
    signed = (False,)
    counted = False

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        maximize: bool = False,
        min_8bit_size: int = quantization.MIN_8BIT_SIZE,
        stochastic_rounding: bool = False,
        seed: int = 0,
    ) -> None:
        checks.non_negative(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay)
        defaults = dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, maximize=maximize)
        super().__init__(
            params, defaults, min_8bit_size=min_8bit_size, stochastic_rounding=stochastic_rounding, seed=seed
        )

    def options(self, group: dict[str, Any]) -> dict[str, Any]:
        return {name: group[name] for name in ("lr", "alpha", "eps", "weight_decay", "maximize")}


class Adagrad8bit(_Optimizer8bit):
    """torch.optim.Adagrad with an 8-bit sum of squares (bitsandbytes' Adagrad8bit)."""

    function = staticmethod(optim.adagrad)
    signed = (False,)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        eps: float = 1e-10,
        *,
        maximize: bool = False,
        min_8bit_size: int = quantization.MIN_8BIT_SIZE,
        stochastic_rounding: bool = False,
        seed: int = 0,
    ) -> None:
        checks.non_negative(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay)
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay, maximize=maximize)
        super().__init__(
            params, defaults, min_8bit_size=min_8bit_size, stochastic_rounding=stochastic_rounding, seed=seed
        )

    def options(self, group: dict[str, Any]) -> dict[str, Any]:
        return {name: group[name] for name in ("lr", "lr_decay", "eps", "weight_decay", "maximize")}


class AdamW4bit(AdamW8bit):
    """AdamW8bit with 4-bit moments (torchao's AdamW4bit): blocks of 128, the 4-bit dynamic map
    for ``exp_avg`` and the linear map without zero for ``exp_avg_sq``."""

    bits = 4


class Adam4bit(Adam8bit):
    """Adam8bit with 4-bit moments (torchao's Adam4bit)."""

    bits = 4


class Lion4bit(Lion8bit):
    """Lion8bit with a 4-bit momentum."""

    bits = 4


class SGD4bit(SGD8bit):
    """SGD8bit with a 4-bit momentum buffer."""

    bits = 4


class RMSprop4bit(RMSprop8bit):
    """RMSprop8bit with a 4-bit square average (the linear map without zero)."""

    bits = 4


class Adagrad4bit(Adagrad8bit):
    """Adagrad8bit with a 4-bit sum of squares (the linear map without zero)."""

    bits = 4


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """The bytes every tensor of ``optimizer``'s state holds (codes, scales, maps, moments)."""
    seen: set[int] = set()
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and id(value) not in seen:
                seen.add(id(value))
                total += value.numel() * value.element_size()
    return total
