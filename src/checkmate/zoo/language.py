"""Language models: a GPT-style decoder-only transformer, small by default, and GPT-2 small at full size."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from checkmate.zoo.common import BATCH_SEED, Factory, language_model_loss


class Attention(nn.Module):
    """Causal multi-head self-attention through `scaled_dot_product_attention`."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.dropout = dropout

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        batch, length, dim = hidden.shape
        query, key, value = self.qkv(hidden).split(dim, dim=2)
        shape = (batch, length, self.heads, dim // self.heads)
        query, key, value = (tensor.view(shape).transpose(1, 2) for tensor in (query, key, value))
        attended = functional.scaled_dot_product_attention(
            query, key, value, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.out(attended.transpose(1, 2).reshape(batch, length, dim))


class Block(nn.Module):
    """Pre-norm transformer block: attention and a GELU MLP, each with a residual connection and dropout."""

    def __init__(self, dim: int, heads: int, dropout: float, attention_dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = Attention(dim, heads, attention_dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(dropout))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.attention(self.norm1(hidden))
        return hidden + self.mlp(self.norm2(hidden))


class GPT(nn.Module):
    """A GPT: token and position embeddings, dropout, transformer blocks, tied output projection."""

    def __init__(
        self, vocab: int, length: int, dim: int, heads: int, layers: int, dropout: float, attention_dropout: float
    ) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(length, dim)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*(Block(dim, heads, dropout, attention_dropout) for _ in range(layers)))
        self.norm = nn.LayerNorm(dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        hidden = self.dropout(self.tokens(tokens) + self.positions(positions))
        return self.norm(self.blocks(hidden)) @ self.tokens.weight.t()


def gpt(
    batch_size: int = 4,
    length: int = 32,
    dim: int = 64,
    heads: int = 4,
    layers: int = 2,
    vocab: int = 128,
    dropout: float = 0.1,
    attention_dropout: float = 0.0,
) -> Factory:
    """A GPT-style transformer with embeddings, dropout and causal `scaled_dot_product_attention` (small defaults).

    Attention dropout is off by default: with it, eager PyTorch on CPU takes the unfused math path
    of `scaled_dot_product_attention`, which materializes the causal mask, unlike the traced graph.
    """
    torch.manual_seed(0)
    model = GPT(vocab, length, dim, heads, layers, dropout, attention_dropout)
    for embedding in (model.tokens, model.positions):
        nn.init.normal_(embedding.weight, std=0.02)
    generator = torch.Generator().manual_seed(BATCH_SEED)
    tokens = torch.randint(0, vocab, (batch_size, length + 1), generator=generator)
    return model, language_model_loss, (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


def gpt2(
    batch_size: int = 8,
    length: int = 1024,
    dim: int = 768,
    heads: int = 12,
    layers: int = 12,
    vocab: int = 50257,
    dropout: float = 0.1,
) -> Factory:
    """GPT-2 small's size (124M parameters): 12 layers, 768 wide, 12 heads, 1024 tokens of context, 50257 tokens.

    The `gpt` architecture (pre-norm blocks, GELU, learned positions, tied output projection) with GPT-2's
    dimensions and its 0.1 dropout; attention dropout is off, as in `gpt`. Smaller arguments give a tiny variant.
    """
    return gpt(batch_size, length, dim, heads, layers, vocab, dropout)
