"""Public test helpers: a tiny scenario, a fixed-script policy, and hidden-state setters.

They let users (and our own tests) build small hand-made states and check an action's exact
effect, the way PettingZoo ships its conformance tests.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from socialworld.core import Action, Decision, MentalState, Observation
from socialworld.world.engine import World
from socialworld.world.spec import ScenarioSpec, parse_spec
from socialworld.world.voice import VoiceReply, VoiceRequest


def tiny_spec_data(**overrides) -> dict:
    """A two-NPC, one-decision scenario (as a mapping, so tests can break it on purpose)."""
    data = {
        "id": "tiny-v1",
        "name": "Tiny",
        "tier": "L0",
        "setting": "Two friends choose a film.",
        "role": "You pick the film.",
        "goal": "Agree on a film.",
        "turn_budget": 8,
        "t_ref": 4,
        "npcs": [
            {"id": "ann", "name": "Ann", "profile": "likes drama", "style": "warm",
             "traits": {"openness": 0.9, "agreeableness": 0.5, "sensitivity": 0.5, "influence": 0.5},
             "threshold": [0.5, 0.5], "mood": [0.5, 0.5],
             "secret": {"text": "I am moving abroad.", "keywords": ["abroad"]},
             "preferences": {"film": {"drama": [0.8, 0.8], "comedy": [0.4, 0.4], "horror": [0.1, 0.1]}}},
            {"id": "bob", "name": "Bob", "profile": "likes comedy", "style": "blunt",
             "traits": {"openness": 0.9, "agreeableness": 0.5, "sensitivity": 0.5, "influence": 0.5},
             "threshold": [0.5, 0.5], "mood": [0.5, 0.5],
             "preferences": {"film": {"drama": [0.45, 0.45], "comedy": [0.8, 0.8], "horror": [0.3, 0.3]}}},
        ],
        "slots": [{"id": "film", "label": "film", "options": [
            {"id": "drama", "label": "Drama"}, {"id": "comedy", "label": "Comedy"},
            {"id": "horror", "label": "Horror", "tags": ["scary"]}]}],
        # one decision and two guards: deliberately minimal; see check_scenario's idle check
        "offers": [{"id": "treat", "kind": "goodwill", "text": "I'll buy the popcorn", "value": 0.1}],
        "guards": ["no_secret_leaked", "good_relations"],
    }
    data.update(overrides)
    return data


def tiny_spec(**overrides) -> ScenarioSpec:
    return parse_spec(tiny_spec_data(**overrides), "<tiny>")


def set_hidden(world: World, npc: str, *, slot: str | None = None, utilities: dict[str, float] | None = None,
               vetoes: Sequence[str] = (), threshold: float | None = None, mood: float | None = None,
               engagement: float | None = None) -> None:
    """Overwrite hidden values of one NPC (for hand-built test states)."""
    h = world.hid[npc]
    if slot is not None and utilities is not None:
        h.utilities = {**h.utilities, slot: dict(utilities)}
        h.vetoes = {**h.vetoes, slot: frozenset(vetoes)}
    if threshold is not None:
        h.threshold = threshold
    if mood is not None:
        h.mood = mood
    if engagement is not None:
        h.engagement = engagement


class FixedPolicy:
    """Plays a fixed list of action texts (canonical form, ``|`` then the utterance), then
    ``end()``. Text that does not parse becomes an unparseable decision, as from an LM."""

    policy_id = "fixed"

    def __init__(self, script: Sequence[str], mental_state: MentalState | None = None):
        self.script = list(script)
        self.mental_state = mental_state or MentalState()
        self._pos: dict[str, int] = {}

    def reset(self, episode_keys: Sequence[str]) -> None:
        for k in episode_keys:
            self._pos[k] = 0

    def act(self, episode_keys: Sequence[str], observations: Sequence[Observation]) -> list[Decision]:
        out = []
        for k in episode_keys:
            i = self._pos.get(k, 0)
            self._pos[k] = i + 1
            raw = self.script[i] if i < len(self.script) else "end() | Bye everyone, thanks."
            text, _, utterance = raw.partition("|")
            try:
                a = Action.parse(text.strip(), utterance.strip())
                out.append(Decision(a, self.mental_state, raw=raw))
            except ValueError as err:
                out.append(Decision(None, None, raw=raw, parse_error=str(err)))
        return out


@dataclass
class ScriptedVoice:
    """An NPC voice (:class:`~socialworld.world.voice.Voice`) from a function of each request: ``words(req)``
    is the line; an exception it raises stands for a failed call (its message becomes the reply's error).
    ``requests`` keeps every request it was asked, in order."""

    words: Callable[[VoiceRequest], str]
    voice_id: str = "scripted"
    decoding: dict[str, Any] = field(default_factory=lambda: {"strategy": "scripted"})
    requests: list[VoiceRequest] = field(default_factory=list)

    def speak(self, requests: Sequence[VoiceRequest]) -> list[VoiceReply]:
        out = []
        for r in requests:
            self.requests.append(r)
            try:
                out.append(VoiceReply(self.words(r), prompt_hash="scripted"))
            except Exception as err:  # noqa: BLE001 -- a failed call, recorded as the reply's error
                out.append(VoiceReply("", prompt_hash="scripted", error=str(err)))
        return out


def drive(world: World, policy, steps: int | None = None, key: str = "k") -> World:
    """Advance ``world`` with ``policy`` for ``steps`` steps (or to the end); returns the world.
    Hands hidden views only to privileged policies, like the runner."""
    from socialworld.rollout.runner import decide
    from socialworld.world.visibility import observe

    policy.reset([key])
    n = 0
    while not world.done and (steps is None or n < steps):
        d = decide(policy, [key], [world], [observe(world.spec, world.pub)])[0]
        world.step(d.action, parse_error=d.parse_error)
        n += 1
    return world


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_corpus() -> list[str]:
    """The text :func:`tiny_lm`'s tokenizer is trained on: every template string (each policy system
    message once) and the shipped scenarios. Only the templates' own names: a module's ``__file__`` would make the tokenizer,
    and so every tiny model's output, depend on where the repository is checked out."""
    from socialworld.text import templates
    from socialworld.world.spec import load_builtin_scenarios

    corpus = [t for k, t in vars(templates).items() if isinstance(t, str) and not k.startswith("__")]
    corpus += [str(v) for d in (templates.NPC_REPLIES, templates.AGENT_UTTERANCES) for v in d.values()]
    corpus += list(dict.fromkeys(p.system for p in templates.POLICY_PROMPTS.values()))  # each once: a new prompt version
    return corpus + [s.model_dump_json() for s in load_builtin_scenarios().values()]  # on an old system text changes nothing


def tiny_lm(folder, seed: int = 0, vocab_size: int = 600):
    """Build and save a tiny random causal LM with an in-process byte-level BPE tokenizer
    (trained on the project's own scenario and template text, ChatML chat template) into
    ``folder``; returns the folder. Never downloads anything. The same ``seed`` gives the same model
    wherever the repository lies; torch's global generator is left as it was."""
    from pathlib import Path

    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = Path(folder)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(tiny_corpus(), vocab_size=vocab_size, min_frequency=1,
                            special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", unk_token="<|endoftext|>")
    tok.chat_template = CHATML
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng(devices=[]):  # the init draws from torch's global generator: seed it, then give it back
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def random_adapter(base, folder, seed: int = 1, base_name: str | None = None):
    """Save a LoRA adapter with random (not zero) weights for the model in ``base`` into
    ``folder``, as a trained one would be saved (its config naming ``base_name``, default the
    folder ``base``); a stand-in for a trained policy that changes what the model says. Returns
    ``folder``."""
    import json
    from pathlib import Path

    import torch
    from peft import LoraConfig, get_peft_model

    from socialworld.agents.models import load_hf

    torch.manual_seed(seed)
    cfg = LoraConfig(r=4, lora_alpha=512, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False)
    get_peft_model(load_hf(base, dtype="float32")[0], cfg).save_pretrained(folder)
    path = Path(folder) / "adapter_config.json"
    doc = json.loads(path.read_text())
    doc["base_model_name_or_path"] = str(base) if base_name is None else base_name
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return Path(folder)


@contextmanager
def serving(app):
    """Serve an ASGI ``app`` (e.g. :func:`socialworld.agents.lm.server.make_app`) with uvicorn on a free
    local port in a background thread; yields its ``http://127.0.0.1:<port>/v1`` base URL."""
    from socialworld.agents.lm.server import in_background

    with in_background(app) as url:
        yield f"{url}/v1"


@contextmanager
def stub_endpoint(reply):
    """A local stand-in for an OpenAI-compatible endpoint, on a free port in a background thread.
    ``reply(request, headers)`` gets each POST's JSON body and its headers and returns ``(status,
    extra response headers, body)``, the body a dict (sent as JSON) or bytes. Yields the
    ``http://127.0.0.1:<port>/v1`` base URL."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def do_POST(self):  # noqa: N802
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
            code, headers, body = reply(request, self.headers)
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()  # shutdown waits one poll
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def reading_reply(messages: list[dict]) -> str:
    """A deterministic reply in the policy's format from a conversation's system message (the
    decisions' options) and its last user message (the turn, who is here, which decisions are
    open) alone, under any prompt version: at turn k, for the first open decision, ``inquire`` the (k mod n)-th person present
    on odd turns, ``propose`` its first option to all on even ones, ``finalize`` it every fourth;
    ``end()`` once none is open. Not a good policy: one whose replies depend on the state alone, so
    a growing conversation and a fresh prompt per state give the same episode."""
    import re

    system, last = messages[0]["content"], messages[-1]["content"]
    options = dict(re.findall(r"^(\w+): (?:options )?(\w+)[ |\n]", system + "\n", re.M))  # policy-v6's brief, or v8's
    turn = int(m.group(1)) if (m := re.search(r"Turn (\d+)/", last)) else 1
    line = re.search(r"^(?:Here|Moods): (.*)$", last, re.M)
    here = re.findall(r"(\w+) (?:\(|\?|low\b|mid\b|high\b)", line.group(1)) if line else []
    open_ = [d for d in re.findall(r"^(\w+): open", last, re.M) if d in options]
    if not open_:
        return "ACTION: end()"
    d = open_[0]
    if turn % 4 == 0:
        return f"ACTION: finalize({d}, {options[d]})"
    if turn % 2 == 0 or not here:
        return f"ACTION: propose({d}, {options[d]}, all)\nSAY: How about {options[d]}?"
    return f"ACTION: inquire({here[turn % len(here)]}, {d})\nSAY: What would you like?"


def chat_stub(reply_text):
    """A ``stub_endpoint`` reply function for ``/chat/completions``: the text ``reply_text(messages)``
    as one choice, streamed as server-sent events when the request asks (one content chunk, a
    finish chunk, a usage chunk, ``[DONE]``)."""
    import json

    def reply(request, headers):
        text = reply_text(request["messages"])
        base = {"id": "stub", "created": 0, "model": request.get("model", "stub")}
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        if not request.get("stream"):
            return 200, {}, {**base, "object": "chat.completion", "usage": usage,
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}
        chunks = [{"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": None},
                  {"index": 0, "delta": {}, "finish_reason": "stop"}]
        events = [{**base, "object": "chat.completion.chunk", "choices": [c]} for c in chunks]
        events.append({**base, "object": "chat.completion.chunk", "choices": [], "usage": usage})
        body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return 200, {"Content-Type": "text/event-stream"}, body.encode()

    return reply


def write_user_scenario(path, base="team_lunch", id="my_lunch-v1", name="My team lunch"):
    """A user's scenario file outside the package: a copy of a shipped one with its own id and name."""
    import yaml

    from socialworld.world.spec import builtin_scenario_files

    (src,) = [p for p in builtin_scenario_files() if p.stem == base]
    data = yaml.safe_load(src.read_text())
    data.update(id=id, name=name)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def lora_b(folder) -> dict:
    """The LoRA B weights of the adapter saved in ``folder`` (PEFT's ``adapter_model.safetensors``), by name:
    zero when an adapter starts, so they show whether it trained and which layers it adapts."""
    from safetensors.torch import load_file

    return {k: v for k, v in load_file(f"{folder}/adapter_model.safetensors").items() if "lora_B" in k}
