"""Random-weight stand-ins for the Visual Genome bottom-up checkpoints, at their real shapes.

The real files (MILVLG's ``bua-caffe-frcn-r101_with_attributes.pth``, airsplay's
``faster_rcnn_from_caffe_attr.pkl``) cannot be downloaded here. This writes a
ResNet-101 C4 detector with 1601 classes and 401 attributes, randomly
initialised (seeded), in either naming, exactly as those files lay it out, so
that ``extract-regions --arch bottom-up --weights FILE`` and the extraction
benchmark run the real network at its real size.

    python benchmarks/vg_checkpoints.py OUT_DIR [--naming bua-caffe detectron2] [--seed 0]
"""

from __future__ import annotations

import argparse
import pickle
from pathlib import Path

import common  # this checkout importable  # noqa: F401

import torch

from pipeline.features.detectors.checkpoints import in_naming
from pipeline.features.detectors.detector import BottomUpDetector, DetectorConfig

FILES = {"bua-caffe": "bua-caffe-frcn-r101_with_attributes.pth",
         "detectron2": "faster_rcnn_from_caffe_attr.pkl"}


def random_vg_detector(seed: int = 0) -> BottomUpDetector:
    """The VG R101 model, PyTorch's default initialisation, frozen norms at identity."""
    torch.manual_seed(seed)
    return BottomUpDetector(DetectorConfig())


def write(detector: BottomUpDetector, naming: str, out_dir: Path) -> Path:
    state = in_naming(detector, naming)
    path = out_dir / FILES[naming]
    if naming == "detectron2":  # a pickle of numpy arrays, as detectron2 writes .pkl files
        with open(path, "wb") as f:
            pickle.dump({"model": {k: v.numpy() for k, v in state.items()},
                         "__author__": "capstack benchmarks/vg_checkpoints.py"}, f)
    else:
        torch.save({"model": state}, path)
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--naming", nargs="+", default=list(FILES), choices=list(FILES))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    detector = random_vg_detector(args.seed)
    for naming in args.naming:
        path = write(detector, naming, args.out_dir)
        print(f"{naming}: {path} ({path.stat().st_size / 1e6:.0f} MB)")


if __name__ == "__main__":
    main()
