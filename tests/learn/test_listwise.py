"""The listwise objective: soft targets from the simulator's values, the policy's distribution over
legal actions (the constrained decoder's trie), and training that moves it toward the targets."""

import math
from importlib.util import find_spec

import pytest

from socialworld.learn.pairs.record import Candidate, Pair
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
    from socialworld.learn.trainers.common import load_trainable

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
    assert row_loss(model, [build_row(pair({"inquire(ann, food)": 0.0}), tok, 0.05, 0.05, 4096)], pad, 0.2).item() > 0


def _logps(model, row, pad) -> list[float]:
    """log P(candidate) of each block of ``row``, from a forward pass of the row (the trainer's own arithmetic)."""
    import torch

    from socialworld.learn.listwise import _block_logps, _forward

    with torch.no_grad():
        return [float(x) for x in _block_logps(_forward(model, [row], pad), 0, row)]


@needs_torch
@pytest.mark.parametrize("layers", [None, [1]])
def test_an_activated_adapter_scores_candidates_as_peft_runs_it(tiny_dir, layers):
    """With an activated adapter (PEFT's aLoRA) the trainer reads the prompt under the base model
    and the replies under the adapter: each block's log-probability is the one from PEFT's own
    forward over the prompt and that candidate alone; in a batch of two rows of other lengths too.
    From the store, with LoRA on every layer or on the upper one only (then the store keeps that
    layer's prompt KV and the replies' hidden states entering it, and the lower layer never runs)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from socialworld.learn.listwise import PromptKV, _block_logps, _forward, build_row, frozen_below, invocation
    from socialworld.learn.trainers.common import assistant_header, load_trainable

    model, tok = load_trainable(tiny_dir)
    torch.manual_seed(3)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=512, target_modules=["q_proj", "v_proj"], init_lora_weights=False,
                                             layers_to_transform=layers, alora_invocation_tokens=assistant_header(tok),
                                             task_type="CAUSAL_LM"))
    assert invocation(model) == assistant_header(tok)
    first = frozen_below(model)
    assert first == (0 if layers is None else 1)
    model.eval()
    pad = tok.pad_token_id
    two = build_row(pair({"inquire(ann, food)": 0.0, "propose(food, pizza, all)": 1.0}), tok, 0.05, 0.05, 4096)
    other = pair({"wait()": 0.0}, chosen="wait()")
    other = other.model_copy(update={"prompt": other.prompt + [{"role": "assistant", "content": "ACTION: wait()"},
                                                               {"role": "user", "content": "Turn 2/5. Bo says hi."}]})
    one = build_row(other, tok, 0.05, 0.05, 4096)

    def alone(row, block: int) -> float:
        """log P(block's candidate) by PEFT's forward over the shared prefix and that block"""
        s, e = row.blocks[block]
        ids = row.ids[: row.blocks[0][0]] + row.ids[s:e]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()
        shift = row.blocks[0][0] - s
        total = 0.0
        for ci, at, allowed, t in row.choices:
            if ci == block:
                i = at if at < row.blocks[0][0] else at + shift
                total += float(torch.log_softmax(logits[i, allowed], -1)[allowed.index(t)])
        return total

    with torch.no_grad():
        batched = _forward(model, [two, one], pad)
        got = [[float(x) for x in _block_logps(batched, b, r)] for b, r in enumerate((two, one))]
    assert got[0] == pytest.approx([alone(two, 0), alone(two, 1)], abs=1e-4)
    assert got[1] == pytest.approx([alone(one, 0)], abs=1e-4)
    with torch.no_grad(), model.disable_adapter():
        assert [float(x) for x in _block_logps(_forward(model, [two], pad), 0, two)] != pytest.approx(got[0], abs=1e-3)
    # the prompts' KV kept across passes: the same log-probabilities, in another batch, from the store
    kept = PromptKV()
    with torch.no_grad():
        for rows in ([two, one], [one, two, one]):
            logits = _forward(model, rows, pad, kept)
            for b, r in enumerate(rows):
                want = got[0] if r is two else got[1]
                assert [float(x) for x in _block_logps(logits, b, r)] == pytest.approx(want, abs=1e-4)
    assert (kept.misses, kept.hits, len(kept._kv)) == (2, 3, 2) and kept.bytes > 0
    assert all(len(e.kv) == 2 - first for e in kept._kv.values())  # the adapted layers' prompt KV only
    if first:  # the lower layer runs in the reads alone
        calls = []
        hook = model.get_base_model().model.layers[0].register_forward_hook(lambda *a: calls.append(1))
        with torch.no_grad():
            _forward(model, [two, one], pad, kept)
        hook.remove()
        assert calls == [] and kept.hits == 5
    # their system message (the same in both) read once and kept apart; a prompt with another has its own
    assert two.shared == one.shared > 0 and list(kept._prefix) == [tuple(two.ids[: two.shared])]
    apart = pair({"wait()": 0.0}, chosen="wait()")
    apart = build_row(apart.model_copy(update={"prompt": [{"role": "system", "content": "Plan dinner for the whole team."}] + apart.prompt[1:]}),
                      tok, 0.05, 0.05, 4096)
    assert apart.shared != two.shared
    with torch.no_grad():
        want = _block_logps(_forward(model, [apart], pad), 0, apart)
        logits = _forward(model, [two, apart], pad, kept)
        assert [float(x) for x in _block_logps(logits, 1, apart)] == pytest.approx([float(x) for x in want], abs=1e-4)
        assert [float(x) for x in _block_logps(logits, 0, two)] == pytest.approx(got[0], abs=1e-4)
    assert len(kept._prefix) == 2
    alone_row = pair({"wait()": 0.0}, chosen="wait()")  # no system message: nothing shared, beside rows that share one
    alone_row = build_row(alone_row.model_copy(update={"prompt": alone_row.prompt[1:]}), tok, 0.05, 0.05, 4096)
    assert alone_row.shared == 0
    with torch.no_grad():
        want = _block_logps(_forward(model, [alone_row], pad), 0, alone_row)
        logits = _forward(model, [one, alone_row], pad, kept)
        assert [float(x) for x in _block_logps(logits, 1, alone_row)] == pytest.approx([float(x) for x in want], abs=1e-4)
        assert [float(x) for x in _block_logps(logits, 0, one)] == pytest.approx(got[1], abs=1e-4)
    # under bf16 autocast the keys are kept in bf16 (attention reads them so): the same scores, fewer bytes
    import socialworld.learn.listwise as listwise

    def scores(store):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            for _ in range(2):  # the second pass from the store
                logits = _forward(model, [two, one], pad, store)
            return [float(x) for b, r in enumerate((two, one)) for x in _block_logps(logits, b, r)]

    low = PromptKV()
    got_low = scores(low)
    listwise._kept, kept_as = (lambda t: t.clone()), listwise._kept
    try:
        as_computed = PromptKV()
        assert scores(as_computed) == got_low
    finally:
        listwise._kept = kept_as
    assert low.hits == as_computed.hits == 2 and low.bytes < as_computed.bytes
    assert {k.dtype for e in low._kv.values() for k, v in e.kv} == {torch.bfloat16}
    tight = PromptKV(max_bytes=kept.bytes // 2)  # room for the prefix and one prompt's KV: the other is read each time
    with torch.no_grad():
        _forward(model, [two, one], pad, tight)
        _forward(model, [two, one], pad, tight)
    assert len(tight._kv) == 1 and tight.misses == 3 and tight.bytes <= tight.max_bytes
    # one row read at a time: what is kept of a row is the same, bit for bit, whatever it was read beside
    beside, by_itself = PromptKV(), PromptKV()
    beside.begin(model, "float32", [two, one, apart])
    with torch.no_grad():
        _forward(model, [two, one], pad, beside)
        _forward(model, [one], pad, by_itself)
    key = next(k for k in beside._kv if k[1] == tuple(one.ids))
    assert torch.equal(beside._kv[key].hidden, by_itself._kv[key].hidden)
    assert all(torch.equal(a, b) for (k1, v1), (k2, v2) in zip(beside._kv[key].kv, by_itself._kv[key].kv) for a, b in ((k1, k2), (v1, v2)))
    # kept across training runs: the next run keeps the rows it trains on, drops the others, and counts again
    beside.begin(model, "float32", [one, apart])
    assert [k[1] for k in beside._kv] == [tuple(one.ids)] and beside.hits == beside.misses == 0
    with torch.no_grad():
        assert [float(x) for x in _block_logps(_forward(model, [one], pad, beside), 0, one)] == pytest.approx(got[1], abs=1e-4)
    assert (beside.hits, beside.misses) == (1, 0)
    beside.begin(model, "bfloat16", [one])  # a run computing in another dtype: nothing carried over
    assert not beside._kv and not beside._prefix and beside.bytes == 0


@needs_torch
@pytest.mark.parametrize("activated", [False, True])
def test_training_raises_the_probability_of_the_higher_valued_candidate(tiny_dir, tmp_path, activated):
    """A few listwise steps on states where the simulator's values favour another action than the
    label: that action's probability over the legal set rises (an activated adapter too)."""
    import torch

    from socialworld.learn.config import TrainConfig
    from socialworld.learn.documents import read_train_record
    from socialworld.learn.listwise import build_row, invocation
    from socialworld.learn.train import train_adapter
    from socialworld.learn.trainers.common import TrainingSet, load_trainable

    better = {"inquire(ann, food)": 0.2, "propose(food, pizza, all)": 0.6, "wait()": 0.0}
    pairs = [pair(better)]
    cfg = TrainConfig(method="listwise", steps=12, batch_size=1, learning_rate=5e-3, lora_r=4, activated=activated)
    model, tok = load_trainable(tiny_dir)
    row = build_row(pairs[0], tok, cfg.value_temperature, cfg.value_margin, cfg.max_length)
    target = "propose(food, pizza, all)"
    assert max(zip(row.probs, ("inquire(ann, food)", target)))[1] == target
    with torch.no_grad():
        before = _logps(model, row, tok.pad_token_id)[1]
    res = train_adapter(tiny_dir, tmp_path / "a", cfg, TrainingSet(tuple(pairs)))
    assert res.steps == 12 and res.record == read_train_record(tmp_path / "a")  # what it returns is what it saved
    trained, _ = load_trainable(tiny_dir, tmp_path / "a")
    assert (invocation(trained) is not None) == activated
    with torch.no_grad():
        after = _logps(trained, row, tok.pad_token_id)[1]
    assert after > before + 0.5


@needs_torch
def test_at_weight_zero_the_loss_is_the_words_alone(tiny_dir):
    """W = 0 (the dialogue track's words): the loss is the belief and SAY lines' likelihood, the
    W = 1 loss less exactly the decision's listwise term."""
    import torch
    from peft import LoraConfig, get_peft_model

    from socialworld.learn.listwise import _block_logps, _forward, build_row, row_loss
    from socialworld.learn.trainers.common import assistant_header, load_trainable

    model, tok = load_trainable(tiny_dir)
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False,
                                             alora_invocation_tokens=assistant_header(tok), task_type="CAUSAL_LM"))
    rows = [build_row(pair(v), tok, 0.05, 0.05, 4096) for v in ({"inquire(ann, food)": 0.0, "propose(food, pizza, all)": 1.0},
                                                                 {"inquire(ann, food)": 0.0})]
    pad = tok.pad_token_id
    with torch.no_grad():
        words, both = (float(row_loss(model, rows, pad, w)) for w in (0.0, 1.0))
        logits = _forward(model, rows, pad)
        decision = sum(-sum(p * float(lp) for p, lp in zip(r.probs, _block_logps(logits, b, r))) for b, r in enumerate(rows)) / len(rows)
    assert decision > 0.1 and both == pytest.approx(words + decision, abs=1e-4)


@needs_torch
@pytest.mark.parametrize("bf16", [False, True])
def test_the_replies_run_as_plain_lora_with_peft_alora_s_loss_and_gradients(tiny_dir, bf16, monkeypatch):
    """An activated adapter's replies follow their invocation everywhere, so PEFT's aLoRA path masks
    nothing: the trainer runs them as plain LoRA (no per-token select and scatter, no float32 round
    trip under autocast). The loss and every gradient are PEFT's own aLoRA path's, bit for bit, fresh
    and from the store; the layers are aLoRA again after."""
    import contextlib

    import torch
    from peft import LoraConfig, get_peft_model

    import socialworld.learn.listwise as listwise
    from socialworld.learn.listwise import PromptKV, build_row, row_loss
    from socialworld.learn.trainers.common import assistant_header, load_trainable

    model, tok = load_trainable(tiny_dir)
    torch.manual_seed(5)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=32, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False,
                                             layers_to_transform=[1], alora_invocation_tokens=assistant_header(tok), task_type="CAUSAL_LM"))
    rows = [build_row(pair({"inquire(ann, food)": 0.0, "propose(food, pizza, all)": 1.0}), tok, 0.05, 0.05, 4096),
            build_row(pair({"wait()": 0.0}, chosen="wait()"), tok, 0.05, 0.05, 4096)]
    params = [p for p in model.parameters() if p.requires_grad]

    def run(store):
        got = []
        for _ in range(2):  # the second pass from the store, where there is one
            model.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = row_loss(model, rows, tok.pad_token_id, 1.0, store)
            loss.backward()
            got.append((loss.detach().clone(), [p.grad.clone() for p in params]))
        return got

    fast = run(None) + run(PromptKV())
    variants = {id(m): dict(m.lora_variant) for m in model.modules() if getattr(m, "lora_variant", None)}
    assert variants and all(v for v in variants.values())  # aLoRA again after the forward
    monkeypatch.setattr(listwise, "_all_tokens_active", lambda model: contextlib.nullcontext())
    slow = run(None) + run(PromptKV())
    for (l1, g1), (l2, g2) in zip(fast, slow):
        assert torch.equal(l1, l2) and all(torch.equal(a, b) for a, b in zip(g1, g2))
