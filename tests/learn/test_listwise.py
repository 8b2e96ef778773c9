"""The listwise objective: soft targets from the simulator's values, the policy's distribution over
legal actions (the constrained decoder's trie), and training that moves it toward the targets."""

import math
from importlib.util import find_spec

import pytest

from socialworld.learn.sleep import Candidate, Pair
from socialworld.text.reply import render_turn

needs_torch = pytest.mark.skipif(find_spec("peft") is None, reason="needs the train extra")

LEGAL = ["wait()", "end()", "inquire(ann, food)", "inquire(bo, food)", "propose(food, pizza, all)", "propose(food, sushi, all)",
         "finalize(food, pizza)"]


def pair(values: dict[str, float], chosen: str = "inquire(ann, food)", legal=LEGAL) -> Pair:
    turn = render_turn("BELIEF: ann food=pizza mood=mid", chosen, "Ann, what would you like?")
    return Pair(id="p", track="action", scenario_id="s", tier="L0", seed=1, step=0, episode_id="e",
                prompt=[{"role": "system", "content": "Plan lunch."}, {"role": "user", "content": "Turn 1/5. Here: ann, bo"}],
                chosen=[{"role": "assistant", "content": turn}], rejected=[{"role": "assistant", "content": "ACTION: wait()"}],
                chosen_value=values.get(chosen, 0.0), rejected_value=0.0, quality=1.0, provenance="test",
                evidence={"U": "direct", "A_e": "direct", "S_npc": "fused", "D": "fused", "ranking": "direct"},
                template_key="k", chosen_by="reference",
                candidates=[Candidate(key=k, value=v) for k, v in values.items()], legal=legal)


def test_targets_keep_the_label_unless_a_candidate_beats_it_by_the_margin():
    from socialworld.learn.listwise import targets

    assert targets(pair({"inquire(ann, food)": 0.5, "inquire(bo, food)": 0.53, "wait()": 0.1}), 0.05, 0.05) == \
        {"inquire(ann, food)": 1.0}  # a tie (within the margin) leaves the label alone
    t = targets(pair({"inquire(ann, food)": 0.5, "propose(food, pizza, all)": 0.6, "wait()": 0.1}), 0.05, 0.05)
    assert set(t) == {"inquire(ann, food)", "propose(food, pizza, all)"} and sum(t.values()) == pytest.approx(1)
    assert t["propose(food, pizza, all)"] / t["inquire(ann, food)"] == pytest.approx(math.exp(0.1 / 0.05))
    assert targets(pair({}), 0.05, 0.05) == {"inquire(ann, food)": 1.0}  # no values recorded: the label alone


@needs_torch
def test_the_trie_distribution_is_over_the_legal_actions_and_blocks_score_like_separate_rows(tiny_dir):
    """P(a|s) from the row's branch points sums to 1 over the legal actions; a candidate scored in
    a block beside others gets the same probability as alone (the 4-D mask isolates blocks)."""
    import torch

    from socialworld.learn.listwise import build_row, row_loss
    from socialworld.learn.train import load_trainable

    model, tok = load_trainable(tiny_dir)
    pad = tok.pad_token_id

    def prob(key: str, values: dict[str, float], chosen: str) -> float:
        """P(key) in the row of a pair labelled ``chosen`` with ``values`` (blocks: chosen first)"""
        row = build_row(pair(values, chosen), tok, 0.05, 0.05, 4096)
        i = 0 if key == chosen else 1
        with torch.no_grad():
            logp = _logps(model, row, pad)
        return math.exp(logp[i])

    total = sum(prob(k, {k: 1.0}, k) for k in LEGAL)
    assert total == pytest.approx(1.0, abs=1e-4)
    alone = prob("propose(food, pizza, all)", {"propose(food, pizza, all)": 1.0}, "propose(food, pizza, all)")
    beside = prob("propose(food, pizza, all)", {"inquire(ann, food)": 0.0, "propose(food, pizza, all)": 1.0}, "inquire(ann, food)")
    assert beside == pytest.approx(alone, rel=1e-4)
    assert row_loss(model, [build_row(pair({"inquire(ann, food)": 0.0}), tok, 0.05, 0.05, 4096)], pad).item() > 0


def _logps(model, row, pad) -> list[float]:
    """log P(candidate) of each block of ``row``, from a forward pass of the row (the trainer's own arithmetic)."""
    import torch

    from socialworld.learn.listwise import _block_logps, _forward

    with torch.no_grad():
        hidden, head = _forward(model, [row], pad)
        return [float(x) for x in _block_logps(head, hidden[0], row)]


@needs_torch
def test_training_raises_the_probability_of_the_higher_valued_candidate(tiny_dir, tmp_path):
    """A few listwise steps on states where the simulator's values favour another action than the
    label: that action's probability over the legal set rises."""
    import torch

    from socialworld.learn.config import TrainConfig
    from socialworld.learn.listwise import build_row
    from socialworld.learn.train import TRAIN_RECORD, load_trainable, train_adapter

    better = {"inquire(ann, food)": 0.2, "propose(food, pizza, all)": 0.6, "wait()": 0.0}
    pairs = [pair(better)]
    cfg = TrainConfig(method="listwise", steps=12, batch_size=1, learning_rate=5e-3, lora_r=4)
    model, tok = load_trainable(tiny_dir)
    row = build_row(pairs[0], tok, cfg.value_temperature, cfg.value_margin, cfg.max_length)
    target = "propose(food, pizza, all)"
    assert max(zip(row.probs, ("inquire(ann, food)", target)))[1] == target
    with torch.no_grad():
        before = _logps(model, row, tok.pad_token_id)[1]
    res = train_adapter(tiny_dir, tmp_path / "a", cfg, pairs=pairs)
    assert res.steps == 12 and (tmp_path / "a" / TRAIN_RECORD).exists()
    trained, _ = load_trainable(tiny_dir, tmp_path / "a")
    with torch.no_grad():
        after = _logps(trained, row, tok.pad_token_id)[1]
    assert after > before + 0.5
