"""Text for the LLM path: load documents, offline pydoc text, and stratified token windows for calibration.

Splits of ``pydoc_data.topics`` (the Python docs every interpreter ships, in the dict's own order):

- ``evaluation``: the shortest tail of topics holding at least ``EVALUATION_MIN_CHARS`` characters. Joined with
  ``DOC_SEPARATOR`` and cut to its last 4,096 tokens by ``checks.perplexity``, it is "the last 4,096 tokens of
  pydoc_data.topics" on which the reference perplexities (benchmarks/llm/quantize.py) are measured.
- ``calibration``: every other topic, so calibration never sees evaluation text.
- ``prompts``: instruction-style prompts made from topic names, for the stability run.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from calibrators.sampling import length_bucket, stratified_sample
from dopt_common.errors import ConfigError, InputError

log = logging.getLogger(__name__)

DOC_SEPARATOR = "\n\n"
# About 9,000 SmolLM2 tokens with Python 3.11's topics: more than the 4,096 the perplexity check scores.
EVALUATION_MIN_CHARS = 32_000
MAX_SAMPLES = 100_000
RECOMMENDED_SAMPLES = (128, 512)  # windows: 128 of 512 tokens is 65k tokens, GPTQ's 128 x 2048 halved
BINARY_PROBE_BYTES = 8192  # a NUL byte in the first 8 KiB: a binary file (git's and grep's rule)

# Coarse groups of pydoc topics, following the chapters of the language reference; unknown topics are "other".
_TOPIC_GROUPS = {
    "statements": (
        "assert assignment async augassign break class compound continue del else for function global if import "
        "nonlocal pass raise return try while with yield"
    ),
    "expressions": (
        "atom-identifiers atom-literals attribute-references await binary bitwise booleans calls comparisons "
        "conversions exprlists in lambda operator-summary power shifting slicings subscriptions unary"
    ),
    "lexical": "floating formatstrings id-classes identifiers imaginary integers numbers strings",
    "datamodel": (
        "attribute-access callable-types context-managers customization numeric-types objects sequence-types "
        "specialattrs specialnames types"
    ),
    "builtin-types": (
        "bltin-code-objects bltin-ellipsis-object bltin-null-object bltin-type-objects dict lists string-methods "
        "truth typesfunctions typesmapping typesmethods typesmodules typesseq typesseq-mutable"
    ),
    "execution": "debugger dynamic-features exceptions execmodel naming",
}
_GROUP_OF = {topic: group for group, names in _TOPIC_GROUPS.items() for topic in names.split()}

_PROMPT_TEMPLATES = (
    "Explain what '{topic}' means in Python, with a short example.",
    "Write a small Python function that shows {topic} in use, then describe what it prints.",
    "List three common mistakes programmers make with {topic} in Python and how to avoid them.",
    "Summarise the rules for {topic} in Python for a beginner, in plain words.",
)
_PROMPT_COUNT = 8


@dataclass(frozen=True)
class TextDoc:
    """One document: where it came from, its domain (a stratum for sampling) and its text."""

    source: str
    domain: str
    text: str


@dataclass(frozen=True)
class TextSelection:
    """Token windows chosen for calibration, with the stratum counts, domain shares, a hash and warnings.

    ``sample_hash`` is the sha256 of the chosen windows' token ids in order (BOS included): it changes with the
    text, the tokenizer, the seed or the count, so two reports with the same hash calibrated on the same tokens.
    """

    input_ids: tuple[tuple[int, ...], ...]
    sample_ids: tuple[str, ...]
    counts: dict[str, int]
    available: dict[str, int]
    domain_share: dict[str, float]
    sample_hash: str
    max_seq_len: int
    warnings: tuple[str, ...] = field(default=())
    bos_token_id: int | None = None  # each window starts with it (llama.cpp's placement); None: no BOS

    def tensors(self) -> list[Any]:
        """One ``(1, length)`` int64 tensor per sample, the form ``model(input_ids)`` takes."""
        import torch

        return [torch.tensor([ids], dtype=torch.long) for ids in self.input_ids]

    def to_report(self) -> dict[str, Any]:
        """Plain data for quantize_report.json (no token ids)."""
        lengths = [len(ids) for ids in self.input_ids]
        return {
            "samples": len(self.input_ids),
            "tokens": sum(lengths),
            "longest": max(lengths, default=0),
            "max_seq_len": self.max_seq_len,
            "bos": self.bos_token_id is not None,
            "counts": dict(self.counts),
            "available": dict(self.available),
            "domain_share": dict(self.domain_share),
            "sample_hash": self.sample_hash,
            "warnings": list(self.warnings),
        }


def _read_text(path: Path) -> str:
    """A file's text as UTF-8, whatever its suffix; a binary file (a NUL byte) or another encoding is refused."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read text file '{path}': {exc.strerror}") from exc
    if b"\x00" in data[:BINARY_PROBE_BYTES]:
        raise InputError(f"'{path}' is a binary file, not text; fix: give UTF-8 text files (any suffix) or .jsonl")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"text file '{path}' is not UTF-8 ({exc.reason} at byte {exc.start}); fix: re-save it as UTF-8"
        ) from exc


def _load_jsonl(path: Path, default_domain: str) -> list[TextDoc]:
    docs: list[TextDoc] = []
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"'{path}' line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where} is not valid JSON ({exc.msg}); fix: write one JSON object per line") from exc
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise InputError(f'{where} needs a string field "text", e.g. {{"text": "...", "domain": "code"}}')
        domain = record.get("domain", default_domain)
        if not isinstance(domain, str) or not domain.strip():
            raise InputError(f'{where}: "domain" must be a non-empty string, got {domain!r}')
        if record["text"].strip():
            docs.append(TextDoc(f"{path}:{number}", domain.strip(), record["text"]))
    return docs


def _load_file(path: Path, default_domain: str) -> list[TextDoc]:
    if path.suffix == ".jsonl":
        return _load_jsonl(path, default_domain)
    # Any other file is one document of UTF-8 text, whatever its suffix (Debian's license texts have none):
    # calibration wants long contiguous context, and windows are cut later.
    text = _read_text(path)
    return [TextDoc(str(path), default_domain, text)] if text.strip() else []


def _folder_files(path: Path) -> list[Path]:
    """Every file under ``path``, hidden files and folders (``.git``, ``.DS_Store``) left out."""
    files = (p for p in path.rglob("*") if p.is_file())
    return sorted(p for p in files if not any(part.startswith(".") for part in p.relative_to(path).parts))


def load_texts(paths: Sequence[str | Path]) -> list[TextDoc]:
    """Documents from UTF-8 text files of any suffix (one each), .jsonl files (field "text", optional "domain") or
    folders of them; a binary file is refused, naming it."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    docs: list[TextDoc] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files = _folder_files(path)
            if not files:
                raise InputError(f"folder '{path}' holds no files; fix: point to the text data")
            for file in files:
                # Files in a subfolder take the subfolder's name as domain (data/code/a.txt → "code").
                parts = file.relative_to(path).parts
                docs.extend(_load_file(file, parts[0] if len(parts) > 1 else file.stem))
        elif path.is_file():
            docs.extend(_load_file(path, path.stem))
        else:
            raise InputError(f"text data '{path}' does not exist; fix: give an existing text file or folder")
    if not docs:
        shown = ", ".join(str(p) for p in paths) or "(no paths)"
        raise InputError(f"no text found in {shown}; fix: give non-empty text or .jsonl files")
    log.info("loaded %d documents from %d paths", len(docs), len(paths))
    return docs


def topic_group(topic: str) -> str:
    """The coarse group of a pydoc topic: statements, expressions, lexical, datamodel, builtin-types, ..."""
    return _GROUP_OF.get(topic, "other")


def _evaluation_topics(topics: dict[str, str]) -> list[str]:
    names = list(topics)
    held, chars = [], 0
    for name in reversed(names):
        if chars >= EVALUATION_MIN_CHARS:
            break
        held.append(name)
        chars += len(topics[name]) + len(DOC_SEPARATOR)
    return held[::-1]


def _prompts(topics: dict[str, str]) -> list[TextDoc]:
    names = list(topics)
    step = max(1, len(names) // _PROMPT_COUNT)
    picked = names[step // 2 :: step][:_PROMPT_COUNT]
    docs = []
    for i, name in enumerate(picked):
        text = _PROMPT_TEMPLATES[i % len(_PROMPT_TEMPLATES)].format(topic=name.replace("-", " "))
        docs.append(TextDoc(f"pydoc-prompt:{name}", topic_group(name), text))
    return docs


def pydoc_texts(part: Literal["calibration", "evaluation", "prompts"]) -> list[TextDoc]:
    """Offline text from ``pydoc_data.topics``: disjoint calibration/evaluation splits, or stability prompts."""
    from pydoc_data.topics import topics

    if part == "prompts":
        return _prompts(topics)
    held = set(_evaluation_topics(topics))
    if part == "evaluation":
        names = [n for n in topics if n in held]
    elif part == "calibration":
        names = [n for n in topics if n not in held]
    else:
        raise ConfigError(f"pydoc text part '{part}' is unknown; use calibration, evaluation or prompts")
    return [TextDoc(f"pydoc:{name}", topic_group(name), topics[name]) for name in names]


def _encode(tokenizer: Any, text: str) -> list[int]:
    # No special tokens: windows are cut anywhere in a document, so a BOS would land mid-text (``with_bos`` places it).
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def _encode_docs(tokenizer: Any, docs: Sequence[TextDoc]) -> list[list[int]]:
    """Each document's ids as ``_encode`` gives them, in one call: a fast tokenizer encodes the batch in Rust
    (the mixed corpus's ~840 documents: 1.4 s instead of 2.6 s one by one)."""
    if not docs:
        return []
    batch = tokenizer([doc.text for doc in docs], add_special_tokens=False, verbose=False)["input_ids"]
    return [list(ids) for ids in batch]


def bos_token_id(tokenizer: Any) -> int | None:
    """The BOS id the tokenizer puts first when it adds special tokens (Gemma, Llama 2), or None (SmolLM2, Qwen2).

    The tokenizer is asked, not its ``add_bos_token`` attribute: transformers 5 reads that False on Gemma 3's
    tokenizer, which adds BOS. A tokenizer read from a GGUF follows ``tokenizer.ggml.add_bos_token``."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return None
    special = list(tokenizer("x", add_special_tokens=True, verbose=False)["input_ids"])
    plain = list(tokenizer("x", add_special_tokens=False, verbose=False)["input_ids"])
    return int(bos) if special[:1] == [bos] and plain[:1] != [bos] else None


def with_bos(piece: Sequence[int], bos: int | None) -> list[int]:
    """A window as llama.cpp's perplexity and imatrix tools feed it: its first token replaced by BOS (same length,
    so the tokens scored are unchanged); unchanged when the tokenizer adds no BOS (``bos`` None)."""
    return list(piece) if bos is None or not piece else [bos, *piece[1:]]


def _bucket_edges(max_seq_len: int) -> tuple[int, ...]:
    edges = sorted({max_seq_len // 4, max_seq_len // 2, max_seq_len - 1} - {0})
    return tuple(edges) or (1,)


def _check_counts(count: int, max_seq_len: int, min_tokens: int) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_SAMPLES:
        raise ConfigError(
            f"calibration sample count {count!r} is out of range; use an integer in 1..{MAX_SAMPLES} "
            f"({RECOMMENDED_SAMPLES[0]}–{RECOMMENDED_SAMPLES[1]} recommended)"
        )
    if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 1:
        raise ConfigError(f"max_seq_len {max_seq_len!r} must be a positive integer, e.g. 512 or 2048")
    if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or not 1 <= min_tokens <= max_seq_len:
        raise ConfigError(f"min_tokens {min_tokens!r} must be an integer in 1..max_seq_len={max_seq_len}")


def _packed_windows(docs: Sequence[TextDoc], tokenizer: Any, max_seq_len: int, min_tokens: int):
    """Each domain's documents, in their order, joined by a blank line and cut into full ``max_seq_len`` windows
    (GPTQ's and AWQ's own practice): every window calibrates every position. A domain shorter than one window
    gives its one window."""
    separator = _encode(tokenizer, "\n\n")
    streams: dict[str, list[int]] = {}
    for doc, ids in zip(docs, _encode_docs(tokenizer, docs), strict=True):
        stream = streams.setdefault(doc.domain, [])
        stream.extend(ids + separator)
    windows: list[tuple[TextDoc, int, list[int]]] = []
    for domain, stream in streams.items():
        source = TextDoc(f"{domain} (packed)", domain, "")
        for start in range(0, len(stream), max_seq_len):
            piece = stream[start : start + max_seq_len]
            if len(piece) >= min_tokens and (len(piece) == max_seq_len or start == 0):
                windows.append((source, start, piece))
    return windows


def _windows(docs: Sequence[TextDoc], tokenizer: Any, max_seq_len: int, min_tokens: int):
    windows: list[tuple[TextDoc, int, list[int]]] = []
    for doc, ids in zip(docs, _encode_docs(tokenizer, docs), strict=True):
        for start in range(0, len(ids), max_seq_len):
            piece = ids[start : start + max_seq_len]
            if len(piece) >= min_tokens:
                windows.append((doc, start, piece))
    return windows


def _domain_warnings(domain_share: dict[str, float], chosen: int) -> list[str]:
    messages = []
    for domain, share in domain_share.items():
        if share > 0.5:
            alone = " (the only domain)" if len(domain_share) == 1 else ""
            messages.append(
                f"domain '{domain}'{alone} is {share:.0%} of the {chosen} calibration samples; quantization will "
                "fit it best; fix: add text from the other domains the model will serve"
            )
    return messages


def stratified_text_samples(
    docs: Sequence[TextDoc],
    tokenizer: Any,
    count: int = 512,
    max_seq_len: int = 512,
    seed: int = 0,
    min_tokens: int = 32,
    mode: str = "balanced",
    windows: Literal["packed", "documents"] = "documents",
) -> TextSelection:
    """Cut docs into ≤ max_seq_len-token windows and choose ``count`` of them over domain × length strata.

    ``windows``: "documents" cuts each document on its own (its last window is short); "packed" joins each
    domain's documents and cuts full windows (``_packed_windows``). Each window starts with BOS where the
    tokenizer adds one (``with_bos``), as the model sees text at inference.
    """
    _check_counts(count, max_seq_len, min_tokens)
    messages: list[str] = []
    if count < RECOMMENDED_SAMPLES[0]:
        messages.append(
            f"{count} calibration samples is below the recommended {RECOMMENDED_SAMPLES[0]}–"
            f"{RECOMMENDED_SAMPLES[1]}; GPTQ/AWQ error estimates get noisy with fewer"
        )
    cut = _packed_windows if windows == "packed" else _windows
    bos = bos_token_id(tokenizer)
    pieces = [(doc, start, with_bos(piece, bos)) for doc, start, piece in cut(docs, tokenizer, max_seq_len, min_tokens)]
    if not pieces:
        raise InputError(
            f"no document has {min_tokens} tokens or more ({len(docs)} documents); fix: give longer texts "
            "or lower min_tokens"
        )
    edges = _bucket_edges(max_seq_len)
    keys = [f"{doc.domain}/{length_bucket(len(ids), edges)}" for doc, _, ids in pieces]
    ids = [f"{doc.source}@{start}" for doc, start, _ in pieces]
    strata = len(set(keys))
    if count < strata:  # the mixed corpus has ~30 strata: a short run still works, some strata get no window
        messages.append(
            f"{count} calibration samples are fewer than the {strata} domain x length strata; some strata get none"
        )
    selection = stratified_sample(keys, count, ids=ids, mode=mode, seed=seed, min_per_stratum=int(count >= strata))

    # The sampler has logged its own warnings; keep them in the selection, with one line for all capped strata.
    capped = [w for w in selection.warnings if "below its balanced share" in w]
    inherited = [w for w in selection.warnings if w not in capped and "dominates" not in w]
    if capped:
        messages.append(
            f"{len(capped)} of {len(selection.counts)} strata had fewer windows than their balanced share; "
            "took all of them and gave the rest to the other strata"
        )
    chosen = [pieces[i] for i in selection.indices]
    domains = Counter(doc.domain for doc, _, _ in chosen)
    domain_share = {d: domains[d] / len(chosen) for d in sorted(domains)}
    messages.extend(_domain_warnings(domain_share, len(chosen)))
    longest = max(len(piece) for _, _, piece in chosen)
    if max_seq_len > longest:
        messages.append(
            f"max_seq_len={max_seq_len} is longer than the longest calibration sample ({longest} tokens): "
            f"positions {longest}..{max_seq_len - 1} are never calibrated; fix: give longer documents or set "
            f"max_seq_len <= {longest}"
        )
    for message in messages:
        log.warning(message)
    digest = hashlib.sha256()
    for _, _, piece in chosen:
        digest.update(",".join(map(str, piece)).encode("ascii") + b"\n")
    return TextSelection(
        input_ids=tuple(tuple(piece) for _, _, piece in chosen),
        sample_ids=tuple(ids[i] for i in selection.indices),
        counts=dict(selection.counts),
        available=dict(selection.available),
        domain_share=domain_share,
        sample_hash=digest.hexdigest(),
        max_seq_len=max_seq_len,
        warnings=tuple(inherited + messages),
        bos_token_id=bos,
    )
