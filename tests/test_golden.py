"""Seeded scripted runs hash as stored (tests/golden.py): the refactors keep behaviour bit for bit."""
import json

import pytest
from golden import STORED, run_hashes


@pytest.mark.slow  # ~8 s on 2 cores
def test_seeded_scripted_runs_hash_as_stored():
    stored, now = json.loads(STORED.read_text()), run_hashes()
    assert now.keys() == stored.keys()
    changed = sorted(k for k in now if now[k] != stored[k])
    assert not changed, f"behaviour changed in {changed} (python tests/golden.py --write only for a change that means it)"
