"""Data for the two nudenet detectors (YOLOv8n, 18 body-part and face classes, 320 × 320 input).

Inputs are seeded square crops of the photographs in ``images.py`` (several scales, left-right flips), resized
to 320 × 320, RGB / 255, as nudenet feeds its model (it pads to a square and lets ``blobFromImage`` resize;
a square crop needs no padding). Calibration and evaluation crops come from different photographs. Few of the
photographs show people, so each split is weighted towards the ones where the FP32 model detects something:
calibration repeats astronaut and camera, evaluation repeats grace_hopper. The other photographs stay in, so
the model also sees crops where it should (and the FP32 model does) find nothing.

No labels: ``detection_f1`` (deploy_opt's built-in) scores each image's detections against the FP32 model's.
``python benchmarks/corpus/people.py --check`` prints how many FP32 detections each evaluation image has.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from dopt_common.siblings import sibling

SIDE = 320
CALIBRATION_SAMPLES, EVALUATION_SAMPLES = 64, 192
CALIBRATION_MIX = ("astronaut", "camera", "chelsea", "astronaut", "camera", "cell", "rocket", "china", "hubble")
EVALUATION_MIX = ("grace_hopper", "coffee", "grace_hopper", "moon", "color", "grace_hopper", "clock", "flower")
CALIBRATION_SEED, EVALUATION_SEED, TEST_SEED = 11, 12, 13
Item = tuple[dict[str, np.ndarray], None, list[str]]


def _batches(names: tuple[str, ...], count: int, seed: int, batch_size: int) -> list[Item]:
    images = sibling(__file__, "images")
    samples = images.crops(names, count, SIDE, seed)
    pixels = np.stack([images.to_chw(image) for _, image in samples])
    ids = [sample_id for sample_id, _ in samples]
    return [
        ({"images": pixels[i : i + batch_size]}, None, ids[i : i + batch_size]) for i in range(0, count, batch_size)
    ]


def calibration_data(batch_size: int = 8) -> list[Item]:
    """64 crops of the calibration photographs, [batch, 3, 320, 320]."""
    return _batches(CALIBRATION_MIX, CALIBRATION_SAMPLES, CALIBRATION_SEED, batch_size)


def evaluation_data(batch_size: int = 8) -> list[Item]:
    """192 crops of the evaluation photographs (none of them in calibration), [batch, 3, 320, 320]: the build
    decides on 96 and judges on the other 96 (64 left the search choosing on noise: one detection flipping in a
    one-person crop moved the F1 by 1.6 points)."""
    return _batches(EVALUATION_MIX, EVALUATION_SAMPLES, EVALUATION_SEED, batch_size)


def calibration_data_single() -> list[Item]:
    """The same calibration crops one per batch, for the export with a fixed batch of 1."""
    return calibration_data(batch_size=1)


def evaluation_data_single() -> list[Item]:
    """The same evaluation crops one per batch, for the export with a fixed batch of 1."""
    return evaluation_data(batch_size=1)


def test_data(batch_size: int = 8) -> list[Item]:
    """192 other crops of the evaluation photographs (seed 13), never shown to a build: run.py scores these."""
    return _batches(EVALUATION_MIX, EVALUATION_SAMPLES, TEST_SEED, batch_size)


def test_data_single() -> list[Item]:
    """The test crops one per batch, for the export with a fixed batch of 1."""
    return test_data(batch_size=1)


def detection_counts(model: Path, data: list[Item]) -> dict[str, int]:
    """FP32 detections per image (score ≥ 0.25 after class-aware NMS, as ``detection_f1`` decodes them)."""
    from deploy_opt.evaluation.detection import _detections, _yolo_rows
    from dopt_common.ort import create_session

    session = create_session(str(model))
    counts = {}
    for inputs, _, ids in data:
        for row, sample_id in enumerate(ids):
            output = session.run(None, {"images": inputs["images"][row : row + 1]})[0]
            counts[sample_id] = len(_detections(_yolo_rows(output)[0])[0])
    return counts


def main() -> None:
    """CLI: ``--check`` prints the FP32 detections per evaluation image of both nudenet models."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="FP32 detections per image, both splits")
    if not parser.parse_args().check:
        return
    packages = sibling(__file__, "packages")
    for label, model in (
        ("3.4.2 320n", packages.prepare("yolo-nudenet")),
        ("3.0.8 best", packages.prepare_nudenet_308()),
    ):
        splits = (("calibration", lambda: calibration_data(1)), ("evaluation", lambda: evaluation_data(1)))
        print_counts(f"nudenet {label}", model, splits, "image")


def print_counts(name: str, model: Path, splits: Sequence[tuple[str, Callable[[], list[Item]]]], unit: str) -> None:
    """Print, per split (made when its turn comes), how many ``unit``s (image, page) have FP32 detections."""
    for split, make in splits:
        counts = detection_counts(model, make())
        found = sum(c > 0 for c in counts.values())
        print(
            f"{name} {split}: {found}/{len(counts)} {unit}s with detections, {sum(counts.values())} detections; "
            f"per {unit} {list(counts.values())}"
        )


if __name__ == "__main__":
    main()
