"""The bottom-up detector's test-time rules: Caffe's (the default) and MMF's (``--reference mmf``).

What each rule says is checked on hand-made numbers here; that capstack's ``mmf`` rules
equal MMF's own frcnn code on a real-size checkpoint is ``benchmarks/parity.py --peer MMF``.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from pipeline.features.detectors.detector import BottomUpDetector, DetectorConfig, Detections
from pipeline.features.detectors.rules import RULES
from pipeline.features.detectors.rules.base import Selection
from pipeline.features.detectors.rules.mmf import mmf_input, resized_sides
from tests.test_extractors import DEMO_DETECTOR, inputs, plan_only  # noqa: F401 (fixtures)


def small_detector(rules: str, **anchors) -> BottomUpDetector:
    torch.manual_seed(0)
    return BottomUpDetector(DetectorConfig.from_dict(DEMO_DETECTOR), rules=rules, **anchors).eval()


def test_the_registry_names_both_references():
    assert list(RULES) == ["caffe", "mmf"]


def test_mmf_anchors_are_the_offset_0_grid_of_unrounded_sizes():
    """detectron2's generator: size s at ratio r is sqrt(s^2/r) wide, r times that high,
    centred on the cell's corner (x * 16, y * 16); listed ratio-major like the RPN."""
    detector = small_detector("mmf")
    settings = detector.config.proposals  # ratios 0.5, 1, 2; scales 2, 4, 8; stride 16
    anchors = detector.proposals.anchors(3, 5).reshape(3, 5, 9, 4)
    for y, x in [(0, 0), (2, 4), (1, 3)]:
        k = 0
        for ratio in settings.ratios:
            for scale in settings.scales:
                w = math.sqrt((16 * scale) ** 2 / ratio)
                h = ratio * w
                expected = [16 * x - w / 2, 16 * y - h / 2, 16 * x + w / 2, 16 * y + h / 2]
                assert anchors[y, x, k].tolist() == pytest.approx(expected, abs=1e-4)
                k += 1
    caffe = small_detector("caffe").proposals.anchors(3, 5).reshape(3, 5, 9, 4)
    centres = (caffe[..., :2] + caffe[..., 2:]) / 2
    assert torch.allclose(centres[0, 0], torch.full((9, 2), 7.5))  # Caffe's: 7.5, not 0


def test_mmf_takes_the_anchors_a_checkpoint_carries():
    cell = torch.arange(36, dtype=torch.float32).reshape(9, 4)
    detector = small_detector("mmf", file_anchors=cell)
    assert torch.equal(detector.proposals.cell, cell)
    assert not torch.equal(small_detector("caffe", file_anchors=cell).proposals.cell, cell)


@pytest.mark.parametrize("height, width, sides", [
    (375, 500, (600, 800)), (480, 360, (800, 600)),
    (100, 1000, (100, 1000)),  # the longer side capped at 1000: 600 x 6000 shrunk
    (333, 333, (600, 600)),
    (401, 1001, (401, 1000)),  # 600 x 1497.8 shrunk by 1000 / 1497.8: 400.6 -> 401
])
def test_mmf_resizes_the_shorter_side_with_each_side_rounded_half_up(height, width, sides):
    assert resized_sides(height, width, 600, 1000) == sides


def test_mmf_input_is_the_resized_8_bit_values_in_bgr_minus_the_means():
    values = torch.randint(0, 256, (3, 30, 40)).float()
    x, back = mmf_input(values / 255.0, 60, 1000, (1.0, 2.0, 3.0))
    expected = torch.nn.functional.interpolate(values[None], (60, 80), mode="bilinear",
                                               align_corners=False)[0].flip(0)
    assert torch.allclose(x, expected - torch.tensor([1.0, 2.0, 3.0]).view(3, 1, 1))
    assert back.tolist() == [0.5, 0.5] and back.dtype == torch.float32


def found(proposals, class_probs, box_deltas, size=(100, 100)) -> Detections:
    n = len(proposals)
    attributes = torch.tensor([[0.5, 0.3, 0.2]]).repeat(n, 1)
    return Detections(proposals.clone(), torch.arange(n, dtype=torch.float32)[:, None],
                      class_probs, attributes, proposals=proposals, box_deltas=box_deltas,
                      input_size=size, scale=torch.tensor([2.0, 2.0]))


def test_mmf_keeps_the_regressed_box_of_the_best_class_after_one_class_agnostic_nms():
    """Two overlapping proposals of different classes: Caffe's per-class NMS keeps both,
    MMF's one NMS over all classes keeps the better. Each box is regressed by its best
    class's deltas (detectron2's coding: widths x2 - x1), clipped to [0, W]."""
    proposals = torch.tensor([[10.0, 10.0, 50.0, 50.0], [12.0, 12.0, 52.0, 52.0],
                              [60.0, 60.0, 90.0, 90.0]])
    probs = torch.tensor([[0.1, 0.7, 0.2], [0.1, 0.2, 0.7 - 1e-3], [0.75, 0.05, 0.2]])
    deltas = torch.zeros(3, 3, 4)
    deltas[0, 1] = torch.tensor([0.25, 0.0, math.log(2.0), 0.0])  # class 1 of proposal 0
    deltas[2, 2] = torch.tensor([0.0, 0.0, math.log(2.0), 0.0])  # class 2 of proposal 2
    selection = Selection(min_boxes=1, max_boxes=10, conf_thresh=0.3, nms_thresh=0.3,
                          top_attributes=1)
    region = RULES.get("mmf").regions(found(proposals, probs, deltas.reshape(3, 12)), selection)
    # regressed, 1 overlaps 0 (IoU 0.46 > 0.3): gone, though of another class
    assert region["keep"].tolist() == [0, 2]
    # proposal 0: centre 30 + 0.25 * 40 = 40, width 80 -> [0, 10, 80, 50]; original pixels x2
    assert region["boxes"][0].tolist() == pytest.approx([0.0, 20.0, 160.0, 100.0])
    # proposal 2: centre 75, width 60 -> [45, 60, 105, 90], clipped to W = 100 (not 99)
    assert region["boxes"][1].tolist() == pytest.approx([90.0, 120.0, 200.0, 180.0])
    assert region["classes"].tolist() == [1, 2]
    assert region["scores"].tolist() == pytest.approx([0.7, 0.2])  # conf_thresh unused
    assert region["attributes"][:, 0].tolist() == [1, 1]
    assert region["attribute_scores"][:, 0].tolist() == pytest.approx([0.6, 0.6])  # 0.3 / 0.5
    caffe = RULES.get("caffe").regions(found(proposals, probs, deltas.reshape(3, 12)),
                                       selection)
    assert caffe["keep"].tolist() == [0, 1]  # per class both overlaps survive; 2 under 0.3


def test_mmf_proposals_take_the_best_logits_first_then_clip_and_nms():
    detector = small_detector("mmf")
    a = detector.proposals.anchors_per_cell
    objectness = torch.randn(a, 2, 2)
    deltas = torch.zeros(4 * a, 2, 2)
    boxes = detector.rules.proposals(detector.proposals, objectness, deltas, (32, 32), None)
    anchors = detector.proposals.anchors(2, 2)
    best = objectness.permute(1, 2, 0).reshape(-1).argmax()
    assert boxes[0].tolist() == pytest.approx(anchors[best].clamp(0, 32).tolist())
    assert (boxes[:, 2:] <= 32).all() and (boxes >= 0).all()


def test_the_reference_names_the_store_only_when_it_is_not_caffes(capstack, inputs, plan_only,
                                                                   tmp_path):
    """--reference mmf is a setting of the store (another name); the default adds nothing,
    so the stores made before the choice keep theirs (test_extractors pins those)."""
    base = ["extract-regions", inputs["dataset"], inputs["root"], "--arch", "bottom-up",
            "--weights", inputs["extract_regions"], "--min-size", 64, "--max-size", 64,
            "--features-root", tmp_path, "--workers", 0]
    capstack(*base)
    capstack(*base, "--reference", "mmf")
    caffe, mmf = (json.loads(json.dumps(m["producer"]["settings"])) for m in plan_only)
    assert "reference" not in caffe and mmf == {**caffe, "reference": "mmf"}
    assert plan_only[0]["fingerprint"] != plan_only[1]["fingerprint"]
    result = capstack(*base, "--reference", "detectron", expect_ok=False)
    assert result.exit_code == 2 and "'caffe', 'mmf'" in result.output
