"""Variations of a scenario: the same structure under other words, as a scenario writer would redraw
it. Every person gets another name (and id), every decision and option another word (and label);
everything else — preferences' distributions, traits, thresholds, costs, tags, offers, events,
guards, turn budget — is the scenario's own, so the variant is exactly as hard and plays by the same
rules. A student that learned the scenario's words (``tom`` wants ``thriller``) has nothing to
match on a variant; one that learned to read the state does (the held-out scenarios say which).

A variant is named by its scenario and its number, ``<name>_var<k>-v<n>``, and :func:`variant`
makes it again from the id alone: records and pairs made on variants name it, and any reader
resolves it (:func:`socialworld.world.spec.resolve_scenarios`). The words come from fixed pools
and a stream derived from (scenario id, k); nothing global is read.
"""

from __future__ import annotations

import re
from typing import Any

from socialworld.world.rng import WorldRNG, derive_seed

VARIANT_ID = re.compile(r"^(?P<name>[a-z0-9_]+?)_var(?P<k>\d+)-v(?P<n>\d+)$")
"""a variant's id: the scenario's name, ``_var`` and the variant's number, the scenario's version"""

NAMES = (
    "ada", "ben", "cleo", "dan", "eli", "fay", "gus", "hana", "ivo", "jade", "kai", "lena", "milo", "nina", "otto",
    "pia", "quinn", "ravi", "sara", "theo", "uma", "vic", "wes", "xena", "yara", "zack", "amir", "bria", "cody",
    "dora", "emil", "fern", "gia", "hugo", "iris", "jon", "kira", "luca", "maya", "noel", "olive", "pedro", "rita",
    "sam", "tara", "ugo", "vera", "will", "yusuf", "zora", "anya", "boris", "carla", "dev", "ella", "finn", "greta",
    "hal", "ines", "joel", "kemal", "lola", "mats", "nadia", "oren", "pablo", "rosie", "soren", "tess", "umar",
)
"""people's first names (ids lower-case, names capitalised)"""

WORDS = (
    "amber", "birch", "canyon", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper", "kestrel",
    "lagoon", "meadow", "nimbus", "orchid", "pebble", "quartz", "raven", "saffron", "tundra", "umber", "violet",
    "willow", "yonder", "zephyr", "acorn", "bramble", "cobalt", "dune", "echo", "falcon", "glacier", "hazel",
    "iris_hall", "jasper", "koala", "lantern", "maple", "nectar", "opal", "pine", "quill", "ridge", "summit",
    "thistle", "upland", "vista", "walnut", "yarrow", "zinnia", "anchor", "beacon", "cedar", "dawn", "elm",
    "fable", "grove", "heron", "isle", "jolly", "kelp", "lotus", "moss", "north", "oak", "prism", "quest", "reef",
    "sparrow", "tide", "unity", "valley", "wren", "yew", "zenith", "alder", "basil", "clover", "drift", "eagle",
    "flint", "gale", "holly", "ivy", "jet", "kite", "lark", "mint", "nova", "onyx", "plume", "rune", "sage",
    "topaz", "urchin", "vale", "wave", "yucca", "zest",
)
"""words for decisions and options (ids; labels capitalised)"""


def variant_id(spec_id: str, k: int) -> str:
    name, version = spec_id.rsplit("-v", 1)
    return f"{name}_var{k}-v{version}"


def parse_variant(spec_id: str) -> tuple[str, int] | None:
    """(the scenario's id, k) of a variant's id, or None for any other id."""
    m = VARIANT_ID.match(spec_id)
    return None if m is None else (f"{m['name']}-v{m['n']}", int(m["k"]))


def variant(spec: Any, k: int) -> Any:
    """Variant ``k`` (k >= 1) of ``spec`` (a :class:`~socialworld.world.spec.ScenarioSpec`): the same
    scenario under other names and words (see the module's text); the same ``(spec, k)`` gives the
    same variant."""
    if k < 1:
        raise ValueError(f"variant numbers start at 1, got {k}")
    rng = WorldRNG(derive_seed(spec.id, "variant", k))
    options = [o.id for s in spec.slots for o in s.options]
    own = {n.id for n in spec.npcs} | {s.id for s in spec.slots} | set(options) | {o.id for o in spec.offers} | {"all"}
    people = _draw(rng, NAMES, [n.id for n in spec.npcs], exclude=own)
    words = _draw(rng, WORDS, [s.id for s in spec.slots] + options, exclude=own | set(people.values()))
    names = {n.name: people[n.id].capitalize() for n in spec.npcs}
    labels = {o.label: _label(words[o.id]) for s in spec.slots for o in s.options} | {s.label: words[s.id].replace("_", " ") for s in spec.slots}
    doc = spec.model_dump(mode="json")
    doc["id"] = variant_id(spec.id, k)
    doc["name"] = f"{spec.name} (variant {k})"
    for n in doc["npcs"]:
        n["preferences"] = {words[slot]: {words.get(o, o): d for o, d in prefs.items()} for slot, prefs in n["preferences"].items()}
        n["id"], n["name"] = people[n["id"]], names[n["name"]]
    for s in doc["slots"]:
        if s["stakeholders"] != "all":
            s["stakeholders"] = [people[h] for h in s["stakeholders"]]
        s["id"], s["label"] = words[s["id"]], labels[s["label"]]
        for o in s["options"]:
            o["id"], o["label"] = words[o["id"]], labels[o["label"]]
    for o in doc["offers"]:
        if o.get("target_slot"):
            o["target_slot"] = words[o["target_slot"]]
    for e in doc["events"]:
        e["npc"] = people.get(e["npc"], e["npc"]) if e.get("npc") else e.get("npc")
        e["npcs"] = [people[h] for h in e.get("npcs") or ()]
        e["slot"] = words.get(e["slot"], e["slot"]) if e.get("slot") else e.get("slot")
        e["text"] = _renamed(e["text"], names)
    return type(spec).model_validate(doc)


def _draw(rng: WorldRNG, pool: tuple[str, ...], ids: list[str], exclude: set[str]) -> dict[str, str]:
    """A new word from ``pool`` for each of ``ids`` (none twice, none in ``exclude``: the scenario's own ids among them)."""
    left = [w for w in pool if w not in exclude]
    out: dict[str, str] = {}
    for i in ids:
        choices = [w for w in left if w not in out.values()]
        if not choices:
            raise ValueError(f"the word pool has too few words for a variant of {len(ids)} names")
        out[i] = rng.choice(choices)
    return out


def _label(word: str) -> str:
    return " ".join(w.capitalize() for w in word.split("_"))


def _renamed(text: str, names: dict[str, str]) -> str:
    """``text`` with each old name (a whole word) replaced by its new one."""
    for old, new in names.items():
        text = re.sub(rf"\b{re.escape(old)}\b", new, text)
    return text
