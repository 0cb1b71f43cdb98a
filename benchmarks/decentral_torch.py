"""The decentralized trainer for torch modules, N = 8 workers, on the CPU or a GPU:

(a) the vmapped forward/backward of all workers against a Python loop over N module copies;
(b) clip + mix + AdamW (steadystep's one launch, after one norm reduction) against torch
    doing the same on the [N, D] tensor: per-worker clip, mix with a gather, fused AdamW;
    both beside a bandwidth probe that reads and writes the same bytes once;
(c) the share of a whole trainer step spent outside the forward/backward;
(d) for those two and a BatchNorm CNN and a TransformerEncoder (scaled_dot_product_attention):
    vmapped, the trainer's loop over workers, a loop over copies, and what vmap="auto" chose.

Run: python -m benchmarks.decentral_torch [--quick] [--device cuda]
"""

from __future__ import annotations

import copy
import sys
import time

import torch

from benchmarks.common import compare, machine
from steadystep import decentral, lm
from steadystep.torch.decentral import DecentralizedTrainer, cross_entropy

WORKERS = 8
LR, BETAS, EPS, MAX_NORM, WEIGHT_DECAY = 1e-3, (0.9, 0.999), 1e-8, 1.0, 0.1


def mlp_case(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
    ).to(device)
    inputs = torch.randn(WORKERS, 64, 784, device=device)
    targets = torch.randint(0, 10, (WORKERS, 64), device=device)
    return "MLP 784-256-128-10, 64 samples/worker", model, inputs, targets


def transformer_case(device):
    torch.manual_seed(0)
    model = lm.ByteTransformer(context=64, width=96, layers=2, heads=4).to(device)
    tokens = torch.randint(0, 256, (WORKERS, 8, 65), device=device)
    return "byte transformer 2×96, 8×64 tokens/worker", model, tokens[..., :-1], tokens[..., 1:]


class BatchNormCNN(torch.nn.Module):
    """Three convolution blocks with BatchNorm (a small ResNet's stem and stages): torch's
    batching rule for batch norm makes vmap slower than a loop here."""

    def __init__(self):
        super().__init__()
        blocks, channels = [], 3
        for width in (16, 32, 64):
            blocks += [
                torch.nn.Conv2d(channels, width, 3, padding=1, bias=False),
                torch.nn.BatchNorm2d(width),
                torch.nn.ReLU(),
                torch.nn.MaxPool2d(2),
            ]
            channels = width
        self.features = torch.nn.Sequential(*blocks)
        self.head = torch.nn.Linear(64 * 4 * 4, 10)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def cnn_case(device):
    torch.manual_seed(0)
    model = BatchNormCNN().to(device)
    inputs = torch.randn(WORKERS, 16, 3, 32, 32, device=device)
    targets = torch.randint(0, 10, (WORKERS, 16), device=device)
    return "BatchNorm CNN 3 blocks, 16 images 32×32/worker", model, inputs, targets


class AttentionClassifier(torch.nn.Module):
    """torch's TransformerEncoder, whose attention is scaled_dot_product_attention (vmap falls
    back to a slow path for it), over embedded bytes, classifying each sequence."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(256, 64)
        layer = torch.nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(64, 10)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


def attention_case(device):
    torch.manual_seed(0)
    model = AttentionClassifier().to(device)
    inputs = torch.randint(0, 256, (WORKERS, 8, 32), device=device)
    targets = torch.randint(0, 10, (WORKERS, 8), device=device)
    return "TransformerEncoder 2×64 (sdpa), 8×32 tokens/worker", model, inputs, targets


def synchronized(function, device):
    if device == "cpu":
        return function

    def timed():
        function()
        torch.cuda.synchronize()

    return timed


def trainer_of(model, vmap) -> DecentralizedTrainer:
    return DecentralizedTrainer(
        model,
        WORKERS,
        topology=decentral.one_peer_exponential(),
        lr=LR,
        betas=BETAS,
        eps=EPS,
        weight_decay=WEIGHT_DECAY,
        max_norm=MAX_NORM,
        decay=lambda name, p: True,
        vmap=vmap,
    )


def choice(case, device: str, repeats: int) -> dict[str, float]:
    """(a) alone: the forward/backward of all workers vmapped, in the trainer's loop, and in a
    loop over module copies (torch alone), with what vmap="auto" chose on the first batch."""
    name, model, inputs, targets = case
    ways = {way: trainer_of(model, way == "vmap") for way in ("vmap", "loop")}
    auto = trainer_of(model, "auto")
    auto.step(inputs, targets)
    copies = [copy.deepcopy(model) for _ in range(WORKERS)]

    def copies_loop():
        for worker, replica in enumerate(copies):
            replica.zero_grad(set_to_none=False)
            cross_entropy(replica(inputs[worker]), targets[worker]).backward()

    def gradients(trainer):
        buffers = dict(trainer.buffers)
        return lambda: trainer._gradients(buffers, (inputs,), targets, cross_entropy)

    functions = {"copies": copies_loop} | {way: gradients(trainer) for way, trainer in ways.items()}
    times = compare({key: synchronized(function, device) for key, function in functions.items()}, repeats)
    chosen = auto.gradients_by["way"]
    met = times[chosen] <= 1.1 * times["copies"]
    print(
        f"\n{name}: loop over copies {times['copies'] * 1e3:.2f} ms, vmapped {times['vmap'] * 1e3:.2f} ms, "
        f"the trainer's loop {times['loop'] * 1e3:.2f} ms; auto chose {chosen} ({auto.gradients_by['why']})\n"
        f"  {'met    ' if met else 'NOT met'}  the chosen way within 1.1x the loop over copies "
        f"(issue 50): {times[chosen] / times['copies']:.2f}x"
    )
    return times


def run(case, device: str, repeats: int) -> dict[str, float]:
    name, model, inputs, targets = case
    trainer = trainer_of(model, True)
    copies = [copy.deepcopy(model) for _ in range(WORKERS)]

    def loop():
        for worker, replica in enumerate(copies):
            replica.zero_grad(set_to_none=False)
            cross_entropy(replica(inputs[worker]), targets[worker]).backward()

    buffers = dict(trainer.buffers)

    def vmapped():
        trainer._gradients(buffers, (inputs,), targets, cross_entropy)

    def whole_step():
        trainer.step(inputs, targets)

    # (b): the update alone, from gradients already in the [N, D] tensor
    trainer.step(inputs, targets)
    ((optimizer,), (grads,)) = trainer.optimizers, trainer.grads

    def ours_update():
        optimizer.step(grads, lr=LR)

    rows = trainer.params.detach().clone().requires_grad_()
    rows.grad = grads.clone()
    fused = torch.optim.AdamW([rows], lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, fused=True)
    steps = [0]

    def torch_update():
        with torch.no_grad():
            norms = torch.linalg.vector_norm(rows.grad, dim=1, keepdim=True)
            rows.grad.mul_(torch.clamp(MAX_NORM / (norms + 1e-6), max=1.0))
            peers = torch.as_tensor(decentral.one_peer_exponential().peers(WORKERS, steps[0]), device=rows.device)
            rows.copy_(0.5 * rows + 0.5 * rows[peers])  # AWC: mix, then the step from the mixed rows
        fused.step()
        steps[0] += 1

    probe_in = [torch.randn_like(rows.detach()) for _ in range(5)]
    probe_out = [torch.empty_like(rows.detach()) for _ in range(3)]

    def probe():  # read x, x[peer], g, m, v; write x', m', v': the bytes of an in-place step, once
        x, peer, g, m, v = probe_in
        torch.add(x, peer, out=probe_out[0])
        torch.add(m, g, out=probe_out[1])
        torch.add(v, g, out=probe_out[2])

    # each pair round-robin on its own: the update's streams would evict the forward's weights
    times = compare({"loop": synchronized(loop, device), "vmap": synchronized(vmapped, device)}, repeats)
    times |= compare(
        {
            key: synchronized(function, device)
            for key, function in {"ours": ours_update, "torch": torch_update, "probe": probe}.items()
        },
        repeats,
    )
    times["step"], times["inside"] = share_inside(trainer, synchronized(whole_step, device), device, repeats)
    dim = sum(p.numel() for p in model.parameters())
    print(f"\n{name}: {dim:,} parameters per worker, D = {rows.shape[1]:,} with padding")
    print(
        f"  (a) forward/backward: loop over copies {times['loop'] * 1e3:7.2f} ms, "
        f"vmapped {times['vmap'] * 1e3:7.2f} ms "
        f"→ vmap is {times['loop'] / times['vmap']:.2f}× the loop"
    )
    print(
        f"  (b) clip + mix + AdamW: torch {times['torch'] * 1e3:7.3f} ms, steadystep {times['ours'] * 1e3:7.3f} ms "
        f"→ {times['torch'] / times['ours']:.2f}× torch; probe {times['probe'] * 1e3:.3f} ms, steadystep "
        f"{times['ours'] / times['probe']:.2f}× the probe"
    )
    outside = times["step"] - times["inside"]
    print(
        f"  (c) whole step {times['step'] * 1e3:7.2f} ms, of which outside forward/backward "
        f"{outside * 1e3:6.2f} ms = {outside / times['step']:.1%}"
    )
    return times


def share_inside(trainer, step, device: str, repeats: int) -> tuple[float, float]:
    """Seconds per whole step, and of them inside the vmapped forward/backward, timed within
    the same steps (the difference of two separately timed medians drowns in noise)."""
    gradients, inside = trainer._gradients, [0.0]

    def timed(*arguments):
        start = time.perf_counter()
        result = gradients(*arguments)
        if device != "cpu":
            torch.cuda.synchronize()
        inside[0] += time.perf_counter() - start
        return result

    trainer._gradients = timed
    for _ in range(3):
        step()
    inside[0] = 0.0
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    total = time.perf_counter() - start
    trainer._gradients = gradients
    return total / repeats, inside[0] / repeats


def main(argv: list[str]) -> int:
    device = "cuda" if "--device" in argv and argv[argv.index("--device") + 1] == "cuda" else "cpu"
    repeats = 5 if "--quick" in argv else 25
    print(
        f"decentralized trainer, {WORKERS} workers, {device}: {machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} torch threads"
    )
    for case in (mlp_case, transformer_case):
        run(case(device), device, repeats)
    print("\n(a) alone, and what vmap='auto' chooses:")
    for case in (mlp_case, transformer_case, cnn_case, attention_case):
        choice(case(device), device, repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
