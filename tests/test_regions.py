"""Region features from torchvision's Faster R-CNN: small random-weight detectors, real forwards."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torchvision.models import resnet18, resnet50
from torchvision.ops import roi_align

from pipeline.core.errors import CapstackError
from pipeline.features.detectors.selection import select_regions
from pipeline.features.extract.kinds.regions import (RegionFeatureExtractor, build_detector,
                                               load_detector_weights)

MIN_SIZE, MAX_SIZE = 128, 160
NUM_CLASSES = 91


@pytest.fixture(scope="module")
def fpn():
    torch.manual_seed(0)
    return build_detector("fpn", min_size=MIN_SIZE, max_size=MAX_SIZE)


@pytest.fixture(scope="module")
def c5():
    torch.manual_seed(0)
    return build_detector("c5", backbone="resnet18", min_size=MIN_SIZE, max_size=MAX_SIZE)


@pytest.fixture(scope="module")
def c4():
    torch.manual_seed(0)
    return build_detector("c4", backbone="resnet18", min_size=MIN_SIZE, max_size=MAX_SIZE)


@pytest.fixture(scope="module")
def detectors(fpn, c5, c4):
    return {"fpn": (fpn, 1024), "c5": (c5, 512), "c4": (c4, 512)}


def random_images():
    gen = torch.Generator().manual_seed(1)
    return [torch.rand(3, 100, 150, generator=gen), torch.rand(3, 180, 120, generator=gen)]


def check_region_dict(out: dict, n: int, dim: int, height: int, width: int):
    assert out["features"].shape == (n, dim) and out["features"].dtype == torch.float32
    assert out["boxes"].shape == (n, 4) and out["boxes"].dtype == torch.float32
    assert out["scores"].shape == (n,) and out["scores"].dtype == torch.float32
    assert out["classes"].shape == (n,) and out["classes"].dtype == torch.int64
    assert torch.isfinite(out["features"]).all()
    if n:
        assert ((out["classes"] >= 1) & (out["classes"] < NUM_CLASSES)).all()


# --------------------------------------------------------------------------- detect mode

@pytest.mark.parametrize("arch", ["fpn", "c5", "c4"])
def test_detect_mode_shapes_and_bounds(detectors, arch):
    detector, dim = detectors[arch]
    extractor = RegionFeatureExtractor(detector, min_boxes=10, max_boxes=30, conf_thresh=0.01)
    assert extractor.feature_dim == dim
    images = random_images()
    outs = extractor(images)
    assert len(outs) == 2
    for out, image in zip(outs, images):
        h, w = image.shape[-2:]
        n = len(out["features"])
        assert 10 <= n <= 30
        check_region_dict(out, n, dim, h, w)
        b = out["boxes"]
        assert (b[:, 0] >= 0).all() and (b[:, 1] >= 0).all()
        assert (b[:, 2] <= w).all() and (b[:, 3] <= h).all()
        assert (b[:, 0] <= b[:, 2]).all() and (b[:, 1] <= b[:, 3]).all()
        assert torch.equal(out["scores"], out["scores"].sort(descending=True).values)
        above = out["scores"] >= 0.01
        assert above.all() or n == 10  # below threshold only to fill up to min_boxes


@pytest.mark.parametrize("arch", ["fpn", "c5", "c4"])
def test_detect_mode_fixed_36(detectors, arch):
    detector, dim = detectors[arch]
    extractor = RegionFeatureExtractor(detector, min_boxes=36, max_boxes=36, conf_thresh=0.2)
    for out, image in zip(extractor(random_images()), random_images()):
        check_region_dict(out, 36, dim, *image.shape[-2:])


def test_detect_features_are_those_of_the_returned_proposals(c5):
    """Pooling the returned (original-pixel) boxes again gives the same features."""
    extractor = RegionFeatureExtractor(c5, min_boxes=5, max_boxes=12, conf_thresh=0.0)
    images = random_images()
    detected = extractor(images)
    again = extractor(images, [d["boxes"] for d in detected])
    for d, g in zip(detected, again):
        assert torch.allclose(d["features"], g["features"], atol=1e-4, rtol=1e-4)
        assert torch.equal(d["classes"], g["classes"])


def test_fewer_proposals_than_min_boxes(monkeypatch):
    torch.manual_seed(0)
    detector = build_detector("c5", backbone="resnet18", min_size=MIN_SIZE, max_size=MAX_SIZE)
    monkeypatch.setitem(detector.rpn._post_nms_top_n, "testing", 4)
    extractor = RegionFeatureExtractor(detector, min_boxes=10, max_boxes=20)
    for out, image in zip(extractor(random_images()), random_images()):
        n = len(out["features"])
        assert 0 <= n <= 4
        check_region_dict(out, n, 512, *image.shape[-2:])


def test_select_regions_bottom_up_rule():
    # boxes 0 and 1 overlap almost fully; box 2 lies elsewhere; box 3 overlaps box 2
    boxes = torch.tensor([[0, 0, 10, 10], [0, 0, 10, 11], [50, 50, 60, 60], [50, 50, 60, 61.]])
    scores = torch.tensor([[0.9, 0.05],   # wins class 1
                           [0.8, 0.15],   # suppressed for class 1, survives class 2 at 0.15
                           [0.1, 0.3],    # wins class 2 there
                           [0.05, 0.25]])  # suppressed for both classes: score 0
    keep, kept = select_regions(boxes, scores, nms_thresh=0.3, conf_thresh=0.2,
                                min_boxes=0, max_boxes=10)
    assert keep.tolist() == [0, 2]
    assert torch.allclose(kept, torch.tensor([0.9, 0.3]))
    # fewer than min_boxes above the threshold: fill by score (ties at 0 by raw class score)
    keep, kept = select_regions(boxes, scores, nms_thresh=0.3, conf_thresh=0.2,
                                min_boxes=4, max_boxes=10)
    assert keep.tolist() == [0, 2, 1, 3]
    assert torch.allclose(kept, torch.tensor([0.9, 0.3, 0.15, 0.0]))
    keep, _ = select_regions(boxes, scores, nms_thresh=0.3, conf_thresh=0.0,
                             min_boxes=0, max_boxes=3)
    assert keep.tolist() == [0, 2, 1]
    keep, _ = select_regions(boxes, scores, nms_thresh=0.3, conf_thresh=0.0,
                             min_boxes=10, max_boxes=10)
    assert keep.tolist() == [0, 2, 1, 3]  # never more than exist
    keep, kept = select_regions(boxes[:0], scores[:0], nms_thresh=0.3, conf_thresh=0.2,
                                min_boxes=10, max_boxes=10)
    assert keep.shape == (0,) and kept.shape == (0,)


# --------------------------------------------------------------------------- given mode

@pytest.mark.parametrize("arch", ["fpn", "c5", "c4"])
def test_given_mode_shapes(detectors, arch):
    detector, dim = detectors[arch]
    extractor = RegionFeatureExtractor(detector)
    given = [torch.tensor([[0, 0, 50, 40], [10, 20, 140, 90], [30, 30, 31, 31.]]),
             torch.zeros(0, 4)]
    outs = extractor(random_images(), given)
    check_region_dict(outs[0], 3, dim, 100, 150)
    check_region_dict(outs[1], 0, dim, 180, 120)
    assert torch.equal(outs[0]["boxes"], given[0])
    assert ((outs[0]["scores"] > 0) & (outs[0]["scores"] <= 1)).all()


def test_given_mode_all_images_empty(c5):
    outs = RegionFeatureExtractor(c5)(random_images(), [torch.zeros(0, 4), []])
    for out, image in zip(outs, random_images()):
        check_region_dict(out, 0, 512, *image.shape[-2:])


def white_square_image():
    """120 x 90 (H x W) black image with a white square at x 20..60, y 30..70."""
    image = torch.zeros(3, 120, 90)
    image[:, 30:70, 20:60] = 1.0
    return image


@pytest.mark.parametrize("arch", ["c5", "c4"])
def test_given_boxes_pool_where_they_point(detectors, arch):
    extractor = RegionFeatureExtractor(detectors[arch][0])
    white = [20, 30, 60, 70.]
    black = [60, 80, 90, 120.]
    image = white_square_image()  # resized by the transform: 120 x 90 -> 160 x 120
    boxes = torch.tensor([white, black, white])
    [out] = extractor([image], [boxes])
    f = out["features"]
    assert torch.equal(out["boxes"], boxes)
    assert not torch.allclose(f[0], f[1], atol=1e-3)
    assert torch.equal(f[0], f[2])
    [swapped] = extractor([image], [torch.tensor([black, white])])
    assert torch.allclose(swapped["features"], f[[1, 0]], atol=1e-5)
    assert torch.equal(swapped["classes"], out["classes"][[1, 0]])


class PositionBody(nn.Module):
    """Stands in for the ResNet trunk: channel 0 of cell (y, x) is x, channel 1 is y."""

    def __init__(self, channels: int):
        super().__init__()
        self.channels = channels

    def forward(self, x):
        b, _, h, w = x.shape
        fmap = x.new_zeros(b, self.channels, h // 32, w // 32)  # stride 32
        fmap[:, 0] = torch.arange(w // 32, dtype=x.dtype)[None, None, :]
        fmap[:, 1] = torch.arange(h // 32, dtype=x.dtype)[:, None]
        return {"0": fmap}


def transformed_scale(height: int, width: int, min_size: int, max_size: int) -> tuple[float, float]:
    """How GeneralizedRCNNTransform resizes an image: (y ratio, x ratio)."""
    scale = min(min_size / min(height, width), max_size / max(height, width))
    return math.floor(height * scale) / height, math.floor(width * scale) / width


def test_given_boxes_are_scaled_through_the_transform():
    """Mean-pooled position features equal each box's centre in feature-map cells.

    Boxes stay inside the last feature row and column: RoIAlign clamps samples past them.
    """
    torch.manual_seed(0)
    min_size, max_size = 480, 640
    detector = build_detector("c5", backbone="resnet18", min_size=min_size, max_size=max_size)
    detector.backbone.body = PositionBody(512)
    extractor = RegionFeatureExtractor(detector)
    # one image enlarged (300 x 400 -> 480 x 640), one shrunk (800 x 600 -> 640 x 480), one batch
    images = [torch.rand(3, 300, 400), torch.rand(3, 800, 600)]
    boxes = [torch.tensor([[50, 60, 250, 200], [10, 10, 60, 290], [300, 20, 370, 90.]]),
             torch.tensor([[100, 200, 400, 500], [20, 600, 580, 740.]])]
    outs = extractor(images, boxes)
    for image, given, out in zip(images, boxes, outs):
        ry, rx = transformed_scale(*image.shape[-2:], min_size, max_size)
        centre_x = (given[:, 0] + given[:, 2]) / 2 * rx / 32
        centre_y = (given[:, 1] + given[:, 3]) / 2 * ry / 32
        assert torch.allclose(out["features"][:, 0], centre_x, atol=1e-3)
        assert torch.allclose(out["features"][:, 1], centre_y, atol=1e-3)
        assert torch.equal(out["boxes"], given)


def test_autocast_returns_float32(c5):
    extractor = RegionFeatureExtractor(c5, min_boxes=5, max_boxes=5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outs = extractor(random_images())
        given = extractor(random_images(), [torch.tensor([[0, 0, 50, 50.]]), torch.zeros(0, 4)])
    for out in outs + given:
        assert out["features"].dtype == out["boxes"].dtype == out["scores"].dtype == torch.float32


def test_extractor_stays_in_eval_mode(c5):
    extractor = RegionFeatureExtractor(c5).train()
    assert not extractor.training and not extractor.detector.training


def test_layer_descriptions(detectors):
    assert RegionFeatureExtractor(detectors["fpn"][0]).layer == \
        "roi_heads.box_head (TwoMLPHead fc7 output, 1024-d)"
    assert RegionFeatureExtractor(detectors["c5"][0]).layer == \
        "RoIAlign 7x7 on layer4 (stride 32), mean-pooled (512-d)"
    assert RegionFeatureExtractor(detectors["c4"][0]).layer == \
        "RoIAlign 14x14 on layer3 (stride 16), layer4, mean-pooled (512-d)"


# --------------------------------------------------------------------------- building

def test_build_unknown_arch_or_backbone():
    with pytest.raises(CapstackError, match="unknown 'detr'.*fpn, c5, c4"):
        build_detector("detr")
    with pytest.raises(CapstackError, match="unknown 'vgg16'.*resnet18.*resnet152"):
        build_detector("c5", backbone="vgg16")
    with pytest.raises(CapstackError, match="fpn.*resnet50.*'resnet18'"):
        build_detector("fpn", backbone="resnet18")


@pytest.mark.parametrize("arch", ["c5", "c4"])
def test_resnet_archs_channels(arch):
    for name, channels, trunk in [("resnet18", 512, 256), ("resnet50", 2048, 1024)]:
        detector = build_detector(arch, backbone=name, num_classes=5)
        assert RegionFeatureExtractor(detector).feature_dim == channels
        assert detector.backbone.out_channels == (channels if arch == "c5" else trunk)


# --------------------------------------------------------------------------- weights

def test_load_resnet_classification_weights_into_c5(tmp_path, c5):
    torch.manual_seed(3)
    classifier = resnet18(weights=None, num_classes=7)  # fc of another size: ignored
    path = tmp_path / "resnet18_demo.pth"
    torch.save(classifier.state_dict(), path)
    torch.manual_seed(0)
    detector = build_detector("c5", backbone="resnet18", min_size=MIN_SIZE, max_size=MAX_SIZE)
    head_before = detector.roi_heads.box_predictor.cls_score.weight.clone()
    what = load_detector_weights(detector, path)
    assert what.startswith("backbone")
    body = detector.backbone.body.state_dict()
    for key, value in classifier.state_dict().items():
        if not key.startswith("fc."):
            assert torch.equal(body[key], value), key
    assert torch.equal(detector.roi_heads.box_predictor.cls_score.weight, head_before)


def test_c4_is_layer4_on_a_stride_16_roialign(tmp_path):
    """c4 loads a ResNet into trunk (conv1..layer3) and head (layer4); a box's feature is
    layer4 on RoIAlign 14x14 of the layer3 map, mean-pooled: the bottom-up model's head."""
    torch.manual_seed(3)
    classifier = resnet18(weights=None, num_classes=7).eval()
    path = tmp_path / "resnet18_demo.pth"
    torch.save(classifier.state_dict(), path)
    detector = build_detector("c4", backbone="resnet18", min_size=MIN_SIZE, max_size=MAX_SIZE)
    assert load_detector_weights(detector, path).startswith("backbone")
    assert all(not k.startswith("layer4.") for k in detector.backbone.body.state_dict())
    for key, value in classifier.layer4.state_dict().items():
        assert torch.equal(detector.roi_heads.box_head.layer4.state_dict()[key], value), key
    image, box = white_square_image(), torch.tensor([[20, 30, 60, 70.]])
    [out] = RegionFeatureExtractor(detector)([image], [box])
    with torch.no_grad():
        batch, _ = detector.transform([image])
        x = batch.tensors
        c = classifier
        fmap = c.layer3(c.layer2(c.layer1(c.maxpool(c.relu(c.bn1(c.conv1(x)))))))
        scale = batch.image_sizes[0][0] / image.shape[-2]
        pooled = roi_align(fmap, [box * scale], output_size=14, spatial_scale=1 / 16,
                           sampling_ratio=2)
        expected = c.layer4(pooled).mean(dim=(2, 3))
    assert torch.allclose(out["features"], expected, atol=1e-4, rtol=1e-4)


def test_detector_weights_round_trip(tmp_path, c5):
    path = tmp_path / "detector.pth"
    torch.save(c5.state_dict(), path)
    torch.manual_seed(5)
    other = build_detector("c5", backbone="resnet18", min_size=MIN_SIZE, max_size=MAX_SIZE)
    assert load_detector_weights(other, path, kind="detector").startswith("detector")
    for key, value in c5.state_dict().items():
        assert torch.equal(other.state_dict()[key], value), key


def test_fpn_loads_a_frozen_batchnorm_checkpoint(tmp_path, fpn):
    """torchvision's COCO file has no num_batches_tracked (FrozenBatchNorm2d); it still fits."""
    state = {k: v for k, v in fpn.state_dict().items() if not k.endswith("num_batches_tracked")}
    path = tmp_path / "fasterrcnn_resnet50_fpn_coco-258fb6c6.pth"
    torch.save(state, path)
    torch.manual_seed(5)
    other = build_detector("fpn", min_size=MIN_SIZE, max_size=MAX_SIZE)
    assert load_detector_weights(other, path).startswith("detector")
    assert torch.equal(other.roi_heads.box_head.fc7.weight, fpn.roi_heads.box_head.fc7.weight)


def test_missing_weights_file(tmp_path, c5):
    path = tmp_path / "nope.pth"
    with pytest.raises(CapstackError, match=f"{path}: detector weights not found"):
        load_detector_weights(c5, path)


def test_mismatched_weights_name_file_and_keys(tmp_path, c5):
    wrong_resnet = tmp_path / "resnet50.pth"
    torch.save(resnet50(weights=None).state_dict(), wrong_resnet)
    before = {k: v.clone() for k, v in c5.state_dict().items()}
    with pytest.raises(CapstackError, match=f"{wrong_resnet}: .*(missing|unexpected|shape).*layer"):
        load_detector_weights(c5, wrong_resnet)
    vg = tmp_path / "vg_1601.pth"
    torch.save(build_detector("c5", backbone="resnet18", num_classes=1601).state_dict(), vg)
    with pytest.raises(CapstackError, match=f"{vg}: .*shape mismatch.*box_predictor.*num_classes"):
        load_detector_weights(c5, vg)
    junk = tmp_path / "junk.pth"
    torch.save({"something": torch.zeros(2)}, junk)
    with pytest.raises(CapstackError, match=f"{junk}: neither"):
        load_detector_weights(c5, junk)
    with pytest.raises(CapstackError, match=f"{junk}: .*missing keys"):
        load_detector_weights(c5, junk, kind="backbone")
    for key, value in c5.state_dict().items():  # a refused file changes nothing
        assert torch.equal(value, before[key]), key
