"""Unseen model (c): PaddleOCR's text-direction classifier, an ONNX file from another framework.

The model is ``ch_ppocr_mobile_v2.0_cls_infer.onnx`` (MobileNetV3-small, 585 KB, exported by Paddle2ONNX at
opset 11; input ``x`` [batch, 3, 48, 192] float, output the softmax over ("0", "180") degrees). It ships
inside the PyPI wheel ``rapidocr-onnxruntime``; install it without its OpenCV and other dependencies::

    pip install rapidocr-onnxruntime --no-deps

``model.onnx`` in a build config is a path relative to the config, so ``prepare()`` copies the packaged file
to ``.cache/`` beside this module (``python benchmarks/unseen/textdir.py --prepare``; run.py does it).

Data: real text lines rendered with PIL in the DejaVu fonts that matplotlib ships, half of them turned
180 degrees (label 1) and half upright (label 0). Calibration lines come from Debian's license texts,
evaluation lines from the Python standard library's comments. Preprocessing is RapidOCR's
``TextClassifier.resize_norm_img``: resize to height 48 keeping the aspect ratio (width at most 192),
scale to (x/255 - 0.5)/0.5, and pad on the right with zeros to width 192.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from dopt_common.siblings import sibling

MODEL_FILE = "ch_ppocr_mobile_v2.0_cls_infer.onnx"
CORPUS_CLI = Path(__file__).resolve().parents[1] / "corpus" / "cli.py"  # the flags shared with corpus/
CACHE = Path(__file__).resolve().parent / ".cache"
HEIGHT, WIDTH = 48, 192
CALIBRATION_SAMPLES, EVALUATION_SAMPLES = 512, 512
FONTS = ("DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf")
WORDS_PER_LINE = (2, 3, 4, 5)
SEED = 0
Item = tuple[dict[str, np.ndarray], np.ndarray, list[str]]


def packaged_model(name: str = MODEL_FILE) -> Path:
    """The path of the ONNX file ``name`` (default: the classifier) inside the installed ``rapidocr_onnxruntime``."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("rapidocr_onnxruntime is not installed: pip install rapidocr-onnxruntime --no-deps")
    return Path(next(iter(spec.submodule_search_locations))) / "models" / name


def prepare(cache: Path = CACHE, name: str = MODEL_FILE) -> Path:
    """Copy the packaged ONNX file ``name`` to ``cache`` (where the model's config points) and return its path."""
    out = cache / name
    cache.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    shutil.copyfile(packaged_model(name), tmp)
    tmp.replace(out)
    return out


def _lines(sentences: list[str], count: int) -> list[str]:
    """Cut sentences into short text lines of 2-5 words, the size of a detected OCR text box."""
    lines: list[str] = []
    for index, sentence in enumerate(sentences):
        words = sentence.split()
        step = WORDS_PER_LINE[index % len(WORDS_PER_LINE)]
        lines += [" ".join(words[i : i + step]) for i in range(0, len(words), step) if len(words[i : i + step]) > 1]
        if len(lines) >= count:
            break
    return lines[:count]


def _font(index: int) -> Any:
    import matplotlib
    from PIL import ImageFont

    path = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / FONTS[index % len(FONTS)]
    return ImageFont.truetype(str(path), size=20 + (index * 7) % 17)


def render(text: str, index: int, rotated: bool) -> Any:
    """A tight grey-level text-line image (PIL, RGB), dark ink on a light page, turned 180° if ``rotated``."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(SEED + index)
    font = _font(index)
    left, top, right, bottom = font.getbbox(text)
    margin_x, margin_y = int(rng.integers(2, 10)), int(rng.integers(2, 8))
    size = (right - left + 2 * margin_x, bottom - top + 2 * margin_y)
    paper, ink = int(rng.integers(200, 256)), int(rng.integers(0, 70))
    image = Image.new("RGB", size, (paper,) * 3)
    ImageDraw.Draw(image).text((margin_x - left, margin_y - top), text, font=font, fill=(ink,) * 3)
    return image.transpose(Image.Transpose.ROTATE_180) if rotated else image


def preprocess(image: Any, size: int = WIDTH) -> np.ndarray:
    """RapidOCR's resize_norm_img: [3, 48, size] float32, aspect kept, (x/255-0.5)/0.5, zero-padded right."""
    from PIL import Image

    width = min(size, math.ceil(HEIGHT * image.width / image.height))
    resized = np.asarray(image.resize((width, HEIGHT), Image.Resampling.BILINEAR), dtype=np.float32)
    out = np.zeros((3, HEIGHT, size), dtype=np.float32)
    out[:, :, :width] = (resized.transpose(2, 0, 1) / 255.0 - 0.5) / 0.5
    return out


def _samples(lines: list[str], prefix: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    labels = np.arange(len(lines), dtype=np.int64) % 2  # alternate upright (0) and turned 180° (1)
    pixels = np.stack([preprocess(render(t, i, bool(labels[i]))) for i, t in enumerate(lines)])
    return pixels, labels, [f"{prefix}-{i}" for i in range(len(lines))]


def _batches(lines: list[str], prefix: str, batch_size: int) -> list[Item]:
    x, y, ids = _samples(lines, prefix)
    return [
        ({"x": x[i : i + batch_size]}, y[i : i + batch_size], ids[i : i + batch_size])
        for i in range(0, len(x), batch_size)
    ]


def calibration_data(batch_size: int = 32) -> list[Item]:
    """512 rendered lines of Debian license text as ``(inputs, labels, ids)`` batches."""
    return _batches(_lines(sibling(__file__, "texts").license_sentences(), CALIBRATION_SAMPLES), "license", batch_size)


def evaluation_data(batch_size: int = 32) -> list[Item]:
    """512 rendered lines of Python standard-library comments (labels: 0 upright, 1 turned 180°)."""
    return _batches(_lines(sibling(__file__, "texts").comment_sentences(), EVALUATION_SAMPLES), "comment", batch_size)


def test_data(batch_size: int = 32) -> list[Item]:
    """512 other rendered lines (comments from the far end of the list), never shown to a build."""
    sentences = sibling(__file__, "texts").comment_sentences()[::-1]
    return _batches(_lines(sentences, EVALUATION_SAMPLES), "test", batch_size)


def fp32_top1(data: list[Item], model: Path | None = None) -> float:
    """Top-1 (percent) of the FP32 ONNX model in ONNX Runtime on ``data``."""
    from dopt_common.ort import create_session

    session = create_session(str(model or packaged_model()))
    hits = [session.run(None, inputs)[0].argmax(axis=1) == labels for inputs, labels, _ in data]
    return float(np.concatenate(hits).mean() * 100.0)


def main() -> None:
    """CLI: ``--prepare`` copies the model next to the config; ``--check`` prints the FP32 top-1 per split."""
    cli = sibling(CORPUS_CLI, "cli")
    flags = [
        cli.prepare_flag(prepare, f"copy {MODEL_FILE} into {CACHE}"),
        cli.Flag("--check", "FP32 top-1 on the calibration and evaluation data", _check),
        cli.Flag("--save-examples", "write a few rendered lines as PNG files", _save_examples, metavar="DIR"),
    ]
    cli.run_flags(__doc__, flags)


def _check() -> None:
    calibration, evaluation = fp32_top1(calibration_data()), fp32_top1(evaluation_data())
    print(f"FP32 top-1: calibration {calibration:.2f}%, evaluation {evaluation:.2f}%")


def _save_examples(examples: str) -> None:
    folder = Path(examples)
    folder.mkdir(parents=True, exist_ok=True)
    lines = _lines(sibling(__file__, "texts").comment_sentences(), 8)
    for i, text in enumerate(lines):
        render(text, i, bool(i % 2)).save(folder / f"line{i}.png")


if __name__ == "__main__":
    main()
