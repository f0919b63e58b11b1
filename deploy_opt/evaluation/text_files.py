"""Text samples for the file sources: reading .txt/.jsonl lines and tokenizing them with a tokenizer.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from deploy_opt.config.model import InputSpec
from dopt_common.deps import require
from dopt_common.errors import InputError

TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def tokenize(tokenizer: Any, texts: list[str], specs: tuple[InputSpec, ...]) -> dict[str, np.ndarray]:
    """One batch of texts as the model's token inputs, padded to the longest."""
    encoded = tokenizer.encode_batch(texts)
    arrays = {
        "input_ids": np.array([e.ids for e in encoded]),
        "attention_mask": np.array([e.attention_mask for e in encoded]),
        "token_type_ids": np.array([e.type_ids for e in encoded]),
    }
    return {s.name: arrays[s.name].astype(s.dtype) for s in specs}


def read_texts(path: Path, what: str) -> tuple[list[str], list[Any] | None]:
    """The samples of a .txt (non-empty lines) or .jsonl (``text``, optional ``label``) file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if path.suffix.lower() == ".txt":
        texts = [line.strip() for line in lines if line.strip()]
        if not texts:
            raise InputError(f"{what} '{path}' has no text lines")
        return texts, None
    texts, labels = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            texts.append(str(row["text"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(
                f"{what} '{path.name}' line {number}: not a JSON object with a 'text' field ({exc})"
            ) from exc
        labels.append(row.get("label"))
    if not texts:
        raise InputError(f"{what} '{path}' has no JSON lines")
    given = [label is not None for label in labels]
    if any(given) and not all(given):
        raise InputError(f"{what} '{path.name}': {given.count(False)} lines have no 'label'; label every line or none")
    return texts, labels if all(given) else None


def read_field(path: Path, field: str, what: str) -> list[Any]:
    """Each JSON line's ``field`` (data.strata), which every line must have."""
    if path.suffix.lower() != ".jsonl":
        raise InputError(f"data.strata '{field}' names a field; {what} '{path.name}' is plain text: use a .jsonl")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    missing = sum(field not in row for row in rows)
    if missing:
        raise InputError(
            f"{what} '{path.name}': {missing} lines have no '{field}' (data.strata); give it on every line"
        )
    return [row[field] for row in rows]


def token_targets(inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The token ids as a causal LM's labels, with padding -1 (metric perplexity scores each next token)."""
    ids = inputs["input_ids"].astype(np.int64)
    mask = inputs.get("attention_mask")
    return ids if mask is None else np.where(mask > 0, ids, -1)


def load_tokenizer(folder: str | None, max_length: int, what: str) -> Any:
    """The ``tokenizers`` tokenizer of a Hugging Face model folder, truncating and padding per batch."""
    if folder is None:
        raise InputError(f"{what} is a text file: set data.tokenizer to a folder with tokenizer.json (or model.hf)")
    tokenizers = require("tokenizers", purpose="text data files", extra="examples")
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise InputError(
            f"data.tokenizer '{folder}' has no tokenizer.json; fix: point it at a Hugging Face model folder"
        )
    tokenizer = tokenizers.Tokenizer.from_file(str(path))
    tokenizer.enable_truncation(max_length=max_length)
    pad_id = tokenizer.token_to_id("[PAD]")
    pad_id = tokenizer.token_to_id("<pad>") if pad_id is None else pad_id
    tokenizer.enable_padding(pad_id=0 if pad_id is None else pad_id, pad_token=tokenizer.id_to_token(pad_id or 0))
    return tokenizer
