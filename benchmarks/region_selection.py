"""Region selection: the bottom-up rule's per-class NMS, every class at once against the loop.

``select_regions`` (``pipeline/features/detectors/selection.py``) against the per-class loop it
replaced (``_per_class_select_regions``: one torchvision ``nms`` per class, the fill-up over
every (box, class) entry), on one image's 300 proposals x 1,600 foreground classes (the VG
detector's 1,601 with the background), at the extraction defaults (NMS 0.3, confidence 0.2,
10-100 boxes). Boxes are drawn in a 1000x1000 image; scores are softmaxes over 1,601 logits:

- ``random weights``: flat, no class reaches 0.2, so the fill-up ranks the rest (the random
  VG checkpoint's case, every image);
- ``few confident``: a few boxes pass 0.2, the fill-up adds the rest up to 10;
- ``confident``: most boxes pass, no fill-up;
- ``one box best everywhere``: one box scores highest for every class, so nothing bounds
  the fill-up and it ranks every entry (the new selection's worst case).

On the CPU each case's two selections must be equal (indices and scores); on a GPU the
column ``equal`` says whether they are (torchvision's CUDA ``nms`` compares the IoU with the
threshold in float32, its CPU kernel and ``select_regions`` in float64). Times: the median of
``--repeat`` runs after one warm-up.

    python benchmarks/region_selection.py [--boxes 300] [--classes 1600] [--repeat 5]
        [--device cpu]
"""

from __future__ import annotations

import argparse

from common import median_timed

import torch

from pipeline.core.ranks import pick_device
from pipeline.features.detectors.boxes import inclusive
from pipeline.features.detectors.selection import (_per_class_select_regions,
                                                   select_regions)

RULE = {"nms_thresh": 0.3, "conf_thresh": 0.2, "min_boxes": 10, "max_boxes": 100}
CASES = ("random weights", "few confident", "confident", "one box best everywhere")


def image(case: str, boxes: int, classes: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Inclusive-pixel boxes [N, 4] and foreground scores [N, K] of one drawn image."""
    gen = torch.Generator().manual_seed(seed)
    xy = torch.rand(boxes, 2, generator=gen) * 900
    wh = torch.rand(boxes, 2, generator=gen) * 300 + 4
    logits = torch.randn(boxes, classes + 1, generator=gen)
    if case == "few confident":
        logits[:5, 1:6] += 8.0 * torch.eye(5)  # five boxes, each sure of one class
    elif case == "confident":
        logits *= 8.0
    elif case == "one box best everywhere":  # the rest sure they are background
        logits *= 0.2
        logits[1:, 0] += 10.0
    scores = logits.softmax(dim=1)[:, 1:]
    return inclusive(torch.cat([xy, (xy + wh).clamp(max=999)], dim=1)), scores


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--boxes", type=int, default=300)
    ap.add_argument("--classes", type=int, default=1600, help="foreground classes")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    device = pick_device(args.device)
    print(f"region selection on {device}, torch threads {torch.get_num_threads()}: "
          f"{args.boxes} proposals x {args.classes} classes, NMS {RULE['nms_thresh']}, "
          f"confidence {RULE['conf_thresh']}, {RULE['min_boxes']}-{RULE['max_boxes']} boxes; "
          f"median of {args.repeat}")
    print(f"{'scores':26s} {'per-class loop':>14s} {'batched':>10s} {'speed-up':>9s} "
          f"{'kept':>5s} {'passed':>6s} {'equal':>5s}")
    differ = []
    for case in CASES:
        boxes, scores = (t.to(device) for t in image(case, args.boxes, args.classes))
        loop, want = median_timed(_per_class_select_regions, boxes, scores, repeat=args.repeat,
                                  cuda=device.type == "cuda", **RULE)
        batched, got = median_timed(select_regions, boxes, scores, repeat=args.repeat,
                                    cuda=device.type == "cuda", **RULE)
        equal = torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        if not equal:
            differ.append(case)
        passed = int((got[1] >= RULE["conf_thresh"]).sum())
        print(f"{case:26s} {loop * 1000:11.1f} ms {batched * 1000:7.1f} ms "
              f"{loop / batched:8.1f}x {len(got[0]):5d} {passed:6d} {'yes' if equal else 'NO':>5s}")
    if differ and device.type == "cpu":
        raise SystemExit(f"the two selections differ on the CPU: {', '.join(differ)}")


if __name__ == "__main__":
    main()
