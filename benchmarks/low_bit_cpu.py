"""8-bit and 4-bit AdamW on the CPU, in one process (`python -m benchmarks.low_bit_cpu`):
steadystep's blockwise 8-bit step against its memory probe (what it must read and write:
parameters, gradients, two code streams; the scales are 1/64 of that), its 4-bit step, float32
AdamW (steadystep's and torch's fused), and bitsandbytes' and torchao's AdamW8bit (and
torchao's AdamW4bit; torchao's first call, which compiles, reported apart), at 1M, 4M, 10M and
40M parameters; then the N-worker step with 8-bit and 4-bit moments against its float32 one,
and each layout's bytes a parameter, measured from its buffers. Targets (issue 49): 8-bit
AdamW ≤ 2× torch's fused float32 AdamW at 4M and 10M, so ≥ 8× bitsandbytes' and torchao's
steps. Run on a quiet machine."""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from numba import njit, prange

from benchmarks.common import compare, machine, table
from steadystep import decentral, optim, quantization
from steadystep.cpu.primitives import byte_planes, dequantize_block, quantize_block


@njit(cache=True, parallel=True, error_model="numpy")
def eight_bit_probe(param, grad, exp_avg, exp_avg_sq):
    """The physical floor of an 8-bit AdamW step: read p, g and the two code streams, write p
    and the codes once, no math."""
    for i in prange(param.shape[0]):
        g = grad[i]
        exp_avg[i] = exp_avg[i] + np.uint8(1)
        exp_avg_sq[i] = exp_avg_sq[i] + np.uint8(1)
        param[i] = param[i] + g


@njit(cache=True, parallel=True, error_model="numpy")
def lookup_probe(exp_avg, exp_avg_sq, signed, unsigned, signed_lookup, unsigned_lookup):
    """The table work alone: each of the two code streams read, dequantized through its map and
    stored again as its nearest code (the same reads and lookups as the step's), with no
    formula and no parameters: what the quantization costs on this CPU, which has no fast gather."""
    blocks = exp_avg.shape[0] // 256
    for task in prange((blocks + 63) // 64):
        first, second = np.empty(256, np.float32), np.empty(256, np.float32)
        signed_planes, unsigned_planes = byte_planes(signed), byte_planes(unsigned)
        for block in range(task * 64, min(task * 64 + 64, blocks)):
            start = block * 256
            dequantize_block(first, exp_avg, start, 256, signed, signed_planes, np.float32(1.0))
            dequantize_block(second, exp_avg_sq, start, 256, unsigned, unsigned_planes, np.float32(1.0))
            quantize_block(exp_avg, start, first, 256, np.float32(1.0), signed_lookup)
            quantize_block(exp_avg_sq, start, second, 256, np.float32(1.0), unsigned_lookup)


def _flat_parameter(size: int, seed: int = 0) -> torch.nn.Parameter:
    generator = torch.Generator().manual_seed(seed)
    parameter = torch.nn.Parameter(torch.randn(size, generator=generator))
    parameter.grad = torch.randn(size, generator=generator) * 1e-3
    return parameter


def optimizers(size: int, repeats: int) -> tuple[dict[str, float], dict[str, str]]:
    rng = np.random.default_rng(0)
    param = rng.standard_normal(size).astype(np.float32)
    grad = (rng.standard_normal(size) * 1e-3).astype(np.float32)
    exp_avg, exp_avg_sq = quantization.zeros(size, signed=True), quantization.zeros(size, signed=False)
    exp_avg4, exp_avg_sq4 = (quantization.zeros(size, signed=signed, bits=4) for signed in (True, False))
    float_avg, float_avg_sq = np.zeros_like(param), np.zeros_like(param)
    codes = (np.zeros(size, np.uint8), np.zeros(size, np.uint8))
    maps = [quantization.dynamic_map(signed=True), quantization.dynamic_map(signed=False)]
    tables = (*maps, *(quantization.code_tables(qmap)[1] for qmap in maps))
    counts = {"8bit": 0, "4bit": 0, "f32": 0}

    def ours_8bit() -> None:
        counts["8bit"] += 1
        optim.adamw(param, grad, exp_avg, exp_avg_sq, step=counts["8bit"], lr=1e-3)

    def ours_4bit() -> None:
        counts["4bit"] += 1
        optim.adamw(param, grad, exp_avg4, exp_avg_sq4, step=counts["4bit"], lr=1e-3)

    def ours_float32() -> None:
        counts["f32"] += 1
        optim.adamw(param, grad, float_avg, float_avg_sq, step=counts["f32"], lr=1e-3)

    fused_parameter = _flat_parameter(size)
    fused = torch.optim.AdamW([fused_parameter], lr=1e-3, fused=True)
    functions = {
        "probe": lambda: eight_bit_probe(param, grad, *codes),
        "lookup probe": lambda: lookup_probe(*codes, *tables),
        "steadystep 8-bit": ours_8bit,
        "steadystep 4-bit": ours_4bit,
        "steadystep float32": ours_float32,
        "torch fused float32": fused.step,
    }
    notes = {}
    try:
        import bitsandbytes

        bnb_parameter = _flat_parameter(size)
        functions["bitsandbytes AdamW8bit"] = bitsandbytes.optim.AdamW8bit([bnb_parameter], lr=1e-3).step
    except ImportError:
        notes["bitsandbytes"] = "not installed"
    try:
        import torchao.optim

        for bits in (8, 4):
            ao_parameter = _flat_parameter(size)
            ao = getattr(torchao.optim, f"AdamW{bits}bit")([ao_parameter], lr=1e-3)
            start = time.perf_counter()
            ao.step()
            notes[f"torchao AdamW{bits}bit first step (compiles)"] = f"{time.perf_counter() - start:.1f} s"
            functions[f"torchao AdamW{bits}bit"] = ao.step
    except Exception as error:  # not installed, or its compiler unavailable
        notes["torchao"] = f"not run ({type(error).__name__})"
    return compare(functions, repeats, warmup=2), notes


def decentralized(workers: int, width: int, repeats: int) -> dict[str, float]:
    rng = np.random.default_rng(1)
    grads = (rng.standard_normal((workers, width)) * 1e-3).astype(np.float32)
    steppers = {}
    for name, bits in (("float32 moments", 32), ("8-bit moments", 8), ("4-bit moments", 4)):
        params = rng.standard_normal((workers, width)).astype(np.float32)
        state = decentral.DecentralizedAdamW(params, topology=decentral.one_peer_exponential(), state_bits=bits)
        steppers[name] = lambda state=state: state.step(grads)
    return compare(steppers, repeats, warmup=2)


def bytes_per_parameter() -> list[list[str]]:
    rows = []
    model = torch.nn.Linear(1024, 1024, bias=False)
    import steadystep.torch
    from steadystep.torch.low_bit import state_bytes

    for name, cls in (
        ("float32 AdamW", steadystep.torch.AdamW),
        ("AdamW8bit", steadystep.torch.AdamW8bit),
        ("AdamW4bit", steadystep.torch.AdamW4bit),
    ):
        optimizer = cls(model.parameters(), lr=1e-3)
        model(torch.ones(2, 1024)).sum().backward()
        optimizer.step()
        held = (
            state_bytes(optimizer)
            if name != "float32 AdamW"
            else sum(
                value.numel() * value.element_size()
                for value in optimizer.state[model.weight].values()
                if isinstance(value, torch.Tensor) and value.numel() > 1
            )
        )
        rows.append([f"{name} state (1M-parameter tensor)", f"{held / model.weight.numel():.3f}"])
    import ml_dtypes

    workers, width = 64, 1 << 20
    params = np.zeros((workers, width), ml_dtypes.bfloat16)
    grads = np.full((workers, width), 1e-3, ml_dtypes.bfloat16)
    for bits in (8, 4):
        state = decentral.DecentralizedAdamW(
            params, topology=decentral.one_peer_exponential(), lr=1e-3, state_bits=bits
        )
        state.step(grads)
        held = sum(buffer.nbytes for buffer in state.buffers.values()) + grads.nbytes
        rows.append(
            [f"64 workers × 1M bfloat16, {bits}-bit: rows, gradients, codes, scales", f"{held / (workers * width):.3f}"]
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", default="1M,4M,10M,40M", help="parameters, comma-separated, in M = 2^20 (1M,4M or 1,4)"
    )
    arguments = parser.parse_args()
    sizes = [int(float(text.rstrip("M")) * (1 << 20)) for text in arguments.sizes.split(",")]
    print(machine())
    print("8-bit and 4-bit AdamW, one flat tensor, ms a step (median); ratios to the 8-bit probe and to ours")
    for size in sizes:
        times, notes = optimizers(size, repeats=5 if size > (10 << 20) else 15)
        ours = times["steadystep 8-bit"]
        rows = [
            [name, f"{seconds * 1e3:.2f}", f"{seconds / times['probe']:.2f}", f"{seconds / ours:.2f}"]
            for name, seconds in times.items()
        ]
        print(f"\n{size / (1 << 20):.0f}M parameters")
        print(table(rows, ["", "ms", "÷ probe", "÷ steadystep 8-bit"]))
        torch_ratio = ours / times["torch fused float32"]
        print(f"target: steadystep 8-bit ≤ 2× torch fused float32: {torch_ratio:.2f}×")
        lookups = times["lookup probe"] / times["torch fused float32"]
        print(f"the lookups alone (lookup probe): {lookups:.2f}× torch fused float32")
        for peer in ("bitsandbytes AdamW8bit", "torchao AdamW8bit"):
            if peer in times:
                print(f"target: ≥ 8× faster than {peer}: {times[peer] / ours:.1f}×")
        four = times["steadystep 4-bit"]
        print(f"4-bit: {four / times['torch fused float32']:.2f}× torch fused float32, {four / ours:.2f}× our 8-bit")
        if "torchao AdamW4bit" in times:
            print(f"torchao AdamW4bit ÷ our 4-bit: {times['torchao AdamW4bit'] / four:.1f}×")
        for name, note in notes.items():
            print(f"{name}: {note}")
    print("\nThe N-worker step, 8 workers × 1M columns, one-peer exponential AWC, ms a step")
    times = decentralized(8, 1 << 20, repeats=10)
    print(table([[name, f"{seconds * 1e3:.2f}"] for name, seconds in times.items()], ["", "ms"]))
    for bits in (8, 4):
        print(f"{bits}-bit ÷ float32: {times[f'{bits}-bit moments'] / times['float32 moments']:.2f}")
    print("\nBytes a parameter, measured from the buffers")
    print(table(bytes_per_parameter(), ["", "bytes"]))


if __name__ == "__main__":
    main()
