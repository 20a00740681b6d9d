"""Attention figures and training curves are written as real PNGs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.core.errors import CapstackError
from trainer.evaluation.figures import (attention_figure, curves_figure, on_one_axis,
                                        training_curves, upsampled_attention)
from trainer.evaluation.figures.attention import (BOXES_DRAWN, attention_drawing, drawn_boxes,
                                                  stages_figure)

H, W, K = 48, 64, 4


def _image() -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(H, W, 3), dtype=np.uint8)


def _alphas(t: int, n: int, extra_rows: int = 0) -> np.ndarray:
    rng = np.random.default_rng(1)
    a = rng.random((t + extra_rows, n))
    return a / a.sum(axis=1, keepdims=True)


def _png_size(path: Path) -> tuple[int, int]:
    with Image.open(path) as im:
        assert im.format == "PNG"
        return im.size


# ---------------------------------------------------------------- upsampled_attention


def test_upsampled_attention_shape():
    heat = upsampled_attention(_alphas(1, K * K)[0], K, H, W)
    assert heat.shape == (H, W)
    assert np.all(np.isfinite(heat))


@pytest.mark.parametrize("cell", [(0, 0), (1, 2), (3, 3), (2, 0)])
def test_one_hot_peaks_inside_its_cell(cell):
    r, c = cell
    alpha = np.zeros(K * K)
    alpha[r * K + c] = 1.0
    heat = upsampled_attention(alpha, K, H, W)
    y, x = np.unravel_index(np.argmax(heat), heat.shape)
    ch, cw = H // K, W // K
    assert r * ch <= y < (r + 1) * ch
    assert c * cw <= x < (c + 1) * cw


def test_strongest_cell_is_brightest_at_its_centre():
    alpha = np.full(K * K, 0.5 / (K * K - 1))
    alpha[1 * K + 2] = 0.5
    heat = upsampled_attention(alpha, K, H, W)
    centre = heat[int(1.5 * H / K), int(2.5 * W / K)]
    other_centres = [heat[int((r + 0.5) * H / K), int((c + 0.5) * W / K)]
                     for r in range(K) for c in range(K) if (r, c) != (1, 2)]
    assert centre > max(other_centres)


def test_unsmoothed_is_piecewise_constant_by_cell():
    alpha = _alphas(1, K * K)[0]
    heat = upsampled_attention(alpha, K, H, W, smooth=False)
    ch, cw = H // K, W // K
    for r in range(K):
        for c in range(K):
            block = heat[r * ch:(r + 1) * ch, c * cw:(c + 1) * cw]
            np.testing.assert_allclose(block, alpha[r * K + c])


def test_upsampled_attention_rejects_wrong_length():
    with pytest.raises(CapstackError):
        upsampled_attention(np.ones(10), K, H, W)


# ---------------------------------------------------------------- attention_figure


def test_grid_figure_writes_png(tmp_path):
    out = attention_figure(_image(), ["a", "red", "circle"], _alphas(3, K * K, extra_rows=2),
                           tmp_path / "att.png", grid=K, title="a red circle")
    assert out == tmp_path / "att.png"
    _png_size(out)
    assert [p.name for p in tmp_path.iterdir()] == ["att.png"]  # no temp files left


def test_grid_figure_wraps_long_captions_into_rows(tmp_path):
    short = attention_figure(_image(), "a red circle".split(), _alphas(3, K * K),
                             tmp_path / "short.png", grid=K)
    words = "a red circle on the left side".split()
    long = attention_figure(_image(), words, _alphas(7, K * K), tmp_path / "long.png", grid=K)
    (sw, sh), (lw, lh) = _png_size(short), _png_size(long)
    assert lh > sh
    assert lw > sw


def test_box_figure_writes_png(tmp_path):
    boxes = np.array([[0, 0, 20, 20], [10, 5, 60, 40], [30, 30, 63, 47]], dtype=np.float32)
    alphas = _alphas(2, 5)  # two padded locations beyond the three boxes
    out = attention_figure(_image(), ["a", "dog"], alphas, tmp_path / "sub" / "box.png",
                           boxes=boxes)
    _png_size(out)


def test_overwrites_existing_output(tmp_path):
    out = tmp_path / "att.png"
    out.write_bytes(b"old")
    attention_figure(_image(), ["a"], _alphas(1, K * K), out, grid=K)
    _png_size(out)


def _panels(fig):
    """The image panels of an attention figure (its colour bar apart)."""
    return [ax for ax in fig.axes if ax.get_images()]


def _colour_bars(fig):
    return [ax for ax in fig.axes if not ax.get_images() and ax.get_ylabel()]


def test_grid_panels_title_the_word_and_its_weight_under_one_colour_bar(tmp_path):
    alphas = np.full((2, K * K), 0.5 / (K * K - 1))
    alphas[0, 5], alphas[1, 9] = 0.5, 0.5
    fig = attention_drawing(_image(), ["red", "circle"], alphas, tmp_path / "att.png", grid=K)
    panels = _panels(fig)
    assert [ax.get_title() for ax in panels] == ["", "red 0.50", "circle 0.50"]
    [bar] = _colour_bars(fig)
    assert "weight of a grid cell" in bar.get_ylabel()
    assert bar.get_ylim() == pytest.approx((0.0, 0.5))  # 0 to the figure's largest weight


def test_grid_heat_map_is_clear_where_the_word_did_not_look(tmp_path):
    alphas = np.zeros((1, K * K))
    alphas[0, 0] = 1.0  # all of it on the top-left cell
    fig = attention_drawing(_image(), ["star"], alphas, tmp_path / "att.png", grid=K)
    image, heat = _panels(fig)[1].get_images()
    overlay = heat.get_array()
    assert overlay.shape == (H, W, 4)
    assert overlay[0, 0, 3] == pytest.approx(0.8)  # the strongest cell: the scale's top
    assert overlay[-1, -1, 3] < 0.01  # far from it the image shows through


def test_evenly_spread_attention_is_a_faint_wash_not_a_hot_frame(tmp_path):
    """An even spread (what a weak model gives on a real photo) must not paint the frame."""
    even = np.full((2, K * K), 1 / (K * K))
    fig = attention_drawing(_image(), ["a", "b"], even, tmp_path / "att.png", grid=K)
    overlay = _panels(fig)[1].get_images()[1].get_array()
    assert overlay[..., 3].max() <= 0.8 / 4 + 1e-6  # a quarter of the way up the scale


def test_regions_are_outlined_by_weight_never_filled(tmp_path):
    boxes = np.array([[0, 0, 20, 20], [10, 5, 60, 40], [30, 30, 63, 47]], dtype=np.float32)
    alphas = np.array([[0.1, 0.6, 0.3, 0.0, 0.0], [0.2, 0.2, 0.6, 0.0, 0.0]])
    fig = attention_drawing(_image(), ["a", "dog"], alphas, tmp_path / "box.png", boxes=boxes)
    panels = _panels(fig)
    assert [ax.get_title() for ax in panels] == ["", "a 0.60", "dog 0.60"]
    assert "weight of a region" in _colour_bars(fig)[0].get_ylabel()
    outlines = panels[1].patches
    assert outlines and not any(p.get_fill() for p in outlines)
    assert [p.get_xy() for p in outlines] == [(0, 0), (30, 30), (10, 5)]  # lightest first
    widths = [p.get_linewidth() for p in outlines]
    assert widths[0] < widths[1] < widths[2]  # the heavier, the thicker


def test_a_panel_outlines_only_the_heaviest_regions():
    weights = np.full(36, 0.001)
    weights[:12] = np.linspace(0.2, 0.03, 12)
    kept = drawn_boxes(weights, 36)
    assert len(kept) == BOXES_DRAWN and kept[-1] == 0  # the heaviest drawn last, on top
    assert len(drawn_boxes(np.full(100, 0.01), 100)) == 1  # none carries 2%: the heaviest alone


def test_stack_cap_stages_share_one_colour_bar(tmp_path):
    alphas = _alphas(2, K * K)
    out = stages_figure(_image(), [("coarse", ["a", "dog"], None), ("fine 1", ["a", "dog"], alphas),
                                   ("fine 2", ["a", "dog"], alphas)], tmp_path / "stages.png",
                        grid=K)
    _png_size(out)


@pytest.mark.parametrize(
    "kwargs, alphas, match",
    [
        ({"grid": K, "boxes": np.zeros((2, 4))}, _alphas(2, K * K), "exactly one"),
        ({}, _alphas(2, K * K), "exactly one"),
        ({"grid": K}, _alphas(2, 9), r"\(2, 9\)"),
        ({"boxes": np.zeros((4, 4))}, _alphas(2, 3), r"\(2, 3\)"),
        ({"grid": K}, _alphas(1, K * K), "1 rows"),
    ],
    ids=["both", "neither", "grid-L", "boxes-L", "few-rows"],
)
def test_bad_attention_inputs_raise(tmp_path, kwargs, alphas, match):
    out = tmp_path / "bad.png"
    with pytest.raises(CapstackError, match=match):
        attention_figure(_image(), ["a", "dog"], alphas, out, **kwargs)
    assert not out.exists()


# ---------------------------------------------------------------- training_curves


def _write_jsonl(path: Path, records: list[dict], extra_lines: tuple[str, ...] = ()) -> Path:
    lines = [json.dumps(r) for r in records] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n")
    return path


def _train_records(n: int = 60) -> list[dict]:
    return [{"kind": "train", "epoch": s // 20, "step": s, "loss": 4.0 / (1 + s),
             "lr": 1e-3} for s in range(n)]


def test_training_curves_writes_png(tmp_path):
    val = [{"kind": "val", "epoch": e, "cider": 0.5 + 0.1 * e, "loss": 3.0} for e in range(3)]
    metrics = _write_jsonl(tmp_path / "metrics.jsonl", _train_records() + val)
    out = training_curves(metrics, tmp_path / "curves.png")
    assert out == tmp_path / "curves.png"
    _png_size(out)


def test_xe_then_rl_curves_on_one_axis(tmp_path):
    xe_val = [{"kind": "val", "epoch": e, "cider": 0.3 + 0.05 * e} for e in range(3)]
    xe = _write_jsonl(tmp_path / "xe.jsonl", _train_records(60) + xe_val)
    rl_train = [{"kind": "train", "epoch": 0, "step": s, "loss": -0.1} for s in range(1, 21)]
    rl_val = [{"kind": "val", "epoch": -1, "cider": 0.4, "start": "xe/best.pt"},
              {"kind": "val", "epoch": 0, "cider": 0.45}]
    rl = _write_jsonl(tmp_path / "rl.jsonl", rl_train + rl_val)
    first, then = on_one_axis((_train_records(60), xe_val), (rl_train, rl_val))
    assert [r["step"] for r in then[0]][:2] == [60, 61]  # after XE's last step (59)
    assert [(r["epoch"], r["cider"]) for r in then[1]] == [(2, 0.4), (3, 0.45)]
    assert first == (_train_records(60), xe_val)
    _png_size(training_curves(rl, tmp_path / "curves.png", before=xe))


def test_training_curves_without_val_lines(tmp_path):
    metrics = _write_jsonl(tmp_path / "metrics.jsonl", _train_records(5))
    _png_size(training_curves(metrics, tmp_path / "curves.png"))


def _rounds(steps: list[int], phase: str = "adversarial", first_round: int = 1) -> list[dict]:
    return [{"kind": "discriminator", "epoch": s // 20, "step": s, "round": first_round + k,
             "phase": phase, "heldout_accuracy": 0.9 - 0.01 * s, "heldout_real": 0.8,
             "heldout_fake": 0.2, "d_loss": 0.5, "time": 0.0} for k, s in enumerate(steps)]


def _lines(ax) -> dict[str, tuple[list, list]]:
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
            for line in ax.get_lines()}


def test_curves_without_discriminator_rounds_are_unchanged(tmp_path):
    val = [{"kind": "val", "epoch": e, "cider": 0.5} for e in range(3)]
    plain = _write_jsonl(tmp_path / "plain.jsonl", _train_records() + val)
    fig = curves_figure(plain)
    assert len(fig.axes) == 2 and tuple(fig.get_size_inches()) == (10, 4)
    assert [ax.get_xlabel() for ax in fig.axes] == ["step", "epoch"]
    # rounds that scored no held-out image (heldout_images 0) draw nothing either
    unscored = [{**r, "heldout_accuracy": float("nan")} for r in _rounds([20])]
    assert len(curves_figure(_write_jsonl(tmp_path / "nan.jsonl", _train_records() + val
                                          + unscored)).axes) == 2
    assert len(curves_figure(plain, before=plain).axes) == 3  # the RL loss's own scale


def test_curves_count_epochs_and_scale_cider_as_the_printed_lines(tmp_path):
    """`epoch 1/3 ... val CIDEr 50.0`: the first epoch at 1, CIDEr x100; an RL run's start
    (epoch -1) at the XE run's last epoch."""
    val = [{"kind": "val", "epoch": e, "cider": 0.5 + 0.1 * e} for e in range(3)]
    plain = _write_jsonl(tmp_path / "plain.jsonl", _train_records() + val)
    xs, ys = next(iter(_lines(curves_figure(plain).axes[1]).values()))
    assert (xs, ys) == ([1, 2, 3], [pytest.approx(50), pytest.approx(60), pytest.approx(70)])
    rl = _write_jsonl(tmp_path / "rl.jsonl", _train_records(20) + [
        {"kind": "val", "epoch": -1, "cider": 0.7}, {"kind": "val", "epoch": 0, "cider": 0.8}])
    lines = _lines(curves_figure(rl, before=plain).axes[1])
    assert lines["XE"][0] == [1, 2, 3] and lines["RL"][0] == [3, 4]


def test_discriminator_rounds_add_a_panel_on_the_step_axis(tmp_path):
    val = [{"kind": "val", "epoch": e, "cider": 0.5 + 0.1 * e} for e in range(3)]
    rounds = _rounds([1, 1], "pretrain") + _rounds([20, 40], first_round=3)
    metrics = _write_jsonl(tmp_path / "metrics.jsonl", _train_records() + val + rounds)
    fig = curves_figure(metrics)
    assert len(fig.axes) == 4  # loss, CIDEr by epoch, D by step, CIDEr by step (right)
    loss_ax, _, d_ax, cider_by_step = fig.axes
    assert tuple(fig.get_size_inches()) == (15, 4)
    assert d_ax.get_shared_x_axes().joined(loss_ax, d_ax) and d_ax.get_xlabel() == "step"
    lines = _lines(d_ax)
    assert lines["D held-out accuracy (pre-training)"] == ([1, 1], [0.89, 0.89])
    assert lines["D held-out accuracy"] == ([20, 40], [pytest.approx(0.7), pytest.approx(0.5)])
    assert lines["chance"][1] == [0.5, 0.5] and d_ax.get_lines()[-1].get_linestyle() == "--"
    # each validation at the last logged step of its epoch (_train_records: 20 steps an epoch)
    assert _lines(cider_by_step)["validation CIDEr"] == ([19, 39, 59], [50, 60, 70])
    assert {t.get_text() for t in d_ax.get_legend().get_texts()} == {
        "D held-out accuracy (pre-training)", "D held-out accuracy", "chance", "validation CIDEr"}
    assert _png_size(training_curves(metrics, tmp_path / "curves.png")) == (1500, 400)


def test_discriminator_rounds_after_the_run_started_from(tmp_path):
    xe_val = [{"kind": "val", "epoch": e, "cider": 0.3 + 0.05 * e} for e in range(3)]
    xe = _write_jsonl(tmp_path / "xe.jsonl", _train_records(60) + xe_val)
    adv_train = [{"kind": "train", "epoch": (s - 1) // 10, "step": s, "loss": 1.0}
                 for s in range(1, 21)]
    adv_val = [{"kind": "val", "epoch": -1, "cider": 0.4, "start": "xe/best.pt"},
               {"kind": "val", "epoch": 0, "cider": 0.45},
               {"kind": "val", "epoch": 1, "cider": 0.5}]
    adv = _write_jsonl(tmp_path / "adv.jsonl", adv_train + adv_val + _rounds([1], "pretrain")
                       + _rounds([10, 20], first_round=2))
    fig = curves_figure(adv, before=xe)
    assert len(fig.axes) == 5  # loss, CIDEr by epoch, D; then the loss's RL scale, CIDEr by step
    lines = _lines(fig.axes[2])
    assert lines["D held-out accuracy (pre-training)"][0] == [60]  # after XE's last step (59)
    assert lines["D held-out accuracy"][0] == [69, 79]
    assert _lines(fig.axes[4])["validation CIDEr"][0] == [19, 39, 59, 59, 69, 79]
    _png_size(training_curves(adv, tmp_path / "curves.png", before=xe))


def test_malformed_line_names_file_and_line(tmp_path):
    metrics = _write_jsonl(tmp_path / "metrics.jsonl", _train_records(3), ("{not json",))
    with pytest.raises(CapstackError, match=r"metrics\.jsonl: line 4"):
        training_curves(metrics, tmp_path / "curves.png")
    assert not (tmp_path / "curves.png").exists()


def test_no_train_lines_raises(tmp_path):
    metrics = _write_jsonl(tmp_path / "metrics.jsonl", [{"kind": "val", "epoch": 0, "cider": 1.0}])
    with pytest.raises(CapstackError, match="no training lines"):
        training_curves(metrics, tmp_path / "curves.png")


def test_missing_metrics_file_raises(tmp_path):
    with pytest.raises(CapstackError, match="not found"):
        training_curves(tmp_path / "absent.jsonl", tmp_path / "curves.png")


def test_stages_figure_has_a_row_per_stage(tmp_path):
    from trainer.evaluation.figures import stages_figure

    image = np.zeros((48, 64, 3), np.uint8)
    alphas = np.full((3, 16), 1 / 16)
    out = stages_figure(image, [("coarse", ["a", "red"], None),
                                ("fine 1", ["a", "red", "dot"], alphas),
                                ("fine 2", ["a", "dot"], alphas)], tmp_path / "s.png", grid=4)
    two = stages_figure(image, [("coarse", ["a"], None), ("fine 1", ["a"], alphas[:1])],
                        tmp_path / "t.png", grid=4)
    from PIL import Image
    assert Image.open(out).size[1] > Image.open(two).size[1]


# ---------------------------------------------------------------- the image under the attention


def test_attention_is_drawn_on_the_image_as_the_extractor_saw_it(tmp_path, monkeypatch):
    """Issue 31, item 11: a JPEG with EXIF Orientation 6 (stored 64 wide, 48 tall; shown rotated,
    48 wide, 64 tall). The extractor (``load_rgb``) applies the orientation and its boxes are
    in the rotated image; the figures were drawn on ``Image.open(path).convert("RGB")``, the
    stored 48 x 64 pixels. Given the path, the figure code loads it with ``load_rgb`` itself:
    every image panel and heat map is the rotated 64 x 48."""
    from matplotlib.axes import Axes

    from pipeline.vision.images import load_rgb
    from trainer.evaluation.figures import figure_image, stages_figure

    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / "rotated.jpg"
    Image.fromarray(_image()).save(path, exif=exif, quality=95)
    extracted = np.asarray(load_rgb(path))
    assert extracted.shape == (W, H, 3)
    assert np.asarray(Image.open(path).convert("RGB")).shape == (H, W, 3)  # what was drawn
    np.testing.assert_array_equal(figure_image(path), extracted)

    drawn = []
    real_imshow = Axes.imshow

    def spy(self, X, *args, **kwargs):
        drawn.append(np.asarray(X))
        return real_imshow(self, X, *args, **kwargs)

    monkeypatch.setattr(Axes, "imshow", spy)
    attention_figure(path, ["a", "dog"], _alphas(2, K * K), tmp_path / "grid.png", grid=K)
    boxes = np.array([[0, 0, 20, 60], [10, 30, 47, 63]], float)  # inside the rotated 48 x 64 only
    attention_figure(str(path), ["a"], _alphas(1, 2), tmp_path / "box.png", boxes=boxes)
    stages_figure(path, [("coarse", ["a"], None), ("fine 1", ["a"], _alphas(1, K * K))],
                  tmp_path / "stages.png", grid=K)
    images = [a for a in drawn if a.shape[-1] == 3]
    assert len(images) == 3 + 2 + 3
    assert all(np.array_equal(a, extracted) for a in images)
    heat_maps = [a for a in drawn if a.shape[-1] == 4]  # RGBA, over the rotated image
    assert len(heat_maps) == 2 + 1 and all(a.shape == (W, H, 4) for a in heat_maps)

    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    with pytest.raises(CapstackError, match="broken.jpg: cannot draw attention on it: "):
        attention_figure(tmp_path / "broken.jpg", ["a"], _alphas(1, K * K), tmp_path / "x.png",
                         grid=K)
