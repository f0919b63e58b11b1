"""Tiny torch models for the pruning tests: a residual CNN, and a BERT-style encoder layer with HF names."""

from __future__ import annotations

import math

import numpy as np
import torch
from tiny_torch import labelled_images
from torch import nn


class ResidualCNN(nn.Module):
    """Stem, two residual blocks (depthwise 3x3, BN, ReLU, pointwise 1x1, added to the input), pool, Linear."""

    def __init__(self, channels: int = 16, classes: int = 5) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU())
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.Conv2d(channels, channels, 3, padding=1, groups=channels),
                nn.BatchNorm2d(channels),
                nn.ReLU(),
                nn.Conv2d(channels, channels, 1),
            )
            for _ in range(2)
        )
        self.head = nn.Linear(channels, classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.stem(image)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x.mean(dim=(2, 3)))


class SelfAttention(nn.Module):
    """Multi-head self-attention named like transformers' BertSelfAttention (query, key, value)."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.num_attention_heads = heads
        self.attention_head_size = hidden // heads
        self.all_head_size = hidden
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (*x.shape[:-1], -1, self.attention_head_size)
        q, k, v = (layer(x).view(shape).transpose(1, 2) for layer in (self.query, self.key, self.value))
        probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.attention_head_size), dim=-1)
        return (probs @ v).transpose(1, 2).reshape(*x.shape[:-1], -1)


class EncoderLayer(nn.Module):
    """Attention and FFN, each with a residual add and LayerNorm (post-norm, as BERT)."""

    def __init__(self, hidden: int, heads: int, inter: int) -> None:
        super().__init__()
        self.attention = SelfAttention(hidden, heads)
        self.attention_output = nn.Linear(hidden, hidden)
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.intermediate = nn.Linear(hidden, inter)
        self.output = nn.Linear(inter, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attention_output(self.attention(x)))
        return self.norm2(x + self.output(torch.nn.functional.gelu(self.intermediate(x))))


class TinyEncoder(nn.Module):
    """Embedding, two encoder layers, mean pooling."""

    def __init__(self, vocab: int = 50, hidden: int = 32, heads: int = 4, inter: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(EncoderLayer(hidden, heads, inter) for _ in range(2))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return x.mean(dim=1)


def build_cnn() -> nn.Module:
    """The residual CNN with fixed random weights."""
    torch.manual_seed(0)
    return ResidualCNN().eval()


def build_encoder() -> nn.Module:
    """The tiny encoder with fixed random weights."""
    torch.manual_seed(0)
    return TinyEncoder().eval()


def calibration() -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    """128 images labelled by the unpruned CNN."""
    return labelled_images(build_cnn(), 10, 128, 16)


def evaluation() -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    """64 images from another seed."""
    return labelled_images(build_cnn(), 11, 64, 16)


def tokens(seed: int = 0, n: int = 8) -> torch.Tensor:
    """Random token ids [n, 12]."""
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 50, (n, 12)))
