"""Region selection (selection.py): per-class NMS over every class at once, exactly the loop.

Hand-built cases with known selections; random images against the per-class loop it
replaced (``_per_class_select_regions``: one torchvision ``nms`` per class, the fill-up
over every entry); region stores extracted with each, identical.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torchvision.ops import nms

from pipeline.features.detectors import checkpoints
from pipeline.features.detectors import selection as selection_module
from pipeline.features.detectors.boxes import inclusive
from pipeline.features.detectors.rules import caffe as caffe_rules
from pipeline.features.detectors.selection import (_per_class_select_regions, fill_up_floor,
                                                   select_regions)
from pipeline.features.extract.region_extraction import RegionSettings, extract_regions
from pipeline.features.stores import open_store
from tests.test_bottom_up_checkpoints import CONFIG, random_detector, save_pth

RULE = {"nms_thresh": 0.3, "conf_thresh": 0.2, "min_boxes": 10, "max_boxes": 100}


def selected(boxes, scores, **rule) -> tuple[list[int], list[float]]:
    """select_regions' choice, checked against the per-class loop's: indices, scores."""
    rule = {**RULE, **rule}
    boxes, scores = torch.tensor(boxes, dtype=torch.float32), torch.tensor(scores)
    keep, kept = select_regions(boxes, scores, **rule)
    want_keep, want_kept = _per_class_select_regions(boxes, scores, **rule)
    assert torch.equal(keep, want_keep) and torch.equal(kept, want_kept)
    return keep.tolist(), kept.tolist()


# --------------------------------------------------------------------------- by hand
A, B = [0, 0, 100, 100], [5, 5, 105, 105]  # IoU 0.82
C, D = [300, 300, 400, 400], [305, 305, 405, 405]
E = [600, 0, 700, 100]


def test_a_box_is_suppressed_by_a_better_one_of_its_class_only():
    scores = [[0.7, 0.1, 0.0],   # A wins class 0
              [0.6, 0.3, 0.0],   # B: suppressed for class 0, first of class 1
              [0.0, 0.0, 0.5]]   # C, elsewhere
    assert selected([A, B, C], scores, min_boxes=0) == ([0, 2, 1], pytest.approx([0.7, 0.5, 0.3]))
    scores[1][1] = 0.1  # B's class 1 under conf_thresh: B survives no class that takes part
    assert selected([A, B, C], scores, min_boxes=0) == ([0, 2], pytest.approx([0.7, 0.5]))
    scores[1] = [0.0, 0.0, 0.6]  # B's best in another class than A's: kept
    assert selected([A, B, C], scores, min_boxes=0)[0] == [0, 1, 2]


FILL = [[0.15, 0.02],   # A: class 0's best
        [0.12, 0.10],   # B: suppressed for class 0 by A, first of class 1 in its place
        [0.05, 0.11],   # C: class 1's best
        [0.04, 0.09],   # D: suppressed for both classes by C
        [0.01, 0.03]]   # E: alone


def test_the_fill_up_takes_the_best_survived_scores_when_too_few_pass():
    boxes = [A, B, C, D, E]
    assert selected(boxes, FILL, min_boxes=4) == ([0, 2, 1, 4],
                                                  pytest.approx([0.15, 0.11, 0.10, 0.03]))
    assert selected(boxes, FILL, min_boxes=5) == ([0, 2, 1, 4, 3],
                                                  pytest.approx([0.15, 0.11, 0.10, 0.03, 0.0]))
    assert selected(boxes, FILL, min_boxes=9)[0] == [0, 2, 1, 4, 3]  # never more than exist
    assert selected(boxes, FILL, min_boxes=0) == ([], [])  # none passes, no fill-up


def test_the_fill_up_ranks_only_the_entries_that_can_reach_its_best():
    """Two classes' best boxes (A, C) reach 0.15 and 0.11: two boxes of at least 0.11 exist,
    so a fill-up to 2 needs no entry under 0.11; to 3 it needs every entry (floor 0)."""
    scores = torch.tensor(FILL)
    assert fill_up_floor(scores, 2).item() == pytest.approx(0.11)
    assert fill_up_floor(scores, 3).item() == 0.0
    assert selected([A, B, C, D, E], FILL, min_boxes=2) == ([0, 2], pytest.approx([0.15, 0.11]))
    one_winner = [[0.10, 0.10], [0.09, 0.05], [0.02, 0.03]]  # A is both classes' best
    assert fill_up_floor(torch.tensor(one_winner), 2).item() == 0.0
    assert selected([A, B, C], one_winner, min_boxes=3) == ([0, 2, 1],
                                                            pytest.approx([0.10, 0.03, 0.0]))


def test_equal_scores_go_to_the_lower_box_index():
    """Boxes 0 and 1 are one box; 2 overlaps it (IoU 0.67): all three score 0.5 for class 0."""
    boxes = [[0, 0, 50, 50], [0, 0, 50, 50], [10, 0, 60, 50]]
    scores = [[0.5, 0.0], [0.5, 0.3], [0.5, 0.25]]
    assert selected(boxes, scores, min_boxes=0) == ([0, 1], pytest.approx([0.5, 0.3]))
    # the other way round: box 0 (the old 2) now takes class 0 and suppresses the rest
    assert selected(boxes[::-1], scores[::-1], min_boxes=0) == ([0, 1],
                                                                pytest.approx([0.5, 0.3]))
    # fill-up ties at 0 go to the higher raw class score, then to the lower index
    assert selected(boxes, [[0.1, 0.0], [0.1, 0.0], [0.1, 0.0]], min_boxes=3)[0] == [0, 1, 2]


def test_an_iou_of_exactly_the_threshold_in_float32_suppresses():
    """IoU 3/10 is 0.30000001 in float32, above 0.3 as torchvision's kernel compares (in
    float64); the IoU computed in float64 (0.3 exactly) would keep both boxes."""
    boxes, scores = [[0, 0, 10, 1], [0, 0, 3, 1]], [[0.9], [0.8]]
    assert selected(boxes, scores, min_boxes=0) == ([0], pytest.approx([0.9]))
    as_double = nms(torch.tensor(boxes).double(), torch.tensor([0.9, 0.8]).double(), 0.3)
    assert as_double.tolist() == [0, 1]


def test_pixel_coordinates_keep_their_precision_for_the_last_of_1600_classes():
    """Two boxes at IoU 0.2991 both survive class 1599. Offsetting them by 1599 * 1000 in
    float32 (a class range of its own for each) rounds them to 1/8 pixel: IoU 0.30000001."""
    pair = torch.tensor([[508.9, 304.52, 564.47, 623.2], [540.93, 304.52, 587.59, 623.2]])
    boxes = torch.cat([pair, torch.tensor([[900.0, 900.0, 999.0, 999.0]])])
    scores = torch.zeros(3, 1600)
    scores[0, 1599], scores[1, 1599], scores[2, 0] = 0.9, 0.8, 0.5
    assert selected(boxes.tolist(), scores.tolist(), min_boxes=0) == \
        ([0, 1, 2], pytest.approx([0.9, 0.8, 0.5]))
    assert nms(pair + 1599 * 1000.0, torch.tensor([0.9, 0.8]), 0.3).tolist() == [0]


def test_no_box_no_class_and_no_survivor():
    keep, kept = select_regions(torch.zeros(0, 4), torch.zeros(0, 5), **RULE)
    assert keep.shape == kept.shape == (0,)
    assert selected([A, B], [[0.1, 0.1], [0.1, 0.05]], min_boxes=0) == ([], [])


# --------------------------------------------------------------------------- random images
def random_image(gen: torch.Generator, case: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to 300 boxes in a 1000-px image, over 50 to 1,600 classes (softmax scores with the
    background dropped, flat or peaked); some cases on whole pixels, some with tied scores."""
    n = 300 if case % 4 else int(torch.randint(1, 300, (1,), generator=gen))
    k = int(50 * 32 ** torch.rand(1, generator=gen))  # 50..1600, log-uniform
    xy = torch.rand(n, 2, generator=gen) * 900
    wh = torch.rand(n, 2, generator=gen) * 300 + 4
    if case % 3 == 0:
        xy, wh = xy.floor(), wh.floor()
    boxes = torch.cat([xy, (xy + wh).clamp(max=999)], dim=1)
    logits = torch.randn(n, k + 1, generator=gen) * (0.5, 3.0, 8.0, 15.0)[case % 4]
    if case % 5 == 0:
        logits = (logits * 2).round() / 2  # many equal scores
    return boxes, logits.softmax(dim=1)[:, 1:]


RULES = [RULE, {**RULE, "min_boxes": 36, "max_boxes": 36}, {**RULE, "conf_thresh": 0.0},
         {**RULE, "conf_thresh": 0.5, "min_boxes": 0, "max_boxes": 20}]


@pytest.mark.parametrize("convention", ["caffe", "torchvision"])
def test_random_images_select_what_the_per_class_loop_selects(convention):
    """50 images per box convention: the caffe rule's inclusive-pixel boxes, and the plain ones
    of the torchvision region extractors (c4, c5, fpn)."""
    gen = torch.Generator().manual_seed(0 if convention == "caffe" else 1)
    filled = 0
    for case in range(50):
        boxes, scores = random_image(gen, case)
        if convention == "caffe":
            boxes = inclusive(boxes)
        rule = RULES[case % len(RULES)]
        keep, kept = select_regions(boxes, scores, **rule)
        want_keep, want_kept = _per_class_select_regions(boxes, scores, **rule)
        assert torch.equal(keep, want_keep), (case, rule)
        assert torch.equal(kept, want_kept), (case, rule)
        filled += int((kept < rule["conf_thresh"]).any())
    assert 10 <= filled <= 40  # both paths taken: the fill-up and the threshold alone


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
def test_on_cuda_the_selection_is_the_cpu_loop_s():
    """The same float32 IoU, float64 comparison and stable ranking on the GPU: the CPU's
    per-class loop's regions (torchvision's CUDA ``nms`` compares in float32, so a loop of
    it could differ where an IoU rounds to the threshold)."""
    gen = torch.Generator().manual_seed(2)
    for case in range(20):
        boxes, scores = random_image(gen, case)
        boxes = inclusive(boxes)
        rule = RULES[case % len(RULES)]
        keep, kept = select_regions(boxes.cuda(), scores.cuda(), **rule)
        want_keep, want_kept = _per_class_select_regions(boxes, scores, **rule)
        assert torch.equal(keep.cpu(), want_keep) and torch.equal(kept.cpu(), want_kept), case


# --------------------------------------------------------------------------- stores
SHAPES = dict(n_train=3, n_val=1, n_test=1, seed=3)  # conftest's shapes


def vg_sized_detector(flat: bool):
    """The tests' random detector with Visual Genome's 1,601 classes; ``flat``: its class
    logits scaled down, so that no region passes conf_thresh and every one is a fill-up's
    (as drawn, some pass)."""
    model = random_detector(config=dataclasses.replace(CONFIG, num_classes=1601))
    if flat:
        with torch.no_grad():
            model.predictor.cls_score.weight.mul_(0.01)
    return model


def extract(shapes, settings, root):
    image_root, dataset = shapes
    result = extract_regions(dataset, image_root, settings, root=root, batch_size=3, workers=0,
                             progress=False)
    return result, open_store(result.store)


@pytest.mark.parametrize("detector", ["bottom-up", "bottom-up flat", "c5"])
def test_extracted_stores_are_those_of_the_per_class_loop(detector, shapes, tmp_path,
                                                          monkeypatch):
    """Same store name, same regions: 5 images, 64 px shown at 160 (120-130 proposals)."""
    if detector == "c5":
        settings = RegionSettings(arch="c5", backbone="resnet18", weights="random",
                                  min_size=160, max_size=240, num_classes=1601)
    else:
        weights = save_pth(checkpoints.in_naming(vg_sized_detector("flat" in detector),
                                                 "bua-caffe"), tmp_path / "bua.pth")
        settings = RegionSettings(arch="bottom-up", weights=str(weights), min_size=160,
                                  max_size=240, top_attributes=2)
    result, store = extract(shapes, settings, tmp_path / "batched")
    calls = []

    def loop(*args, **kw):
        calls.append(1)
        return _per_class_select_regions(*args, **kw)

    for module in (selection_module, caffe_rules):
        monkeypatch.setattr(module, "select_regions", loop)
    loop_result, loop_store = extract(shapes, settings, tmp_path / "loop")
    assert len(calls) == 5  # one selection per image, by the loop
    assert result.store.name == loop_result.store.name and not loop_result.reused
    assert sorted(store.ids()) == sorted(loop_store.ids()) and len(store.ids()) == 5
    passed = []
    for image_id in store.ids():
        got, want = store.get(image_id), loop_store.get(image_id)
        for name in store.meta["fields"]:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        assert got.num >= 10  # min_boxes
        passed.append(int((got["scores"] >= 0.2).sum()))
    if detector == "bottom-up flat":
        assert not any(passed)  # every region a fill-up's
    elif detector == "bottom-up":
        assert any(passed)
