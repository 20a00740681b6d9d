"""Objectives as components: an objective that owns a module and a second optimiser is saved in
every checkpoint and restored by an exact resume (the mechanism HACap's discriminator uses)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainer.checkpoint import load_checkpoint
from trainer.config import load_experiment
from trainer.objectives import OBJECTIVES
from trainer.objectives.cross_entropy import CrossEntropy, CrossEntropyConfig
from trainer.objectives.token_cross_entropy import token_cross_entropy
from trainer.train import train
from trainer.training import loop
from trainer.training.build import build
from trainer.training.position import Position
from trainer_fixtures import logged, write_experiment


@dataclass
class CriticConfig(CrossEntropyConfig):
    critic_lr: float = 0.05


@OBJECTIVES.register("test_xe_with_critic")
class CriticizedCrossEntropy(CrossEntropy):
    """Cross-entropy, and a critic that learns to predict each batch's loss with its own Adam."""

    Config = CriticConfig
    label = "XE+critic"

    def __init__(self, config: CriticConfig, setting):
        super().__init__(config, setting)
        self.critic = nn.Linear(2, 1)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=config.critic_lr)
        self.steps_seen = 0
        self._seen = None

    def loss(self, decoder, batch, key):
        loss, stats = super().loss(decoder, batch, key)
        summary = torch.stack([batch.feats.abs().mean(), batch.mask.float().mean()])
        self._seen = (summary.detach(), loss.detach())
        return loss, stats

    def after_step(self, decoder, batch, key) -> dict:
        summary, target = self._seen
        critic_loss = (self.critic(summary[None]).squeeze() - target) ** 2
        self.critic_optimizer.zero_grad()
        critic_loss.backward()
        self.critic_optimizer.step()
        self.steps_seen += 1
        return {**super().after_step(decoder, batch, key), "critic_loss": critic_loss.item()}

    def modules(self):
        return {"critic": self.critic}

    def optimizers(self):
        return {"critic": self.critic_optimizer}

    def extra_state(self):
        return {"steps_seen": self.steps_seen}

    def load_extra_state(self, state):
        self.steps_seen = state["steps_seen"]


def test_an_objective_with_its_own_optimiser_resumes_exactly(small_data, tmp_path):
    prepared, store = small_data
    path = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                            features=[store], epochs=3, log_every=1,
                            objective={"name": "test_xe_with_critic", "critic_lr": 0.05})
    train(load_experiment(path), tmp_path / "whole", progress=False)
    train(load_experiment(path, ["train.epochs=1"]), tmp_path / "split", progress=False)
    resumed = train(load_experiment(path), tmp_path / "split", progress=False)
    assert resumed.resumed_at == (1, 0)
    assert logged(tmp_path / "split", "loss") == logged(tmp_path / "whole", "loss")
    assert logged(tmp_path / "split", "critic_loss") == logged(tmp_path / "whole", "critic_loss")
    whole, split = (load_checkpoint(tmp_path / run / "last.pt")["objective"]
                    for run in ("whole", "split"))
    assert whole["extra"] == split["extra"] == {"steps_seen": 9}  # 3 batches x 3 epochs
    for name, tensor in whole["modules"]["critic"].items():
        assert torch.equal(tensor, split["modules"]["critic"][name])
    moments = whole["optimizers"]["critic"]["state"][0]["exp_avg"]
    assert torch.equal(moments, split["optimizers"]["critic"]["state"][0]["exp_avg"])


def test_the_critic_learns_with_its_optimiser_and_the_decoder_with_the_loops(small_data, tmp_path):
    """The decoder's optimiser holds the decoder's parameters only; the critic moves by its own."""
    prepared, store = small_data
    path = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                            features=[store], epochs=1,
                            objective={"name": "test_xe_with_critic"})
    run = build(load_experiment(path), tmp_path / "run")
    decoder_params = {id(p) for p in run.model.parameters()}
    in_optimizer = {id(p) for group in run.optimizer.param_groups for p in group["params"]}
    assert in_optimizer == decoder_params
    critic_before = run.objective.critic.weight.detach().clone()
    for batch in run.batches.epoch(0):
        stats = loop.train_step(run, Position.fresh("cider"), batch)
    assert "critic_loss" in stats and not torch.equal(critic_before, run.objective.critic.weight)


def test_a_changed_objective_setting_is_another_run(small_data, tmp_path):
    prepared, store = small_data
    path = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                            features=[store], epochs=1, objective={"name": "test_xe_with_critic"})
    train(load_experiment(path), tmp_path / "run", progress=False)
    from pipeline.core.errors import CapstackError

    with pytest.raises(CapstackError, match=r"objective.critic_lr: the run was trained with 0.05"):
        train(load_experiment(path, ["objective.critic_lr=0.1", "train.epochs=2"]),
              tmp_path / "run", progress=False)


def test_objectives_command_lists_the_registered_objectives(capstack):
    lines = capstack("objectives").output.splitlines()
    names = [line.split()[0] for line in lines]
    assert {"xe", "scst", "c2f"} <= set(names)
    assert all(len(line.split(None, 1)) == 2 for line in lines)


def test_token_cross_entropy_is_torch_s_summed_cross_entropy_in_value_and_gradient():
    """The in-place backward (softmax - onehot in the saved log-probabilities) gives torch's
    gradient, <pad> targets (0) contributing nothing, for any upstream gradient."""
    torch.manual_seed(0)
    logits = torch.randn(6, 5, 40, requires_grad=True)
    targets = torch.randint(1, 40, (6, 5))
    targets[0, 2:] = 0
    ours = token_cross_entropy(logits, targets)
    (ours * 2.5).backward()
    ours_grad, logits.grad = logits.grad, None
    theirs = F.cross_entropy(logits.reshape(-1, 40), targets.reshape(-1), ignore_index=0,
                             reduction="sum")
    (theirs * 2.5).backward()
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(ours_grad, logits.grad)
    assert (ours_grad[0, 2:] == 0).all()


SPLIT_READOUT = ["gru_init", "show_tell", "soft_attention", "top_down", "transformer"]


@pytest.mark.parametrize("name", SPLIT_READOUT)
def test_the_loss_made_from_the_readout_equals_the_loss_of_the_logits_bit_for_bit(name):
    """Teacher forcing hands over the vocabulary layer and its input; the cross-entropy made
    from them (logits in its own buffer) gives the loss and every parameter's gradient of
    the cross-entropy of the logits: the same products in the same order, so equal."""
    from pipeline.captions.vocab import BOS_ID
    from trainer.objectives.token_cross_entropy import output_cross_entropy
    from trainer_fixtures import make_decoder, tiny_decoder_config

    torch.manual_seed(0)
    model = make_decoder(name, tiny_decoder_config(name), 30, 16).eval()
    feats, mask = torch.randn(3, 5, 16), torch.ones(3, 5, dtype=torch.bool)
    captions = torch.randint(4, 30, (6, 8))
    captions[:, 0], captions[0, 5:] = BOS_ID, 0  # one caption padded

    def loss_and_grads(made_from_readout: bool):
        model.zero_grad()
        output = model(model.encode(feats, mask), captions)
        assert output.readout is not None and not output.projected
        targets = captions[:, 1:]
        terms = model.loss_terms(output, targets, targets != 0, mask.repeat_interleave(2, 0))
        assert not output.projected  # the objective's next call does not project them either
        loss = (output_cross_entropy(output, targets) if made_from_readout
                else token_cross_entropy(output.logits, targets)) + terms.summed
        (loss * 0.37).backward()
        return loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters()
                               if p.grad is not None}

    for _ in range(2):  # the second time in the buffer the first gave back
        fused, fused_grads = loss_and_grads(True)
        plain, plain_grads = loss_and_grads(False)
        assert torch.equal(fused, plain)
        assert fused_grads.keys() == plain_grads.keys() and "out.weight" in fused_grads
        for key in plain_grads:
            assert torch.equal(fused_grads[key], plain_grads[key]), key


def test_two_losses_made_from_readouts_alive_at_once_keep_their_own_logits():
    """The buffer kept between steps is lent to one loss at a time: a second made before the
    first's backward gets its own, and a loss without gradients gives it back at once."""
    from trainer.decoders.base import DecoderOutput, ReadOut
    from trainer.objectives.token_cross_entropy import WORKSPACE, output_cross_entropy

    torch.manual_seed(1)
    layer = nn.Linear(8, 25)
    features = [torch.randn(4, 3, 8, requires_grad=True) for _ in range(2)]
    targets = torch.randint(1, 25, (4, 3))
    losses = [output_cross_entropy(DecoderOutput(ReadOut(f, layer), None), targets)
              for f in features]
    torch.autograd.backward(losses)
    for f, loss in zip(features, losses):
        expected_grad = f.grad
        f.grad = None
        reference = F.cross_entropy(layer(f).reshape(-1, 25), targets.reshape(-1),
                                    reduction="sum")
        reference.backward()
        torch.testing.assert_close(loss, reference)
        torch.testing.assert_close(expected_grad, f.grad)
    kept = WORKSPACE._free[(torch.device("cpu"), torch.float32)]
    with torch.no_grad():
        output_cross_entropy(DecoderOutput(ReadOut(features[0], layer), None), targets)
    assert WORKSPACE._free[(torch.device("cpu"), torch.float32)] is kept
