"""How good a detector is on a split: COCO mAP of its detections, attribute accuracy.

Detections are Faster R-CNN's test output (py-faster-rcnn ``test_net``): each
proposal's box regressed per class (deltas times the stds folded into the
weights), scores of at least 0.05, per-class NMS at 0.3, the 100 best per
image. pycocotools' COCOeval scores them against the split's boxes: mAP at IoU
0.5 and averaged over 0.5:0.95. Attribute accuracy: of the ground-truth boxes
that a detection of the right class finds (IoU >= 0.5, the best-scoring such
detection), the fraction whose top attribute is the box's own.
"""

from __future__ import annotations

import contextlib
import io

import torch
import torch.nn.functional as F
from torch import Tensor

from pipeline.features.detectors import boxes as caffe_boxes
from pipeline.features.detectors.detector import BottomUpDetector
from pipeline.features.detectors.targets import caffe_iou


@torch.inference_mode()
def detect(detector: BottomUpDetector, image: Tensor, *, score_thresh: float = 0.05,
           nms: float = 0.3, max_detections: int = 100) -> dict[str, Tensor]:
    """One image's detections: boxes [D, 4] (original pixels), scores, labels, attributes."""
    [(x, scale)] = detector.prepare([image])
    [fmap] = detector.res4([x])
    objectness, deltas = detector.rpn(fmap[None])
    proposals, _ = detector.proposals(objectness[0], deltas[0], tuple(x.shape[-2:]), scale)
    rois = torch.cat([proposals.new_zeros(len(proposals), 1), proposals], dim=1)
    features = detector.box_head(fmap[None], rois)
    class_logits, box_deltas = detector.predictor(features)
    probs = F.softmax(class_logits.float(), dim=1)
    k = probs.shape[1]
    boxes = caffe_boxes.decode(box_deltas.float().reshape(-1, 4),
                               proposals.repeat_interleave(k, dim=0))
    boxes = caffe_boxes.clip(boxes, *x.shape[-2:]).reshape(-1, k, 4)[:, 1:]  # [P, K-1, 4]
    scores = probs[:, 1:]
    rows, cols = torch.nonzero(scores >= score_thresh, as_tuple=True)
    kept = caffe_boxes.caffe_batched_nms(boxes[rows, cols], scores[rows, cols], cols, nms)
    kept = kept[:max_detections]
    rows, cols = rows[kept], cols[kept]
    out = {"boxes": boxes[rows, cols] / scale, "scores": scores[rows, cols], "labels": cols + 1}
    if detector.attributes is not None:
        predicted = probs[rows].argmax(dim=1)
        attribute_logits = detector.attributes(features[rows], predicted)
        out["attributes"] = attribute_logits[:, 1:].argmax(dim=1) + 1 if len(rows) else cols
    return out


def coco_map(truth: list[dict], found: list[dict], num_classes: int) -> dict[str, float]:
    """COCOeval bbox mAP@[.5:.95] and mAP@.5; truth/found: per image boxes and labels (+scores)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    def xywh(box):
        x1, y1, x2, y2 = (float(v) for v in box)
        return [x1, y1, x2 - x1, y2 - y1]

    boxes = [(i, xywh(box), int(label)) for i, t in enumerate(truth)
             for box, label in zip(t["boxes"], t["labels"])]
    annotations = [{"id": n + 1, "image_id": i, "category_id": label, "iscrowd": 0,
                    "bbox": bbox, "area": bbox[2] * bbox[3]}
                   for n, (i, bbox, label) in enumerate(boxes)]
    gt = COCO()
    gt.dataset = {"images": [{"id": i} for i in range(len(truth))], "annotations": annotations,
                  "categories": [{"id": c} for c in range(1, num_classes)]}
    detections = [{"image_id": i, "category_id": int(label), "bbox": xywh(box),
                   "score": float(score)}
                  for i, f in enumerate(found)
                  for box, label, score in zip(f["boxes"], f["labels"], f["scores"])]
    if not detections or not annotations:
        return {"map": 0.0, "map50": 0.0}
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
        evaluation = COCOeval(gt, gt.loadRes(detections), "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return {"map": float(evaluation.stats[0]), "map50": float(evaluation.stats[1])}


def attribute_accuracy(truth: list[dict], found: list[dict]) -> float | None:
    """Of the true boxes a right-class detection finds, how many get their own attribute."""
    right = total = 0
    for t, f in zip(truth, found):
        if "attributes" not in f or not len(t["boxes"]):
            continue
        for box, label, attribute in zip(t["boxes"], t["labels"], t["attributes"]):
            same = (f["labels"] == label).nonzero().squeeze(1)
            if not len(same):
                continue
            iou = caffe_iou(box[None].float(), f["boxes"][same].float())[0]
            hits = same[iou >= 0.5]
            if not len(hits):
                continue
            best = hits[f["scores"][hits].argmax()]
            total += 1
            right += int(f["attributes"][best] == attribute)
    return right / total if total else None
