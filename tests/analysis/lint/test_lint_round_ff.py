"""Round FF's false default findings (docs/lint_corpus.md: 39 fresh repositories, 1.15 M lines), each reduced
to its data flow, with the twins right next to them that must still be flagged by default."""

from __future__ import annotations

import textwrap

from torchmem.lint import lint_source


def found(src: str, path: str = "train.py") -> list[tuple[str, str, str]]:
    return [(f.code, f.form, f.severity) for f in lint_source(textwrap.dedent(src), path)]


# -- A. UoA-CARES (CTD4, REDQ): a list made afresh per update call, one output per ensemble critic ----------
ENSEMBLE = """
import torch
import torch.nn.functional as F


class Agent:
    def __init__(self, critics, optimizers):
        self.critics = critics
        self.optimizers = optimizers

    def update_critic(self, states, actions, q_target):
        q_set = []
        for critic, opt in zip(self.critics, self.optimizers):
            q_values = critic(states, actions)
            q_set.append(q_values)
            loss = F.mse_loss(q_values, q_target)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            spread = torch.stack(q_set).std(dim=0).mean().item()
        return {"q_spread": spread}
"""


def test_a_per_call_list_over_the_members_of_an_ensemble_is_not_shown_by_default() -> None:
    # each iteration steps its own optimizer: the loop walks a fixed collection of critics, not the steps of
    # a run; the list is made afresh by each call and dropped at return. At most an `--all` finding
    assert found(ENSEMBLE) == [("TM001", "output-in-step", "info")]
    # the optimizer picked by the loop's index (`opt = self.optimizers[i]`, or `self.optimizers[i].step()`)
    by_index = ENSEMBLE.replace(
        "for critic, opt in zip(self.critics, self.optimizers):",
        "for i, critic in enumerate(self.critics):\n            opt = self.optimizers[i]",
    )
    assert found(by_index) == [("TM001", "output-in-step", "info")]
    stepped = ENSEMBLE.replace(
        "for critic, opt in zip(self.critics, self.optimizers):", "for i, critic in enumerate(self.critics):"
    ).replace("opt.step()", "self.optimizers[i].step()")
    assert found(stepped) == [("TM001", "output-in-step", "info")]
    # a loss total over the members: the same, in its backward-ran shape
    total = """
    def update(critics, optimizers, x, y):
        total = 0
        for critic, opt in zip(critics, optimizers):
            loss = ((critic(x) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss
        return {"loss": total.item()}
    """
    assert found(total) == [("TM001", "backward-in-step", "info")]


def test_the_same_list_kept_across_batches_or_handed_out_is_still_flagged() -> None:
    # must: the list made before the loop over batches, the ensemble loop inside it: it grows every step
    across = """
    import torch.nn.functional as F


    def train(critics, optimizers, loader):
        q_hist = []
        for states, actions, q_target in loader:
            for critic, opt in zip(critics, optimizers):
                q_values = critic(states, actions)
                q_hist.append(q_values)
                loss = F.mse_loss(q_values, q_target)
                opt.zero_grad()
                loss.backward()
                opt.step()
        return len(q_hist)
    """
    assert found(across) == [("TM001", "output-kept", "warning")]
    # one optimizer stepped by a loop over data: the plain training loop
    plain = """
    import torch.nn.functional as F


    def train(critic, opt, loader):
        q_hist = []
        for states, actions, q_target in loader:
            q_values = critic(states, actions)
            q_hist.append(q_values)
            loss = F.mse_loss(q_values, q_target)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return len(q_hist)
    """
    assert found(plain) == [("TM001", "output-kept", "warning")]
    # the per-call list returned to the caller, or kept on the agent: it leaves the call
    for leaves in ("return q_set", "self.history.append(q_set)", "self.last = q_set"):
        src = ENSEMBLE.replace('return {"q_spread": spread}', leaves)
        assert found(src) == [("TM001", "output-kept", "warning")], leaves


# -- B. PyContinual: `buf_inputs = buf_inputs`, and a value read afresh in the same arm ------------------
REPLAY = """
import torch


class Appr:
    def train_epoch(self, t, iter_bar):
        self.model.train()
        for step, batch in enumerate(iter_bar):
            x, y = batch
            if not self.buffer.is_empty():
                buf_inputs, buf_labels = self.buffer.get_data(self.buffer_size)
{lines}
                x = torch.cat([x, buf_inputs])
                y = torch.cat([y, buf_labels])
            for s_step in range(self.s_steps):
                self.optimizer.zero_grad()
                output = self.model(x)
                loss = self.criterion(output, y)
                loss.backward(retain_graph=True)
                self.optimizer.step()
"""


def test_a_self_assignment_and_a_rebinding_of_a_fresh_read_carry_nothing_between_iterations() -> None:
    # as PyContinual's cnn_acl writes it: a no-op line, then a conversion of what the buffer just returned
    lines = "                buf_inputs = buf_inputs\n                buf_labels = buf_labels.long()"
    assert found(REPLAY.format(lines=lines)) == []
    assert found(REPLAY.format(lines="                buf_inputs = buf_inputs")) == []
    # a self-assignment at the top of the loop body, with nothing bound afresh before it
    top = """
    import torch


    def train(model, optimizer, criterion, loader, memory):
        for x, y in loader:
            memory = memory
            out = model(torch.cat([x, memory]))
            loss = criterion(out, y)
            optimizer.zero_grad()
            loss.backward(retain_graph=True)
            optimizer.step()
    """
    assert found(top) == []


def test_state_the_loop_really_carries_into_the_retained_backward_is_still_flagged() -> None:
    # must: the same loop where the memory is updated from its previous value by the model
    carried = """
    import torch


    def train(model, optimizer, criterion, loader, memory):
        for x, y in loader:
            memory = memory
            memory = model.update_memory(x, memory)
            out = model(torch.cat([x, memory]))
            loss = criterion(out, y)
            optimizer.zero_grad()
            loss.backward(retain_graph=True)
            optimizer.step()
    """
    assert found(carried) == [("TM004", "", "warning")]
    # a fresh value only under an `if` the update is not in: the other iterations read the last one's
    first_only = """
    def train(model, optimizer, criterion, loader, h0):
        for t, (x, y) in enumerate(loader):
            if t == 0:
                h = h0
            h = model.cell(x, h)
            loss = criterion(model.head(h), y)
            optimizer.zero_grad()
            loss.backward(retain_graph=True)
            optimizer.step()
    """
    assert found(first_only) == [("TM004", "", "warning")]


# -- C. rf-detr: one step's output dict converted in place, entry by entry ----------------------------------
EVALUATE = """
import torch


def evaluate(model, data_loader, fp16_eval=True):
    model.eval()
    stats = []{init}
    for samples, targets in data_loader:
        outputs = model(samples)
        if fp16_eval:
            for key in outputs.keys():
                if key == "enc_outputs":
                    for sub_key in outputs[key].keys():
                        outputs[key][sub_key] = outputs[key][sub_key].float()
                elif key == "aux_outputs":
                    for idx in range(len(outputs[key])):
                        for sub_key in outputs[key][idx].keys():
                            outputs[key][idx][sub_key] = outputs[key][idx][sub_key].to(torch.float32)
                else:
                    outputs[key] = outputs[key].float()
{extra}
        stats.append(outputs["pred_logits"].argmax(-1).eq(targets).float().mean().item())
    return sum(stats) / len(stats)
"""


def test_an_in_place_conversion_of_one_steps_output_entries_keeps_nothing() -> None:
    # each entry replaced once by its own conversion; `outputs` is rebound by the next batch's forward.
    # What remains is the loop itself, run with autograd on in eval() mode: TM002, as round FF's
    # reader judged rf-detr's `evaluate()` (called without no_grad for the EMA and test runs)
    assert found(EVALUATE.format(init="", extra="")) == [("TM002", "eval-mode", "warning")]


def test_outputs_kept_across_batches_next_to_the_conversion_are_still_flagged() -> None:
    # must: the converted logits appended to a list made before the loop over batches
    kept = EVALUATE.format(init="\n    kept = []", extra='        kept.append(outputs["pred_logits"])')
    assert found(kept) == [("TM010", "eval-mode", "warning")]
    # a dict made before the loop whose entries take each batch's outputs: not a conversion of themselves
    for update in ("totals[key] + outputs[key]", "totals[key].add(outputs[key])"):
        extra = f"        for key in outputs:\n            totals[key] = {update}"
        src = EVALUATE.format(init="\n    totals = {}", extra=extra)
        assert found(src) == [("TM010", "eval-mode", "warning")], update


# -- found by the re-run of round CC: UniVLA's `ActionDecoder`, whose forward returns `np.argmax(...)` -------
# (round FF's fix for TM004 no longer takes `frame = f(frame)` after `frame = g(obs)` in the same `if` arm for
# carried state; that state had kept TM010 silent on the episode's `action_list` and left the true TM002)
DECODER = """
import numpy as np
import torch
import torch.nn as nn


class ActionDecoder(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, 4)

    def forward(self, latent):
        pred = torch.softmax(self.proj(latent), dim=-1)
        pred = np.array(pred.cpu().tolist())
{ret}


def evaluate(env, policy, dim, episodes, max_steps):
    action_decoder = ActionDecoder(dim)
    action_decoder.eval()
    for episode in range(episodes):
        obs = env.reset()
        actions = []
        for step in range(max_steps):
            action = action_decoder(policy(obs))
            obs = env.step(action)
            actions.append(action)
            if obs is None:
                break
"""


def test_a_model_of_this_file_whose_forward_returns_an_array_keeps_no_graph_in_a_list() -> None:
    # the kept actions are NumPy values; what remains is the forward run with autograd on in eval() mode
    for ret in (
        "        return np.argmax(pred, axis=-1)[0][0]",
        "        action = np.argmax(pred, axis=-1)\n        action = action[0][0]\n        return action",
    ):
        assert found(DECODER.format(ret=ret)) == [("TM002", "eval-mode", "warning")], ret


def test_a_model_of_this_file_whose_forward_returns_a_tensor_is_still_kept_with_its_graph() -> None:
    # must: the forward returns the tensor itself (or a tensor entry), so each kept action holds its graph
    for ret in ("        return self.proj(latent)", "        return self.proj(latent)[0]"):
        assert found(DECODER.format(ret=ret)) == [("TM010", "eval-mode", "warning")], ret
