"""``builtin:char_transformer``: a small decoder-only transformer over byte tokens.

Pre-norm blocks of causal self-attention (PyTorch's scaled_dot_product_attention) and an MLP,
learned positions, and an output head tied to the token embedding. Small enough to train on
two CPU cores in a couple of minutes; ``generate`` samples from it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from baton.schemas.builtins import CharTransformerKwargs


class Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class CharTransformer(nn.Module):
    def __init__(self, vocab: int, block: int, width: int, layers: int, heads: int, dropout: float):
        super().__init__()
        self.block = block
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(block, width)
        self.blocks = nn.Sequential(*(Block(width, heads, dropout) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight  # tied
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        """GPT-2's init: N(0, 0.02) weights, zero biases (PyTorch's N(0, 1) embedding would make the
        tied head's initial logits so large that the first loss is ~3x log(vocab))."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T<=block) -> next-token logits (B, T, vocab)."""
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.head(self.norm(self.blocks(self.tokens(ids) + self.positions(positions))))

    @torch.no_grad()
    def generate(self, ids: torch.Tensor, new_tokens: int, temperature: float = 0.8,
                 generator: "torch.Generator | None" = None) -> torch.Tensor:
        for _ in range(new_tokens):
            logits = self(ids[:, -self.block:])[:, -1] / temperature
            ids = torch.cat([ids, torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)], dim=1)
        return ids


def char_transformer(**kwargs) -> nn.Module:
    k = CharTransformerKwargs.model_validate(kwargs)
    return CharTransformer(k.vocab, k.block, k.width, k.layers, k.heads, k.dropout)
