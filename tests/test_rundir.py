"""Run directory: atomic artifacts, manifest with hashes, resume after a crash."""

import json

import pytest

from socialworld.layout import cycle_files, cycle_number, loop_cycles
from socialworld.rundir import RunDir


def test_produce_commit_and_resume(tmp_path):
    run = RunDir(tmp_path / "r")
    run.write_config({"cycles": 2})
    calls = []

    def write_file(p):
        calls.append(p)
        p.write_text("hello")

    assert run.produce("a/one.txt", "test", write_file) is True
    assert run.produce("a/one.txt", "test", write_file) is False and len(calls) == 1

    def write_dir(p):
        p.mkdir()
        (p / "w.bin").write_bytes(b"\x00\x01")

    assert run.produce("a/adapter", "train", write_dir, inputs=["a/one.txt"])
    m = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert m["artifacts"]["a/adapter"]["inputs"] == {"a/one.txt": m["artifacts"]["a/one.txt"]["sha256"]}
    assert len(m["artifacts"]["a/one.txt"]["sha256"]) == 64

    # a fresh handle (a resumed process) sees the same complete artifacts
    again = RunDir(tmp_path / "r")
    assert again.complete("a/one.txt") and again.complete("a/adapter")
    # a changed file is no longer complete and is redone
    (tmp_path / "r" / "a" / "one.txt").write_text("tampered")
    assert not again.complete("a/one.txt")
    assert again.produce("a/one.txt", "test", write_file) and (tmp_path / "r" / "a" / "one.txt").read_text() == "hello"
    with pytest.raises(ValueError, match="different config"):
        again.write_config({"cycles": 3})
    # a field named in may_grow may increase (extend a finished loop), never decrease
    again.write_config({"cycles": 3}, may_grow=("cycles",))
    with pytest.raises(ValueError, match="different config"):
        again.write_config({"cycles": 2}, may_grow=("cycles",))
    # the stored file is compared in the form it is read in (an earlier version's, migrated), then rewritten in ours
    again.write_config({"cycles": 3, "train": {"lr": 1}}, read=lambda old, path: {**old, "train": {"lr": 1}})
    renamed = {"cycles": 3, "train": {"rate": 1}}
    again.write_config(renamed, read=lambda old, path: {**old, "train": {"rate": old["train"]["lr"]}})
    assert "rate" in (tmp_path / "r" / "config.yaml").read_text()
    with pytest.raises(ValueError, match="refused"):  # a reader may refuse a run it cannot continue
        again.write_config(renamed, read=lambda old, path: (_ for _ in ()).throw(ValueError(f"{path.name}: refused")))
    with pytest.raises(ValueError, match="different config"):
        again.write_config({**renamed, "new": 0})
    # where the folder is, is not what it makes: runs/r/ or a moved folder resumes (the rest still compared)
    again.write_config({**renamed, "out": "runs/r"})
    again.write_config({**renamed, "out": "./elsewhere/r/"})
    with pytest.raises(ValueError, match="different config"):
        again.write_config({**renamed, "cycles": 4, "out": "runs/r"})
    with pytest.raises(ValueError, match="inputs not in the manifest"):
        again.produce("b.txt", "x", write_file, inputs=["nope"])
    assert not (tmp_path / "r" / "b.txt").exists()


def test_a_crash_mid_write_leaves_nothing(tmp_path):
    run = RunDir(tmp_path)

    def crash(p):
        p.write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run.produce("x.txt", "test", crash)
    assert not (tmp_path / "x.txt").exists() and not run.complete("x.txt")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_an_input_made_again_differently_remakes_what_was_built_from_it(tmp_path):
    """Inputs are recorded with their hashes: a rebuilt input with other bytes makes everything
    downstream incomplete, down the chain; one rebuilt byte for byte keeps it."""
    run = RunDir(tmp_path)
    text = {"v": "one"}
    run.produce("wake.txt", "wake", lambda p: p.write_text(text["v"]))
    run.produce("pairs.txt", "sleep", lambda p: p.write_text("pairs of " + (tmp_path / "wake.txt").read_text()), inputs=["wake.txt"])
    run.produce("adapter.txt", "train", lambda p: p.write_text("trained on " + (tmp_path / "pairs.txt").read_text()),
                inputs=["pairs.txt"])
    (tmp_path / "wake.txt").write_text("corrupted")
    run = RunDir(tmp_path)
    assert run.produce("wake.txt", "wake", lambda p: p.write_text(text["v"]))  # redone, the same bytes
    assert run.complete("pairs.txt") and run.complete("adapter.txt")
    text["v"] = "two"
    (tmp_path / "wake.txt").write_text("corrupted")
    run = RunDir(tmp_path)
    assert run.produce("wake.txt", "wake", lambda p: p.write_text(text["v"]))  # redone, other bytes
    assert run.stale_inputs("pairs.txt") == ["wake.txt"] and not run.complete("pairs.txt")
    assert run.produce("pairs.txt", "sleep", lambda p: p.write_text("pairs of " + (tmp_path / "wake.txt").read_text()),
                       inputs=["wake.txt"])
    assert not run.complete("adapter.txt")  # its input was remade with other bytes
    assert run.produce("adapter.txt", "train", lambda p: p.write_text("trained on " + (tmp_path / "pairs.txt").read_text()),
                       inputs=["pairs.txt"])
    assert (tmp_path / "adapter.txt").read_text() == "trained on pairs of two"


def test_a_derived_document_follows_its_sources_and_what_was_built_from_it_follows_the_document(tmp_path):
    """``derive``: a document computed from another folder's runs is kept while its text is the same
    and replaced (in a new process too) once it differs; what lists it as input is then stale."""
    run = RunDir(tmp_path)
    assert run.derive("table.json", "suite", "one\n")
    run.produce("report.md", "report", lambda p: p.write_text("report of " + (tmp_path / "table.json").read_text()),
                inputs=["table.json"])
    assert not RunDir(tmp_path).derive("table.json", "suite", "one\n") and RunDir(tmp_path).complete("report.md")
    run = RunDir(tmp_path)
    assert run.derive("table.json", "suite", "two\n") and (tmp_path / "table.json").read_text() == "two\n"
    run = RunDir(tmp_path)  # what the manifest says, read afresh
    assert run.complete("table.json") and not run.complete("report.md")


def test_a_killed_runs_temporary_names_are_removed_when_it_starts_again(tmp_path):
    import tempfile

    run = RunDir(tmp_path)
    run.produce("keep/a.txt", "x", lambda p: p.write_text("a"))
    (tmp_path / "keep").joinpath(".gitignore").write_text("*")  # not ours: kept
    left_dir = tempfile.mkdtemp(prefix=".adapter.swtmp-", dir=tmp_path / "keep")  # as produce names them
    (tmp_path / "keep" / left_dir / "adapter").mkdir()
    left_file = tempfile.mkstemp(prefix=".manifest.json.swtmp-", suffix=".tmp", dir=tmp_path)[1]  # as atomic_write_text
    mine = [tmp_path / n for n in (".backup.20240101", ".config.defaults", ".data.settings.tmp")]  # a user's own: kept
    for m in mine:
        m.write_text("mine")
    RunDir(tmp_path)  # opened to be read (another process may be writing it): nothing removed
    assert (tmp_path / "keep" / left_dir).exists() and (tmp_path / left_file).exists()
    RunDir(tmp_path).write_config({"cycles": 1})  # the run starts again
    assert not (tmp_path / "keep" / left_dir).exists() and not (tmp_path / left_file).exists()
    assert (tmp_path / "keep" / ".gitignore").exists() and all(m.exists() for m in mine)
    assert RunDir(tmp_path).complete("keep/a.txt")


def test_a_damaged_manifest_is_named_with_the_fix(tmp_path):
    run = RunDir(tmp_path)
    run.produce("a.txt", "x", lambda p: p.write_text("a"))
    text = (tmp_path / "manifest.json").read_text()
    for bad in (text[: len(text) // 2], "[]", "\xff"):
        (tmp_path / "manifest.json").write_text(bad, encoding="latin-1")
        with pytest.raises(ValueError, match=r"manifest\.json: not a.*delete it"):
            RunDir(tmp_path)


def test_a_manifest_from_before_input_hashes_still_passes_a_rebuild_on(tmp_path):
    """Inputs listed by name (manifest-v1 before hashes) take the hashes they have when read."""
    run = RunDir(tmp_path)
    run.produce("w.txt", "wake", lambda p: p.write_text("one"))
    run.produce("s.txt", "sleep", lambda p: p.write_text("pairs"), inputs=["w.txt"])
    doc = json.loads((tmp_path / "manifest.json").read_text())
    doc["artifacts"]["s.txt"]["inputs"] = ["w.txt"]
    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    run = RunDir(tmp_path)
    assert run.complete("s.txt")
    (tmp_path / "w.txt").write_text("damaged")
    assert run.produce("w.txt", "wake", lambda p: p.write_text("two"))
    assert run.stale_inputs("s.txt") == ["w.txt"] and not run.complete("s.txt")


def test_the_cycle_folders_of_a_loop_run_are_read_by_the_names_cycle_files_writes(tmp_path):
    for c in (10, 2, 0):
        (tmp_path / cycle_files(c).root).mkdir()
    (tmp_path / "cycle-x").mkdir()
    (tmp_path / "cycle-3").write_text("a file, not a cycle folder")
    assert loop_cycles(tmp_path) == [0, 2, 10]  # numeric order, not the names'
    assert [cycle_number(tmp_path / cycle_files(c).root) for c in (0, 10)] == [0, 10]
    assert cycle_number(tmp_path / "cycle-x") is None and cycle_number("loop") is None
    assert loop_cycles(tmp_path / "absent") == []


def test_a_folders_hash_tells_apart_what_concatenation_would_not(tmp_path):
    from socialworld.rundir import sha256_path

    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    (one / "a").write_bytes(b"xb\0y")
    (two / "a").write_bytes(b"x")
    (two / "b").write_bytes(b"y")
    assert sha256_path(one, "folder-v1") == sha256_path(two, "folder-v1")  # the old form's collision
    assert sha256_path(one) != sha256_path(two)


def test_a_manifest_written_with_the_old_folder_hash_still_finds_its_folders_complete(tmp_path):
    from socialworld.rundir import sha256_path

    run = RunDir(tmp_path / "r")
    run.produce("adapter", "train", lambda p: (p.mkdir(), (p / "w.bin").write_bytes(b"\1\2")))
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["artifacts"]["adapter"]["hash"] == "folder-v2"
    entry = manifest["artifacts"]["adapter"]
    del entry["hash"]  # as a manifest written before folder-v2 lists it
    entry["sha256"] = sha256_path(tmp_path / "r" / "adapter", "folder-v1")
    (tmp_path / "r" / "manifest.json").write_text(json.dumps(manifest))
    assert RunDir(tmp_path / "r").complete("adapter")


def test_every_file_of_an_artifact_gets_the_mode_open_gives(tmp_path):
    """A library that writes through ``tempfile`` (600) inside an artifact's folder (safetensors did, for
    trained adapters) leaves no file less readable than the rest."""
    import os
    import tempfile

    from socialworld.records import umask

    def write(p):
        p.mkdir()
        fd, name = tempfile.mkstemp(dir=p)
        os.close(fd)
        os.replace(name, p / "adapter_model.safetensors")
        (p / "adapter_config.json").write_text("{}")

    run = RunDir(tmp_path / "r")
    run.produce("adapter", "train", write)
    modes = {f.name: f.stat().st_mode & 0o777 for f in (tmp_path / "r" / "adapter").iterdir()}
    assert set(modes.values()) == {0o666 & ~umask()}, modes
