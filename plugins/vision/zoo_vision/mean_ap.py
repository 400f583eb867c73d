"""Mean average precision for object detection, as PASCAL VOC (2010 onwards) defines it.

Per class: every detection of that class over the whole split, highest score first, is
matched greedily to the still unmatched ground-truth box of the same image and class
with the largest IoU (COCO's matching rule); it is a true positive when that IoU is at
least the threshold, a false positive otherwise -- so a second detection of an
already-matched object (a duplicate) is a false positive. AP is the area under the precision-recall curve with precision
made monotonically decreasing (all-point interpolation, Everingham et al., "The PASCAL
Visual Object Classes Challenge: A Retrospective", IJCV 2015). mAP averages AP over the
classes that have ground truth in the split.
"""

from __future__ import annotations

import numpy as np


def iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one [x1, y1, x2, y2] box with each row of `boxes`."""
    iw = np.clip(np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0]), 0, None)
    ih = np.clip(np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1]), 0, None)
    inter = iw * ih
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / np.maximum(area + areas - inter, 1e-12)


def average_precision(recall: np.ndarray, precision: np.ndarray) -> float:
    """Area under the PR curve after making precision non-increasing in recall."""
    r = np.concatenate([[0.0], recall, [1.0]])
    p = np.concatenate([[0.0], precision, [0.0]])
    p = np.maximum.accumulate(p[::-1])[::-1]
    steps = np.nonzero(r[1:] != r[:-1])[0]
    return float(np.sum((r[steps + 1] - r[steps]) * p[steps + 1]))


def mean_average_precision(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, targets: np.ndarray,
                           iou_threshold: float = 0.5) -> tuple[float, dict[int, float]]:
    """mAP over a split, and AP per class.

    boxes (n, k, 4), scores (n, k), classes (n, k): k detections per image (rows with a
    score <= 0 are padding and ignored). targets (n, m, 5): [class, x1, y1, x2, y2] rows,
    class -1 for padding.
    """
    boxes, scores, classes = np.asarray(boxes, np.float64), np.asarray(scores, np.float64), np.asarray(classes)
    targets = np.asarray(targets, np.float64)
    truth_classes = sorted({int(c) for c in targets[..., 0].ravel() if c >= 0})
    per_class: dict[int, float] = {}
    for c in truth_classes:
        truth = {i: targets[i, targets[i, :, 0] == c, 1:] for i in range(len(targets))}
        n_truth = sum(len(t) for t in truth.values())
        matched = {i: np.zeros(len(t), dtype=bool) for i, t in truth.items()}
        image, slot = np.nonzero((classes == c) & (scores > 0))
        order = np.argsort(-scores[image, slot], kind="stable")
        hits = np.zeros(len(order), dtype=bool)
        for rank, j in enumerate(order):
            i, box = image[j], boxes[image[j], slot[j]]
            if len(truth[i]) == 0:
                continue
            overlaps = np.where(matched[i], -1.0, iou(box, truth[i]))
            best = int(np.argmax(overlaps))
            if overlaps[best] >= iou_threshold:
                matched[i][best] = True
                hits[rank] = True
        tp = np.cumsum(hits)
        recall = tp / n_truth
        precision = tp / np.arange(1, len(hits) + 1)
        per_class[c] = average_precision(recall, precision)
    value = float(np.mean(list(per_class.values()))) if per_class else 0.0
    return value, per_class
