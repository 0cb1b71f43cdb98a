"""Writes the CPU and CUDA kernel files from the formula sources in ``steadystep/kernels``.

Run ``python -m steadystep.codegen`` after editing a formula; ``tests/test_codegen.py``
fails while the committed files differ from what this module generates, so the CPU
and CUDA builds can only ever come from the same source.

For every dtype (float32 as ``f32``, float64 as ``f64``) each target file gets:

* ``name_f32`` for every function in the formula module (and the ``_numerics`` helpers
  it uses): the function's own body with every float literal cast to the dtype and
  calls renamed to their ``_f32`` twins, so float32 stays float32;
* ``name_f32_kernel(out, *args)`` for every public formula: the elementwise loop. Each
  argument is a 1-D array of ``out``'s length or a scalar; ``at(x, i)`` picks ``x[i]`` or
  ``x`` at compile time;
* ``name_f32_rows`` for every `Row`: the row loop over a 2-D ``xs``, on the CPU in vector
  lanes; on the GPU ``(out, xs)``, one thread block per row, and also
  ``name_f32_short_rows``, one thread per row;
* ``name_f32_step(skip_step, grad_scale, [segment_ids,] *buffers, *scalars)`` for every
  `Step`: the fused in-place optimizer update (a grid-stride loop on the GPU);
* ``name_f32_mix(...)`` for every `Mixing`: a decentralized
  step over [N, D] buffers;
* ``name_f32_grid(rows, columns, *args)`` for every `Grid`:
  the formula once per (row, column) pair, in parallel.

Every CPU kernel is serial and takes two more arguments, ``part, parts``: it
runs that part of its outer loop, ``(0, 1)`` the whole of it; a large call runs the parts at
once (cpu/parallel.py).

Generated files are real modules on disk, so Numba's ``cache=True`` works for them.
"""

from __future__ import annotations

import ast
import copy
import fnmatch
import functools
import hashlib
import importlib
import importlib.util
import math
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from steadystep.kernels import (
    QUANTIZATION_BLOCK,
    QUANTIZATION_BLOCKS,
    Blockwise,
    FORMULA_MODULES,
    Fold,
    Grid,
    Mixing,
    Row,
    Step,
    Summary,
    blockwise_prefix,
)

__all__ = [
    "Target",
    "TARGETS",
    "generate_module",
    "generated_files",
    "generated_path",
    "main",
]

PACKAGE = Path(__file__).resolve().parent
KERNELS = PACKAGE / "kernels"
HELPERS = "_numerics"
DTYPES: dict[str, type[np.floating]] = {"f32": np.float32, "f64": np.float64}
MATH_CONSTANTS = {"pi", "e", "tau", "inf", "nan"}


@dataclass(frozen=True)
class Target:
    name: str
    imports: str
    primitives: tuple[str, ...]  # names imported from steadystep.<target>.primitives
    native_helpers: frozenset[str]  # helpers the target's primitives module provides
    device_decorator: str
    builtins: dict[str, str]  # builtins a formula calls -> the primitive the target calls instead
    kernel_decorator: str
    step_decorator: str
    loop: str  # the loop of an elementwise or step kernel over {length}'s elements, index i
    kernel_range: str  # the parameters after a kernel's own that choose the part of its loop it runs


CPU = Target(
    name="cpu",
    imports=(
        "import math  # noqa: F401  (formulas may call math functions)\n\n"
        "import numpy as np  # noqa: F401\n"
        "from numba import njit  # noqa: F401\n"
        "from numpy import float32, float64  # noqa: F401  (literal casts)"
    ),
    primitives=(
        "DistinctBuffers",
        "LANES",
        "at",
        "byte_planes",
        "cast_like",
        "copy_transposed",
        "dequantize_block",
        "dequantize_pairs",
        "lane_array",
        "lane_chunks",
        "part_of",
        "put",
        "put_rounded",
        "quantize_block",
        "quantize_block_rounded",
        "quantize_pairs",
        "quantize_pairs_rounded",
        "unowned",
    ),
    native_helpers=frozenset(
        {
            "code_bucket",
            "code_in_bucket",
            "exp",
            "exp_with_tail",
            "floor",
            "larger_magnitude",
            "largest",
            "log1p",
            "uniform",
        }
    ),
    device_decorator='@njit(error_model="numpy", cache=True, forceinline=True)',
    builtins={},
    # Every kernel is serial and runs part ``part`` of ``parts`` of its outer loop: a large call
    # runs the parts at once (cpu/parallel.py), a small one the whole loop, (0, 1). The steps'
    # buffers never share written memory: their kernels' pointers are noalias (DistinctBuffers).
    kernel_decorator='@njit(error_model="numpy", cache=True)',
    step_decorator='@njit(error_model="numpy", cache=True, pipeline_class=DistinctBuffers)',
    loop="begin, end = part_of({length}.shape[0], part, parts)\n    for i in range(begin, end):",
    kernel_range=", part, parts",
)
CUDA = Target(
    name="cuda",
    imports=("from numba import cuda\nfrom numpy import float32, float64  # noqa: F401  (literal casts)"),
    primitives=(
        "ROW_THREADS",
        "at",
        "cast_like",
        "device_function",
        "jit_kernel",
        "math",
        "put",
        "put_rounded",
        "python_max",
        "python_min",
    ),
    native_helpers=frozenset({"code_bucket", "code_in_bucket", "cospi", "floor", "uniform"}),
    device_decorator="@device_function",  # cuda.jit(device=True), inlined by NVVM: primitives.py says why
    # Numba's CUDA min/max of floats are fmin/fmax, which drop a NaN; the CPU's keep Python's rule
    builtins={"max": "python_max", "min": "python_min"},
    kernel_decorator="@jit_kernel",  # cuda.jit, linked from PTX: primitives.py says why
    step_decorator="@jit_kernel",
    loop="for i in range(cuda.grid(1), {length}.shape[0], cuda.gridsize(1)):",
    kernel_range="",
)
TARGETS = (CPU, CUDA)


def dtype_literal(value: float, dtype: type[np.floating]) -> float:
    """The literal a kernel of ``dtype`` uses for ``value``.

    A magnitude the dtype cannot hold means the dtype's own limit: above its largest
    finite value it is that value, below its smallest normal value (but non-zero) it is
    that normal value. So ``|x| <= 1e308`` still rejects inf in float32, and
    ``|den| < 1e-300`` still treats a float32 subnormal as too small.
    """
    info = np.finfo(dtype)
    magnitude = abs(value)
    if math.isfinite(magnitude) and magnitude > float(info.max):
        return math.copysign(float(info.max), value)
    if 0.0 < magnitude < float(info.tiny):
        return math.copysign(float(info.tiny), value)
    return float(dtype(value))


def _cast_source(value: float, suffix: str) -> str:
    """Source text of ``value`` cast to the dtype of ``suffix``."""
    dtype = DTYPES[suffix]
    literal = dtype_literal(value, dtype)
    if math.isinf(literal):
        text = "math.inf" if literal > 0 else "-math.inf"
    elif math.isnan(literal):
        text = "math.nan"
    else:
        text = repr(literal)
    return f"{dtype.__name__}({text})"


class _Specialize(ast.NodeTransformer):
    """Casts literals to one dtype and renames calls to their dtype twins."""

    def __init__(self, suffix: str, renamed: set[str], builtins: dict[str, str]):
        self.suffix = suffix
        self.renamed = renamed
        self.builtins = builtins

    def _cast(self, value: float) -> ast.expr:
        return ast.parse(_cast_source(float(value), self.suffix), mode="eval").body

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if isinstance(node.value, float):  # integer literals stay integers: indices and counts
            return self._cast(node.value)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id == "math" and node.attr in MATH_CONSTANTS:
            return self._cast(getattr(math, node.attr))
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.renamed:
            return ast.Name(f"{node.id}_{self.suffix}", node.ctx)
        if node.id in self.builtins:
            return ast.Name(self.builtins[node.id], node.ctx)
        return node


def _functions(path: Path) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def _called_names(function: ast.FunctionDef) -> set[str]:
    return {
        node.func.id for node in ast.walk(function) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }


def _without_docstring(function: ast.FunctionDef) -> list[ast.stmt]:
    body = function.body
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return body[1:]
    return body


def _device_function(function: ast.FunctionDef, suffix: str, renamed: set[str], target: Target) -> str:
    clone = copy.copy(function)  # keeps the fields this Python's FunctionDef has (type_params from 3.12)
    clone.name = f"{function.name}_{suffix}"
    specialize = _Specialize(suffix, renamed, target.builtins)
    clone.body = [specialize.visit(copy.deepcopy(statement)) for statement in _without_docstring(function)]
    clone.decorator_list, clone.returns = [], None
    return f"{target.device_decorator}\n{ast.unparse(ast.fix_missing_locations(clone))}"


def _elementwise_kernel(function: ast.FunctionDef, suffix: str, target: Target) -> str:
    params = [arg.arg for arg in function.args.args]
    loads = ", ".join(f"at({name}, i)" for name in params)
    return (
        f"{target.kernel_decorator}\n"
        f"def {function.name}_{suffix}_kernel(out, {', '.join(params)}{target.kernel_range}):\n"
        f"    {target.loop.format(length='out')}\n"
        f"        put(out, i, {function.name}_{suffix}({loads}))\n"
    )


def _fold_element(
    fold: Fold, suffix: str, earlier: list[str], into: list[str], element: str, share: tuple[str, str] | None = None
) -> list[str]:
    """Lines that lift ``element`` and merge it into the state variables ``into``; with a
    ``share`` (the function, where to write it), they also write the element's share."""
    lifted = [f"lifted_{k}" for k in range(len(fold.state))]
    context = "".join(", " + name for name in earlier)
    lines = [
        f"{', '.join(lifted)}, = {fold.lift}_{suffix}({element}{context})",
        f"{', '.join(into)}, = {fold.merge}_{suffix}({', '.join(into + lifted)})",
    ]
    if share is not None:  # after the lift, which may read the element from where the share goes
        function, destination = share
        lines.append(f"{destination} = {function}_{suffix}({', '.join(lifted)})")
    return lines


def _shares(row: Row, fold: Fold, destination: str) -> tuple[str, str] | None:
    """``_fold_element``'s ``share`` for the row's last pass, None for the others."""
    return (row.share, destination) if row.share is not None and fold is row.passes[-1] else None


def _column_fold_lines(row: Row, fold: Fold, earlier: list[str], suffix: str, columns: str) -> list[str]:
    """A GPU thread's pass over the ``columns`` of its row that it takes (all of a short row,
    or a strided piece of a long one), its state carried from element to element."""
    state = list(fold.state)
    identity = ", ".join(_cast_source(value, suffix) for value in fold.identity)
    element = _fold_element(fold, suffix, earlier, state, "xs[row, j]", _shares(row, fold, "out[row, j]"))
    return [f"{', '.join(state)}, = {identity},", f"for j in {columns}:", *(f"    {line}" for line in element)]


def _block_merge_lines(fold: Fold, suffix: str) -> list[str]:
    """The block merges its threads' pieces of the row in a tree through shared memory."""
    state = list(fold.state)
    lines = [f"shared_{name}[thread] = {name}" for name in state]
    lines += ["cuda.syncthreads()", "step = ROW_THREADS // 2", "while step > 0:", "    if thread < step:"]
    pairs = [f"shared_{name}[thread]" for name in state] + [f"shared_{name}[thread + step]" for name in state]
    lines.append(f"        {', '.join(state)}, = {fold.merge}_{suffix}({', '.join(pairs)})")
    lines += [f"        shared_{name}[thread] = {name}" for name in state]
    lines += ["    cuda.syncthreads()", "    step //= 2"]
    return lines + [f"{name} = shared_{name}[0]" for name in state]


def _lane_fold_lines(row: Row, fold: Fold, earlier: list[str], suffix: str) -> list[str]:
    """The CPU's pass over one long row (at least two chunks of LANES columns): the whole
    chunks are folded into LANES independent states (lane k takes columns k, k + LANES, ...),
    a loop over the lanes that the compiler vectorises; the lanes are merged pairwise (a
    tree, also vectorised). The columns after the last whole chunk go to the first lanes
    before the tree: folded one by one after it, the ≤ 63 scalar exponentials of a
    1000-column row took as long as the 960 vectorised ones. One state carried along the row
    would make each element wait for the previous merge (a compensated add is four dependent
    operations)."""
    state = list(fold.state)
    lanes = _lanes(state)
    merge = f"{fold.merge}_{suffix}"
    share = _shares(row, fold, "shares[k]")
    element = _fold_element(fold, suffix, earlier, lanes, "values[k]", share)
    columns = ["chunk * LANES:(chunk + 1) * LANES", "chunks * LANES:"]
    slices = [[f"values = xs[row, {span}]", *([f"shares = out[row, {span}]"] if share else [])] for span in columns]
    lines = _lanes_reset(fold, suffix)
    lines += [
        "for chunk in range(chunks):",
        *(f"    {line}" for line in slices[0]),
        "    for k in range(LANES):",
        *(f"        {line}" for line in element),
    ]
    # the tail in a loop of its own, so that the whole chunks' loop keeps its constant trip count
    lines += [*slices[1], "for k in range(values.shape[0]):", *(f"    {line}" for line in element)]
    lines += [
        "width = LANES",
        "while width > 1:",
        "    width //= 2",
        "    for k in range(width):",
        f"        {', '.join(lanes)}, = {merge}({', '.join(lanes + _lanes(state, 'k + width'))})",
    ]
    lines += [f"{', '.join(state)}, = {', '.join(_lanes(state, '0'))},"]
    return lines


def _lanes(names, index: str = "k") -> list[str]:
    """The lane arrays' entries ``lane_<name>[index]`` for state variables ``names``."""
    return [f"lane_{name}[{index}]" for name in names]


def _lanes_reset(fold: Fold, suffix: str) -> list[str]:
    identity = [_cast_source(value, suffix) for value in fold.identity]
    return ["for k in range(LANES):", *(f"    {lane} = {value}" for lane, value in zip(_lanes(fold.state), identity))]


def _finish_lines(row: Row, suffix: str, arguments: str, index: str) -> list[str]:
    """Lines that write the row's ``finish(arguments)`` to ``out[index]`` (``out[index, k]``
    for the k-th of several outputs)."""
    call = f"{row.finish}_{suffix}({arguments})"
    if row.outputs == 1:
        return [f"out[{index}] = {call}"]
    names = [f"result_{k}" for k in range(row.outputs)]
    return [f"{', '.join(names)} = {call}", *(f"out[{index}, {k}] = {name}" for k, name in enumerate(names))]


def _group_fold_lines(row: Row, fold: Fold, earlier: list[str], suffix: str) -> list[str]:
    """The CPU's pass over a group of LANES short rows, transposed into ``columns``: lane k
    folds row k, so that one vectorised step takes a column of all LANES rows. A share
    takes its element's place in ``columns``."""
    element = _fold_element(
        fold, suffix, _lanes(earlier), _lanes(fold.state), "values[k]", _shares(row, fold, "values[k]")
    )
    lines = _lanes_reset(fold, suffix)
    lines += ["for j in range(xs.shape[1]):", "    values = columns[j]", "    for k in range(LANES):"]
    lines += [f"        {line}" for line in element]
    return lines


def _cpu_row_kernel(row: Row, suffix: str) -> str:
    """A row kernel for the CPU, serial, over its part of the rows: a large call runs the parts
    at once (cpu/parallel.py), each part allocating its lanes once.
    Rows of fewer than two chunks of LANES columns are taken LANES at a time, one row per
    lane; longer rows one at a time, their columns spread over the lanes."""
    dtype = DTYPES[suffix].__name__
    results = [name for fold in row.passes for name in fold.state]
    summary = row.summary.state if row.summary is not None else ()
    short: list[str] = [
        "group = min(LANES, end - first)",
        "copy_transposed(columns, 0, xs, first, group, xs.shape[1])",
    ]
    long: list[str] = []
    earlier: list[str] = []
    for fold in row.passes:
        short += _group_fold_lines(row, fold, earlier, suffix)
        long += _lane_fold_lines(row, fold, earlier, suffix)
        earlier += list(fold.state)
    at_lane = ", ".join(_lanes(results) + ["length"])
    long += _row_write_lines(row, suffix, ", ".join(results + ["length"]), "range(xs.shape[1])")
    if row.finish is not None:
        short += [
            "for k in range(group):",
            *(f"    {line}" for line in _finish_lines(row, suffix, at_lane, "first + k")),
        ]
    else:
        if row.summary is not None:
            call = f"{row.summary.function}_{suffix}"
            short += ["for k in range(LANES):", f"    {', '.join(_lanes(summary))}, = {call}({at_lane})"]
            at_lane = ", ".join(_lanes(summary))
        if row.share is not None:  # the shares are in columns: a vectorised step over a column, then back
            short += [
                "for j in range(xs.shape[1]):",
                "    values = columns[j]",
                "    for k in range(LANES):",
                f"        values[k] = {row.value}_{suffix}(values[k], {at_lane})",
                "copy_transposed(out, first, columns, 0, xs.shape[1], group)",
            ]
        else:  # a value of x: along each row, from xs, with no transpose back
            short += [
                "for k in range(group):",
                "    for j in range(xs.shape[1]):",
                f"        out[first + k, j] = {row.value}_{suffix}(xs[first + k, j], {at_lane})",
            ]
    lines = [
        CPU.kernel_decorator,
        f"def {row.name}_{suffix}_rows(out, xs{CPU.kernel_range}):",
        "    begin, end = part_of(xs.shape[0], part, parts)",
        f"    length = {dtype}(xs.shape[1])",
        "    chunks = lane_chunks(xs.shape[1])",
        *(f"    lane_{name} = lane_array({dtype}(0.0), LANES)" for name in sorted({*_state_names(row), *summary})),
        "    if chunks == 0:",
        f"        columns = np.zeros((xs.shape[1], LANES), {dtype})",
        # in a short last group the lanes past its rows fold what the group before left: never written out
        "        for first in range(begin, end, LANES):",
        *(f"            {line}" for line in short),
        "    else:",
        "        for row in range(begin, end):",
        *(f"            {line}" for line in long),
    ]
    return "\n".join(lines) + "\n"


def _row_kernels(row: Row, suffix: str, target: Target) -> list[str]:
    if target is CPU:
        return [_cpu_row_kernel(row, suffix)]
    return [_cuda_row_kernel(row, suffix, short=False), _cuda_row_kernel(row, suffix, short=True)]


def _cuda_row_kernel(row: Row, suffix: str, short: bool) -> str:
    """A row kernel for the GPU: one block per row (``<name>_rows``: its threads fold strided
    pieces, then merge them in a tree), or, for short rows, one thread per row
    (``<name>_short_rows``: a block of threads on a row of ten would mostly idle, and wait
    at every level of the tree)."""
    dtype = DTYPES[suffix].__name__
    columns = "range(xs.shape[1])" if short else "range(thread, xs.shape[1], ROW_THREADS)"
    results: list[str] = []
    body: list[str] = []
    for fold in row.passes:
        body += _column_fold_lines(row, fold, list(results), suffix, columns)
        body += [] if short else _block_merge_lines(fold, suffix)
        results += list(fold.state)
    write = _row_write_lines(row, suffix, ", ".join(results + ["length"]), columns)
    if short:
        header = [
            f"def {row.name}_{suffix}_short_rows(out, xs):",
            f"    length = {dtype}(xs.shape[1])",
            "    for row in range(cuda.grid(1), xs.shape[0], cuda.gridsize(1)):",
        ]
    else:
        if row.finish is not None:  # one value per row: the block's first thread writes it
            write = ["if thread == 0:", *(f"    {line}" for line in write)]
        write.append("cuda.syncthreads()  # the next row reuses the shared arrays")
        header = [
            f"def {row.name}_{suffix}_rows(out, xs):",
            "    thread = cuda.threadIdx.x",
            f"    length = {dtype}(xs.shape[1])",
        ]
        header += [f"    shared_{name} = cuda.shared.array(ROW_THREADS, {dtype})" for name in _state_names(row)]
        header.append("    for row in range(cuda.blockIdx.x, xs.shape[0], cuda.gridDim.x):")
    return "\n".join([CUDA.kernel_decorator, *header, *(f"        {line}" for line in body + write)]) + "\n"


def _row_write_lines(row: Row, suffix: str, arguments: str, columns: str) -> list[str]:
    """Lines that write one row's result from its folded state (``arguments``): ``finish``
    to ``out[row]``, or ``value`` (after the summary, if any) to each of the row's ``columns``
    this thread takes."""
    if row.finish is not None:
        return _finish_lines(row, suffix, arguments, "row")
    lines = []
    if row.summary is not None:
        lines = [f"{', '.join(row.summary.state)}, = {row.summary.function}_{suffix}({arguments})"]
        arguments = ", ".join(row.summary.state)
    return lines + [f"for j in {columns}:", f"    out[row, j] = {row.value}_{suffix}({_element(row)}, {arguments})"]


def _element(row: Row) -> str:
    """What ``value`` takes for element j of a long row (and on the GPU): x, or its share."""
    return "out[row, j]" if row.share is not None else "xs[row, j]"


def _state_names(row: Row) -> list[str]:
    return sorted({name for fold in row.passes for name in fold.state})


def _step_kernel(step: Step, formula: ast.FunctionDef, suffix: str, target: Target) -> str:
    params = [arg.arg for arg in formula.args.args]
    scalars = [name for name in params if name not in step.buffers and name not in step.indexed]
    segment = ["segment_ids"] if step.indexed else []
    # ``rounding``: 0 rounds half-precision buffers to nearest, another integer keys their
    # stochastic rounding (``_arrays.ROUNDING``)
    arguments = ["skip_step", "grad_scale", *segment, *step.buffers, *step.indexed, *scalars, "rounding"]
    reference = step.buffers[0]
    lines = [
        target.step_decorator,
        f"def {step.name}_{suffix}_step({', '.join(arguments)}{target.kernel_range}):",
        *_step_prelude(step, params, scalars, suffix),
    ]
    if step.indexed and target is CPU:
        # The per-element gather of a segment's value kept the loop scalar (LARS ran at a
        # third of SGD's speed). Segment ids never decrease, so a block whose first and last
        # ids agree lies in one tensor (every block of an arena's large tensors): its values
        # are read once and the inner loop vectorizes (2x at 1M).
        lines += [
            f"    size = {reference}.shape[0]",
            f"    begin, end = part_of((size + {SEGMENT_BLOCK - 1}) // {SEGMENT_BLOCK}, part, parts)",
            "    for block in range(begin, end):",
            f"        start = block * {SEGMENT_BLOCK}",
            f"        stop = min(start + {SEGMENT_BLOCK}, size)",
            "        if segment_ids[start] == segment_ids[stop - 1]:",
            *(f"            {name}_here = {name}[segment_ids[start]]" for name in step.indexed),
            "            for i in range(start, stop):",
            *_step_body(step, formula, suffix, params, "{name}_here", "                "),
            "        else:",
            "            for i in range(start, stop):",
            *_step_body(step, formula, suffix, params, "{name}[segment_ids[i]]", "                "),
        ]
    else:
        lines += [
            f"    {target.loop.format(length=reference)}",
            *_step_body(step, formula, suffix, params, "{name}[segment_ids[i]]", "        "),
        ]
    return "\n".join(lines) + "\n"


SEGMENT_BLOCK = 256  # elements per block of an indexed CPU step: smaller was slower, larger no faster


def _step_prelude(step: Step, params: list[str], scalars: list[str], suffix: str) -> list[str]:
    """A step kernel's first lines: its numbers in the buffers' dtype, and the returns that make
    it write nothing (AMP's skip, a non-finite scale or device scalar)."""
    zero = _cast_source(0.0, suffix)
    reference = step.buffers[0]
    lines = [
        *(
            f"    {name} = cast_like({name}, {reference})"
            for name in ["skip_step", "grad_scale", *scalars]
            if name not in step.device_scalars
        ),
        *(f"    {name} = cast_like(at({name}, 0), {reference})" for name in step.device_scalars),
        f"    if at(skip_step, 0) != {zero}:",
        "        return",
        *(["    grad_factor = at(grad_scale, 0)"] if step.gradient in params else []),
    ]
    # x − x is 0 for a finite x, NaN for ±inf and NaN: a non-finite number computed on the
    # device (a count's schedule, an inverse loss scale) makes the step write nothing.
    guarded = [*(["grad_factor"] if step.gradient in params and step.guards_scale else []), *step.device_scalars]
    return lines + [f"    if {name} - {name} != {zero}:\n        return" for name in guarded]


def _step_body(
    step: Step, formula: ast.FunctionDef, suffix: str, params: list[str], indexed_load: str, indent: str
) -> list[str]:
    """Element i of a step: the formula on the loaded values, then the updated buffers written."""
    loads = []
    for name in params:
        if name == step.gradient:
            loads.append(f"at({name}, i) * grad_factor")
        elif name in step.indexed:
            loads.append(indexed_load.format(name=name))
        else:
            loads.append(f"at({name}, i)")
    updated = ", ".join(f"new_{name}" for name in step.updates)
    return [
        f"{indent}{updated}, = {formula.name}_{suffix}({', '.join(loads)})",
        # the first buffer (the parameters) may round stochastically; the state to nearest
        f"{indent}put_rounded({step.updates[0]}, i, new_{step.updates[0]}, rounding)",
        *(f"{indent}put({name}, i, new_{name})" for name in step.updates[1:]),
    ]


BLOCKS_PER_TASK = 64  # quantization blocks a CPU task takes in turn (its scratch is made once per task)


def _blockwise_loads(blockwise: Blockwise, params: list[str], dequantized: str, column: str) -> str:
    """The formula's arguments at element i (``column``: its index in the row, for the mask)."""
    step = blockwise.step
    loads = []
    for name in params:
        if name == step.gradient:
            loads.append(f"at({name}, i) * grad_factor")
        elif name in blockwise.quantized:
            loads.append(dequantized.format(name=name))
        elif name in blockwise.per_row:
            loads.append(f"{name}_here")
        elif name == step.mask:
            loads.append(f"at({name}, {column})")
        else:
            loads.append(f"at({name}, i)")
    return ", ".join(loads)


def _running_absmax(quantized: list, suffix: str) -> list[str]:
    """Each quantized state's running absmax taking the element's new value, on either target."""
    return [f"{name}_largest = larger_magnitude_{suffix}({name}_largest, new_{name})" for _, name in quantized]


def _blockwise_kernels(
    blockwise: Blockwise, formula: ast.FunctionDef, suffix: str, target: Target, bits: int = 8
) -> list[str]:
    """The two kernels of a step with quantized states (``kernels.Blockwise``), float32 only, for
    codes of ``bits``: 8 (a uint8 an element) or 4 (two a byte, the first in the high nibble;
    each row starts a byte, so a pair never straddles two rows or blocks)."""
    step = blockwise.step
    params = [arg.arg for arg in formula.args.args]
    arguments, scalars = blockwise.arguments(params)
    prelude = _step_prelude(step, params, scalars, suffix)
    zero, one = _cast_source(0.0, suffix), _cast_source(1.0, suffix)
    call = f"{formula.name}_{suffix}"
    updated = ", ".join(f"new_{name}" for name in step.updates) + ","
    b = QUANTIZATION_BLOCKS[bits]
    packed = bits == 4
    span = [
        f"blocks_per_row = (row_length + {b - 1}) // {b}",
        f"blocks = {step.buffers[0]}.shape[0] // row_length * blocks_per_row",
    ]
    locate = [  # the block's row, its first and last element, and what the row's per-row arguments hold
        "row = block // blocks_per_row",
        f"start = row * row_length + block % blocks_per_row * {b}",
        f"stop = min(start + {b}, (row + 1) * row_length)",
        *(f"{name}_here = {name}[row]" for name in blockwise.per_row),
        *(["base = row * ((row_length + 1) // 2) + (start - row * row_length) // 2"] if packed else []),
    ]
    quantized = list(enumerate(blockwise.quantized))
    refuse = [f"if not is_finite_{suffix}({name}_largest):\n    refused[0] = {one}" for _, name in quantized]
    writes = [
        f"put_rounded({step.updates[0]}, i, new_{step.updates[0]}, rounding)",
        *(f"put({name}, i, new_{name})" for name in step.updates[1:] if name not in blockwise.quantized),
    ]

    def scaled(name: str, value: str) -> str:  # m/absmax for the code, 0 in a block of zeros
        return f"{value} / {name}_scale if {name}_scale > {zero} else {zero}"

    def nearest(name: str, value: str) -> str:  # 4 bits: fifteen comparisons; 8 bits: the bucket lookup
        if packed:
            return f"nearest_code16_{suffix}({value}, {name}_midpoints)"
        return f"nearest_code_{suffix}({value}, {name}_lookup)"

    def rounded(name: str, j: int, value: str, index: str) -> str:
        return (
            f"rounded_code_{suffix}({value}, {nearest(name, value)}, {name}_qmap, "
            f"({index}) * {len(quantized)} + {j}, state_rounding)"
        )

    def draws(name: str, j: int) -> str:  # a block primitive's map and random positions: rounded()'s, from start
        return f"{name}_qmap, start * {len(quantized)} + {j}, {len(quantized)}, state_rounding"

    def code(name: str, j: int, value: str, index: str) -> str:
        return f"{nearest(name, value)} if state_rounding == 0 else {rounded(name, j, value, index)}"

    def indent(lines: list[str], depth: int) -> list[str]:
        return [("    " * depth) + line for text in lines for line in text.split("\n")]

    head = [target.step_decorator]
    prefix = blockwise_prefix(step.name, suffix, bits)
    kernels = []
    if target is CPU:
        for kind in ("scales", "codes"):
            body = [f"{name}_values = np.empty({b}, np.float32)" for _, name in quantized]
            if not packed:
                body += [f"{name}_planes = byte_planes({name}_qmap)" for _, name in quantized]
            inner = [*locate, *(f"{name}_scale = {name}_absmax[block]" for _, name in quantized)]
            if packed:  # each byte's high nibble, then its low one (none past a row's odd end)
                inner += [
                    f"dequantize_pairs({name}_values, {name}, base, (stop - start) // 2, {name}_qmap, {name}_scale)"
                    for _, name in quantized
                ]
                inner += ["if (stop - start) % 2 == 1:"]
                inner += indent(
                    [
                        f"{name}_values[stop - start - 1] = "
                        f"at({name}_qmap, at({name}, base + (stop - start) // 2) >> 4) * {name}_scale"
                        for _, name in quantized
                    ],
                    1,
                )
            else:
                inner += [
                    f"dequantize_block({name}_values, {name}, start, stop - start, {name}_qmap, {name}_planes, "
                    f"{name}_scale)"
                    for _, name in quantized
                ]
            loads = _blockwise_loads(blockwise, params, "{name}_values[k]", "i - row * row_length")
            largest = _running_absmax(quantized, suffix)
            if kind == "scales":
                inner += [f"{name}_largest = {zero}" for _, name in quantized]
                inner += ["for k in range(stop - start):"]
                inner += indent(["i = start + k", f"{updated} = {call}({loads})", *largest], 1)
                inner += [f"new_absmax[{j} * blocks + block] = {name}_largest" for j, name in quantized] + refuse
            else:  # the block's new absmax again, from the values it keeps: the scales kernel may not have run
                inner += [f"{name}_largest = {zero}" for _, name in quantized]
                inner += ["for k in range(stop - start):"]
                inner += indent(
                    ["i = start + k", f"{updated} = {call}({loads})", *writes]
                    + [f"{name}_values[k] = new_{name}" for _, name in quantized]
                    + largest,
                    1,
                )
                inner += [f"{name}_scale = {name}_largest" for _, name in quantized]
                if packed:  # m/absmax in place; 8 bits divide where the code is looked up, a pass fewer
                    inner += ["for k in range(stop - start):"]
                    inner += indent(
                        [f"{name}_values[k] = {scaled(name, f'{name}_values[k]')}" for _, name in quantized], 1
                    )

                def value_at(name: str, k: str) -> str:  # m/absmax of the block's element k
                    return f"{name}_values[{k}]" if packed else f"({scaled(name, f'{name}_values[{k}]')})"

                def rounded_at(name: str, j: int, k: str) -> str:
                    return rounded(name, j, value_at(name, k), f"start + {k}")

                def pairs(code: Callable[[str, int, str], str], rounded: bool) -> list[str]:
                    """4 bits: each byte from its two codes, the first bytes 16 at a time by
                    cpu.primitives.quantize_pairs(_rounded), and a row's odd end alone in its
                    high nibble."""
                    lines = []
                    for j, name in quantized:
                        block = f"{name}, base, {name}_values, (stop - start) // 2, {name}_midpoints"
                        if rounded:
                            lines += [f"done = quantize_pairs_rounded({block}, {draws(name, j)})"]
                        else:
                            lines += [f"done = quantize_pairs({block})"]
                        lines += ["for h in range(done, (stop - start) // 2):"]
                        lines += indent(
                            [f"put({name}, base + h, ({code(name, j, '2 * h')} << 4) | {code(name, j, '2 * h + 1')})"],
                            1,
                        )
                    lines += ["if (stop - start) % 2 == 1:"]
                    lines += indent(
                        [
                            f"put({name}, base + (stop - start) // 2, {code(name, j, 'stop - start - 1')} << 4)"
                            for j, name in quantized
                        ],
                        1,
                    )
                    return lines

                inner += ["if state_rounding == 0:"]
                if packed:  # 16 bytes at a time by cpu.primitives (searches in registers), the rest here
                    inner += indent(pairs(lambda name, j, k: nearest(name, f"{name}_values[{k}]"), rounded=False), 1)
                    inner += ["else:"]
                    inner += indent(pairs(rounded_at, rounded=True), 1)
                else:  # 16 codes at a time by cpu.primitives (loads, not gathers), the rest here
                    block = "{name}, start, {name}_values, stop - start, {name}_scale, {name}_lookup"
                    for j, name in quantized:
                        inner += indent([f"done = quantize_block({block.format(name=name)})"], 1)
                        inner += indent(["for k in range(done, stop - start):"], 1)
                        inner += indent([f"put({name}, start + k, {nearest(name, value_at(name, 'k'))})"], 2)
                    inner += ["else:"]
                    for j, name in quantized:
                        inner += indent(
                            [f"done = quantize_block_rounded({block.format(name=name)}, {draws(name, j)})"], 1
                        )
                        inner += indent(["for k in range(done, stop - start):"], 1)
                        inner += indent([f"put({name}, start + k, {rounded_at(name, j, 'k')})"], 2)
                inner += [f"{name}_absmax[block] = {name}_scale" for _, name in quantized]
            lines = [
                *head,
                f"def {prefix}_{kind}({', '.join(arguments)}{target.kernel_range}):",
                *prelude,
                *(["    if refused[0] != " + zero + ":", "        return"] if kind == "codes" else []),
                *indent(span, 1),
                f"    begin, end = part_of((blocks + {BLOCKS_PER_TASK - 1}) // {BLOCKS_PER_TASK}, part, parts)",
                "    for task in range(begin, end):",
                *indent(body, 2),
                f"        first = task * {BLOCKS_PER_TASK}",
                f"        for block in range(first, min(first + {BLOCKS_PER_TASK}, blocks)):",
                *indent(inner, 3),
            ]
            kernels.append("\n".join(lines) + "\n")
        return kernels
    # CUDA: a thread block per quantization block, its threads striding over the block's
    # elements (over pairs of them for 4-bit codes, so that one thread writes each byte); the
    # block's maxima meet in a shared-memory tree, and its absmax is replaced once every thread
    # has read it.
    dequantized = (  # 4 bits: element i - start of the block is a nibble of byte base + (i - start) / 2
        "{name}_qmap[({name}[base + ((i - start) >> 1)] >> (4 - 4 * ((i - start) & 1))) & 15] * {name}_absmax[block]"
        if packed
        else "{name}_qmap[{name}[i]] * {name}_absmax[block]"
    )
    loads = _blockwise_loads(blockwise, params, dequantized, "i - row * row_length")
    elements = "for i in range(start + cuda.threadIdx.x, stop, cuda.blockDim.x):"
    for kind in ("scales", "codes"):
        inner = list(locate)
        if kind == "scales":
            inner += [f"{name}_largest = {zero}" for _, name in quantized]
            inner += [elements]
            inner += indent(
                [f"{updated} = {call}({loads})"] + _running_absmax(quantized, suffix),
                1,
            )
            inner += [f"{name}_shared[cuda.threadIdx.x] = {name}_largest" for _, name in quantized]
            inner += ["cuda.syncthreads()", "width = cuda.blockDim.x // 2", "while width > 0:"]
            inner += indent(["if cuda.threadIdx.x < width:"], 1)
            inner += indent(
                [
                    f"{name}_shared[cuda.threadIdx.x] = maximum_{suffix}({name}_shared[cuda.threadIdx.x], "
                    f"{name}_shared[cuda.threadIdx.x + width])"
                    for _, name in quantized
                ],
                2,
            )
            inner += indent(["cuda.syncthreads()", "width = width // 2"], 1)
            inner += ["if cuda.threadIdx.x == 0:"]
            inner += indent([f"{name}_largest = {name}_shared[0]" for _, name in quantized], 1)
            inner += indent([f"new_absmax[{j} * blocks + block] = {name}_largest" for j, name in quantized] + refuse, 1)
            inner += ["cuda.syncthreads()"]
            # a slot per thread of the block (at most QUANTIZATION_BLOCK threads: cuda/threads.py)
            body = [f"{name}_shared = cuda.shared.array({QUANTIZATION_BLOCK}, float32)" for _, name in quantized]
        else:
            inner += [f"{name}_scale = new_absmax[{j} * blocks + block]" for j, name in quantized]
            step_lines = [f"{updated} = {call}({loads})", *writes] + [
                f"{name}_value = {scaled(name, f'new_{name}')}" for _, name in quantized
            ]
            if packed:
                inner += ["for pair in range(start + 2 * cuda.threadIdx.x, stop, 2 * cuda.blockDim.x):"]
                inner += indent([f"{name}_packed = 0" for _, name in quantized], 1)
                inner += indent(["for i in range(pair, min(pair + 2, stop)):"], 1)
                inner += indent(
                    step_lines
                    + [
                        f"{name}_packed = {name}_packed | "
                        f"(({code(name, j, f'{name}_value', 'i')}) << (4 - 4 * (i - pair)))"
                        for j, name in quantized
                    ],
                    2,
                )
                inner += indent([f"{name}[base + ((pair - start) >> 1)] = {name}_packed" for _, name in quantized], 1)
            else:
                inner += [elements]
                inner += indent(
                    step_lines + [f"{name}[i] = {code(name, j, f'{name}_value', 'i')}" for j, name in quantized], 1
                )
            inner += ["cuda.syncthreads()", "if cuda.threadIdx.x == 0:"]
            inner += indent([f"{name}_absmax[block] = {name}_scale" for _, name in quantized], 1)
            inner += ["cuda.syncthreads()"]
            body = []
        lines = [
            *head,
            f"def {prefix}_{kind}({', '.join(arguments)}):",
            *prelude,
            *(["    if refused[0] != " + zero + ":", "        return"] if kind == "codes" else []),
            *indent(span + body, 1),
            "    for block in range(cuda.blockIdx.x, blocks, cuda.gridDim.x):",
            *indent(inner, 2),
        ]
        kernels.append("\n".join(lines) + "\n")
    return kernels


# What each kind of mixing takes besides the buffers: one peer (W_ii = self_weight,
# W_i,peer = peer_weight), the column mean (mean_weight·x̄ + own_weight·x_i), or any W.
_MIX_EXTRA = {
    "peer": ("peers", "self_weight", "peer_weight"),
    "complete": ("mean_weight", "own_weight", "inverse_workers"),
    "dense": ("weights",),
}

# One in-place scheme for every mixing, on both targets. The rows are read with ``at`` and
# written with ``put`` (half-precision rows as float32, rounded once); the scratch has the
# clip factors' dtype, the one the kernel computes in. A CPU task takes a chunk of columns
# of all N workers, a GPU thread one column; each copies the workers' pre-step values (AWC)
# or their updates y_j (ATC, moments updated in place) to scratch (a block that stays in L2;
# the thread's own slots of the block's dynamic shared memory), then writes each worker's
# mixed result over its own rows. Nothing reads a half-updated neighbour, no barrier is
# needed, each buffer crosses memory once, and no second set of buffers exists. The
# arithmetic is the same, in the same order, on both targets.
MIX_SCRATCH = 32768  # elements of the scratch block: 128 KiB in float32

# The templates' placeholders are dunder names (``__update__``), which no formula name can be:
# _fill replaces them and fails if one is left.
_CPU_MIX = """
width = max(__scratch__ // x.shape[0], 16)
begin, end = part_of((x.shape[1] + width - 1) // width, part, parts)
for task in range(begin, end):
    start = task * width
    stop = min(start + width, x.shape[1])
    source = np.empty((x.shape[0], stop - start), clip.dtype)
    for j in range(x.shape[0]):
        xs, gs, ms, vs, ys = x[j, start:stop], g[j, start:stop], m[j, start:stop], v[j, start:stop], source[j]
        for k in range(stop - start):
            if atc:
                y, new_m, new_v = __update__(
                    at(xs, k), at(gs, k), at(ms, k), at(vs, k), clip[j], at(decay, start + k), __scalars__
                )
                put(ms, k, new_m)
                put(vs, k, new_v)
            else:
                y = at(xs, k)
            ys[k] = y
    __total__
    for i in range(x.shape[0]):
        xs, gs, ms, vs = x[i, start:stop], g[i, start:stop], m[i, start:stop], v[i, start:stop]
        __rows__
        for k in range(stop - start):
            __mixed__
            if atc:
                put(xs, k, mixed)
            else:
                new_x, new_m, new_v = __update__(
                    mixed, at(gs, k), at(ms, k), at(vs, k), clip[i], at(decay, start + k), __scalars__
                )
                put(xs, k, new_x)
                put(ms, k, new_m)
                put(vs, k, new_v)
"""

# GPU: worker j's scratch value for this thread's column is source[j * lanes + lane]
# (cuda/backend.py's run_mixing sizes the shared memory: N × threads elements).
_GPU_MIX = """
source = cuda.shared.array(0, clip.dtype)
lane = cuda.threadIdx.x
lanes = cuda.blockDim.x
for d in range(cuda.grid(1), x.shape[1], cuda.gridsize(1)):
    for j in range(x.shape[0]):
        if atc:
            y, new_m, new_v = __update__(
                at(x[j], d), at(g[j], d), at(m[j], d), at(v[j], d), clip[j], at(decay, d), __scalars__
            )
            put(m[j], d, new_m)
            put(v[j], d, new_v)
        else:
            y = at(x[j], d)
        source[j * lanes + lane] = y
    __total__
    for i in range(x.shape[0]):
        __mixed__
        if atc:
            put(x[i], d, mixed)
        else:
            new_x, new_m, new_v = __update__(
                mixed, at(g[i], d), at(m[i], d), at(v[i], d), clip[i], at(decay, d), __scalars__
            )
            put(x[i], d, new_x)
            put(m[i], d, new_m)
            put(v[i], d, new_v)
"""

# Gossip alone, x_i ← Σ_j W_ij x_j in place (the 8-bit decentralized step mixes apart from its
# blockwise local update): the mixing skeletons without the update. ``like`` carries the dtype
# the scratch computes in (float32 for half-precision rows).
_CPU_GOSSIP = """
width = max(__scratch__ // x.shape[0], 16)
begin, end = part_of((x.shape[1] + width - 1) // width, part, parts)
for task in range(begin, end):
    start = task * width
    stop = min(start + width, x.shape[1])
    source = np.empty((x.shape[0], stop - start), like.dtype)
    for j in range(x.shape[0]):
        xs, ys = x[j, start:stop], source[j]
        for k in range(stop - start):
            ys[k] = at(xs, k)
    __total__
    for i in range(x.shape[0]):
        xs = x[i, start:stop]
        __rows__
        for k in range(stop - start):
            __mixed__
            put(xs, k, mixed)
"""

_GPU_GOSSIP = """
source = cuda.shared.array(0, like.dtype)
lane = cuda.threadIdx.x
lanes = cuda.blockDim.x
for d in range(cuda.grid(1), x.shape[1], cuda.gridsize(1)):
    for j in range(x.shape[0]):
        source[j * lanes + lane] = at(x[j], d)
    __total__
    for i in range(x.shape[0]):
        __mixed__
        put(x[i], d, mixed)
"""


def _gossip_kernel(kind: str, suffix: str, target: Target) -> str:
    """``{kind}_{suffix}_gossip(x, like, *extra)``: the rows of x mixed by ``kind`` in place."""
    zero = _cast_source(0.0, suffix)
    mixed, rows = _scratch_reads(_MIXED[kind], target)
    body = _fill(
        _CPU_GOSSIP if target is CPU else _GPU_GOSSIP,
        scratch=str(MIX_SCRATCH),
        total=_TOTAL[target.name].replace("clip.dtype", "like.dtype") if kind == "complete" else "",
        rows=rows,
        mixed=_fill(mixed, total=_TOTAL_READ[target.name], zero=zero),
        zero=zero,
    )
    arguments = ["x", "like", *_MIX_EXTRA[kind]]
    lines = [target.kernel_decorator, f"def {kind}_{suffix}_gossip({', '.join(arguments)}{target.kernel_range}):"]
    lines += [f"    {line}" for line in body.strip("\n").splitlines() if line.strip()]
    return "\n".join(lines) + "\n"


# The mixed value of worker i at one column, per kind, one text for both targets:
# __value__(j) is worker j's scratch value at the column, __total__ the column's sum.
_MIXED = {
    "peer": "mixed = self_weight * __value__(i) + peer_weight * __value__(peers[i])",
    "complete": "mixed = mean_weight * (__total__ * inverse_workers) + own_weight * __value__(i)",
    "dense": """
mixed = __zero__
for j in range(x.shape[0]):
    weight = weights[i, j]
    if weight != __zero__:
        mixed += weight * __value__(j)
""",
}

# The column sum complete averaging needs, added over the workers in order on both targets
# (so the same bits); only the loop order differs: a CPU task sums its chunk of columns a
# worker at a time (a loop LLVM vectorises), a GPU thread its own column.
_TOTAL = {
    "cpu": """
total = np.zeros(stop - start, clip.dtype)
for j in range(x.shape[0]):
    row = source[j]
    for k in range(stop - start):
        total[k] += row[k]
""",
    "cuda": """
total = __zero__
for j in range(x.shape[0]):
    total += source[j * lanes + lane]
""",
}


def _atom(expression: str) -> str:
    """``expression``, parenthesised unless it is a name or a subscript of one."""
    return expression if re.fullmatch(r"[\w\[\]]+", expression) else f"({expression})"


# What __total__ reads on each target
_TOTAL_READ = {"cpu": "total[k]", "cuda": "total"}


def _scratch_reads(mixed: str, target: Target) -> tuple[str, str]:
    """``mixed`` with each ``__value__(w)`` read from the scratch, and the lines a CPU task
    runs first for worker i: worker w's scratch row, taken once outside the loop over the
    chunk's columns when w does not vary inside it (i, peers[i]), which keeps that loop
    vectorised; a GPU thread reads its own slot, source[w * lanes + lane]."""
    rows: list[str] = []

    def read(match: re.Match) -> str:
        worker = _atom(match.group(1))
        if target is CUDA:
            return f"source[{worker} * lanes + lane]"
        if re.search(r"\bj\b", worker):  # the worker varies with the mixed text's own loop
            return f"source[{worker}, k]"
        rows.append(f"row_{len(rows)} = source[{worker}]")
        return f"row_{len(rows) - 1}[k]"

    return re.sub(r"__value__\(([^()]*)\)", read, mixed), "\n".join(rows)


def _fill(template: str, **values: str) -> str:
    """``template`` with each ``__name__`` replaced by ``values[name]`` (a block of lines is
    indented as the placeholder is); a placeholder left unfilled is an error."""
    lines = []
    for line in template.splitlines():
        for name, value in values.items():
            placeholder = f"__{name}__"
            if line.strip() == placeholder:
                indent = line[: len(line) - len(line.lstrip())]
                line = "\n".join(indent + part for part in value.strip("\n").splitlines())
            else:
                line = line.replace(placeholder, value)
        lines.append(line)
    filled = "\n".join(lines)
    left = re.findall(r"\b__[a-z]+__\b", filled)
    if left:
        raise ValueError(f"placeholders {sorted(set(left))} were not filled")
    return filled


def _mixing_kernel(mixing: Mixing, formula: ast.FunctionDef, suffix: str, target: Target) -> str:
    params = [arg.arg for arg in formula.args.args]
    if tuple(params[: len(mixing.leading)]) != mixing.leading or len(mixing.state) != 3:
        raise ValueError(
            f"mixing formula {formula.name} must start with the parameters {', '.join(mixing.leading)} (the "
            "parameter, the gradient, its two moment buffers, the worker's clip factor and the column's decay "
            f"mask, as the Mixing declares them), then its scalars; it starts with {', '.join(params[:6])}"
        )
    scalars = params[len(mixing.leading) :]
    zero = _cast_source(0.0, suffix)
    mixed, rows = _scratch_reads(_MIXED[mixing.kind], target)
    body = _fill(
        _CPU_MIX if target is CPU else _GPU_MIX,
        scratch=str(MIX_SCRATCH),
        total=_TOTAL[target.name] if mixing.kind == "complete" else "",
        rows=rows,
        mixed=_fill(mixed, total=_TOTAL_READ[target.name], zero=zero),
        update=f"{formula.name}_{suffix}",
        scalars=", ".join(scalars),
        zero=zero,
    )
    arguments = ["x", "g", "m", "v", "clip", "decay", *_MIX_EXTRA[mixing.kind], "atc", *scalars]
    lines = [target.kernel_decorator, f"def {mixing.kind}_{suffix}_mix({', '.join(arguments)}{target.kernel_range}):"]
    lines += [f"    {line}" for line in body.strip("\n").splitlines() if line.strip()]
    return "\n".join(lines) + "\n"


def _grid_kernel(grid: Grid, formula: ast.FunctionDef, suffix: str, target: Target) -> str:
    arguments = [arg.arg for arg in formula.args.args[2:]]
    listed = ", ".join(arguments)
    if target is CPU:  # an item passes the arrays to its formula: unowned, they count no references
        loop = [
            *(f"    {name} = unowned({name})" for name in arguments),
            "    begin, end = part_of(rows * columns, part, parts)",
            "    for flat in range(begin, end):",
        ]
    else:
        loop = ["    for flat in range(cuda.grid(1), rows * columns, cuda.gridsize(1)):"]
    lines = [
        target.kernel_decorator,
        f"def {grid.formula}_{suffix}_grid(rows, columns, {listed}{target.kernel_range}):",
        *loop,
        f"        {grid.formula}_{suffix}(flat // columns, flat % columns, {listed})",
    ]
    return "\n".join(lines) + "\n"


def _needed(roots: set[str], available: dict[str, ast.FunctionDef]) -> set[str]:
    """Names in ``available`` reachable by calls from ``roots`` (roots included)."""
    needed: set[str] = set()
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name in available and name not in needed:
            needed.add(name)
            pending.extend(_called_names(available[name]))
    return needed


def _declared(module: str, kind: str) -> tuple:
    """The module's ROWS, STEPS, MIXINGS or GRIDS declarations, read from the formula file
    generation reads (``KERNELS``), so a module outside the package generates too (the recipe
    test's)."""
    path = KERNELS / f"{module}.py"
    name = f"steadystep.kernels.{module}"
    loaded = sys.modules.get(name)
    if loaded is None or Path(getattr(loaded, "__file__", "")).resolve() != path.resolve():
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None, path
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
    return getattr(loaded, kind, ())


def _imported_formulas(path: Path) -> dict[str, ast.FunctionDef]:
    """Functions a formula module imports from another formula module (reused formulas),
    with the private helpers they call there."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("steadystep.kernels."):
            source = node.module.rsplit(".", 1)[-1]
            if source != HELPERS:  # with what that module imports in turn
                functions = {**_imported_formulas(KERNELS / f"{source}.py"), **_functions(KERNELS / f"{source}.py")}
                reachable = _needed({alias.name for alias in node.names}, functions)  # with their private helpers
                found.update({name: function for name, function in functions.items() if name in reachable})
    return found


# -- names a formula may not use, and literals it may not write ------------------------------------

_PROBE = re.compile(r"__probe\d+__")


def _probe_function(name: str, params: list[str], returns: int = 1) -> ast.FunctionDef:
    values = ", ".join(params[:returns]) + ("," if returns > 1 else "")
    tree = ast.parse(f"def {name}({', '.join(params)}):\n    return {values}")
    function = tree.body[0]
    assert isinstance(function, ast.FunctionDef)
    return function


@functools.cache
def _kernel_names() -> dict[str, tuple[frozenset[str], tuple[str, ...]]]:
    """Per kind of kernel, the names its generated code uses of its own (loop indices, scratch,
    primitives, modules) and the patterns of those it makes from a formula's (``new_*``).

    Found rather than listed: every kind is generated, for both targets and dtypes, from probe
    declarations whose every name is a ``__probeN__`` (a dunder name no formula can use, as
    Numba's vectorizer templates use), and whatever else the kernels hold is the generator's.
    """
    probes = [f"__probe{k}__" for k in range(12)]
    p = probes
    fold = Fold(state=(p[6],), identity=(0.0,), lift=p[7], merge=p[8])
    second = Fold(state=(p[9],), identity=(0.0,), lift=p[7], merge=p[8])
    rows = [
        Row(p[0], "", "", (fold, second), finish=p[10]),
        Row(p[0], "", "", (fold,), finish=p[10], outputs=2),
        Row(p[0], "", "", (fold, second), value=p[10]),
        Row(p[0], "", "", (fold,), value=p[10], summary=Summary((p[11],), p[5])),
        Row(p[0], "", "", (fold,), value=p[10], share=p[5]),
    ]
    steps = [
        (Step(p[0], p[1], (p[2], p[3]), (p[2],), indexed=(p[4],), device_scalars=(p[5],), gradient=p[3]), 1),
        (Step(p[0], p[1], (p[2], p[3]), (p[2],), device_scalars=(p[5],), gradient=p[3]), 1),
    ]
    step_formula = _probe_function(p[1], [p[2], p[3], p[4], p[5], p[6]])
    mixing_formula = _probe_function(p[1], p[2:10], returns=3)
    blockwise = Blockwise(Step(p[0], p[1], (p[2], p[3], p[4]), (p[2], p[4]), gradient=p[3]), (p[4],), (True,), (p[5],))
    blockwise_formula = _probe_function(p[1], [p[2], p[3], p[4], p[5], p[6]], returns=2)
    sources: dict[str, list[str]] = {
        "elementwise": [],
        "step": [],
        "row": [],
        "mixing": [],
        "grid": [],
        "blockwise": [],
    }
    for target in TARGETS:
        for suffix in DTYPES:
            sources["elementwise"].append(_elementwise_kernel(_probe_function(p[0], [p[1], p[2]]), suffix, target))
            sources["step"] += [_step_kernel(step, step_formula, suffix, target) for step, _ in steps]
            sources["row"] += [kernel for row in rows for kernel in _row_kernels(row, suffix, target)]
            sources["mixing"] += [
                _mixing_kernel(Mixing(kind, p[1], (p[2], p[4], p[5]), p[3], p[6], p[7]), mixing_formula, suffix, target)
                for kind in _MIX_EXTRA
            ]
            sources["grid"].append(_grid_kernel(Grid(p[1]), _probe_function(p[1], p[2:6]), suffix, target))
            for bits in QUANTIZATION_BLOCKS:
                sources["blockwise"] += _blockwise_kernels(blockwise, blockwise_formula, suffix, target, bits)
    found = {}
    for kind, texts in sources.items():
        names: set[str] = set()
        for text in texts:
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.Name):
                    names.add(node.id)
                elif isinstance(node, ast.arg):
                    names.add(node.arg)
                elif isinstance(node, ast.FunctionDef):
                    names.add(node.name)
        numbered = {name for name in names if re.fullmatch(r"[a-z]+_\d+", name)}  # lifted_0, result_1, row_0: any count
        own = frozenset(name for name in names - numbered if not _PROBE.search(name))
        patterns = {_PROBE.sub("*", name) for name in names if _PROBE.search(name)} - {"*"}
        patterns |= {name.rsplit("_", 1)[0] + "_*" for name in numbered}
        found[kind] = (own, tuple(sorted(patterns)))
    return found


def _check_names(where: str, kind: str, names: Iterable[str]) -> None:
    """Refuse a formula's name that the generated kernels of ``kind`` also use for their own."""
    own, patterns = _kernel_names()[kind]
    for name in names:
        if _PROBE.search(name) or name.startswith("__"):
            raise ValueError(
                f"{where}: {name!r} is a dunder name, which the generator keeps for its templates; rename it"
            )
        if name in own or any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            raise ValueError(
                f"{where}: the generated {kind} kernels use the name {name!r} themselves (a loop index, scratch, "
                f"a primitive or a module); rename it, e.g. to {name + '_value'!r}"
            )


def _in_index(node: ast.AST | None, parents: dict) -> bool:
    """Whether ``node`` lies in a subscript or in a range() call."""
    while node is not None:
        if isinstance(node, (ast.Subscript, ast.Slice)):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
            return True
        node = parents.get(node)
    return False


_BITWISE = (ast.BitAnd, ast.BitOr, ast.BitXor, ast.LShift, ast.RShift)


def _in_bitwise(node: ast.AST | None, parents: dict) -> bool:
    """Whether ``node`` lies in an operand of a bit operation, which Python refuses for floats."""
    while isinstance(node, (ast.BinOp, ast.UnaryOp)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, _BITWISE):
            return True
        node = parents.get(node)
    return False


def _check_literals(module: str, function: ast.FunctionDef) -> None:
    """Refuse an integer literal in arithmetic outside an index or a range(): in a formula,
    ``1 - beta`` is float64 arithmetic in a float32 kernel (Numba widens int64 with float32
    to float64), which the PTX test would only catch later."""
    parents = {child: node for node in ast.walk(function) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(function):
        if not (isinstance(node, ast.Constant) and type(node.value) is int):
            continue
        parent = parents.get(node)
        if not isinstance(parent, (ast.BinOp, ast.AugAssign)) and not (
            isinstance(parent, ast.UnaryOp) and isinstance(parents.get(parent), (ast.BinOp, ast.AugAssign))
        ):
            continue
        if _in_index(parent, parents) or _in_bitwise(parent, parents):
            continue  # an index, a slice bound, a range() or bit operations: integer arithmetic is meant
        raise ValueError(
            f"kernels/{module}.py, {function.name}, line {node.lineno}: the integer literal {node.value} in "
            f"arithmetic computes in float64 in a float32 kernel; write {float(node.value)!r}"
        )


def _check_declared_names(
    module: str, functions: dict, formulas: list, rows, steps, mixings, grids, blockwises=()
) -> None:
    """Every name a formula brings into a kernel, checked against the kernel's own names."""

    def params(formula: str, skip: int = 0) -> list[str]:
        return [arg.arg for arg in functions[formula].args.args][skip:]

    for name in formulas:
        _check_names(f"kernels/{module}.py, {name}", "elementwise", params(name))
    for step in steps:
        declared = {*params(step.formula), *step.buffers, *step.indexed, *step.device_scalars}
        _check_names(f"kernels/{module}.py, step {step.name}", "step", declared)
    for row in rows:
        states = [name for fold in row.passes for name in fold.state] + list(row.summary.state if row.summary else ())
        _check_names(f"kernels/{module}.py, row {row.name}", "row", states)
    for mixing in mixings:
        _check_names(f"kernels/{module}.py, {mixing.formula}", "mixing", params(mixing.formula, len(mixing.leading)))
    for grid in grids:
        _check_names(f"kernels/{module}.py, {grid.formula}", "grid", params(grid.formula, 2))
    for blockwise in blockwises:
        step = blockwise.step
        declared = {*params(step.formula), *step.buffers, *blockwise.per_row}
        _check_names(f"kernels/{module}.py, 8-bit step {step.name}", "blockwise", declared)


def generate_module(module: str, target: Target) -> str:
    """Source of ``steadystep/<target>/_generated/<module>.py`` generated from ``kernels/<module>.py``."""
    path = KERNELS / f"{module}.py"
    functions = _functions(path)
    helpers = {**_functions(KERNELS / f"{HELPERS}.py"), **_imported_formulas(path)}
    rows, steps, mixings = _declared(module, "ROWS"), _declared(module, "STEPS"), _declared(module, "MIXINGS")
    grids, blockwises = _declared(module, "GRIDS"), _declared(module, "BLOCKWISE")
    step_formulas = (
        {step.formula for step in steps}
        | {mixing.formula for mixing in mixings}
        | {grid.formula for grid in grids}
        | {blockwise.step.formula for blockwise in blockwises}
    )
    formulas = [name for name in functions if not name.startswith("_") and name not in step_formulas]
    pieces = {
        name
        for row in rows
        for name in (row.finish, row.value, row.share, row.summary and row.summary.function)
        if name
    } | {name for row in rows for fold in row.passes for name in (fold.lift, fold.merge)}
    local = [name for name in functions if name in _needed(set(formulas) | pieces | step_formulas, functions)]
    calls = set().union(*(_called_names(functions[name]) for name in local)) if local else set()
    if blockwises:  # the helpers the blockwise skeletons call themselves
        calls |= {
            "code_bucket",
            "code_in_bucket",
            "larger_magnitude",
            "largest",
            "maximum",
            "is_finite",
            "nearest_code",
            "nearest_code16",
            "rounded_code",
        }
    shared = [name for name in helpers if name in _needed(calls, helpers)]
    for name in local:
        _check_literals(module, functions[name])
    for name in shared:
        _check_literals(module, helpers[name])
    _check_declared_names(module, functions, formulas, rows, steps, mixings, grids, blockwises)
    renamed = set(local) | set(shared)
    native = [name for name in shared if name in target.native_helpers]
    primitives = [*target.primitives, *(f"{name}_{suffix}" for name in native for suffix in DTYPES)]
    imports = (
        f"{target.imports}\n\nfrom steadystep.{target.name}.primitives import {', '.join(primitives)}  # noqa: F401"
    )
    blocks = []
    for suffix in DTYPES:
        sources = [helpers[name] for name in shared if name not in native] + [functions[name] for name in local]
        for function in sources:
            blocks.append(_device_function(function, suffix, renamed, target))
            if function.name in formulas:
                blocks.append(_elementwise_kernel(function, suffix, target))
        blocks += [kernel for row in rows for kernel in _row_kernels(row, suffix, target)]
        blocks += [_step_kernel(step, functions[step.formula], suffix, target) for step in steps]
        blocks += [_mixing_kernel(mixing, functions[mixing.formula], suffix, target) for mixing in mixings]
        blocks += [_gossip_kernel(kind, suffix, target) for kind in _declared(module, "GOSSIP")]
        blocks += [_grid_kernel(grid, functions[grid.formula], suffix, target) for grid in grids]
        if suffix == "f32":  # 8-bit states serve float32 and half-precision parameters
            blocks += [
                kernel
                for bits in QUANTIZATION_BLOCKS
                for blockwise in blockwises
                for kernel in _blockwise_kernels(blockwise, functions[blockwise.step.formula], suffix, target, bits)
            ]
    header = (
        f'"""{target.name.upper()} kernels generated by `python -m steadystep.codegen` from '
        f"steadystep/kernels/{module}.py;\n"
        "do not edit: change the formula there and generate again.\n"
        '"""\n\n'
        f"{imports}\n\n"
        "# Numba's cache checks only this file: a change to the primitives these kernels inline must\n"
        "# rewrite it, and test_codegen fails until codegen has\n"
        f'PRIMITIVES_DIGEST = "{_primitives_digest(target)}"\n'
    )
    return header + "\n\n" + "\n\n\n".join(block.rstrip("\n") for block in blocks) + "\n"


def _primitives_digest(target: Target) -> str:
    """A digest of the files whose code the target's kernels take in besides their own."""
    sources = [PACKAGE / "_primitives.py", PACKAGE / target.name / "primitives.py"]
    return hashlib.sha256("".join(path.read_text() for path in sources).encode()).hexdigest()[:16]


GENERATED = "_generated"  # steadystep/<target>/_generated/: generated files only, nothing hand-written


def generated_path(target: Target, module: str) -> Path:
    """Where the kernels of ``module`` for ``target`` are written."""
    return PACKAGE / target.name / GENERATED / f"{module}.py"


def generated_files() -> dict[Path, str]:
    """Every generated file, keyed by its path (each target's package marker included)."""
    files = {
        generated_path(target, module): generate_module(module, target)
        for module in FORMULA_MODULES
        for target in TARGETS
    }
    for target in TARGETS:
        files[PACKAGE / target.name / GENERATED / "__init__.py"] = (
            f'"""{target.name.upper()} kernels generated by `python -m steadystep.codegen` from steadystep/kernels/; '
            'do not edit."""\n'
        )
    return files


def main() -> int:
    for path, text in generated_files().items():
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(PACKAGE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
