"""HACap's discriminator D: a stacked SRU over word embeddings; by default it reads text only.

Its top layer's output after a prefix y_<=t is the *leaked feature* f_t that
the generator's MANAGER reads at every step (LeakGAN); the score of a whole
caption is D(y) = sigmoid(phi^T f_T + b), f_T read at ``<eos>``. Token rows
start with ``<bos>`` (f_0 is the empty prefix's feature) and end with
``<eos>`` then ``<pad>``.

A step beyond the paper (HACap names it future work): with ``image_dim`` the
score also reads the image, D(y, I) = sigmoid(phi^T [f_T ; u ; f_T * u] + b),
u = W_img v with v the image's pooled feature (its mean over the valid
locations). The product f_T * u is what lets the score depend on whether the
words fit the image: a linear score of [f_T ; u] alone would only add a
per-image constant, the same for an image's references and its samples. The
features f_t (what leaks to the MANAGER) stay the text's alone, so decoding
reads what it reads with a text-only D; only the score changes. W_img exists
only then, so a text-only D's weights are what they always were.

:meth:`features` computes every f_t of a sequence at once (the SRU's parallel
path); :meth:`step` advances one word, for decoding; they agree.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pipeline.core.tokens import EOS_ID, PAD_ID
from trainer.modules.sru import SRU


def last_positions(tokens: Tensor) -> Tensor:
    """[N, T] -> each row's index of its first ``<eos>`` (its last non-pad token when none)."""
    is_eos = tokens == EOS_ID
    filled = (tokens != PAD_ID).long().cumsum(1).argmax(1)  # the last non-pad token
    return torch.where(is_eos.any(1), is_eos.long().argmax(1), filled)


class TextDiscriminator(nn.Module):
    def __init__(self, vocab_size: int, embed: int = 64, hidden: int = 128, layers: int = 3,
                 image_dim: int = 0):
        super().__init__()
        self.feature_size = hidden
        self.reads_image = image_dim > 0  # the score reads the pooled image too (docstring)
        self.embed = nn.Embedding(vocab_size, embed)
        self.sru = SRU(embed, hidden, layers)
        if self.reads_image:
            self.image = nn.Linear(image_dim, hidden)  # W_img
            nn.init.xavier_uniform_(self.image.weight)
            nn.init.zeros_(self.image.bias)
        self.classify = nn.Linear(hidden * (3 if self.reads_image else 1), 1)  # phi, b
        nn.init.xavier_uniform_(self.embed.weight)
        nn.init.xavier_uniform_(self.classify.weight)
        nn.init.zeros_(self.classify.bias)

    def initial(self, like: Tensor, n: int) -> Tensor:
        return self.sru.initial(like, n)

    def step(self, words: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """Words [N] after the prefix of ``state`` -> f of the longer prefix [N, F], its state."""
        return self.sru.step(self.embed(words), state)

    def features(self, tokens: Tensor) -> Tensor:
        """Token rows [N, T] -> f_t after each prefix y_<=t [N, T, F]."""
        return self.sru(self.embed(tokens))[0]

    def forward(self, tokens: Tensor, image: Tensor | None = None) -> Tensor:
        """Token rows [N, T] (``<bos>`` first) -> the logit of D(y) at each row's ``<eos>``, [N].

        ``image`` [N, image_dim]: each row's pooled image, which a D that reads the image
        needs and a text-only D leaves unread."""
        f = self.features(tokens)
        last = last_positions(tokens)
        at_end = f.gather(1, last[:, None, None].expand(-1, 1, f.shape[2])).squeeze(1)
        if self.reads_image:
            if image is None:
                raise ValueError("this discriminator reads the image (discriminator_reads_image):"
                                 " give each token row its pooled image")
            u = self.image(image.to(at_end.dtype))  # [N, F]
            at_end = torch.cat([at_end, u, at_end * u], 1)
        return self.classify(at_end).squeeze(1)
