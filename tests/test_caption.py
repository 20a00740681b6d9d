"""capstack caption: raw images -> the store's own extractor -> the checkpoint's decoder."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.features.extract.kinds.grid import GridSettings, extract_grid
from pipeline.features.extract.region_extraction import RegionSettings, extract_regions
from pipeline.vision.backbones import build_resnet
from trainer.config import load_experiment
from trainer.evaluation.evaluate import evaluate_checkpoint
from trainer.train import train
from trainer_fixtures import make_prepared, write_experiment


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny shapes dataset, grid features from saved resnet18 weights, a trained
    soft_attention."""
    root = tmp_path_factory.mktemp("caption")
    dataset, prepared = make_prepared(root)
    torch.manual_seed(0)
    weights = root / "resnet18.pth"
    torch.save(build_resnet("resnet18").state_dict(), weights)
    grid = extract_grid(dataset, dataset.parent, GridSettings("resnet18", str(weights), 64, 2),
                        root=root / "features", pointer=root / "grid.json", workers=0,
                        progress=False)
    exp = write_experiment(root / "soft.yaml", decoder="soft_attention", captions=prepared,
                           features=[root / "grid.json"], epochs=1)
    train(load_experiment(exp), root / "run", progress=False)
    return root, dataset, prepared, weights, grid.store


@pytest.mark.slow
def test_caption_matches_the_evaluation_of_the_same_images(setup, capstack, tmp_path):
    root, dataset, prepared, _, _ = setup
    evaluated = evaluate_checkpoint(root / "run", tmp_path / "eval", beam_size=3, figures=0)
    assert evaluated["images"] == 4
    results = json.loads((tmp_path / "eval" / "results_test.json").read_text())
    test_files = json.loads((prepared / "images_test.json").read_text())
    files = [dataset.parent / e["filepath"] / e["filename"] for e in test_files[:2]]
    out = capstack("caption", "--checkpoint", root / "run", *files, "--beam", 3,
                   "--attention", tmp_path / "att-{n}.png").output.splitlines()
    expected = {r["image_id"]: r["caption"] for r in results}
    for line, entry in zip(out, test_files[:2]):
        assert line.startswith(str(dataset.parent / entry["filepath"] / entry["filename"]))
        assert line.split(": ", 1)[1].split("  [")[0] == expected[entry["image_id"]]
    assert sorted(p.name for p in tmp_path.glob("att*.png")) == ["att-1.png", "att-2.png"]
    assert f"attention -> {tmp_path / 'att-1.png'}" in out[0]


def test_attention_names_the_file_it_writes(tmp_path):
    from trainer.evaluation.caption import attention_files

    one = [tmp_path / "a" / "cat.jpg"]
    two = one + [tmp_path / "b" / "dog.png"]
    assert attention_files(tmp_path / "att.png", one) == [tmp_path / "att.png"]
    assert attention_files(tmp_path / "att-{stem}.png", two) == \
        [tmp_path / "att-cat.png", tmp_path / "att-dog.png"]
    assert attention_files(tmp_path / "{n}" / "att.png", two) == \
        [tmp_path / "1" / "att.png", tmp_path / "2" / "att.png"]


def test_attention_for_several_images_without_a_pattern_is_refused_before_any_work(capstack,
                                                                                   tmp_path):
    images = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        images.append(tmp_path / folder / "cat.png")
        images[-1].write_bytes(b"never read")
    plain = capstack("caption", "--checkpoint", tmp_path / "no-run", *images, "--attention",
                     tmp_path / "att.png", expect_ok=False)
    assert plain.exit_code == 1 and f"--attention {tmp_path / 'att.png'}: 2 images need a " \
        f"picture each: put {{stem}}" in plain.output
    same = capstack("caption", "--checkpoint", tmp_path / "no-run", *images, "--attention",
                    tmp_path / "{stem}.png", expect_ok=False)
    assert f"{images[0]} and {images[1]} would both be drawn to {tmp_path / 'cat.png'}" \
        in same.output
    assert not list(tmp_path.glob("*.png"))


def test_caption_refuses_when_the_weights_changed_or_went(setup, capstack, tmp_path):
    root, dataset, _, weights, _ = setup
    image = next((dataset.parent / "images").glob("*.png"))
    saved = weights.read_bytes()
    try:
        state = torch.load(weights, weights_only=True)
        state["conv1.weight"] += 1
        torch.save(state, weights)
        result = capstack("caption", "--checkpoint", root / "run", image, expect_ok=False)
        assert (result.exit_code == 1
                and "changed since the features were extracted" in result.output)
        weights.unlink()
        result = capstack("caption", "--checkpoint", root / "run", image, expect_ok=False)
        assert "which are not here" in result.output and str(weights) in result.output
    finally:
        weights.write_bytes(saved)


def test_caption_refuses_given_box_regions_and_runs_detected_ones(setup, tmp_path, capstack):
    root, dataset, prepared, _, _ = setup
    image = next((dataset.parent / "images").glob("*.png"))
    runs = {}
    for boxes in ("given", "detect"):
        settings = RegionSettings(arch="c5", backbone="resnet18", weights="random", boxes=boxes,
                                  min_boxes=2, max_boxes=3, min_size=64, max_size=64,
                                  num_classes=3)
        extract_regions(dataset, dataset.parent, settings, root=tmp_path / "features",
                        pointer=tmp_path / f"{boxes}.json", workers=0, progress=False)
        exp = write_experiment(tmp_path / f"{boxes}.yaml", decoder="top_down",
                               captions=prepared, features=[tmp_path / f"{boxes}.json"], epochs=1)
        train(load_experiment(exp), tmp_path / boxes, progress=False)
        runs[boxes] = tmp_path / boxes
    refused = capstack("caption", "--checkpoint", runs["given"], image, expect_ok=False)
    assert "--boxes given" in refused.output and "new images have none" in refused.output
    out = capstack("caption", "--checkpoint", runs["detect"], image, "--attention",
                   tmp_path / "regions.png").output
    assert out.startswith(f"{image}: ") and (tmp_path / "regions.png").is_file()


def test_caption_stopped_by_ctrl_c_while_decoding_ends_at_once_drawing_nothing(
        setup, capstack, tmp_path, monkeypatch):
    """Batches of 2 images: the Ctrl-C comes while the second decodes, after the first's
    pictures could have been drawn; none is, and no caption is printed."""
    import os
    import signal

    import trainer.evaluation.caption as captioning
    import trainer.evaluation.predict as predicting

    root, dataset, _, _, _ = setup
    files = sorted((dataset.parent / "images").glob("*.png"))[:3]
    monkeypatch.setattr(captioning, "CAPTION_BATCH", 2)
    decode, decodes, steps = predicting.decode, [], []

    def signalling(model, ctx, config, vocab=None):
        decodes.append(1)
        step = model.step

        def counted(*args):
            steps.append(len(decodes))
            if len(decodes) == 2 and steps.count(2) == 3:
                os.kill(os.getpid(), signal.SIGINT)
            return step(*args)

        monkeypatch.setattr(model, "step", counted)
        return decode(model, ctx, config, vocab)

    monkeypatch.setattr(predicting, "decode", signalling)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result = capstack("caption", "--checkpoint", root / "run", *files, "--beam", 3,
                          "--attention", tmp_path / "att-{n}.png", expect_ok=False)
    finally:
        signal.signal(signal.SIGINT, before)
    assert result.exit_code == 1 and steps.count(2) == 3  # not one step more
    assert result.output.strip() == "Error: interrupted (Ctrl-C) while decoding, after 2 of 3 " \
        "images: nothing written"
    assert not list(tmp_path.glob("att-*.png"))


def test_caption_of_an_unreadable_image_names_it(setup, capstack, tmp_path):
    root = setup[0]
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not a png")
    result = capstack("caption", "--checkpoint", root / "run", bad, expect_ok=False)
    assert result.exit_code == 1 and str(bad) in result.output


def test_caption_detects_describes_and_draws_with_a_trained_bottom_up_detector(setup, tmp_path,
                                                                                capstack):
    """The demo's path: train-detector, extract-regions --arch bottom-up, top_down, caption."""
    from pipeline.captions.karpathy import load_karpathy
    from pipeline.features.detectors.training import DetectorTraining, train_detector
    from pipeline.features.extract.rebuild import image_extractor
    from pipeline.features.stores import open_store

    root, dataset, prepared, _, _ = setup
    detector = tmp_path / "detector.pth"
    train_detector(dataset, dataset.parent, detector,
                   DetectorTraining(label_key="shape", attribute_key="color", epochs=1,
                                    batch_size=4, image_size=64, proposals=20,
                                    train_proposals=40, rois=8), progress=False)
    settings = RegionSettings(arch="bottom-up", weights=str(detector), min_boxes=2, max_boxes=4,
                              min_size=64, max_size=64)
    # on the CPU, as the comparison below: a GPU's float rounding moves boxes by ~1e-2
    result = extract_regions(dataset, dataset.parent, settings, root=tmp_path / "features",
                             pointer=tmp_path / "regions.json", workers=0, progress=False,
                             device="cpu")
    exp = write_experiment(tmp_path / "td.yaml", decoder="top_down", captions=prepared,
                           features=[tmp_path / "regions.json"], epochs=1)
    train(load_experiment(exp), tmp_path / "top_down", progress=False)

    store = open_store(result.store)
    first = load_karpathy(dataset).images[0]
    image = dataset.parent / first.relpath
    again = image_extractor(store.meta, str(result.store), torch.device("cpu"))([image])[0]
    stored = store.get(first.image_id)
    # the same detector: the same regions (up to float rounding: the store ran a batch)
    assert torch.allclose(torch.as_tensor(again["boxes"]), torch.as_tensor(stored["boxes"]),
                          atol=1e-3)
    assert torch.equal(torch.as_tensor(again["classes"]), torch.as_tensor(stored["classes"]))

    out = capstack("caption", "--checkpoint", tmp_path / "top_down", image, "--attention",
                   tmp_path / "regions.png").output
    assert out.startswith(f"{image}: ") and f"{stored.num} regions" in out
    assert (tmp_path / "regions.png").is_file()


def test_caption_extracts_and_decodes_a_bounded_batch_at_a_time(setup, tmp_path):
    """All the images given were once one batch: 200 images took 6.85 GB."""
    from pipeline.features.extract.rebuild import image_extractor
    from trainer.evaluation.caption import CAPTION_BATCH, caption_files

    root, dataset, _, _, _ = setup
    seen = []

    def extractor_for(meta, where):
        extract = image_extractor(meta, where, torch.device("cpu"))

        def counted(paths):
            seen.append(len(paths))
            return extract(paths)
        return counted

    files = sorted((dataset.parent / "images").glob("*.png"))
    files = (files * 3)[:2 * CAPTION_BATCH + 3]
    captions = caption_files(root / "run", files, extractor_for, beam_size=2,
                             attention=tmp_path / "att_{n}.png")
    assert seen == [CAPTION_BATCH, CAPTION_BATCH, 3]
    assert [c.path for c in captions] == files
    assert captions[-1].attention == tmp_path / f"att_{len(files)}.png"
    alone = caption_files(root / "run", files[-1:], extractor_for, beam_size=2)
    assert alone[0].words == captions[-1].words


def test_caption_takes_the_decoding_options_and_prints_n_ranked_captions(setup, capstack,
                                                                         tmp_path):
    root, dataset, _, _, _ = setup
    files = sorted((dataset.parent / "images").glob("*.png"))[:2]
    plain = capstack("caption", "--checkpoint", root / "run", *files, "--beam", 3).output
    ranked = capstack("caption", "--checkpoint", root / "run", *files, "--beam", 3,
                      "--n", 2).output.splitlines()
    assert [line.split(": ", 1)[0] for line in ranked] == \
        [f"{f} [{rank}]" for f in files for rank in (1, 2)]
    firsts = [line.split(": ", 1)[1] for line in ranked if line.split(": ")[0].endswith("[1]")]
    assert firsts == [line.split(": ", 1)[1] for line in plain.splitlines()]
    sampled = capstack("caption", "--checkpoint", root / "run", files[0], "--search", "greedy",
                       "--sample-method", "sample", "--top-k", 3, "--n", 3,
                       "--no-repeats").output.splitlines()
    assert len(sampled) == 3
    for line in sampled:
        words = line.split(": ", 1)[1].split()
        assert all(a != b for a, b in zip(words, words[1:]))
    refused = capstack("caption", "--checkpoint", root / "run", files[0], "--top-p", 0.9,
                       expect_ok=False)
    assert "capstack caption: eval.top_p: the nucleus is what a sample draws from" in \
        refused.output
