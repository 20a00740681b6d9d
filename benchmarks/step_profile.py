"""Where the time of capstack's XE and SCST steps goes, per op group, forward and backward.

The work is ``peer_steps.py``'s (top_down at the peer's sizes: hidden 512, vocabulary
9,487, 36x2048 regions embedded to 512, 50 images x 5 captions of 16 words, Adam,
clipping). One step of each is profiled with ``torch.profiler`` after a warm-up
step. Each op's own time goes to a group:

- forward: the decoder module that ran it (LSTM cells, attention, vocabulary
  projection, embeddings, dropout), the cross-entropy (log-softmax, loss), or the
  rest of the step function that called it (sampling, state, the SCST loss); the
  CIDEr-D scoring (numpy, no torch op) counts as its whole time;
- greedy: the same groups inside SCST's greedy baseline decode (no gradients);
- backward: the group of the forward op whose gradient it computes (autograd keeps
  the forward op's sequence number), gradient accumulation on its own;
- zero_grad, clipping and the optimiser;
- "Python and dispatch": the profiled step's wall time that no op accounts for.

Times are the profiled step's (the profiler adds some overhead to each op); the
unprofiled step time is printed above each table.

    python benchmarks/step_profile.py [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from peer_steps import CLIP, Capstack, Work, seconds  # noqa: E402
from torch.autograd.profiler import record_function  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import trainer.objectives.cross_entropy as cross_entropy  # noqa: E402
import trainer.objectives.scst as self_critical  # noqa: E402
from trainer.objectives import StepKey  # noqa: E402
from trainer.objectives.scst import SelfCritical  # noqa: E402

MODULE_GROUPS = {"attention_lstm": "LSTM cells", "language_lstm": "LSTM cells",
                 "attention": "attention", "out": "vocabulary projection",
                 "word_embed": "embeddings", "feature_embed": "embeddings", "dropout": "dropout"}
MARK = "group: "
BACKWARD = "autograd::engine::evaluate_function: "


def annotate_modules(model: torch.nn.Module) -> None:
    """Each grouped submodule's forward (and ``project``, the products some take ahead of the
    steps) runs inside a ``record_function`` of its group."""
    for name, group in MODULE_GROUPS.items():
        module = getattr(model, name, None)
        if module is None:
            continue
        module.register_forward_pre_hook(lambda m, args, g=group: m.__dict__.setdefault(
            "_ranges", []).append(record_function(MARK + g).__enter__()))
        module.register_forward_hook(lambda m, args, out: m._ranges.pop().__exit__(None, None, None))
        if hasattr(module, "project"):
            module.project = marked_call(module.project, group)


def marked_call(function, group: str):
    def call(*args, **kwargs):
        with record_function(MARK + group):
            return function(*args, **kwargs)
    return call


GREEDY, REWARD = "greedy decode (no grad)", "CIDEr-D reward (numpy)"
UPDATE = ("zero_grad", "clip", "optimiser")


def annotate_objectives(scst: SelfCritical) -> None:
    """The cross-entropy, SCST's greedy baseline and its reward scoring each in their range."""
    cross_entropy.token_cross_entropy = marked_call(cross_entropy.token_cross_entropy,
                                                    "log-softmax and loss")
    self_critical.greedy_decode = marked_call(self_critical.greedy_decode, GREEDY)
    scst.scorer.score = marked_call(scst.scorer.score, REWARD)


def step_of(side: Capstack, objective) -> callable:
    """``side``'s update as Capstack._update runs it, each phase marked."""
    def step():
        with record_function(MARK + "rest of the step"):
            loss = objective.loss(side.model, side.batch, StepKey(0, 0, 0))[0]
        with record_function(MARK + "zero_grad"):
            side.opt.zero_grad()
        with record_function(MARK + "unattributed"):
            loss.backward()
        with record_function(MARK + "clip"):
            torch.nn.utils.clip_grad_norm_(side.model.parameters(), CLIP)
        with record_function(MARK + "optimiser"):
            side.opt.step()
    return step


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
        spent[where] += event.self_cpu_time_total / 1e6
        ops[(*where, event.name)] += event.self_cpu_time_total / 1e6
    spent["other", "Python and dispatch"] = wall - sum(spent.values())
    return spent, ops


def profile_table(step, label: str, show_ops: bool) -> None:
    times = seconds(step, 3)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        step()
        wall = time.perf_counter() - started
    spent, ops = time_by_group(prof.events(), wall)
    print(f"\n{label}: {min(times):.2f}-{max(times):.2f} s a step unprofiled, "
          f"{wall:.2f} s profiled")
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
            for (phase, where, op), t in sorted(ops.items(), key=lambda kv: -kv[1]):
                if where == group and t >= 0.005:
                    print(f"    {phase:8} {op:40} {t:8.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ops", action="store_true", help="each group's ops above 5 ms too")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    side = Capstack(Work())
    annotate_modules(side.model)
    annotate_objectives(side.scst)
    print(f"torch {torch.__version__}, CPU, {torch.get_num_threads()} threads; "
          f"peer_steps.py's sizes")
    profile_table(step_of(side, side.xe), "XE step", args.ops)
    profile_table(step_of(side, side.scst), "SCST step (5 samples + greedy)", args.ops)


if __name__ == "__main__":
    main()
