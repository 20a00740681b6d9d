"""The bottom-up detector's Caffe choices, each against a hand computation on a tiny input.

Stride placement in the bottleneck, the stem's Caffe max-pool, frozen batch norm,
Caffe's ROIPooling, res5's dilation, the BGR / pixel-mean / resize preprocessing,
generate_anchors, the "+1" box coding and NMS, and the RPN's channel layout. The
references are numpy / plain-Python loops written here, not calls into the package.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torchvision.ops import nms

from pipeline.features.detectors import boxes as caffe_boxes
from pipeline.features.detectors.anchors import cell_anchors, grid_anchors
from pipeline.features.detectors.caffe_resnet import Bottleneck, ConvNorm, ResNetShape, Stem
from pipeline.features.detectors.detector import CAFFE_PIXEL_MEANS_BGR
from pipeline.features.detectors.rules.caffe import caffe_input, scale_for
from pipeline.features.detectors.heads import BoxHead
from pipeline.features.detectors.rpn import per_anchor

EPS = 1e-5  # Caffe's BatchNorm eps, the frozen norm's


# --------------------------------------------------------------------------- helpers

def randomize(module: nn.Module, seed: int) -> nn.Module:
    """Random weights and frozen-norm buffers (variances positive), in float64."""
    gen = torch.Generator().manual_seed(seed)
    module = module.double()
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=gen, dtype=t.dtype) * 1.5 + 0.5)
            elif name.endswith("norm.weight"):
                t.copy_(1 + 0.2 * torch.randn(t.shape, generator=gen, dtype=t.dtype))
            else:
                t.copy_(0.3 * torch.randn(t.shape, generator=gen, dtype=t.dtype))
    return module.eval()


def np_conv(x: np.ndarray, w: np.ndarray, *, stride=1, pad=0, dilation=1) -> np.ndarray:
    """Plain cross-correlation, x [C, H, W], w [O, C, k, k] -> [O, Ho, Wo] (zero padding)."""
    k = w.shape[-1]
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad)))
    ho = (xp.shape[1] - dilation * (k - 1) - 1) // stride + 1
    wo = (xp.shape[2] - dilation * (k - 1) - 1) // stride + 1
    out = np.zeros((w.shape[0], ho, wo))
    for ky in range(k):
        for kx in range(k):
            y0, x0 = ky * dilation, kx * dilation
            y1, x1 = y0 + stride * (ho - 1) + 1, x0 + stride * (wo - 1) + 1
            patch = xp[:, y0:y1:stride, x0:x1:stride]
            out += np.einsum("oc,chw->ohw", w[:, :, ky, kx], patch)
    return out


def np_frozen_norm(y: np.ndarray, norm) -> np.ndarray:
    """(y - mean) / sqrt(var + eps) * weight + bias, per channel (axis 0)."""
    mean, var, weight, bias = (getattr(norm, n).numpy()[:, None, None]
                               for n in ("running_mean", "running_var", "weight", "bias"))
    return (y - mean) / np.sqrt(var + EPS) * weight + bias


def np_conv_norm(x: np.ndarray, layer: ConvNorm, *, stride=1, pad=0, dilation=1) -> np.ndarray:
    return np_frozen_norm(np_conv(x, layer.weight.detach().numpy(), stride=stride, pad=pad,
                                  dilation=dilation), layer.norm)


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


def c_round(v: float) -> int:
    """C's round(): halves away from zero (Python's round() goes to even)."""
    return int(math.floor(v + 0.5)) if v >= 0 else -int(math.floor(-v + 0.5))


# --------------------------------------------------------------------------- 1. strides

@pytest.mark.parametrize("stride_in_1x1", [True, False])
def test_bottleneck_strides_where_caffe_does(stride_in_1x1):
    block = Bottleneck(4, 3, 8, stride=2, dilation=1, stride_in_1x1=stride_in_1x1,
                       frozen_norm=True)
    expected = ((2, 2), (1, 1)) if stride_in_1x1 else ((1, 1), (2, 2))
    assert (block.conv1.stride, block.conv2.stride) == expected
    assert block.conv3.stride == (1, 1) and block.shortcut.stride == (2, 2)
    assert block.conv2.padding == (1, 1) and block.conv1.padding == (0, 0)


@pytest.mark.parametrize("stride_in_1x1", [True, False])
def test_bottleneck_output_equals_a_numpy_forward(stride_in_1x1):
    block = randomize(Bottleneck(4, 3, 8, stride=2, dilation=1, stride_in_1x1=stride_in_1x1,
                                 frozen_norm=True), seed=1)
    x = torch.randn(1, 4, 7, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    xn = x[0].numpy()
    s1, s3 = (2, 1) if stride_in_1x1 else (1, 2)

    y1 = block.conv1(x)[0].detach().numpy()
    if stride_in_1x1:  # the 1x1 reads every other pixel: a channel mix of x[:, ::2, ::2]
        mixed = np.einsum("oc,chw->ohw", block.conv1.weight.detach().numpy()[:, :, 0, 0],
                          xn[:, ::2, ::2])
        np.testing.assert_allclose(y1, np_frozen_norm(mixed, block.conv1.norm), rtol=1e-10)
        assert y1.shape == (3, 4, 5)
    else:
        assert y1.shape == (3, 7, 9)

    h = relu(np_conv_norm(xn, block.conv1, stride=s1))
    h = relu(np_conv_norm(h, block.conv2, stride=s3, pad=1))
    h = np_conv_norm(h, block.conv3)
    shortcut = np_conv_norm(xn, block.shortcut, stride=2)
    expected = relu(h + shortcut)
    out = block(x)[0].detach().numpy()
    assert out.shape == (8, 4, 5)
    np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-12)


def test_the_two_stride_placements_give_different_features():
    a = randomize(Bottleneck(4, 3, 8, stride=2, dilation=1, stride_in_1x1=True,
                             frozen_norm=True), seed=1)
    b = randomize(Bottleneck(4, 3, 8, stride=2, dilation=1, stride_in_1x1=False,
                             frozen_norm=True), seed=1)
    x = torch.randn(1, 4, 8, 8, dtype=torch.float64)
    assert a(x).shape == b(x).shape and not torch.allclose(a(x), b(x))


# --------------------------------------------------------------------------- 2. max-pool

def caffe_max_pool(x: np.ndarray) -> np.ndarray:
    """Caffe's PoolingLayer, MAX, kernel 3, stride 2, pad 0: sizes rounded up, windows clipped."""
    c, h, w = x.shape
    ho, wo = math.ceil((h - 3) / 2) + 1, math.ceil((w - 3) / 2) + 1
    out = np.empty((c, ho, wo))
    for ch in range(c):
        for ph in range(ho):
            for pw in range(wo):
                h0, w0 = ph * 2, pw * 2
                h1, w1 = min(h0 + 3, h), min(w0 + 3, w)
                out[ch, ph, pw] = max(x[ch, i, j] for i in range(h0, h1) for j in range(w0, w1))
    return out


def stem_pool_only(caffe_maxpool: bool) -> Stem:
    """A stem whose conv1 passes its input through: what comes out is ReLU + the max-pool."""
    stem = Stem(2, caffe_maxpool=caffe_maxpool, frozen_norm=True)
    stem.conv1 = nn.Identity()
    return stem


@pytest.mark.parametrize("size", [(9, 12), (8, 11), (7, 7)])
def test_stem_max_pool_is_caffes(size):
    x = torch.randn(1, 2, *size, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    expected = caffe_max_pool(relu(x[0].numpy()))
    out = stem_pool_only(True)(x.clone())[0].numpy()
    assert out.shape == expected.shape
    np.testing.assert_array_equal(out, expected)


def test_caffe_max_pool_differs_from_torchvisions():
    x = torch.randn(1, 2, 9, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    caffe = stem_pool_only(True)(x.clone())
    torchvision_like = stem_pool_only(False)(x.clone())
    assert caffe.shape[-2:] == (4, 6)  # ceil((9 - 3) / 2) + 1, ceil((12 - 3) / 2) + 1
    assert torchvision_like.shape[-2:] == (5, 6)  # floor((9 + 2 - 3) / 2) + 1: a row more
    # even width: as many columns, but the windows start half a cell apart
    assert not torch.equal(caffe[..., 0, :], torchvision_like[..., 0, :])


# --------------------------------------------------------------------------- 3. frozen norm

@pytest.mark.parametrize("kernel, stride, dilation", [(1, 1, 1), (3, 1, 1), (3, 2, 1), (3, 1, 2),
                                                      (7, 2, 1)])
def test_conv_norm_is_conv_then_per_channel_affine(kernel, stride, dilation):
    layer = randomize(ConvNorm(3, 5, kernel, stride=stride, dilation=dilation), seed=5)
    pad = dilation * (kernel - 1) // 2
    assert layer.padding == (pad, pad) and layer.bias is None
    x = torch.randn(1, 3, 9, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    expected = np_conv_norm(x[0].numpy(), layer, stride=stride, pad=pad, dilation=dilation)
    out = layer(x)[0].detach().numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-12)


def test_frozen_norm_reads_the_four_buffers_by_hand():
    layer = ConvNorm(1, 2, 1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([1.0, 2.0]).view(2, 1, 1, 1))
        layer.norm.running_mean.copy_(torch.tensor([0.5, -1.0]))
        layer.norm.running_var.copy_(torch.tensor([4.0 - EPS, 0.25 - EPS]))
        layer.norm.weight.copy_(torch.tensor([3.0, 1.0]))
        layer.norm.bias.copy_(torch.tensor([1.0, -2.0]))
    out = layer(torch.full((1, 1, 1, 1), 2.0)).flatten()
    # (2 - 0.5) / 2 * 3 + 1 = 3.25;  (4 + 1) / 0.5 * 1 - 2 = 8
    torch.testing.assert_close(out, torch.tensor([3.25, 8.0]))


# --------------------------------------------------------------------------- 4. RoI pooling

def caffe_roi_pool(fmap: np.ndarray, roi, pooled: int, scale: float) -> np.ndarray:
    """Caffe's ROIPoolingLayer forward for one RoI (float32 arithmetic, as Dtype=float)."""
    f32 = np.float32
    c, height, width = fmap.shape
    x1, y1, x2, y2 = (c_round(float(f32(v) * f32(scale))) for v in roi)
    roi_w, roi_h = max(x2 - x1 + 1, 1), max(y2 - y1 + 1, 1)
    bin_w, bin_h = f32(roi_w) / f32(pooled), f32(roi_h) / f32(pooled)
    out = np.zeros((c, pooled, pooled), np.float32)
    for ph in range(pooled):
        hstart = min(max(int(math.floor(f32(ph) * bin_h)) + y1, 0), height)
        hend = min(max(int(math.ceil(f32(ph + 1) * bin_h)) + y1, 0), height)
        for pw in range(pooled):
            wstart = min(max(int(math.floor(f32(pw) * bin_w)) + x1, 0), width)
            wend = min(max(int(math.ceil(f32(pw + 1) * bin_w)) + x1, 0), width)
            if hend <= hstart or wend <= wstart:
                continue  # an empty bin is 0
            for ch in range(c):
                out[ch, ph, pw] = fmap[ch, hstart:hend, wstart:wend].max()
    return out


ROIS = [
    (0.0, 0.0, 111.0, 95.0),  # the whole 6 x 7 map
    (10.3, 20.7, 50.2, 60.9),
    (40.0, 24.0, 72.0, 56.0),  # 2.5 and 1.5 cells: C rounds halves away from zero
    (-30.0, 40.0, 140.0, 130.0),  # partly outside the map
    (-24.0, -40.0, 20.0, 8.0),  # negative corners, -1.5 and -2.5 cells
    (33.0, 33.0, 35.0, 36.0),  # tiny: one cell, 14 bins read it
    (100.0, 90.0, 180.0, 150.0),  # mostly outside: some bins empty
]


def test_roi_pool_is_caffes_roi_pooling_layer():
    head = BoxHead(ResNetShape(blocks=(1, 1, 1, 1), width=8), pool_size=14, stride=16)
    assert (head.pool_size, head.spatial_scale) == (14, 1 / 16)
    gen = torch.Generator().manual_seed(7)
    fmap = torch.randn(1, 3, 6, 7, generator=gen)
    rois = torch.tensor([[0.0, *r] for r in ROIS])
    out = head.pool(fmap, rois).numpy()
    assert out.shape == (len(ROIS), 3, 14, 14)
    for k, roi in enumerate(ROIS):
        expected = caffe_roi_pool(fmap[0].numpy(), roi, 14, 1 / 16)
        np.testing.assert_array_equal(out[k], expected, err_msg=f"roi {roi}")
    assert (out[-1] == 0).any()  # bins past the map are empty and read 0


def test_roi_pool_rounds_halves_away_from_zero():
    head = BoxHead(ResNetShape(blocks=(1, 1, 1, 1), width=8), pool_size=14, stride=16)
    fmap = torch.arange(6 * 7, dtype=torch.float32).view(1, 1, 6, 7)  # value = 7 * y + x
    # x1 = 40 px = 2.5 cells: round() -> 3 (banker's rounding would give 2)
    out = head.pool(fmap, torch.tensor([[0.0, 40.0, 0.0, 40.0, 0.0]]))
    assert (out == 3).all()


# --------------------------------------------------------------------------- 5. res5 dilation

def test_res5_is_dilated_at_stride_1_and_keeps_the_14x14_grid():
    shape = ResNetShape(blocks=(1, 1, 1, 1), width=8, res5_stride=1, res5_dilation=2)
    head = randomize(BoxHead(shape, pool_size=14, stride=16), seed=8)
    block = head.res5[0]
    assert block.conv2.dilation == (2, 2) and block.conv2.padding == (2, 2)
    assert block.conv2.stride == (1, 1) and block.conv1.stride == (1, 1)
    assert block.shortcut.stride == (1, 1)
    x = torch.randn(2, shape.channels(4), 14, 14, dtype=torch.float64)
    assert head.res5(x).shape == (2, shape.channels(5), 14, 14)

    # one output of the dilated 3x3 (before and after its norm), summed by hand
    y = torch.randn(1, block.conv2.in_channels, 14, 14, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(9))
    w = block.conv2.weight.detach().numpy()
    yn = y[0].numpy()
    conv = nn.Conv2d.forward(block.conv2, y)[0].detach().numpy()
    normed = block.conv2(y)[0].detach().numpy()
    for o, r, c in [(0, 7, 7), (3, 0, 1), (5, 13, 12), (2, 1, 13)]:
        total = 0.0
        for ch in range(w.shape[1]):
            for ky in range(3):
                for kx in range(3):
                    yy, xx = r + 2 * (ky - 1), c + 2 * (kx - 1)  # taps 2 apart
                    if 0 <= yy < 14 and 0 <= xx < 14:  # zero padding of 2
                        total += w[o, ch, ky, kx] * yn[ch, yy, xx]
        assert conv[o, r, c] == pytest.approx(total, rel=1e-10, abs=1e-12)
        n = block.conv2.norm
        affine = ((total - n.running_mean[o].item()) / math.sqrt(n.running_var[o].item() + EPS)
                  * n.weight[o].item() + n.bias[o].item())
        assert normed[o, r, c] == pytest.approx(affine, rel=1e-10, abs=1e-12)


def test_detectron2_style_res5_halves_the_grid():
    shape = ResNetShape(blocks=(1, 1, 1, 1), width=8, res5_stride=2, res5_dilation=1)
    head = BoxHead(shape).eval()
    block = head.res5[0]
    assert block.conv2.dilation == (1, 1) and block.conv1.stride == (2, 2)
    assert head.res5(torch.randn(1, shape.channels(4), 14, 14)).shape[-2:] == (7, 7)


# --------------------------------------------------------------------------- 6. input

def test_caffe_input_is_bgr_0_255_minus_the_means():
    image = torch.rand(3, 4, 5, generator=torch.Generator().manual_seed(10))
    out = caffe_input(image, 1.0, CAFFE_PIXEL_MEANS_BGR)
    assert out.shape == (3, 4, 5)
    rgb = image.numpy().astype(np.float64)
    for y in range(4):
        for x in range(5):
            r, g, b = rgb[:, y, x]
            expected = [b * 255 - 102.9801, g * 255 - 115.9465, r * 255 - 122.7717]
            np.testing.assert_allclose(out[:, y, x].numpy(), expected, rtol=0, atol=1e-4)


@pytest.mark.parametrize("h, w, min_size, max_size, scale", [
    (480, 640, 600, 1000, 1.25),  # shorter side to 600; 800 <= 1000
    (100, 1000, 600, 1000, 1.0),  # 600 / 100 * 1000 > 1000: longer side to 1000
    (640, 480, 600, 1000, 1.25),
    (40, 60, 64, 96, 1.6),
    (40, 100, 64, 96, 0.96),  # 160 > 96: capped
])
def test_scale_for_follows_the_caffe_rule(h, w, min_size, max_size, scale):
    assert scale_for(h, w, min_size, max_size) == pytest.approx(scale)


def test_the_cap_compares_the_rounded_longer_side():
    # 600 / 448 * 747 = 1000.45, which rounds to 1000: not capped (np.round, as Caffe)
    assert scale_for(448, 747, 600, 1000) == 600 / 448
    # 600 / 399 * 666 = 1001.5 -> 1002 > 1000: capped
    assert scale_for(399, 666, 600, 1000) == 1000 / 666


@pytest.mark.parametrize("h, w, scale", [(480, 640, 1.25), (100, 1000, 1.0), (3, 5, 1.7),
                                         (7, 5, 0.5)])
def test_resized_size_is_round_side_times_scale(h, w, scale):
    out = caffe_input(torch.rand(3, h, w), scale, CAFFE_PIXEL_MEANS_BGR)
    assert out.shape[-2:] == (round(h * scale), round(w * scale))  # cv2's dsize (half to even)


def cv2_linear_axis(n_in: int, n_out: int, scale: float) -> np.ndarray:
    """The [n_out, n_in] weights cv2.resize(fx=scale, INTER_LINEAR) gives one axis."""
    m = np.zeros((n_out, n_in))
    for d in range(n_out):
        src = (d + 0.5) / scale - 0.5  # half-pixel centres, sampled at 1 / scale
        i = math.floor(src)
        t = src - i
        if i < 0:
            i, t = 0, 0.0
        if i >= n_in - 1:
            i, t = n_in - 1, 0.0
        m[d, i] += 1 - t
        if t:
            m[d, i + 1] += t
    return m


def test_resize_is_cv2_bilinear_2x2_by_hand():
    image = torch.tensor([[[0.0, 1.0], [0.5, 0.25]]] * 3)  # [3, 2, 2], same in every channel
    out = caffe_input(image, 2.0, (0.0, 0.0, 0.0))[0].numpy()
    a, b, c, d = 0.0, 255.0, 127.5, 63.75
    # rows and columns sample at -0.25 (clamped to 0), 0.25, 0.75, 1.25 (clamped to 1)
    row0 = [a, 0.75 * a + 0.25 * b, 0.25 * a + 0.75 * b, b]
    row3 = [c, 0.75 * c + 0.25 * d, 0.25 * c + 0.75 * d, d]
    np.testing.assert_allclose(out[0], row0, atol=1e-4)
    np.testing.assert_allclose(out[3], row3, atol=1e-4)
    np.testing.assert_allclose(out[1], 0.75 * np.array(row0) + 0.25 * np.array(row3), atol=1e-4)


def test_resize_samples_at_one_over_scale_not_at_the_size_ratio():
    # 3 x 5 at 1.7: 5 x 8 (8.5 rounds to 8), so size ratios 5/3 and 8/5 are not 1.7
    image = torch.rand(3, 3, 5, generator=torch.Generator().manual_seed(11))
    out = caffe_input(image, 1.7, CAFFE_PIXEL_MEANS_BGR).numpy()
    assert out.shape == (3, 5, 8)
    means = np.array(CAFFE_PIXEL_MEANS_BGR)[:, None, None]
    bgr = image.numpy()[::-1].astype(np.float64) * 255 - means
    rows, cols = cv2_linear_axis(3, 5, 1.7), cv2_linear_axis(5, 8, 1.7)
    expected = np.einsum("yh,chw,xw->cyx", rows, bgr, cols)
    np.testing.assert_allclose(out, expected, atol=2e-4)


# --------------------------------------------------------------------------- 7. anchors

CAFFE_ANCHORS = [
    [-38, -16, 53, 31], [-84, -40, 99, 55], [-176, -88, 191, 103], [-360, -184, 375, 199],
    [-24, -24, 39, 39], [-56, -56, 71, 71], [-120, -120, 135, 135], [-248, -248, 263, 263],
    [-14, -36, 29, 51], [-36, -80, 51, 95], [-80, -168, 95, 183], [-168, -344, 183, 359],
]


def test_cell_anchors_are_generate_anchors_ratio_major():
    cell = cell_anchors()
    assert cell.shape == (12, 4)
    assert cell.tolist() == CAFFE_ANCHORS


def test_grid_anchors_shift_by_16_px_per_cell_cell_major():
    cell = cell_anchors()
    grid = grid_anchors(cell, 2, 3, 16)
    assert grid.shape == (2 * 3 * 12, 4) and grid.dtype == torch.float32
    for y in range(2):
        for x in range(3):
            for a in range(12):
                x1, y1, x2, y2 = CAFFE_ANCHORS[a]
                expected = [x1 + 16 * x, y1 + 16 * y, x2 + 16 * x, y2 + 16 * y]
                assert grid[(y * 3 + x) * 12 + a].tolist() == expected


# --------------------------------------------------------------------------- 8. boxes

def test_decode_by_hand_with_the_plus_one():
    boxes = torch.tensor([[10.0, 20.0, 29.0, 59.0]], dtype=torch.float64)  # w 20, h 40
    deltas = torch.tensor([[0.1, -0.2, math.log(2.0), math.log(0.5)]], dtype=torch.float64)
    # ctr (20, 40) -> (22, 32); size (40, 20); x2 = ctr + w / 2 (no -1)
    torch.testing.assert_close(caffe_boxes.decode(deltas, boxes),
                               torch.tensor([[2.0, 22.0, 42.0, 42.0]], dtype=torch.float64))
    zero = caffe_boxes.decode(torch.zeros(1, 4, dtype=torch.float64), boxes)
    torch.testing.assert_close(zero, boxes + torch.tensor([0.0, 0.0, 1.0, 1.0],
                                                          dtype=torch.float64))


def test_encode_then_decode_gives_the_box_one_pixel_wider():
    gen = torch.Generator().manual_seed(12)
    anchors = torch.rand(20, 2, generator=gen, dtype=torch.float64) * 50
    anchors = torch.cat([anchors, anchors + 5 + torch.rand(20, 2, generator=gen,
                                                           dtype=torch.float64) * 40], 1)
    targets = torch.rand(20, 2, generator=gen, dtype=torch.float64) * 50
    targets = torch.cat([targets, targets + 5 + torch.rand(20, 2, generator=gen,
                                                           dtype=torch.float64) * 40], 1)
    deltas = caffe_boxes.encode(targets, anchors)
    # by hand for the first pair: widths and centres with the +1
    (ax1, ay1, ax2, ay2), (tx1, ty1, tx2, ty2) = anchors[0].tolist(), targets[0].tolist()
    aw, ah, tw, th = ax2 - ax1 + 1, ay2 - ay1 + 1, tx2 - tx1 + 1, ty2 - ty1 + 1
    hand = [(tx1 + tw / 2 - ax1 - aw / 2) / aw, (ty1 + th / 2 - ay1 - ah / 2) / ah,
            math.log(tw / aw), math.log(th / ah)]
    np.testing.assert_allclose(deltas[0].numpy(), hand, rtol=1e-12)
    back = caffe_boxes.decode(deltas, anchors)
    torch.testing.assert_close(back, targets + torch.tensor([0.0, 0.0, 1.0, 1.0],
                                                            dtype=torch.float64))


def test_decode_clamps_the_log_scale():
    box = torch.tensor([[0.0, 0.0, 15.0, 15.0]])
    out = caffe_boxes.decode(torch.tensor([[0.0, 0.0, 50.0, 50.0]]), box)
    width = (out[0, 2] - out[0, 0]).item()
    assert width == pytest.approx(16 * 1000 / 16, rel=1e-5)  # exp(log(1000 / 16)) * 16


def test_clip_to_the_last_pixel():
    boxes = torch.tensor([[-5.0, -1.0, 70.0, 30.0], [10.0, 45.0, 59.0, 49.5]])
    out = caffe_boxes.clip(boxes, 40, 60)  # height 40, width 60: pixels 0..59, 0..39
    assert out.tolist() == [[0.0, 0.0, 59.0, 30.0], [10.0, 39.0, 59.0, 39.0]]


def iou(a, b, plus_one: bool) -> float:
    p = 1.0 if plus_one else 0.0
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]) + p)
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]) + p)
    area = lambda r: (r[2] - r[0] + p) * (r[3] - r[1] + p)  # noqa: E731
    inter = iw * ih
    return inter / (area(a) + area(b) - inter)


def test_caffe_nms_uses_inclusive_areas():
    a, b = [0.0, 0.0, 3.0, 3.0], [1.0, 0.0, 4.0, 3.0]
    assert iou(a, b, plus_one=True) == pytest.approx(0.6)  # 12 / 20
    assert iou(a, b, plus_one=False) == pytest.approx(0.5)  # 6 / 12
    boxes, scores = torch.tensor([a, b]), torch.tensor([0.9, 0.8])
    assert caffe_boxes.caffe_nms(boxes, scores, 0.55).tolist() == [0]
    assert nms(boxes, scores, 0.55).tolist() == [0, 1]  # exclusive areas keep both
    groups = torch.tensor([0, 0])
    assert caffe_boxes.caffe_batched_nms(boxes, scores, groups, 0.55).tolist() == [0]
    assert caffe_boxes.caffe_batched_nms(boxes, scores, torch.tensor([0, 1]), 0.55).tolist() \
        == [0, 1]


def test_caffe_nms_matches_a_python_loop():
    gen = torch.Generator().manual_seed(13)
    xy = (torch.rand(30, 2, generator=gen) * 20).round()
    boxes = torch.cat([xy, xy + (torch.rand(30, 2, generator=gen) * 10).round()], 1)
    scores = torch.rand(30, generator=gen)
    order = scores.argsort(descending=True).tolist()
    kept = []
    for i in order:  # py-faster-rcnn's cpu nms, greedily
        if all(iou(boxes[i].tolist(), boxes[j].tolist(), plus_one=True) <= 0.3 for j in kept):
            kept.append(i)
    assert caffe_boxes.caffe_nms(boxes, scores, 0.3).tolist() == kept


# --------------------------------------------------------------------------- 9. RPN layout

def test_per_anchor_rows_are_cell_major_then_anchor():
    a, h, w = 3, 2, 4
    objectness = torch.randn(a, h, w)
    deltas = torch.randn(4 * a, h, w)
    logits, rows = per_anchor(objectness, deltas)
    assert logits.shape == (h * w * a,) and rows.shape == (h * w * a, 4)
    for y in range(h):
        for x in range(w):
            for k in range(a):
                row = (y * w + x) * a + k
                assert logits[row] == objectness[k, y, x]
                assert rows[row].tolist() == [deltas[k * 4 + j, y, x].item() for j in range(4)]


def test_per_anchor_rows_line_up_with_grid_anchors():
    # an anchor's own deltas decode it: zero deltas everywhere but one cell's anchor 5
    cell = cell_anchors()
    h, w = 2, 3
    deltas = torch.zeros(4 * 12, h, w)
    deltas[5 * 4 + 0, 1, 2] = 0.5  # dx of anchor 5 at cell (y=1, x=2)
    _, rows = per_anchor(torch.zeros(12, h, w), deltas)
    anchors = grid_anchors(cell, h, w, 16)
    moved = caffe_boxes.decode(rows, anchors.double()) - caffe_boxes.decode(
        torch.zeros_like(rows), anchors.double())
    changed = moved.abs().sum(1).nonzero().flatten().tolist()
    assert changed == [(1 * w + 2) * 12 + 5]
    anchor_w = CAFFE_ANCHORS[5][2] - CAFFE_ANCHORS[5][0] + 1
    assert moved[changed[0], 0].item() == pytest.approx(0.5 * anchor_w)
