"""HACap: hierarchical adversarial attention (a MANAGER, a WORKER and a leaking discriminator).

The paper (``hierarchical-adversarial-captioning-hacap``) joins Show-Attend-Tell's
soft attention to LeakGAN's generator; its draft leaves gaps, filled here as
capstack's HACap issue resolves them. Per step t, reading the previous word
y_{t-1}:

    f_{t-1} = D's top SRU layer after the prefix y_<=t-1           (leaked, no gradient)
    g_{t-1} = g^/|g^|, g^ = L_g MANAGER(f_{t-1})                  a goal in f's space
    alpha_t = softmax_i(w_e^T ReLU(L_img a_i + L_lang q_t + b))    q_t = h^W_{t-1}, detached
    z_t     = beta_t sum_i alpha_ti a_i,  beta_t = sigmoid(f_beta(q_t))
    h^W_t   = WORKER([E y_{t-1}; z_t])                            an SRU
    w_t     = W_psi sum_{i<c} g_{t-1-i}                           k = 6 numbers
    p(y_t)  = softmax(O_t w_t),  O_t = L_O h^W_t reshaped to V x k

The first step reads [E <bos>; mean a] (uniform attention). The attention's
query is the WORKER's previous state, detached: "there is no gradient sent back
to the language model". The WORKER reads the goals detached, so its loss trains
the WORKER (and attention) and the MANAGER learns from its own loss only, as in
LeakGAN: two parameter groups (:meth:`HACap.parameter_groups`). D is part of
the decoder because decoding needs f_t at every step (its SRU state is in the
decoding state, batch-first like every state); it is trained by its own
rounds (trainer/objectives/discriminator_rounds.py), alongside maximum
likelihood (``interleaved_pretraining``) and in the adversarial phase
(``adversarial``), never by the run's optimiser. With ``discriminator_reads_image``
(a step beyond the paper) D's score of a caption also reads the image's pooled
feature ``ctx["mean"]``; what leaks to the MANAGER is the text's f_t either way.

Maximum likelihood (the ``xe`` objective) minimises, per caption, -log P(y|x)
plus the doubly stochastic penalty plus the MANAGER's term on the real caption,
-sum_t cos(f_{t+c} - f_t, g_t) (:meth:`HACap.loss_terms`).

Teacher forcing computes D and the MANAGER over the whole caption at once (the
SRU's parallel path), and the words' embeddings and the logits of every step at once; only
the WORKER, whose attention reads its own previous state, goes step by step. E y's share of
the WORKER's products is not taken ahead: its SRU's weights cover the whole input [E y; z],
and splitting them into blocks (another parameter layout) would move E of E + D columns
(256 of 2,304 on 2048-d grids) of a product that O_t's projection dwarfs.
:meth:`HACap.step` is the decoding path; both agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.core.errors import CapstackError
from pipeline.core.tokens import BOS_ID, EOS_ID
from trainer.decoders import DECODERS
from trainer.decoders.base import (Context, Decoder, DecoderConfig, DecoderOutput, LossTerms, State,
                                   WordFeed, per_row)
from trainer.modules.attention import AdditiveAttention, doubly_stochastic_penalty
from trainer.modules.dropout import Dropout
from trainer.modules.pooling import masked_mean
from trainer.modules.sru import SRU, SRUCell
from trainer.modules.text_discriminator import TextDiscriminator, last_positions


@dataclass
class HACapConfig(DecoderConfig):
    embed: int = 256  # the WORKER's word embedding E
    worker: int = 512  # WORKER SRU units
    manager: int = 256  # MANAGER SRU units (the paper's 256)
    goal_size: int = 6  # k, the paper's "6-dim subgoal"
    horizon: int = 4  # c: goals summed, and the step of f_{t+c} - f_t
    att_hidden: int = 512
    dropout: float = 0.5
    doubly_stochastic: float = 1.0  # lambda, per caption (Show-Attend-Tell's)
    manager_weight: float = 1.0  # the MANAGER's cosine term against -log P(y|x)
    discriminator_embed: int = 64
    discriminator: int = 128  # D's SRU units: the size of f (and of the goals, in "features")
    discriminator_layers: int = 3
    # where the goal g lives (docs/hacap.md: the paper's "6-dim subgoal"). "features": in D's
    # feature space, w_t = W_psi sum g of goal_size numbers (LeakGAN's code: its goal has D's
    # feature size, its GOAL_SIZE is w's). "subgoal": g itself has goal_size numbers, w_t = sum g,
    # and the MANAGER's cosines read f through a fixed random orthonormal map to goal_size.
    goal_space: Literal["features", "subgoal"] = "features"
    # a step beyond the paper (its future work): D's caption score also reads the image, the
    # pooled feature through a learned W_img (trainer/modules/text_discriminator.py); the
    # features f_t that leak to the MANAGER stay the text's, so decoding is unchanged
    discriminator_reads_image: bool = False


def goal_windows(goals: Tensor, horizon: int) -> Tensor:
    """[N, T, F] -> [N, T, F]: at t, the sum of goals t-c+1..t (fewer at the start)."""
    summed = torch.cumsum(goals, 1)
    earlier = F.pad(summed, (0, 0, horizon, 0))[:, :goals.shape[1]]
    return summed - earlier


def _cosine(f: Tensor, later: Tensor, earlier: Tensor, goals: Tensor) -> Tensor:
    """cos(f_later - f_earlier, goal) for index tensors [N, T] into f [N, T+1, F]."""
    pick = lambda index: f.gather(1, index[:, :, None].expand(-1, -1, f.shape[2]))  # noqa: E731
    return F.cosine_similarity(pick(later) - pick(earlier), goals, dim=2, eps=1e-8)


def manager_cosines(features: Tensor, goals: Tensor, horizon: int, last: Tensor) -> Tensor:
    """cos(f_{t+c} - f_t, g_t) for every goal t [N, T] (0 from the caption's end), f_{t+c}
    clamped at f_L, the feature at ``<eos>`` (index ``last``): every goal near the end still
    points at where the caption went. features [N, T+1, F], goals [N, T, F], last [N]."""
    t = torch.arange(goals.shape[1], device=goals.device).expand(goals.shape[0], -1)
    later = torch.minimum(t + horizon, last[:, None])
    valid = t < last[:, None]
    return _cosine(features, later, t, goals) * valid


@DECODERS.register("hacap")
class HACap(Decoder):
    """HACap: an SRU WORKER with soft attention, led by an SRU MANAGER's goals in D's space."""

    Config = HACapConfig
    sampled_log_probs_train_all = False  # SCST's loss trains the WORKER alone, not the MANAGER
    feature_projection: Tensor  # a buffer, where the goals' space is the subgoal's

    def __init__(self, config: HACapConfig, vocab_size: int, feature_dim: int):
        super().__init__(config, vocab_size, feature_dim)
        c = config
        self.discriminator = TextDiscriminator(
            vocab_size, c.discriminator_embed, c.discriminator, c.discriminator_layers,
            image_dim=feature_dim if c.discriminator_reads_image else 0)
        self.manager = SRU(c.discriminator, c.manager)
        in_features = c.goal_space == "features"
        self.to_goal = nn.Linear(c.manager, c.discriminator if in_features else c.goal_size)  # L_g
        self.word_embed = nn.Embedding(vocab_size, c.embed)  # E
        self.attention = AdditiveAttention(feature_dim, c.worker, c.att_hidden, activation="relu")
        self.gate = nn.Linear(c.worker, 1)  # f_beta
        self.worker = SRUCell(c.embed + feature_dim, c.worker)
        if in_features:
            self.goal_weights = nn.Linear(c.discriminator, c.goal_size, bias=False)  # W_psi
        else:  # f seen in the goals' space: fixed, so the cosines cannot be gamed by the map
            projection = torch.linalg.qr(torch.randn(c.discriminator, c.goal_size))[0].T
            self.register_buffer("feature_projection", projection.contiguous())
        self.out = nn.Linear(c.worker, vocab_size * c.goal_size)  # O_t
        self.dropout = Dropout(c.dropout)
        for module in (self.to_goal, self.word_embed, self.gate, self.out,
                       getattr(self, "goal_weights", None), *self.attention.modules()):
            if isinstance(module, (nn.Linear, nn.Embedding)):  # Xavier (the SRUs: orthogonal)
                nn.init.xavier_uniform_(module.weight)
                bias = getattr(module, "bias", None)
                if bias is not None:
                    nn.init.zeros_(bias)

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        """The WORKER (with attention) and the MANAGER; D is trained by its objective's rounds."""
        manager = [*self.manager.parameters(), *self.to_goal.parameters()]
        taken = {id(p) for p in [*manager, *self.discriminator.parameters()]}
        return {"worker": [p for p in self.parameters() if id(p) not in taken], "manager": manager}

    # ------------------------------------------------------------------ decoding, a step at a time

    def encode(self, feats: Tensor, mask: Tensor) -> Context:
        return {"feats": feats, "mask": mask, "projected": self.attention.project(feats),
                "mean": masked_mean(feats, mask)}

    def init_state(self, ctx: Context, rows: int) -> State:
        """(WORKER c, WORKER h, MANAGER c, D c, the last c goals, first-step flag), all zero
        but the flag, batch-first."""
        mean, c, n = ctx["mean"], self.config, rows
        return (mean.new_zeros(n, c.worker), mean.new_zeros(n, c.worker),
                self.manager.initial(mean, n), self.discriminator.initial(mean, n),
                mean.new_zeros(n, c.horizon, self.to_goal.out_features), mean.new_ones(n, 1))

    def in_goal_space(self, features: Tensor) -> Tensor:
        """D's features f as the MANAGER's cosines see them: as they are, or mapped to the
        subgoal's goal_size numbers (``goal_space: subgoal``)."""
        if self.config.goal_space == "features":
            return features
        return features @ self.feature_projection.T

    def subgoal(self, window: Tensor) -> Tensor:
        """The summed goals of the last c steps -> w_t, the goal_size numbers that mix O_t."""
        return self.goal_weights(window) if self.config.goal_space == "features" else window

    def goal(self, features: Tensor, manager_state: Tensor | None = None):
        """f [N, F] (a step) or [N, T, F] (a sequence) -> unit goals, the MANAGER's state."""
        if features.dim() == 2:
            assert manager_state is not None, "a step continues the MANAGER's state"
            h, state = self.manager.step(features, manager_state)
        else:
            h, state = self.manager(features)
        return F.normalize(self.to_goal(h), dim=-1), state

    def attend(self, query: Tensor, first: Tensor, ctx: Context) -> tuple[Tensor, Tensor]:
        """-> z [N, D] and alpha [N, L]: the gated attended context, or on the first step the
        mean feature (uniform attention over the valid locations)."""
        query = query.detach()  # no gradient from attention back to the language model
        context, alpha = self.attention(ctx["projected"], ctx["feats"], ctx["mask"], query)
        z = torch.sigmoid(self.gate(query)) * context
        mask, rows = ctx["mask"], query.shape[0]
        uniform = per_row(mask.to(alpha.dtype) / mask.sum(1, keepdim=True).clamp(min=1), rows)
        return (torch.where(first > 0, per_row(ctx["mean"], rows), z),
                torch.where(first > 0, uniform, alpha))

    def embed(self, words: Tensor) -> Tensor:
        """E y, dropped out as the WORKER reads it: [...] -> [..., E]."""
        return self.dropout(self.word_embed(words))

    def work(self, embedded: Tensor, z: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
        """The WORKER's step on [E y_{t-1}; z_t] -> h^W_t, its c."""
        return self.worker.step(torch.cat([embedded, z], 1), c)

    def word_logits(self, h: Tensor, window: Tensor) -> Tensor:
        """p(y_t)'s logits O_t w_t, O_t = L_O h^W_t as V x k, on any leading shape: h [..., H],
        ``window`` the summed goals [..., F] -> [..., V].

        Computed as sum_j w_j (L_O,j h + b_j) = L_O' (w (x) h) + B w, L_O's rows (v, j) regrouped
        as a [V, k H] matrix (a view): one product of the vocabulary's size, without the
        [..., V, k] of O_t (six times the logits, in memory and in backward)."""
        w = self.subgoal(window.detach())  # [..., k]; the WORKER does not train the MANAGER
        h = self.dropout(h)
        weight = self.out.weight.view(self.vocab_size, -1)  # [V, k H]
        mixed = (w[..., :, None] * h[..., None, :]).flatten(-2)  # w (x) h, [..., k H]
        return F.linear(mixed, weight) + w @ self.out.bias.view(self.vocab_size, -1).T

    def step(self, words: Tensor, state: State, ctx: Context):
        worker_c, worker_h, manager_c, d_state, goals, first = state
        with torch.no_grad():  # the leaked feature: D learns from its own loss only
            f, d_state = self.discriminator.step(words, d_state)
        g, manager_c = self.goal(f, manager_c)
        goals = torch.cat([goals[:, 1:], g[:, None]], 1)
        z, alpha = self.attend(worker_h, first, ctx)
        worker_h, worker_c = self.work(self.embed(words), z, worker_c)
        state = (worker_c, worker_h, manager_c, d_state, goals, torch.zeros_like(first))
        return self.word_logits(worker_h, goals.sum(1)), state, alpha

    # ------------------------------------------------------------------ teacher forcing

    def forward(self, ctx: Context, captions: Tensor,
                feed: WordFeed | None = None) -> DecoderOutput:
        """Logits for captions[:, 1:], with ``extras``: ``goals`` g_0..g_{T-1} [N, T, G] (with
        the MANAGER's graph) and ``features`` f_0..f_T [N, T+1, G] of the whole caption, in the
        goals' space (:meth:`in_goal_space`). The words' embeddings are taken for every step
        at once, and the logits of every step in one product after the WORKER's steps."""
        if feed is not None:
            raise CapstackError("hacap: scheduled sampling is not supported (its MANAGER reads "
                                "the discriminator's features of the whole caption at once)")
        with torch.no_grad():
            features = self.discriminator.features(captions)  # [N, T+1, F]
        goals, _ = self.goal(features[:, :-1])
        state = self.init_state(ctx, captions.shape[0])
        worker_c, worker_h, first = state[0], state[1], state[5]
        hiddens, alphas = [], []
        for t, embedded in enumerate(self.embed(captions[:, :-1].t()).unbind(0)):
            z, alpha = self.attend(worker_h, first if t == 0 else torch.zeros_like(first), ctx)
            worker_h, worker_c = self.work(embedded, z, worker_c)
            hiddens.append(worker_h)
            alphas.append(alpha)
        logits = self.word_logits(torch.stack(hiddens, 1), goal_windows(goals, self.config.horizon))
        return DecoderOutput(logits, torch.stack(alphas, 1),
                             {"goals": goals, "features": self.in_goal_space(features)})

    def loss_terms(self, output: DecoderOutput, targets: Tensor, target_mask: Tensor,
                   loc_mask: Tensor) -> LossTerms:
        """lambda sum_i (1 - sum_t alpha_ti)^2 - manager_weight sum_t cos(f_{t+c} - f_t, g_t),
        per caption, summed."""
        terms = super().loss_terms(output, targets, target_mask, loc_mask)
        c = self.config
        if c.doubly_stochastic:
            assert output.alphas is not None, "teacher forcing gives this decoder's attention"
            terms.summed = terms.summed + c.doubly_stochastic * doubly_stochastic_penalty(
                output.alphas, target_mask, loc_mask).sum()
        if c.manager_weight and "goals" in output.extras:
            last = target_mask.sum(1)  # the index of <eos> in the caption row (<bos> at 0)
            cosines = manager_cosines(output.extras["features"], output.extras["goals"],
                                      c.horizon, last)
            terms.summed = terms.summed - c.manager_weight * cosines.sum()
        return terms

    def figures(self, pictures) -> None:
        """HACap's Figures 3-4: the MANAGER's goals along each evaluated caption."""
        preds = pictures.preds
        batch = pictures.batch()
        length = max(len(p.words) for p in preds) + 1
        tokens = torch.zeros(len(preds), length, dtype=torch.long, device=batch.feats.device)
        for k, p in enumerate(preds):
            ids = pictures.vocab.encode(p.words) + [EOS_ID]
            tokens[k, :len(ids)] = torch.tensor(ids)
        trace = self.goal_trace(self.encode(batch.feats, batch.mask), tokens)
        for k, p in enumerate(preds):
            if p.words:
                pictures.draw("goals", p.image_id, p.words,
                              trace["subgoals"][k].cpu().numpy(),
                              trace["cosines"][k].cpu().numpy(),
                              trace["goals"][k].cpu().numpy(), title=" ".join(p.words))

    @torch.no_grad()
    def goal_trace(self, ctx: Context, tokens: Tensor) -> dict[str, Tensor]:
        """What the MANAGER asked along decoded captions [N, T] (words, ``<eos>``, ``<pad>``),
        per word: ``subgoals`` w [N, T, k], ``cosines`` cos(f_{t+c} - f_t, g_t) [N, T] and the
        ``goals`` g [N, T, F] that led to it (the goal pictures)."""
        rows = F.pad(tokens, (1, 0), value=BOS_ID)
        out = self(ctx, rows)
        goals, features = out.extras["goals"], out.extras["features"]
        last = last_positions(rows)
        windows = goal_windows(goals, self.config.horizon)
        return {"subgoals": self.subgoal(windows), "goals": goals,
                "cosines": manager_cosines(features, goals, self.config.horizon, last)}


__all__ = ["HACap", "HACapConfig", "goal_windows", "last_positions",
           "manager_cosines"]
