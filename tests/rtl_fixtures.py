"""self-critical.pytorch checkpoints made without its code: its parameter names and shapes, as
its UpDownModel and TransformerModel save them (captioning/models/AttModel.py,
TransformerModel.py there), with random weights, and an infos pickle as its tools/train.py
writes one (protocol 2, its options an argparse.Namespace)."""

from __future__ import annotations

import argparse
import math
import pickle
from pathlib import Path

import torch


def updown_state(words: int, dim: int, e: int = 12, h: int = 16, att: int = 8,
                 seed: int = 0) -> dict[str, torch.Tensor]:
    """UpDownModel's state_dict: vocabulary of ``words`` + 1 rows, regions of ``dim``."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"embed.0.weight": (words + 1, e), "fc_embed.0.weight": (h, dim),
              "fc_embed.0.bias": (h,), "att_embed.0.weight": (h, dim), "att_embed.0.bias": (h,),
              "logit.weight": (words + 1, h), "logit.bias": (words + 1,),
              "ctx2att.weight": (att, h), "ctx2att.bias": (att,),
              "core.att_lstm.weight_ih": (4 * h, e + 2 * h), "core.att_lstm.weight_hh": (4 * h, h),
              "core.att_lstm.bias_ih": (4 * h,), "core.att_lstm.bias_hh": (4 * h,),
              "core.lang_lstm.weight_ih": (4 * h, 2 * h), "core.lang_lstm.weight_hh": (4 * h, h),
              "core.lang_lstm.bias_ih": (4 * h,), "core.lang_lstm.bias_hh": (4 * h,),
              "core.attention.h2att.weight": (att, h), "core.attention.h2att.bias": (att,),
              "core.attention.alpha_net.weight": (1, att),
              "core.attention.alpha_net.bias": (1,)}
    return {k: torch.randn(s, generator=g) * 0.3 for k, s in shapes.items()}


def transformer_state(words: int, dim: int, d: int = 16, d_ff: int = 24, layers: int = 2,
                      seed: int = 0) -> dict[str, torch.Tensor]:
    """TransformerModel's state_dict (its LayerNorms' a_2, b_2; its positional-encoding
    buffer)."""
    g = torch.Generator().manual_seed(seed)
    shapes: dict[str, tuple[int, ...]] = {"att_embed.0.weight": (d, dim), "att_embed.0.bias": (d,)}

    def linear(name, rows, cols):
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (rows, cols), (rows,)

    def norm(name):
        shapes[f"{name}.a_2"], shapes[f"{name}.b_2"] = (d,), (d,)

    for side, attentions, sublayers in (("encoder", ("self_attn",), 2),
                                        ("decoder", ("self_attn", "src_attn"), 3)):
        for i in range(layers):
            layer = f"model.{side}.layers.{i}"
            for a in attentions:
                for j in range(4):
                    linear(f"{layer}.{a}.linears.{j}", d, d)
            linear(f"{layer}.feed_forward.w_1", d_ff, d)
            linear(f"{layer}.feed_forward.w_2", d, d_ff)
            for j in range(sublayers):
                norm(f"{layer}.sublayer.{j}.norm")
        norm(f"model.{side}.norm")
    shapes["model.tgt_embed.0.lut.weight"] = (words + 1, d)
    linear("model.generator.proj", words + 1, d)
    state = {k: torch.randn(s, generator=g) * 0.3 for k, s in shapes.items()}
    state.update({k: 1 + 0.1 * v for k, v in state.items() if k.endswith(".a_2")})
    position = torch.arange(5000).unsqueeze(1).float()
    rates = torch.exp(torch.arange(0, d, 2).float() * -(math.log(10000.0) / d))
    pe = torch.zeros(5000, d)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(position * rates), torch.cos(position * rates)
    state["model.tgt_embed.1.pe"] = pe[None]
    return state


def peer_options(caption_model: str, **more) -> argparse.Namespace:
    """The options its infos keeps (a few of its parser's, at its defaults)."""
    values = dict(caption_model=caption_model, input_json="data/cocotalk.json", rnn_size=16,
                  input_encoding_size=12, att_hid_size=8, drop_prob_lm=0.5, num_layers=2,
                  max_length=16, seq_length=16, use_bn=0, logit_layers=1, norm_att_feat=0,
                  use_box=0, self_critical_after=-1, learning_rate=5e-4, id="fc",
                  checkpoint_path="log_fc", start_from=None, use_fc=True, use_att=True,
                  dropout=0.1, num_att_heads=2)
    values.update(more)
    return argparse.Namespace(**values)


def write_peer_checkpoint(folder: Path, state: dict, words: list[str],
                          opt: argparse.Namespace) -> tuple[Path, Path]:
    """model.pth and infos_ID.pkl as its save_checkpoint writes them."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(state, folder / "model.pth")
    infos = {"iter": 100, "epoch": 3, "loader_state_dict": {
        "train": {"index_list": [2, 0, 1], "iter_counter": 1}}, "best_val_score": 0.42,
        "vocab": {str(i): w for i, w in enumerate(words, start=1)}, "opt": opt}
    path = folder / f"infos_{opt.id}.pkl"
    path.write_bytes(pickle.dumps(infos, protocol=2))
    return folder / "model.pth", path
