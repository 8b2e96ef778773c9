"""The public test helpers: the tiny model is the same wherever the repository lies."""

from importlib.util import find_spec

import pytest

from socialworld.testing import tiny_corpus


def test_the_tiny_tokenizers_text_does_not_depend_on_the_checkout_path(monkeypatch):
    from socialworld.text import templates

    before = tiny_corpus()
    assert templates.POLICY_PROMPTS["policy-v5"].system in before
    monkeypatch.setattr(templates, "__file__", "/somewhere/else/src/socialworld/text/templates.py")
    monkeypatch.setattr(templates, "__cached__", "/somewhere/else/templates.cpython-311.pyc", raising=False)
    assert tiny_corpus() == before
    assert not any("/" in t and t.endswith((".py", ".pyc")) for t in before)


@pytest.mark.skipif(not find_spec("transformers"), reason="needs the lm extra")
def test_tiny_lm_is_reproducible_and_leaves_torchs_generator_alone(tmp_path):
    import torch
    from safetensors.torch import load_file

    from socialworld.testing import tiny_lm

    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    a, b = tiny_lm(tmp_path / "a"), tiny_lm(tmp_path / "b")
    assert torch.equal(torch.random.get_rng_state(), state)
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()
