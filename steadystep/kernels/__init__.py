"""Formula sources: plain Python, one function per formula, no device code.

Every public function here is compiled by ``steadystep.codegen`` into
``steadystep/cpu/_generated/<module>.py`` (Numba ``@njit``) and ``steadystep/cuda/_generated/<module>.py``
(Numba ``@cuda.jit``), once per dtype. The functions also run as ordinary Python.

Conventions the generator relies on:

* The first docstring line is the catalog description; the second paragraph is the
  formula as printed by ``steadystep.catalog()``.
* Float literals are written plainly (``1.0 - beta1``); the generator casts each one
  to the kernel's dtype, so a float32 kernel does no float64 arithmetic. Integer literals stay
  integers (indices, counts): ``1`` in arithmetic outside an index fails at generation, which asks
  for ``1.0``. A literal beyond the dtype's range means the dtype's own limit (``1e308`` is
  float32's largest finite value, ``1e-300`` its smallest normal value).
* Helpers shared by several formulas live in ``_numerics.py``.
* A formula's parameters, a step's buffers and a fold's states may not take a name the
  generated kernels use themselves (``i``, ``at``, ``size``, ...); generation says which.
* Every helper is inlined into its callers on both targets (``forceinline`` on the CPU): a
  real call would cost more than a short inner loop, and would keep the loops that call
  it from being vectorised.
* Row functions (along the last axis) are declared with `Row`: one or more
  `Fold` passes whose ``merge`` is associative, so the CPU folds a row left to
  right while the GPU folds strided pieces per thread and merges them in a block-wide
  tree. Both call the same piece functions; only the loop skeleton differs by target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FORMULA_MODULES = (
    "autograd_graph",
    "autograd_ops",
    "gradient_descent",
    "training_stability",
    "numerical_stability",
    "optim",
    "decentral",
    "compress",
    "models",
)


@dataclass(frozen=True)
class Fold:
    """One pass over a row: ``state`` starts at ``identity``; each element ``x`` becomes
    ``lift(x, *earlier_results)`` and is merged in with ``merge(*state_a, *state_b)``.
    Piece functions return tuples, one entry per state component."""

    state: tuple[str, ...]
    identity: tuple[float, ...]
    lift: str
    merge: str


@dataclass(frozen=True)
class Step:
    """A fused, in-place optimizer step: ``formula(*buffers, *scalars)`` returns the new
    values of ``updates`` (a subset of ``buffers``), written back in the same pass.

    Each buffer may also be a scalar placeholder (an unused optional buffer: it reads as
    the scalar and is never written). ``indexed`` arguments are per-segment arrays read at
    ``segment_ids[i]``. Every other argument is a scalar or a per-element array (``at``).
    The ``gradient`` argument is multiplied by ``grad_scale`` as it is read, and nothing at
    all happens when ``skip_step`` (AMP's found-inf flag) is non-zero: both are scalars or
    one-element arrays on the device, so an AMP step needs no host synchronisation. So may
    the scalars named in ``device_scalars`` (read once per launch), for numbers computed on
    the device. A non-finite ``grad_scale`` or device scalar makes the step write nothing,
    as ``skip_step`` does: the host refuses such numbers, and this is what the device does
    with them.

    Roles are declared here, never recognised by name: ``gradient`` (scaled by
    ``grad_scale``), ``mask`` (a 0/1 per-element array, or the number 1, checked to hold
    only 0 and 1), ``sign`` (the ±1 factor maximize sets), and ``names`` (what the caller
    calls an argument, for messages).
    """

    name: str
    formula: str
    buffers: tuple[str, ...]
    updates: tuple[str, ...]
    indexed: tuple[str, ...] = ()
    device_scalars: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()  # buffers an option may leave out (SGD's momentum_buffer); the others are required
    gradient: str | None = None
    mask: str | None = None
    sign: str | None = None
    names: tuple[tuple[str, str], ...] = ()  # (the formula's name, the caller's name)
    guards_scale: bool = (
        True  # a non-finite grad_scale writes nothing (False: it scales, as clipping's NaN does in torch)
    )
    # A step whose scalars are the caller's numbers as they are declares them here, with their
    # defaults: ``optim.fused_step`` then makes its functional step, and steadystep.torch a
    # drop-in named ``drop_in``, from this entry alone (ARCHITECTURE.md, "Adding an optimizer").
    hyperparameters: tuple[tuple[str, float], ...] = ()
    drop_in: str | None = None


# Elements per block of an 8-bit state (SPEC §9): one float32 absmax each, bitsandbytes' block.
QUANTIZATION_BLOCK = 256
# the code widths offered, and each one's block: bitsandbytes' for 8 bits, torchao's for 4
QUANTIZATION_BLOCKS = {8: QUANTIZATION_BLOCK, 4: QUANTIZATION_BLOCK // 2}


def blockwise_family(bits: int) -> str:
    """What a step's kernels with codes of ``bits`` are called, and how the GPU launches them:
    ``blockwise`` for 8 bits, ``blockwise4`` for 4."""
    return "blockwise" + ("" if bits == 8 else str(bits))


BLOCKWISE_FAMILIES = tuple(blockwise_family(bits) for bits in QUANTIZATION_BLOCKS)


def blockwise_prefix(step_name: str, suffix: str, bits: int) -> str:
    """The name of a step's blockwise kernels before ``_scales``/``_codes``: codes of 8 bits,
    ``<step>_<suffix>_blockwise``; of 4 bits, ``<step>_<suffix>_blockwise4``."""
    return f"{step_name}_{suffix}_{blockwise_family(bits)}"


# what a quantized buffer's codes travel with into a blockwise kernel, as <buffer>_<part>
QUANTIZED_PARTS = ("absmax", "qmap", "midpoints", "lookup")
# A blockwise kernel's arguments that are not its step's: integers (the rows' length, the
# rounding keys of the parameter and of the states) and the scratch its two kernels share
# (each block's new absmax, the refusal flag). `Blockwise.arguments` puts them in order.
BLOCKWISE_INTEGERS = ("row_length", "rounding", "state_rounding")
BLOCKWISE_SCRATCH = ("new_absmax", "refused")


@dataclass(frozen=True)
class Blockwise:
    """A fused step whose ``quantized`` state buffers are stored as 8-bit codes, with one
    float32 absmax per block of ``QUANTIZATION_BLOCK`` elements of a row (SPEC §9): each code
    indexes a 256-entry increasing map (``signed``: one that holds negative values, for a
    first moment; else one from 0, for a second moment).

    The generator emits two float32 kernels, run in turn: ``<name>_f32_blockwise_scales``
    dequantizes (m = absmax·map[code]), runs ``step``'s formula and keeps each block's new
    max |m|, and ``<name>_f32_blockwise_codes`` runs the formula again, writes what it
    updates, and stores each new moment as the code nearest m/absmax (or one of its two
    neighbours, stochastically). A block whose new absmax is not finite makes the first
    flag ``refused`` and the second write nothing at all, so a failed step leaves every
    buffer as it was. On the CPU the codes kernel finds each block's absmax itself, and the
    scales kernel is skipped where the step's numbers and arrays are within bounds that no
    moment can overflow from (cpu/backend.py): so each moment's update must be a polynomial of
    degree at most 2 in the gradient, the parameter and the old moment (tests/test_quantization.py
    checks it at the bounds' corners). The buffers may hold several rows of ``row_length`` elements (N
    workers' [N, D] rows): blocks never straddle two rows, ``per_row`` arguments are read
    once per row (a worker's clip coefficient), and the step's mask is per column.
    ``reads_param``: whether a moment's update reads the parameter (a weight decay added to the
    gradient); where not (decoupled decay), the CPU's bound check leaves the parameter out, and
    the tests check that the moments do not change with it.
    """

    step: Step
    quantized: tuple[str, ...]
    signed: tuple[bool, ...]
    per_row: tuple[str, ...] = ()
    reads_param: bool = True

    @property
    def name(self) -> str:
        return self.step.name

    def arguments(self, params: Sequence[str]) -> tuple[list[str], list[str]]:
        """Its kernels' arguments in order, and the step's scalars among them (``params``: the
        formula's parameters): each quantized buffer comes as its codes and QUANTIZED_PARTS."""
        step = self.step
        buffers = []
        for name in step.buffers:
            buffers += [name, *(f"{name}_{part}" for part in QUANTIZED_PARTS)] if name in self.quantized else [name]
        scalars = [name for name in params if name not in step.buffers and name not in self.per_row]
        row_length, *keys = BLOCKWISE_INTEGERS
        arguments = [
            "skip_step",
            "grad_scale",
            row_length,
            *buffers,
            *self.per_row,
            *scalars,
            *keys,
            *BLOCKWISE_SCRATCH,
        ]
        return arguments, scalars


@dataclass(frozen=True)
class Mixing:
    """A decentralized step over [N, D] buffers: every worker's ``formula`` update (moments
    included) and the parameter mixing of its ``kind``, in one launch, written over the
    buffers in place so that no worker reads a half-updated neighbour.

    ``peer``: x_i mixes with ``peers[i]`` (weights a, b); ``complete``: with the column mean
    (computed once per column); ``dense``: with any matrix W. ``atc`` chooses
    adapt-then-combine (mix the updated parameters) over adapt-while-combine (update the
    mixed ones). ``formula`` takes, in this order, the parameter, the ``gradient``, the
    other ``state`` buffers, the worker's ``per_worker`` factor (its clip coefficient), the
    column's ``per_column`` value (its decay mask entry), then its scalars; it returns the
    new values of ``state``. The generator checks that the formula's parameters say so.
    """

    kind: str
    formula: str
    state: tuple[str, ...]
    gradient: str
    per_worker: str
    per_column: str

    @property
    def leading(self) -> tuple[str, ...]:
        """The formula's first parameters, in order."""
        return (self.state[0], self.gradient, *self.state[1:], self.per_worker, self.per_column)


@dataclass(frozen=True)
class Grid:
    """A kernel over every (row, column) pair of a 2-D index space, e.g. (worker, sample):
    ``formula(row, column, *arguments)`` writes its own results, and no two pairs write the
    same element, so the pairs run in parallel without atomics (columns are the fast axis)."""

    formula: str


@dataclass(frozen=True)
class Summary:
    """What ``value`` needs of a row, computed once per row: ``function(*results, length)``
    returns one entry per name in ``state`` (a logarithm of the row's total, say, which the
    CPU would otherwise take again for every element of a batch of short rows)."""

    state: tuple[str, ...]
    function: str


@dataclass(frozen=True)
class Row:
    """A row function: its passes, then either ``finish(*results, length)`` once per row
    (``outputs`` values) or ``value(x, *results, length)`` for every element; with a
    ``summary``, ``value(x, *summary)`` instead. With a ``share``, the last pass also writes
    ``share(*what its lift returned)`` to the output, and ``value`` takes that in place of
    x: softmax's exp(x − max), which its last pass has just computed."""

    name: str
    description: str
    formula: str
    passes: tuple[Fold, ...]
    finish: str | None = None
    value: str | None = None
    outputs: int = 1
    summary: Summary | None = None
    share: str | None = None
