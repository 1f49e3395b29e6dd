"""The built-in language model workload: a small GPT (nanoGPT's shape) on characters.

`--model gpt --data text` trains it on a corpus generated here (nothing is downloaded at run
time: a seeded grammar of English-like sentences, so the loss has structure to learn and falls
well below the uniform ln(96) = 4.56), or on your own UTF-8 file with `--data-root file.txt`.
Characters are bytes 32-126 and newline, a fixed vocabulary of 96, so the model can be built
before the data is read.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from dist_jobs.errors import UsageError
from dist_jobs.spec.train import TrainConfig

# fill(param, init): how a parameter gets its initial values (init(tensor) fills a tensor)
Fill = Callable[[torch.Tensor, Callable[[torch.Tensor], Any]], None]
VOCAB = 96  # "\n" and the printable ASCII characters 32..126
_UNKNOWN = ord("?") - 31


def encode(text: str) -> torch.Tensor:
    codes = [0 if c == "\n" else (ord(c) - 31 if 32 <= ord(c) <= 126 else _UNKNOWN) for c in text]
    return torch.tensor(codes, dtype=torch.long)


def generated_corpus(chars: int, seed: int = 0) -> str:
    """English-like sentences from a small seeded grammar: the same text for every rank and run."""
    rng = random.Random(seed)
    nouns = "cat dog bird model rank node job step batch token layer queue".split()
    verbs = "sees trains follows writes loads sends waits for resumes checks".split()
    adjectives = "small quick idle busy shared lost happy green distributed".split()
    out: list[str] = []
    size = 0
    while size < chars:
        words = ["the", rng.choice(adjectives), rng.choice(nouns), rng.choice(verbs), "the", rng.choice(nouns)]
        line = " ".join(words) + (".\n" if rng.random() < 0.3 else ". ")
        out.append(line)
        size += len(line)
    return "".join(out)[:chars]


class TokenChunks(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """(tokens, next tokens) pairs of `length`, cut from a token stream at stride `length`."""

    def __init__(self, tokens: torch.Tensor, length: int) -> None:
        self.tokens, self.length = tokens, length
        self.count = max(0, (len(tokens) - 1) // length)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.length
        chunk = self.tokens[start : start + self.length + 1]
        return chunk[:-1], chunk[1:]


def text_datasets(config: TrainConfig) -> tuple[TokenChunks, TokenChunks]:
    """(train, eval): the last tenth of the text is held out."""
    if config.data_root:
        path = Path(config.data_root)
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise UsageError(f"data_root: cannot read {path}: {exc.strerror}", hint="give a UTF-8 text file") from None
    else:
        text = generated_corpus(config.text_chars, config.seed)
    tokens = encode(text)
    cut = int(len(tokens) * 0.9)
    train, held_out = TokenChunks(tokens[:cut], config.seq_len), TokenChunks(tokens[cut:], config.seq_len)
    if len(train) == 0:
        raise UsageError(
            f"data: the text has {len(tokens)} characters, too few for seq_len {config.seq_len}",
            hint="use a longer text or a smaller --seq-len",
        )
    return train, held_out


class _Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, width = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, time, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, time, width))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and position embeddings, `layers` pre-norm transformer blocks, a tied output head."""

    def __init__(self, layers: int, heads: int, width: int, context: int, vocab: int = VOCAB) -> None:
        super().__init__()
        if width % heads:
            raise UsageError(
                f"gpt_width {width} is not a multiple of gpt_heads {heads}",
                hint=f"use gpt_width {heads * max(1, round(width / heads))}",
            )
        self.context = context
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(_Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight  # weight tying, as in GPT-2
        self._init_matrices()

    def init_weights(self, fill: Fill | None = None) -> None:
        """The matrices' GPT-2 initialisation, each parameter through `fill(param, init)`: the
        default runs init(param); strategy fsdp passes one that initialises whole-size and keeps
        this rank's shard (the layers' own reset_parameters() ran before)."""
        self._init_matrices(fill or (lambda param, init: init(param)))

    def _init_matrices(self, fill: Fill = lambda param, init: init(param)) -> None:
        layers = len(self.blocks)
        for name, param in self.named_parameters():
            if param.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                fill(param, partial(nn.init.normal_, mean=0.0, std=std))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tokens(tokens) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.ln(x))
        return logits


def build_gpt(config: TrainConfig) -> GPT:
    return GPT(config.gpt_layers, config.gpt_heads, config.gpt_width, config.seq_len)
