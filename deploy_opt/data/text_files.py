"""Text samples for the file sources: reading .txt/.jsonl lines and tokenizing them with a tokenizer.json."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from deploy_opt.config.model import InputSpec
from dopt_common.errors import InputError
from dopt_common.hf_tokenizer import load_tokenizer_file

TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
MAX_LINE_BYTES = 2**20  # 1 MiB: a longer line is refused before it is tokenized (a sample is max_length tokens)
UTF8_FIX = "fix: save the file as UTF-8 (not UTF-16 or Latin-1)"


def tokenize(tokenizer: Any, texts: list[str], specs: tuple[InputSpec, ...]) -> dict[str, np.ndarray]:
    """One batch of texts as the model's token inputs, padded to the longest."""
    encoded = tokenizer.encode_batch(texts)
    arrays = {
        "input_ids": np.array([e.ids for e in encoded]),
        "attention_mask": np.array([e.attention_mask for e in encoded]),
        "token_type_ids": np.array([e.type_ids for e in encoded]),
    }
    return {s.name: arrays[s.name].astype(s.dtype) for s in specs}


@dataclass(frozen=True)
class TextSamples:
    """A text file's samples: the texts, their labels (None: unlabelled) and their ``data.strata`` values."""

    texts: list[str]
    labels: list[Any] | None
    strata: list[Any] | None = None


def read_texts(path: Path, what: str, strata: str | None = None) -> TextSamples:
    """The samples of a .txt (non-empty lines) or .jsonl (``text``, optional ``label``, and the ``strata`` field
    when named) file, read once."""
    lines = read_lines(path, what)
    if path.suffix.lower() == ".txt":
        if strata is not None:
            raise InputError(f"data.strata '{strata}' names a field; {what} '{path.name}' is plain text: use a .jsonl")
        texts = [line.strip() for line in lines if line.strip()]
        if not texts:
            raise InputError(f"{what} '{path}' has no text lines")
        return TextSamples(texts, None)
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        rows.append(_json_row(line, f"{what} '{path.name}' line {number}"))
    if not rows:
        raise InputError(f"{what} '{path}' has no JSON lines")
    labels = [row.get("label") for row in rows]
    given = [label is not None for label in labels]
    if any(given) and not all(given):
        raise InputError(f"{what} '{path.name}': {given.count(False)} lines have no 'label'; label every line or none")
    missing = 0 if strata is None else sum(strata not in row for row in rows)
    if missing:
        raise InputError(
            f"{what} '{path.name}': {missing} lines have no '{strata}' (data.strata); give it on every line"
        )
    values = None if strata is None else [row[strata] for row in rows]
    return TextSamples([row["text"] for row in rows], labels if all(given) else None, values)


def read_lines(path: Path, what: str) -> list[str]:
    """The file's lines, read a line at a time: one over ``MAX_LINE_BYTES``, one that is not UTF-8, or one holding
    NUL bytes (UTF-16 text) is an InputError naming the line, before anything tokenizes it."""
    lines: list[str] = []
    with path.open("rb") as handle:
        for number in itertools.count(1):
            raw = handle.readline(MAX_LINE_BYTES + 2)
            if not raw:
                return lines
            where = f"{what} '{path}' line {number}"
            if len(raw.rstrip(b"\r\n")) > MAX_LINE_BYTES:
                raise InputError(
                    f"{where} is over {MAX_LINE_BYTES:,} bytes (MAX_LINE_BYTES); fix: split it into samples (each is "
                    "truncated to data.max_length tokens anyway)"
                )
            try:
                text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"{where} is not UTF-8 ({exc.reason} at byte {exc.start}); {UTF8_FIX}") from None
            if "\x00" in text:
                raise InputError(f"{where} holds NUL bytes (UTF-16 text?); {UTF8_FIX}")
            lines.extend(text.splitlines())


def _json_row(line: str, where: str) -> dict[str, Any]:
    """One .jsonl line: a JSON object whose ``text`` is a string."""
    try:
        row = json.loads(line)
    except RecursionError:
        raise InputError(f"{where}: JSON nested too deeply to read; fix: write one flat object a line") from None
    except ValueError as exc:
        raise InputError(f"{where}: not valid JSON ({exc}); fix: write one JSON object a line") from None
    if not isinstance(row, dict) or "text" not in row:
        raise InputError(f'{where}: not a JSON object with a \'text\' field; fix: write {{"text": "..."}} a line')
    if not isinstance(row["text"], str):
        shown = json.dumps(row["text"])[:40]
        raise InputError(f"{where}: 'text' is {shown}, not a string; fix: give every line its text as a string")
    return row


def text_labels(inputs: dict[str, np.ndarray], labels: Any, metric: str) -> Any:
    """A text batch's labels: its token ids for the ``perplexity`` metric, else ``labels`` as given."""
    return token_targets(inputs) if metric == "perplexity" and "input_ids" in inputs else labels


def token_targets(inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The token ids as a causal LM's labels, with padding -1 (metric perplexity scores each next token)."""
    ids = inputs["input_ids"].astype(np.int64)
    mask = inputs.get("attention_mask")
    return ids if mask is None else np.where(mask > 0, ids, -1)


def load_tokenizer(folder: str | None, max_length: int, what: str) -> Any:
    """The ``tokenizers`` tokenizer of a Hugging Face model folder, truncating and padding per batch."""
    if folder is None:
        raise InputError(f"{what} is a text file: set data.tokenizer to a folder with tokenizer.json (or model.hf)")
    path = Path(folder) / "tokenizer.json"
    if not path.exists():
        raise InputError(
            f"data.tokenizer '{folder}' has no tokenizer.json; fix: point it at a Hugging Face model folder"
        )
    tokenizer = load_tokenizer_file(path, "data.tokenizer", extra="examples")
    tokenizer.enable_truncation(max_length=max_length)
    pad_id = tokenizer.token_to_id("[PAD]")
    pad_id = tokenizer.token_to_id("<pad>") if pad_id is None else pad_id
    tokenizer.enable_padding(pad_id=0 if pad_id is None else pad_id, pad_token=tokenizer.id_to_token(pad_id or 0))
    return tokenizer
