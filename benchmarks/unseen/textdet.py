"""Unseen model (e): PaddleOCR's PP-OCRv4 text detector, a third real-weight ONNX file from Paddle2ONNX.

The model is ``ch_PP-OCRv4_det_infer.onnx`` (4.7 MB: a PP-LCNetV3 backbone, an FPN neck with Resize and
ConvTranspose, and the DB head's sigmoid probability map), exported at **opset 12** with every weight in one of
342 ``Constant`` nodes. Input ``x`` [batch, 3, H, W]; output the text probability map [batch, 1, H, W]. It ships
inside the PyPI wheel ``rapidocr-onnxruntime`` (``pip install rapidocr-onnxruntime --no-deps``); ``prepare()``
copies it to ``.cache/`` beside this module, where ``textdet.yaml`` points.

Data: 320 × 320 pages with 3-6 text lines each, rendered with ``textdir.render`` (calibration text from Debian's
license texts, evaluation text from the standard library's comments), preprocessed as RapidOCR's detector does
with this model's configuration: (x/255 - 0.5)/0.5. The data has no labels, so the metric compares with the FP32
model's own map: ``map_iou`` is the IoU, in percent, of the text pixels (probability > 0.3, RapidOCR's ``thresh``)
of the INT8 map against the FP32 map.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np

from dopt_common.siblings import sibling

MODEL_FILE = "ch_PP-OCRv4_det_infer.onnx"
CORPUS_CLI = Path(__file__).resolve().parents[1] / "corpus" / "cli.py"  # the flags shared with corpus/
CACHE = Path(__file__).resolve().parent / ".cache"
SIDE, THRESH = 320, 0.3
CALIBRATION_SAMPLES, EVALUATION_SAMPLES = 64, 64
Item = tuple[dict[str, np.ndarray], None, list[str]]


def prepare(cache: Path = CACHE) -> Path:
    """Copy the packaged ONNX file to ``cache`` (where textdet.yaml's model.onnx points) and return its path."""
    return sibling(__file__, "textdir").prepare(cache, MODEL_FILE)


def map_iou(prediction: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Per page: 100 × IoU of the text pixels (> 0.3) of ``prediction`` and of the FP32 ``reference`` map."""
    mine = prediction.reshape(len(prediction), -1) > THRESH
    theirs = reference.reshape(len(reference), -1) > THRESH
    union = (mine | theirs).sum(axis=1)
    return 100.0 * np.where(union > 0, (mine & theirs).sum(axis=1) / np.maximum(union, 1), 1.0)


def page(lines: list[str], index: int, textdir: ModuleType) -> np.ndarray:
    """A 320 × 320 light page with ``lines`` pasted at seeded positions, preprocessed to [3, 320, 320]."""
    from PIL import Image

    rng = np.random.default_rng(index)
    canvas = Image.new("RGB", (SIDE, SIDE), (int(rng.integers(200, 256)),) * 3)
    top = int(rng.integers(4, 20))
    for number, text in enumerate(lines):
        image = textdir.render(text, index * 8 + number, False)
        if image.width > SIDE - 8:
            image = image.crop((0, 0, SIDE - 8, image.height))
        if top + image.height > SIDE:
            break
        canvas.paste(image, (int(rng.integers(0, SIDE - image.width)), top))
        top += image.height + int(rng.integers(4, 24))
    pixels = np.asarray(canvas, dtype=np.float32).transpose(2, 0, 1)
    return (pixels / 255.0 - 0.5) / 0.5


def _batches(sentences: list[str], count: int, prefix: str, batch_size: int) -> list[Item]:
    textdir = sibling(__file__, "textdir")
    lines = textdir._lines(sentences, count * 6)
    rng = np.random.default_rng(len(prefix))
    pages, start = [], 0
    for index in range(count):
        take = int(rng.integers(3, 7))
        pages.append(page(lines[start : start + take], index, textdir))
        start += take
    pixels = np.stack(pages)
    ids = [f"{prefix}-page-{i}" for i in range(count)]
    return [({"x": pixels[i : i + batch_size]}, None, ids[i : i + batch_size]) for i in range(0, count, batch_size)]


def calibration_data(batch_size: int = 8) -> list[Item]:
    """64 pages of Debian license text."""
    return _batches(sibling(__file__, "texts").license_sentences(), CALIBRATION_SAMPLES, "license", batch_size)


def evaluation_data(batch_size: int = 8) -> list[Item]:
    """64 pages of Python standard-library comments."""
    return _batches(sibling(__file__, "texts").comment_sentences(), EVALUATION_SAMPLES, "comment", batch_size)


def test_data(batch_size: int = 8) -> list[Item]:
    """64 other pages (comments from the far end of the list, other layouts), never shown to a build."""
    sentences = sibling(__file__, "texts").comment_sentences()[::-1]
    return _batches(sentences, EVALUATION_SAMPLES, "comment-test", batch_size)


def _save_example(png: str) -> None:
    from PIL import Image

    first = evaluation_data()[0][0]["x"][0]
    Image.fromarray(((first * 0.5 + 0.5) * 255).clip(0, 255).astype(np.uint8).transpose(1, 2, 0)).save(png)


def main() -> None:
    """CLI: ``--prepare`` copies the model next to the config; ``--save-example`` writes one page as PNG."""
    cli = sibling(CORPUS_CLI, "cli")
    save = cli.Flag("--save-example", "write the first evaluation page as an image", _save_example, metavar="PNG")
    cli.run_flags(__doc__, [cli.prepare_flag(prepare, f"copy {MODEL_FILE} into {CACHE}"), save])


if __name__ == "__main__":
    main()
