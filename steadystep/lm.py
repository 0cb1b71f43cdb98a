"""A tiny byte-level language model and real text to train it on: the pieces of
``python -m steadystep demo --task lm``.

The text is the standard library's own ``.py`` files (it ships with every Python), split
by file into training and validation sets, each packed into one byte stream; the model is
a small causal transformer over bytes (vocabulary 256) written with ``torch.nn``, whose
attention is plain matmuls and a mask so that ``torch.func.vmap`` batches it on every
device (``scaled_dot_product_attention`` has no batching rule on the CPU). Needs torch.

>>> import torch
>>> from steadystep import lm
>>> model = lm.ByteTransformer(context=16, width=32, layers=1, heads=2)
>>> model(torch.zeros(3, 16, dtype=torch.long)).shape            # [batch, context, 256] logits
torch.Size([3, 16, 256])
>>> round(lm.unigram_bits_per_byte(b"abab"), 6)                  # entropy of the byte frequencies
1.0
"""

from __future__ import annotations

import math
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

try:
    import torch
except ImportError as error:  # not a dependency of steadystep itself
    raise ImportError("steadystep.lm needs torch: pip install 'steadystep[torch]'") from error

__all__ = [
    "ByteTransformer",
    "Corpus",
    "stdlib_corpus",
    "unigram_bits_per_byte",
    "windows",
    "bits_per_byte",
    "generate",
]

VOCABULARY = 256


class ByteTransformer(torch.nn.Module):
    """A causal pre-norm transformer over bytes: token and learned position embeddings,
    ``layers`` blocks of multi-head self-attention and a 4× GELU MLP, a final LayerNorm and
    a linear head to 256 logits (not tied to the embedding: every worker's parameters stay
    plain tensors for the [N, D] arena)."""

    def __init__(self, context: int = 64, width: int = 96, layers: int = 2, heads: int = 4):
        super().__init__()
        if width % heads:
            raise ValueError(f"width ({width}) must be a multiple of heads ({heads})")
        self.context, self.heads = context, heads
        self.embed = torch.nn.Embedding(VOCABULARY, width)
        self.position = torch.nn.Parameter(torch.zeros(context, width))
        self.blocks = torch.nn.ModuleList(_Block(width, heads) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, VOCABULARY, bias=False)
        for name, parameter in self.named_parameters():
            if name.endswith("bias"):
                torch.nn.init.zeros_(parameter)
            elif parameter.dim() >= 2:  # embeddings, projections, the position table
                # residual branches' outputs scaled down with depth (GPT-2)
                residual = name.endswith(("out.weight", "down.weight"))
                torch.nn.init.normal_(parameter, std=0.02 / math.sqrt(2 * layers) if residual else 0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[-1]
        x = self.embed(tokens) + self.position[:length]
        mask = torch.ones(length, length, dtype=torch.bool, device=tokens.device).triu(1)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


class _Block(torch.nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.attention_norm = torch.nn.LayerNorm(width)
        # No biases: the keys' would get a zero gradient (softmax ignores a shift shared by all
        # keys). Three projections rather than one split: under vmap the split's backward is a
        # slow concatenation.
        self.query = torch.nn.Linear(width, width, bias=False)
        self.key = torch.nn.Linear(width, width, bias=False)
        self.value = torch.nn.Linear(width, width, bias=False)
        self.out = torch.nn.Linear(width, width)
        self.mlp_norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        *batch, length, width = x.shape
        size = width // self.heads
        normed = self.attention_norm(x)

        def heads(projected: torch.Tensor) -> torch.Tensor:  # [..., L, W] -> [..., H, L, W/H]
            return projected.reshape(*batch, length, self.heads, size).transpose(-3, -2)

        query = heads(self.query(normed) * (1.0 / math.sqrt(size)))  # scaled before the product: L·W, not L²·H
        scores = (query @ heads(self.key(normed)).transpose(-2, -1)).masked_fill(mask, float("-inf"))
        attended = torch.softmax(scores, dim=-1) @ heads(self.value(normed))
        x = x + self.out(attended.transpose(-3, -2).reshape(*batch, length, width))
        return x + self.down(torch.nn.functional.gelu(self.up(self.mlp_norm(x))))


# -- text -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    """Training and validation byte streams (uint8), and which files went where."""

    train: np.ndarray
    validation: np.ndarray
    train_files: tuple[str, ...]
    validation_files: tuple[str, ...]
    root: str


def stdlib_corpus(seed: int = 0, validation_files: int = 20, root: Optional[str] = None) -> Corpus:
    """The standard library's top-level ``.py`` files (of the running Python, or ``root``),
    shuffled with ``seed``: the first ``validation_files`` are the validation set, the rest
    the training set, each concatenated in that order into one stream."""
    directory = Path(root or sysconfig.get_paths()["stdlib"])
    files = sorted(path.name for path in directory.glob("*.py") if path.is_file())
    if len(files) <= validation_files:
        raise ValueError(f"{directory} holds {len(files)} .py files; need more than the {validation_files} held out")
    order = [files[index] for index in np.random.default_rng(seed).permutation(len(files))]
    held_out, kept = order[:validation_files], order[validation_files:]

    def stream(names: list[str]) -> np.ndarray:
        return np.frombuffer(b"".join((directory / name).read_bytes() for name in names), np.uint8).copy()

    return Corpus(stream(kept), stream(held_out), tuple(kept), tuple(held_out), str(directory))


def unigram_bits_per_byte(text: bytes | np.ndarray) -> float:
    """The entropy of ``text``'s byte frequencies in bits per byte: the loss of the best
    model that ignores context, measured on the same text."""
    counts = np.bincount(np.frombuffer(bytes(text), np.uint8), minlength=VOCABULARY).astype(np.float64)
    probabilities = counts[counts > 0] / counts.sum()
    return float(-(probabilities * np.log2(probabilities)).sum())


def windows(stream: np.ndarray, context: int, count: Optional[int] = None) -> np.ndarray:
    """Packed evaluation windows: [W, context + 1] int64 slices of ``stream`` (inputs and the
    next byte of each), ``count`` of them spread evenly over it (all, back to back, by default)."""
    available = (len(stream) - 1) // context
    if available < 1:
        raise ValueError(f"stream holds {len(stream)} bytes: not one window of context + 1 = {context + 1}")
    starts = np.arange(available) * context
    if count is not None and count < available:
        starts = starts[np.linspace(0, available - 1, count).round().astype(np.int64)]
    return np.asarray(stream)[starts[:, None] + np.arange(context + 1)].astype(np.int64)


@torch.no_grad()
def bits_per_byte(model: torch.nn.Module, packed: np.ndarray, batch: int = 64) -> float:
    """Mean cross-entropy in bits of predicting each next byte of the ``packed`` windows."""
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for start in range(0, len(packed), batch):
        chunk = torch.as_tensor(packed[start : start + batch], device=device)
        logits = model(chunk[:, :-1])
        total += float(
            torch.nn.functional.cross_entropy(
                logits.reshape(-1, VOCABULARY).double(), chunk[:, 1:].reshape(-1), reduction="sum"
            )
        )
        count += chunk[:, 1:].numel()
    return total / count / math.log(2)


@torch.no_grad()
def generate(model: torch.nn.Module, prompt: bytes, length: int, temperature: float = 0.8, seed: int = 0) -> bytes:
    """``length`` bytes sampled after ``prompt`` (the last ``context`` bytes as input)."""
    device = next(model.parameters()).device
    generator = torch.Generator(device="cpu").manual_seed(seed)
    context = getattr(model, "context", 64)
    tokens = list(prompt)
    for _ in range(length):
        window = torch.tensor(tokens[-context:], device=device)[None]
        logits = model(window)[0, -1].double().cpu() / max(temperature, 1e-6)
        tokens.append(int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)))
    return bytes(tokens[len(prompt) :])
