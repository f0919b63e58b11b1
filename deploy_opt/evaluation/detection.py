"""``detection_f1``: how well a detector's boxes agree with a reference's, per image, as an F1 in points.

The output is Ultralytics' YOLOv8/v11 layout, ``[batch, 4 + classes, anchors]`` (rows cx, cy, w, h and one score
per class), or its transpose ``[batch, anchors, 4 + classes]`` (told apart by which axis is shorter). Each image is
decoded as Ultralytics' ``predict`` does: a box's score is its best class score, boxes scoring at least
``SCORE`` are kept, class-aware NMS at IoU ``NMS_IOU``, at most ``MAX_DETECTIONS``. The reference is decoded the
same way when it has the prediction's shape (a build without labels compares against the FP32 model's output);
labels given as ``[batch, boxes, 6]`` rows of (x1, y1, x2, y2, class, valid) are used as they are.

Predicted and reference boxes are matched greedily, highest score first, each to the unmatched reference box of
the same class with the highest IoU ≥ ``MATCH_IOU``; F1 = 2·matched / (predicted + reference), × 100. An image
where neither has a box scores 100.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dopt_common.errors import InputError

SCORE, NMS_IOU, MATCH_IOU, MAX_DETECTIONS = 0.25, 0.7, 0.5, 300
Detections = tuple[np.ndarray, np.ndarray, np.ndarray]  # boxes x1y1x2y2, scores, classes
ImageScore = Callable[[Detections, Detections], float]


def detection_f1(prediction: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Per image, 100 × F1 of the decoded detections of ``prediction`` against those of ``reference``."""
    return _per_image(prediction, reference, _f1)


def detection_map50(prediction: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Per image, 100 × the mean over its reference classes of AP at IoU 0.5 (VOC all-point interpolation).

    A per-image score, averaged over images like every metric here (so that its drop has a paired interval); the
    pooled mAP of COCO and VOC ranks detections across the whole set instead. Detections are those above ``SCORE``,
    as for ``detection_f1``. An image with no reference box scores 100 without detections, else 0.
    """
    return _per_image(prediction, reference, _ap50)


def _per_image(prediction: np.ndarray, reference: np.ndarray, score: ImageScore) -> np.ndarray:
    predicted = _yolo_rows(prediction)
    if reference.shape == prediction.shape:
        expected = [_detections(r) for r in _yolo_rows(reference)]
    elif reference.ndim == 3 and reference.shape[0] == prediction.shape[0] and reference.shape[2] == 6:
        expected = [
            (r[r[:, 5] > 0, :4], np.ones(int((r[:, 5] > 0).sum())), r[r[:, 5] > 0, 4].astype(np.int64))
            for r in reference
        ]
    else:
        raise InputError(
            f"metric detection_f1: the reference has shape {reference.shape}; expected the model's own output shape "
            f"{prediction.shape} or labels [batch, boxes, 6] (x1, y1, x2, y2, class, valid)"
        )
    return np.array([score(_detections(p), e) for p, e in zip(predicted, expected, strict=True)])


def _yolo_rows(output: np.ndarray) -> np.ndarray:
    """``[batch, anchors, 4 + classes]`` from either layout; a shape that is neither is an InputError."""
    if output.ndim != 3 or min(output.shape[1:]) < 5:
        raise InputError(
            f"metric detection_f1: output shape {output.shape} is not a YOLO detection output [batch, 4 + classes, "
            "anchors]; fix: pick another metric, or put the detection output first among the model's outputs"
        )
    rows = output if output.shape[1] > output.shape[2] else output.transpose(0, 2, 1)
    return rows.astype(np.float32)


def _detections(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(boxes x1y1x2y2, scores, classes) after the score threshold and class-aware NMS, best first."""
    scores = rows[:, 4:].max(axis=1)
    keep = scores >= SCORE
    rows, scores = rows[keep], scores[keep]
    classes = rows[:, 4:].argmax(axis=1)
    centre, size = rows[:, :2], rows[:, 2:4]
    boxes = np.concatenate([centre - size / 2, centre + size / 2], axis=1)
    order = np.argsort(-scores, kind="stable")
    kept: list[int] = []
    suppressed = np.zeros(len(order), dtype=bool)
    for position, index in enumerate(order):
        if suppressed[position]:
            continue
        kept.append(int(index))
        if len(kept) == MAX_DETECTIONS:
            break
        rest = order[position + 1 :]
        overlap = _iou(boxes[index], boxes[rest]) > NMS_IOU
        suppressed[position + 1 :] |= overlap & (classes[rest] == classes[index])
    picked = np.asarray(kept, dtype=np.int64)
    return boxes[picked], scores[picked], classes[picked]


def _iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """IoU of one x1y1x2y2 box with each of ``others``."""
    low = np.maximum(box[:2], others[:, :2])
    high = np.minimum(box[2:], others[:, 2:])
    inter = np.clip(high - low, 0, None).prod(axis=1)
    area = np.clip(box[2:] - box[:2], 0, None).prod()
    areas = np.clip(others[:, 2:] - others[:, :2], 0, None).prod(axis=1)
    return inter / np.maximum(area + areas - inter, 1e-9)


def _f1(predicted: tuple[np.ndarray, ...], expected: tuple[np.ndarray, ...]) -> float:
    """100 × F1 of greedy same-class matches at IoU ≥ MATCH_IOU, predictions taken best first."""
    boxes, _, classes = predicted
    ref_boxes, _, ref_classes = expected
    if len(boxes) + len(ref_boxes) == 0:
        return 100.0
    free = np.ones(len(ref_boxes), dtype=bool)
    matched = 0
    for box, cls in zip(boxes, classes, strict=True):
        candidates = free & (ref_classes == cls)
        if not candidates.any():
            continue
        ious = np.where(candidates, _iou(box, ref_boxes), 0.0)
        best = int(ious.argmax())
        if ious[best] >= MATCH_IOU:
            free[best] = False
            matched += 1
    return 100.0 * 2 * matched / (len(boxes) + len(ref_boxes))


def _ap50(predicted: tuple[np.ndarray, ...], expected: tuple[np.ndarray, ...]) -> float:
    """100 × mean over the reference's classes of AP at IoU ``MATCH_IOU`` (VOC all-point interpolation)."""
    boxes, scores, classes = predicted
    ref_boxes, _, ref_classes = expected
    if len(ref_boxes) == 0:
        return 100.0 if len(boxes) == 0 else 0.0
    aps = []
    for cls in np.unique(ref_classes):
        mine = np.flatnonzero(classes == cls)
        mine = mine[np.argsort(-scores[mine], kind="stable")]
        targets = ref_boxes[ref_classes == cls]
        free = np.ones(len(targets), dtype=bool)
        hits = np.zeros(len(mine))
        for rank, index in enumerate(mine):
            ious = np.where(free, _iou(boxes[index], targets), 0.0)
            best = int(ious.argmax()) if len(targets) else 0
            if len(targets) and ious[best] >= MATCH_IOU:
                free[best], hits[rank] = False, 1.0
        true_positives = np.cumsum(hits)
        recall = np.concatenate([[0.0], true_positives / len(targets), [1.0]])
        precision = np.concatenate([[1.0], true_positives / np.arange(1, len(mine) + 1), [0.0]])
        precision = np.maximum.accumulate(precision[::-1])[::-1]  # the envelope: best precision at any higher recall
        aps.append(float(np.sum((recall[1:] - recall[:-1]) * precision[1:])))
    return 100.0 * float(np.mean(aps))
