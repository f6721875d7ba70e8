"""The `transformer-lm` workload: a decoder-only causal transformer (GPT-2 style, pre-norm
blocks) on synthetic tokens, sized by width, layers, heads, seq_len and vocab: the defaults are
~42M parameters; width 256 x 4 layers is ~12M, width 2048 x 20 layers beyond 1B. A sample is one
sequence; its loss is the per-token cross-entropy averaged over the sequence."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from dpbench.workloads.spec import WorkloadSpec

MLP = 4   # the feed-forward layer's width, in widths


class Block(nn.Module):
    """x + attention(norm(x)), then x + mlp(norm(x)): 12·d² + 13·d parameters."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, MLP * width)
        self.fc2 = nn.Linear(MLP * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class TransformerLM(nn.Module):
    def __init__(self, width: int, layers: int, heads: int, seq_len: int, vocab: int, tied: bool):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not a multiple of heads {heads}")
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(seq_len, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.apply(self._init)
        if tied:
            self.head.weight = self.tokens.weight

    @staticmethod
    def _init(module: nn.Module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))   # (batch, seq_len, vocab) logits


def parameter_count(width: int, layers: int, seq_len: int, vocab: int, tied: bool) -> int:
    embeddings = (vocab + seq_len) * width + (0 if tied else vocab * width)
    return layers * (12 * width ** 2 + 13 * width) + embeddings + 2 * width


def flops_per_sample(width: int, layers: int, seq_len: int, vocab: int) -> float:
    """Forward + backward (3x forward) of one sequence: 2 FLOPs per weight of the blocks' and
    head's matrix products per token, plus attention's two T x T products (4·T·d per token and
    layer, counted whole though the causal mask could halve them, as FlopCounterMode counts)."""
    matrix_weights = layers * 12 * width ** 2 + vocab * width
    forward = seq_len * (2 * matrix_weights + 4 * layers * seq_len * width)
    return 3.0 * forward


def per_sequence_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    per_token = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    return per_token.view(targets.shape).mean(1)


def build(width: int = 512, layers: int = 8, heads: int = 8, seq_len: int = 512, vocab: int = 32768,
          tied: bool = True) -> WorkloadSpec:
    def batch(generator: torch.Generator, n: int):
        tokens = torch.randint(0, vocab, (n, seq_len + 1), generator=generator)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()   # predict the next token

    return WorkloadSpec(model=TransformerLM(width, layers, heads, seq_len, vocab, tied),
                        loss=per_sequence_cross_entropy, batch=batch, shard_modules=(Block,),
                        sample_unit="tokens", units_per_sample=seq_len,
                        flops_per_sample=flops_per_sample(width, layers, seq_len, vocab))
