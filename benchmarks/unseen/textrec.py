"""Unseen model (d): PaddleOCR's PP-OCRv4 text recogniser, a real-weight ONNX file from another framework.

The model is ``ch_PP-OCRv4_rec_infer.onnx`` (10.9 MB: a PP-LCNetV3 CNN, then an SVTR attention neck and a CTC
head over 6,625 characters), exported by Paddle2ONNX at **opset 12**. Its input is ``x``
[p2o.DynamicDimension.0, 3, ?, p2o.DynamicDimension.1]; its weights are all held by 420 ``Constant`` nodes (the
file has no initializer). It ships inside the PyPI wheel ``rapidocr-onnxruntime``::

    pip install rapidocr-onnxruntime --no-deps

``prepare()`` copies the packaged file to ``.cache/`` beside this module, where ``textrec.yaml`` points.

Data: text lines rendered with PIL (the same renderer as ``textdir.py``, upright only), calibration lines from
Debian's license texts, evaluation lines from the Python standard library's comments. Preprocessing is
RapidOCR's ``TextRecognizer.resize_norm_img`` at its configured shape [3, 48, 320]: resize to height 48 keeping
the aspect ratio, scale to (x/255 - 0.5)/0.5, and pad on the right with zeros. Lines whose rendered aspect would
not fit 320 pixels are shortened by whole words.

Labels are each line's characters as indices into the model's own character list (its ``character`` metadata,
with blank at 0 and space last, as RapidOCR's ``CTCLabelDecode`` builds it), padded with -1. The metric
``char_accuracy`` decodes the CTC output greedily and scores each line 100 * (1 - edit distance / length),
floored at 0.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from dopt_common.siblings import sibling

MODEL_FILE = "ch_PP-OCRv4_rec_infer.onnx"
CORPUS_CLI = Path(__file__).resolve().parents[1] / "corpus" / "cli.py"  # the flags shared with corpus/
CACHE = Path(__file__).resolve().parent / ".cache"
HEIGHT, WIDTH = 48, 320
MAX_CHARS = 64
CALIBRATION_SAMPLES, EVALUATION_SAMPLES = 256, 256
Item = tuple[dict[str, np.ndarray], np.ndarray, list[str]]


def packaged_model() -> Path:
    """The recogniser's path inside the installed ``rapidocr_onnxruntime`` package."""
    return sibling(__file__, "textdir").packaged_model(MODEL_FILE)


def prepare(cache: Path = CACHE) -> Path:
    """Copy the packaged ONNX file to ``cache`` (where textrec.yaml's model.onnx points) and return its path."""
    return sibling(__file__, "textdir").prepare(cache, MODEL_FILE)


@lru_cache(maxsize=1)
def characters() -> tuple[str, ...]:
    """The model's output classes: blank, its ``character`` metadata, then space (RapidOCR's CTCLabelDecode)."""
    import onnx

    path = CACHE / MODEL_FILE if (CACHE / MODEL_FILE).is_file() else packaged_model()
    meta = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    return ("blank", *meta["character"].splitlines(), " ")


def encode(text: str) -> np.ndarray:
    """``text`` as class indices, padded with -1 to MAX_CHARS; a character the model lacks is -2 (never right)."""
    index = {c: i for i, c in enumerate(characters())}
    codes = [index.get(c, -2) for c in text[:MAX_CHARS]]
    return np.array(codes + [-1] * (MAX_CHARS - len(codes)), dtype=np.int64)


def char_accuracy(prediction: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Per line: 100 * (1 - edit distance / label length), at least 0. ``prediction`` is [batch, T, classes].

    The built-in ``char_accuracy``'s greedy CTC decoding and edit distance; unlike it, a character the model
    lacks (-2) stays in the label, where no prediction can match it (only the -1 padding is dropped)."""
    from deploy_opt.evaluation.sequence_metrics import ctc_decode, edit_distance

    scores = []
    for predicted, label in zip(ctc_decode(prediction), reference, strict=True):
        truth = [int(c) for c in label if c != -1]
        scores.append(100.0 * max(0.0, 1.0 - edit_distance(predicted, truth) / max(len(truth), 1)))
    return np.array(scores)


def _fitting(text: str, index: int, textdir: ModuleType) -> tuple[str, Any]:
    """The longest word prefix of ``text`` whose rendering fits 320 px at height 48, and that image."""
    words = text.split()
    while True:
        image = textdir.render(" ".join(words), index, False)
        if len(words) == 1 or HEIGHT * image.width / image.height <= WIDTH:
            return " ".join(words), image
        words = words[:-1]


def _batches(sentences: list[str], count: int, prefix: str, batch_size: int) -> list[Item]:
    textdir = sibling(__file__, "textdir")
    pairs = [_fitting(line, i, textdir) for i, line in enumerate(textdir._lines(sentences, count))]
    pixels = np.stack([textdir.preprocess(image, WIDTH) for _, image in pairs])  # RapidOCR's resize_norm_img
    labels = np.stack([encode(text) for text, _ in pairs])
    ids = [f"{prefix}-{i}" for i in range(len(pairs))]
    return [
        ({"x": pixels[i : i + batch_size]}, labels[i : i + batch_size], ids[i : i + batch_size])
        for i in range(0, len(pairs), batch_size)
    ]


def calibration_data(batch_size: int = 32) -> list[Item]:
    """256 rendered lines of Debian license text as ``(inputs, labels, ids)`` batches."""
    return _batches(sibling(__file__, "texts").license_sentences(), CALIBRATION_SAMPLES, "license", batch_size)


def evaluation_data(batch_size: int = 32) -> list[Item]:
    """256 rendered lines of Python standard-library comments; labels are the characters' class indices."""
    return _batches(sibling(__file__, "texts").comment_sentences(), EVALUATION_SAMPLES, "comment", batch_size)


def test_data(batch_size: int = 32) -> list[Item]:
    """256 other rendered lines (comments from the far end of the list), never shown to a build."""
    return _batches(sibling(__file__, "texts").comment_sentences()[::-1], EVALUATION_SAMPLES, "test", batch_size)


def fp32_char_accuracy(data: list[Item], model: Path | None = None) -> float:
    """Mean character accuracy (percent) of the FP32 ONNX model in ONNX Runtime on ``data``."""
    from dopt_common.ort import create_session

    session = create_session(str(model or packaged_model()))
    scores = [char_accuracy(session.run(None, inputs)[0], labels) for inputs, labels, _ in data]
    return float(np.concatenate(scores).mean())


def main() -> None:
    """CLI: ``--prepare`` copies the model next to the config; ``--check`` prints FP32 accuracy per split."""
    cli = sibling(CORPUS_CLI, "cli")
    check = cli.Flag("--check", "FP32 character accuracy on both splits", _check)
    cli.run_flags(__doc__, [cli.prepare_flag(prepare, f"copy {MODEL_FILE} into {CACHE}"), check])


def _check() -> None:
    calibration, evaluation = fp32_char_accuracy(calibration_data()), fp32_char_accuracy(evaluation_data())
    print(f"FP32 character accuracy: calibration {calibration:.2f}%, evaluation {evaluation:.2f}%")


if __name__ == "__main__":
    main()
