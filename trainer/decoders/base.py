"""What every decoder is: ``encode`` once per image, ``init_state``, then ``step`` per word.

Teacher forcing (:meth:`Decoder.forward`), greedy decoding, sampling and beam
search (``trainer/decoding/``) all drive the same ``step``. A context is a dict of
tensors whose first dimension is the image, [B, ...]; a state is a tuple of tensors
whose first dimension is the row a decoder steps (a caption, a sample, a beam), and
an image's rows are adjacent, k of them each: row r is image r // k's (``per_row``).
So an image's regions are never copied for its captions or beams (an attention step
reads them once per image, its gradients summed per image and not per caption), and
reordering beams, which stay with their image, is the same ``index_select`` of the
state for every decoder.

A decoder knows no training loop: tensors in, logits and attention out, and its
own loss terms (:meth:`Decoder.loss_terms`) as *sums* that the objective divides
by the global batch's counts. State that follows training (hard attention's
moving baseline) changes only when the objective calls :meth:`Decoder.update`.

Shapes: N captions (or beams), L locations, D feature dim, V vocabulary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, ClassVar, NamedTuple, cast

import torch
from torch import Tensor, nn

Context = dict[str, Tensor]
State = tuple[Tensor, ...]
WordFeed = Callable[[Tensor, Tensor], Tensor]  # (the caption's words at t, logits of t-1) -> inputs


MAX_WIDTH = 65_536  # the largest size a decoder setting may ask for
# the most layers or stages (a setting named *layers or *stages): the papers' deepest is 6; a
# depth of 65,536 took minutes to build even on the meta device, before any memory was asked
MAX_DEPTH = 100


@dataclass
class DecoderConfig:
    """What every decoder's settings share, checked when an experiment is read (a bad value
    is named, ``FILE: decoder.embed: ...``, before torch meets it): sizes are whole numbers
    from 1 to :data:`MAX_WIDTH` (from 0 where the default is 0, meaning none), a depth (a
    setting named ``*layers`` or ``*stages``) to :data:`MAX_DEPTH`, a dropout lies in [0, 1),
    and every other number is finite and not negative. What a machine can hold is checked
    when a run is built (trainer/training/fits.py)."""

    def check(self):
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name, value in vars(self).items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if isinstance(value, int):
                low = 0 if defaults.get(name) == 0 else 1
                high = MAX_DEPTH if name.endswith(("layers", "stages")) else MAX_WIDTH
                if not low <= value <= high:
                    yield f"{name}: must be from {low} to {high}, got {value}"
            elif not math.isfinite(value) or value < 0:
                yield f"{name}: must be a finite number, 0 or more, got {value}"
            elif "dropout" in name and value >= 1:
                yield f"{name}: a probability, must be below 1, got {value}"


class ReadOut(NamedTuple):
    """Logits not made yet: the vocabulary layer and what it reads, [N, T, F]. Teacher
    forcing hands these over so that the cross-entropy can make the [N, T, V] logits in
    memory of its own and turn them into their gradient there
    (trainer/objectives/token_cross_entropy.py); anything else asks
    :attr:`DecoderOutput.logits`, which projects them once."""

    features: Tensor
    layer: nn.Linear

    def logits(self) -> Tensor:
        return self.layer(self.features)


class DecoderOutput:
    """Teacher forcing's result: logits [N, T, V] (or their :class:`ReadOut`, projected on
    first use), attention [N, T, L] (None for decoders without attention), and any
    decoder's extras."""

    def __init__(self, logits: Tensor | ReadOut, alphas: Tensor | None,
                 extras: dict[str, Tensor] | None = None):
        self.readout = logits if isinstance(logits, ReadOut) else None
        self._logits = None if isinstance(logits, ReadOut) else logits
        self.alphas = alphas
        self.extras = {} if extras is None else extras

    @property
    def logits(self) -> Tensor:
        if self._logits is None:
            assert self.readout is not None, "a DecoderOutput holds logits or their readout"
            self._logits = self.readout.logits()
        return self._logits

    @property
    def projected(self) -> bool:
        """Whether the logits have been made (else :attr:`readout` holds them unmade)."""
        return self._logits is not None


@dataclass
class LossTerms:
    """A decoder's training terms beyond the caption cross-entropy, summed over the captions.

    ``summed`` is in the units of a caption's -log P(y|x), as the papers write
    their losses (e.g. Show-Attend-Tell: -log P(y|x) + lambda sum_i (1 - sum_t
    alpha_ti)^2, per caption). The objective adds it to the summed
    cross-entropy and divides both by the target tokens of the global batch
    (trainer/batch.py), so each lambda weighs its term against -log P(y|x) as
    the paper's does, whatever the captions' length. ``observed``: per-caption
    sums of what the decoder's state follows (hard attention's baseline), handed
    back as global means to :meth:`Decoder.update`.
    """

    summed: Tensor
    observed: dict[str, Tensor] = field(default_factory=dict)


def images_of(ctx: Context) -> int:
    """How many images a context holds (its tensors' first dimension)."""
    return next(iter(ctx.values())).shape[0]


def per_row(per_image: Tensor, rows: int) -> Tensor:
    """An image's tensor for each of its rows: [B, ...] -> [rows, ...], rows = B * k."""
    k = rows // per_image.shape[0]
    return per_image if k == 1 else per_image.repeat_interleave(k, 0)


def stack_steps(per_step: list[Tensor | None]) -> Tensor | None:
    """T x [N, ...] -> [N, T, ...]; None for a decoder whose steps give none (no attention)."""
    # a decoder's steps all give attention or none do
    return torch.stack(cast("list[Tensor]", per_step), 1) if per_step[0] is not None else None


def select(tensors, index: Tensor):
    """Rows ``index`` of every tensor of a state tuple or context dict."""
    if isinstance(tensors, dict):
        return {k: v.index_select(0, index) for k, v in tensors.items()}
    return tuple(t.index_select(0, index) for t in tensors)


class Decoder(nn.Module):
    """Subclasses set ``Config`` (a dataclass) and implement encode, init_state and step."""

    Config: ClassVar[type]
    has_attention: ClassVar[bool] = True
    requirement: ClassVar[str] = "a decoder"  # what an objective asking for this class says
    # A loss on the log-probabilities of sampled words alone (SCST's) reaches every parameter;
    # False where some are trained by other terms only (HACap's MANAGER): DDP must know.
    sampled_log_probs_train_all: ClassVar[bool] = True
    # Whether ``step``'s state keeps its shapes from word to word (train.compile compiles it
    # then); False where it grows (the transformer's cache of past keys and values).
    steps_keep_shapes: ClassVar[bool] = True
    out: nn.Linear  # the vocabulary layer, where the readout ends in one (set by the subclass)

    def __init__(self, config, vocab_size: int, feature_dim: int):
        super().__init__()
        self.config, self.vocab_size, self.feature_dim = config, vocab_size, feature_dim

    def figures(self, pictures) -> None:
        """Pictures beyond the attention one every attention decoder gets, drawn at evaluation
        from a :class:`~trainer.evaluation.pictures.Pictures` (the evaluated captions, their
        images, the output folder). None by default."""

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        """The parameters the run's optimiser trains, by group (an Adam parameter group each).

        A parameter in no group is trained by something else, an objective's own
        optimiser (HACap's discriminator), and DDP leaves it alone.
        """
        return {"decoder": list(self.parameters())}

    def encode(self, feats: Tensor, mask: Tensor) -> Context:
        """Per image, what every step reads: feats [B, L, D], mask [B, L] bool."""
        raise NotImplementedError

    def init_state(self, ctx: Context, rows: int) -> State:
        """The state before the first word of ``rows`` rows, k = rows / B of each image."""
        raise NotImplementedError

    def with_room(self, state: State, words: int) -> State:
        """``init_state``'s state made ready for up to ``words`` steps, where the decoding knows
        them: a decoder whose state grows a word a step (the transformer's cache) returns one of
        shapes that stay the same over those steps (CUDA graphs, torch.compile's fixed shapes);
        the others' states are of fixed shapes already."""
        return state

    def step(self, words: Tensor, state: State,
             ctx: Context) -> tuple[Tensor, State, Tensor | None]:
        """words [N] -> logits [N, V], the next state, attention [N, L] (or None); N rows of the
        context's B images, N / B each.

        A decoder whose logits are a readout of what the step computed implements
        :meth:`step_hidden` and :meth:`readout` instead (and :meth:`embed_words` where a
        step's use of its words can be computed ahead), and this composes them."""
        hidden, state, alpha = self.step_hidden(self.embed_words(words), state, ctx)
        return self.readout(hidden), state, alpha

    def embed_words(self, words: Tensor) -> Tensor:
        """Word ids [...] -> what a step reads of them, [..., E] (the ids themselves unless
        overridden): for any leading shape, so teacher forcing computes every step's at once."""
        return words

    def step_hidden(self, inputs: Tensor, state: State, ctx: Context
                    ) -> tuple[Tensor, State, Tensor | None]:
        """:meth:`embed_words` of the step's words [N, ...] -> what the readout reads [N, H],
        the next state, attention [N, L]."""
        raise NotImplementedError

    def readout(self, hidden: Tensor) -> Tensor:
        """[..., H] -> logits [..., V]: the vocabulary projection, applied to any leading
        shape, so teacher forcing projects every step of every caption at once. A decoder
        whose readout ends in one linear layer, ``self.out``, implements
        :meth:`readout_features` instead."""
        return self.out(self.readout_features(hidden))

    def readout_features(self, hidden: Tensor) -> Tensor:
        """[..., H] -> what the vocabulary layer ``self.out`` reads, [..., F]: teacher forcing
        then hands both to the cross-entropy unprojected (:class:`ReadOut`)."""
        raise NotImplementedError

    @property
    def splits_readout(self) -> bool:
        """Whether the readout is :meth:`readout_features` and then ``self.out``."""
        return type(self).readout_features is not Decoder.readout_features

    @property
    def reads_out_once(self) -> bool:
        """Whether teacher forcing may project all steps at once (the decoder splits its step)."""
        return type(self).step_hidden is not Decoder.step_hidden

    def forward(self, ctx: Context, captions: Tensor,
                feed: WordFeed | None = None) -> DecoderOutput:
        """Teacher forcing over captions [N, T+1] (<bos> first): logits for positions 1..T.

        ``ctx`` holds the images, ``captions`` k rows of each (adjacent). ``feed``, when
        given, picks each step's input words after the first from the caption's
        and the previous step's logits (scheduled sampling). Without a feed, a
        decoder that splits its step embeds every step's words at once, runs the
        recurrence alone (:meth:`recur`) and projects all T steps in one matrix product,
        whose backward is one product too: on a CPU the per-step projections, their
        gradient sums and the copies of [N, T, V] logits were a third of an XE step.
        """
        if feed is None and self.reads_out_once:
            return self._forward_read_out_once(ctx, captions)
        state = self.with_room(self.init_state(ctx, captions.shape[0]), captions.shape[1] - 1)
        logits: list[Tensor] = []
        alphas: list[Tensor | None] = []
        for t in range(captions.shape[1] - 1):
            words = captions[:, t] if t == 0 or feed is None else feed(captions[:, t], logits[-1])
            step_logits, state, alpha = self.step(words, state, ctx)
            logits.append(step_logits)
            alphas.append(alpha)
        return DecoderOutput(torch.stack(logits, 1), stack_steps(alphas))

    def _forward_read_out_once(self, ctx: Context, captions: Tensor) -> DecoderOutput:
        hiddens, alphas = self.recur(self.embed_words(captions[:, :-1].t()),
                                     self.init_state(ctx, captions.shape[0]), ctx)
        if self.splits_readout:
            return DecoderOutput(ReadOut(self.readout_features(hiddens), self.out), alphas)
        return DecoderOutput(self.readout(hiddens), alphas)

    def recur(self, inputs: Tensor, state: State, ctx: Context) -> tuple[Tensor, Tensor | None]:
        """The recurrence alone over every step's :meth:`embed_words` [T, N, ...] from ``state``
        -> what the readout reads [N, T, ...], attention [N, T, ...] (or None): ``step_hidden``
        a step at a time, unless a decoder runs a whole sequence its own way (show_tell's
        nn.LSTM on the whole caption, gru_init's cell taking its weights once)."""
        hiddens, alphas = [], []
        for step_inputs in inputs.unbind(0):
            hidden, state, alpha = self.step_hidden(step_inputs, state, ctx)
            hiddens.append(hidden)
            alphas.append(alpha)
        return torch.stack(hiddens, 1), stack_steps(alphas)

    def loss_terms(self, output: DecoderOutput, targets: Tensor, target_mask: Tensor,
                   loc_mask: Tensor) -> LossTerms:
        """This decoder's own terms (none unless overridden), summed over these captions.

        targets [N, T] word ids, target_mask [N, T] bool, loc_mask [N, L] bool.
        """
        return LossTerms(targets.new_zeros((), dtype=torch.float32))  # logits left unmade

    def update(self, observed: dict[str, Tensor]) -> None:
        """Move the state that follows training, given the global batch's means of
        ``LossTerms.observed``; called by the objective once per optimiser step."""


class StagedDecoder(Decoder):
    """A decoder of several stages, any of which can lead decoding (Stack-Cap, coarse to fine).

    Stage 0 is the coarsest; :meth:`heading` makes another stage the one whose
    distribution ``step`` returns, so each stage's own caption can be decoded.
    """

    requirement = "a staged (coarse-to-fine) decoder"
    sampled_log_probs_train_all = False  # the last stage's words: earlier outputs in no term
    head: int

    @property
    def stages(self) -> int:
        raise NotImplementedError

    @contextlib.contextmanager
    def heading(self, stage: int):
        """Decode with ``stage``'s distribution (0 = coarse) inside the block."""
        previous, self.head = self.head, stage
        try:
            yield self
        finally:
            self.head = previous

    def figures(self, pictures) -> None:
        """Stack-Cap's Figure 3: every stage's greedy caption and attention, coarse to fine."""
        per_stage = []
        for stage in range(self.stages):
            with self.heading(stage):
                per_stage.append(pictures.greedy(self))
        for k, p in enumerate(pictures.preds):
            fine = per_stage[1][k]
            if pictures.grid is None and fine.boxes is None:
                continue
            path = pictures.image(p.image_id)
            if path is None:
                continue
            rows = [("coarse" if i == 0 else f"fine {i}", s[k].words,
                     None if i == 0 else s[k].alphas) for i, s in enumerate(per_stage)]
            pictures.draw("stages", p.image_id, path, rows, grid=pictures.grid,
                          boxes=None if pictures.grid else fine.boxes)
