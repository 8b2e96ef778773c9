"""The state dataclasses' codec and clones: every field round-trips, whatever its type."""

import dataclasses
import json

from socialworld.world.engine import World
from socialworld.world.state import NPCHidden, PublicState, from_plain, to_plain
from socialworld.world.visibility import legal_actions, observe


def _played(spec, seed=5, steps=9):
    w = World(spec, seed)
    for t in range(steps):
        la = legal_actions(observe(spec, w.pub))
        w.step(la[(7 * t + 3) % len(la)])
        if w.done:
            break
    return w


def test_every_field_round_trips_through_json(specs):
    for spec in specs.values():
        w = _played(spec)
        pub = json.loads(json.dumps(to_plain(w.pub)))
        assert set(pub) == {f.name for f in dataclasses.fields(PublicState)}
        assert from_plain(PublicState, pub) == w.pub
        for h in w.hid.values():
            assert from_plain(NPCHidden, json.loads(json.dumps(to_plain(h)))) == h


def test_clones_hold_every_field_and_share_no_mutable_part(specs):
    w = _played(specs["hackathon-v1"])
    c = w.pub.clone()
    assert c == w.pub and to_plain(c) == to_plain(w.pub)
    for f in dataclasses.fields(PublicState):
        v = getattr(c, f.name)
        if isinstance(v, (list, dict)):
            assert v is not getattr(w.pub, f.name), f.name  # a fork's step never reaches its parent


def test_a_missing_field_is_named(specs):
    import pytest

    pub = to_plain(_played(specs["team_lunch-v1"]).pub)
    del pub["leaks"]
    with pytest.raises(ValueError, match="PublicState: no 'leaks' in the data"):
        from_plain(PublicState, pub)
    assert from_plain(PublicState, pub, missing={"leaks": 0}).leaks == 0
