"""Where the time of a decoder's XE and SCST steps goes, per op group, forward and backward.

The work is peer_steps.py's sizes, for any registered decoder: its config's defaults (the
papers' widths, hidden 512; top_down with peer_steps.py's 512-d feature embedding),
vocabulary 9,487, 50 images x 5 captions of 16 words, Adam, clipping at 0.1, dropout on,
random weights (so every sampled caption runs the full 16 words). Region decoders read
36x2048 regions, grid decoders (soft and hard attention, Stack-Cap, Stack-Cap*, HACap) the
14x14 = 196 locations of 2048-d their papers attend over. The SCST step is 5 samples per
image with the greedy decode as baseline and the CIDEr-D reward. One step of each is
profiled with ``torch.profiler`` after a warm-up step. Each op's own time goes to a group:

- forward: the decoder's submodule that ran it (by its attribute: recurrent cells,
  attention, vocabulary projection, embeddings, dropout, ...; a submodule not named here is
  its own group), the cross-entropy (log-softmax, loss; the matrix products of a loss
  that makes the logits from the decoder's readout count as the vocabulary projection), or
  the rest of the step function that called it (sampling, state, the SCST loss); the CIDEr-D
  scoring (numpy, no torch op) counts as its whole time;
- greedy: the same groups inside SCST's greedy baseline decode (no gradients);
- backward: the group of the forward op whose gradient it computes (autograd keeps
  the forward op's sequence number), gradient accumulation on its own;
- zero_grad, clipping and the optimiser;
- "Python and dispatch": the profiled step's wall time that no op accounts for.

Times are the profiled step's (the profiler adds some overhead to each op); the
unprofiled step time is printed above each table. ``--decoder all`` prints one row per
decoder instead: its XE and SCST steps unprofiled, and each one's share in matrix products
(mm, addmm, bmm, linear and the fused RNN kernels, forward, greedy and backward, of the
profiled step's wall time): the floor that no reordering of the rest can go below.

``--root DIR`` imports capstack from another checkout (this script unchanged), so the same
table can be printed before and after a change, on the same machine:

    python benchmarks/step_profile.py [--decoder top_down|NAME|all] [--threads 2] [--ops]
        [--steps 3] [--images 50] [--root DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

from common import ROOT, checkout, importable

CHECKOUT = checkout(sys.argv[1:])  # read before capstack is imported
importable(CHECKOUT)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.autograd.profiler import record_function  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import trainer  # noqa: E402
import trainer.objectives.cross_entropy as cross_entropy  # noqa: E402
import trainer.objectives.scst as self_critical  # noqa: E402
from trainer.batch import TrainBatch, whole_batch  # noqa: E402
from trainer.decoders import DECODERS, build_decoder  # noqa: E402
from trainer.objectives import Setting, StepKey  # noqa: E402
from trainer.objectives.cross_entropy import CrossEntropy, CrossEntropyConfig  # noqa: E402
from trainer.objectives.scst import SelfCritical, SelfCriticalConfig  # noqa: E402
from trainer.rewards.cider import CiderD  # noqa: E402

VOCAB, PER_IMAGE, LENGTH, DIM, WIDTH = 9487, 5, 16, 2048, 512
REGIONS, GRID = 36, 14 * 14
GRID_DECODERS = {"soft_attention", "hard_attention", "stack_cap", "stack_cap_star", "hacap"}
CLIP, LR = 0.1, 5e-5
SPECIALS = 4  # capstack's ids below this are <pad> <bos> <eos> <unk>

CELLS, VOCABULARY = "recurrent cells", "vocabulary projection"
MODULE_GROUPS = {"attention_lstm": CELLS, "language_lstm": CELLS, "lstm": CELLS, "gru": CELLS,
                 "coarse": CELLS, "fine": CELLS, "worker": CELLS,
                 "attention": "attention", "gate": "attention",
                 "out": VOCABULARY, "outputs": VOCABULARY, "out_h": "deep output",
                 "out_z": "deep output", "word_embed": "embeddings",
                 "feature_embed": "embeddings", "image_embed": "embeddings",
                 "init_h": "initial state", "init_c": "initial state",
                 "init_proj": "initial state", "manager": "MANAGER and goals",
                 "to_goal": "MANAGER and goals", "dropout": "dropout"}
MODULE_METHODS = ("project", "step", "steps")  # a submodule's calls that are not its forward
# a decoder's own methods that run its vocabulary projection (HACap's O_t w_t uses L_O's weight)
DECODER_METHODS = {"word_logits": VOCABULARY}
PRODUCTS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm",
            "aten::matmul", "aten::linear", "aten::_addmm_activation", "aten::mkldnn_rnn_layer",
            "aten::mkldnn_rnn_layer_backward"}
MARK = "group: "
BACKWARD = "autograd::engine::evaluate_function: "
GREEDY, REWARD = "greedy decode (no grad)", "CIDEr-D reward (numpy)"
UPDATE = ("zero_grad", "clip", "optimiser")
LOSS = "log-softmax and loss"


# ------------------------------------------------------------------------- the work

class Work:
    """One decoder's training step at peer_steps.py's sizes: model, Adam, batch, objectives."""

    def __init__(self, name: str, images: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        locations = GRID if name in GRID_DECODERS else REGIONS
        feats = torch.from_numpy(np.abs(rng.standard_normal((images, locations, DIM)))
                                 .astype(np.float32))
        words = VOCAB - SPECIALS
        refs = (rng.zipf(1.3, size=images * PER_IMAGE * LENGTH) % words + 1).reshape(
            images, PER_IMAGE, LENGTH)  # word w in 1..words
        torch.manual_seed(seed)
        self.model = build_decoder(name, decoder_config(name, DECODERS.get(name).Config),
                                   VOCAB, DIM).train()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=LR)
        captions = torch.zeros(images * PER_IMAGE, LENGTH + 2, dtype=torch.long)
        captions[:, 0] = 1  # <bos>
        captions[:, 1:LENGTH + 1] = torch.from_numpy(refs.reshape(-1, LENGTH)) + SPECIALS - 1
        captions[:, LENGTH + 1] = 2  # <eos>
        mask = torch.ones(images, locations, dtype=torch.bool)
        share = whole_batch(int((captions[:, 1:] != 0).sum()), images * PER_IMAGE, images)
        self.batch = TrainBatch(list(range(images)), feats, mask, captions, share,
                                seq_per_img=PER_IMAGE)
        setting = Setting(captions=None, max_len=LENGTH)
        self.xe = CrossEntropy(CrossEntropyConfig(), setting)
        names = ["<pad>", "<bos>", "<eos>", "<unk>"] + [str(w) for w in range(1, VOCAB - 3)]
        references = {i: [" ".join(str(int(w)) for w in c) for c in refs[i]]
                      for i in range(images)}
        self.scst = SelfCritical(SelfCriticalConfig(reward=None, samples=PER_IMAGE,
                                                    baseline="greedy"), setting,
                                 scorer=CiderD.from_references(references, names))
        self.locations = locations

    def step(self, objective) -> callable:
        """An update with ``objective`` as the run makes it, each phase marked."""
        def step():
            with record_function(MARK + "rest of the step"):
                loss = objective.loss(self.model, self.batch, StepKey(0, 0, 0))[0]
            with record_function(MARK + "zero_grad"):
                self.opt.zero_grad()
            with record_function(MARK + "unattributed"):
                loss.backward()
            with record_function(MARK + "clip"):
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP)
            with record_function(MARK + "optimiser"):
                self.opt.step()
        return step


def decoder_config(name: str, config_class):
    """The decoder's defaults (the papers' widths), top_down as peer_steps.py builds it."""
    fields = {f.name for f in dataclasses.fields(config_class)}
    if name == "top_down":
        return config_class(**{k: WIDTH for k in ("hidden", "embed", "att_hidden",
                                                  "feature_embed") if k in fields})
    return config_class()


# ------------------------------------------------------------------------- marking the groups

def annotate_modules(model: torch.nn.Module) -> None:
    """Each submodule's forward (and ``project``, ``step``, ``steps``: the products some take
    ahead of the steps, or a step called by name) runs inside a ``record_function`` of its
    group; a container's (Stack-Cap's stages) each of its modules."""
    for name, child in model.named_children():
        group = MODULE_GROUPS.get(name, name)
        is_container = isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict))
        for module in (child.children() if is_container else [child]):
            module.register_forward_pre_hook(lambda m, args, g=group: m.__dict__.setdefault(
                "_ranges", []).append(record_function(MARK + g).__enter__()))
            module.register_forward_hook(
                lambda m, args, out: m._ranges.pop().__exit__(None, None, None))
            for method in MODULE_METHODS:
                if hasattr(module, method):
                    setattr(module, method, marked_call(getattr(module, method), group))
    for method, group in DECODER_METHODS.items():
        if hasattr(model, method):
            setattr(model, method, marked_call(getattr(model, method), group))


def marked_call(function, group: str):
    def call(*args, **kwargs):
        with record_function(MARK + group):
            return function(*args, **kwargs)
    return call


def annotate_objectives(scst) -> None:
    """The cross-entropy, SCST's greedy baseline and its reward scoring each in their range."""
    # today's objective calls output_cross_entropy; a --root checkout's may call the other
    for name in ("output_cross_entropy", "token_cross_entropy"):
        if hasattr(cross_entropy, name):
            setattr(cross_entropy, name, marked_call(getattr(cross_entropy, name), LOSS))
    self_critical.greedy_decode = marked_call(self_critical.greedy_decode, GREEDY)
    scst.scorer.score = marked_call(scst.scorer.score, REWARD)


# ------------------------------------------------------------------------- attributing the time

def group_of(event, forward_groups: dict) -> tuple[str, str]:
    """(phase, group) of an op event: its nearest marked ancestor names the group, a backward
    ancestor makes it backward (of the forward op's group), the greedy range makes it greedy."""
    group, node = None, event
    while node is not None:
        if node.name.startswith(BACKWARD):
            if node.name.endswith("AccumulateGrad"):
                return "backward", "gradient accumulation"
            return "backward", forward_groups.get(node.sequence_nr, "unattributed")
        if node.name.startswith(MARK):
            name = node.name[len(MARK):]
            if name == GREEDY:
                return "greedy", group or "rest of the step"
            group = group or name
        node = node.cpu_parent
    if group == "unattributed":
        return "backward", group
    return ("update" if group in UPDATE else "forward"), group or "outside the step"


def forward_groups_by_sequence(events) -> dict[int, str]:
    """sequence number -> the group of the forward op that recorded it."""
    groups = {}
    for event in events:
        if event.sequence_nr >= 0 and not event.name.startswith(BACKWARD):
            phase, group = group_of(event, {})
            if phase == "forward":
                groups.setdefault(event.sequence_nr, group)
    return groups


def time_by_group(events, wall: float) -> tuple[dict, dict]:
    """{(phase, group): seconds} and {(phase, group, op): seconds} of one profiled step."""
    by_sequence = forward_groups_by_sequence(events)
    spent, ops = defaultdict(float), defaultdict(float)
    for event in events:
        if event.name.startswith(BACKWARD):
            continue  # its children's self times are counted; its own is dispatch
        if event.name.startswith(MARK):
            if event.name == MARK + REWARD:  # numpy work: no torch op inside
                spent["forward", REWARD] += event.cpu_time_total / 1e6
            continue
        where = group_of(event, by_sequence)
        if where[1] == LOSS and event.name in PRODUCTS:  # made by the loss from the readout
            where = (where[0], VOCABULARY)
        spent[where] += event.self_cpu_time_total / 1e6
        ops[(*where, event.name)] += event.self_cpu_time_total / 1e6
    spent["other", "Python and dispatch"] = wall - sum(spent.values())
    return spent, ops


class Profiled(NamedTuple):
    times: list[float]  # unprofiled steps, seconds
    wall: float  # the profiled step
    spent: dict  # (phase, group) -> seconds
    ops: dict  # (phase, group, op) -> seconds

    @property
    def in_products(self) -> float:
        """The profiled step's share in matrix products, every phase."""
        return sum(t for (_, _, op), t in self.ops.items() if op in PRODUCTS) / self.wall


def seconds(run, steps: int) -> list[float]:
    """Seconds of each of ``steps`` calls after one warm-up call."""
    run()
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return times


def profiled(step, steps: int) -> Profiled:
    times = seconds(step, steps)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        step()
        wall = time.perf_counter() - started
    return Profiled(times, wall, *time_by_group(prof.events(), wall))


def print_table(result: Profiled, label: str, show_ops: bool) -> None:
    spent, wall = result.spent, result.wall
    print(f"\n{label}: {min(result.times):.2f}-{max(result.times):.2f} s a step unprofiled, "
          f"{wall:.2f} s profiled, {result.in_products:.0%} of it in matrix products")
    print(f"{'group':34} {'forward':>8} {'greedy':>8} {'backward':>8} {'total':>8} {'share':>6}")
    totals = defaultdict(float)
    for (_, group), t in spent.items():
        totals[group] += t
    for group, total in sorted(totals.items(), key=lambda kv: -kv[1]):
        if round(total, 3) == 0:
            continue
        columns = (spent.get((phase, group), 0.0) for phase in ("forward", "greedy", "backward"))
        print(f"{group:34} " + " ".join(f"{t:8.3f}" for t in columns)
              + f" {total:8.3f} {total / wall:6.1%}")
        if show_ops:
            for (phase, where, op), t in sorted(result.ops.items(), key=lambda kv: -kv[1]):
                if where == group and t >= 0.005:
                    print(f"    {phase:8} {op:40} {t:8.3f}")


def profile_decoder(name: str, args) -> tuple[Work, Profiled, Profiled]:
    work = Work(name, args.images)
    annotate_modules(work.model)
    annotate_objectives(work.scst)
    return work, profiled(work.step(work.xe), args.steps), profiled(work.step(work.scst),
                                                                    args.steps)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decoder", default="top_down", help="a registered decoder, or all")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ops", action="store_true", help="each group's ops above 5 ms too")
    ap.add_argument("--steps", type=int, default=3, help="timed steps of each (after a warm-up)")
    ap.add_argument("--images", type=int, default=50, help="images a step (5 captions each)")
    ap.add_argument("--root", type=Path, default=ROOT,
                    help="the capstack checkout to import (another one: its code, timed "
                         "by this script; read before the imports, see common.checkout())")
    args = ap.parse_args(argv)
    if args.root.resolve() != CHECKOUT:
        ap.error(f"--root {args.root}: capstack was imported from {CHECKOUT} (--root is read "
                 f"from the command line, before the imports)")
    torch.set_num_threads(args.threads)
    names = sorted(DECODERS) if args.decoder == "all" else [args.decoder]
    DECODERS.get(names[0])  # an unknown name: the registry's error, with the names it has
    print(f"torch {torch.__version__}, CPU, {torch.get_num_threads()} threads; capstack at "
          f"{Path(trainer.__file__).parent.parent}; hidden {WIDTH}, vocabulary {VOCAB}, "
          f"{args.images} images x {PER_IMAGE} captions of {LENGTH} words, Adam, clip {CLIP}")
    if args.decoder != "all":
        work, xe, scst = profile_decoder(args.decoder, args)
        print(f"{args.decoder}: {work.locations}x{DIM} features")
        print_table(xe, "XE step", args.ops)
        print_table(scst, f"SCST step ({PER_IMAGE} samples + greedy)", args.ops)
        return
    print(f"\n{'decoder':16} {'features':>9} {'XE s':>11} {'products':>9} {'SCST s':>11} "
          f"{'products':>9}")
    for name in names:
        work, xe, scst = profile_decoder(name, args)
        print(f"{name:16} {work.locations:>5}x{DIM} "
              + " ".join(f"{np.median(r.times):11.2f} {r.in_products:9.0%}" for r in (xe, scst)),
              flush=True)


if __name__ == "__main__":
    main()
