"""A run's config.yaml: written as one record, read back from any version (v1 migrates), and
refused where this code cannot continue the run."""

import copy

import pytest
import yaml

from socialworld.bench.config import RECIPE_SLEEP, BenchConfig
from socialworld.learn.config import LoopConfig, SleepConfig
from socialworld.learn.loop import _reusable, regate, stored_sleep_config
from socialworld.learn.runconfig import CONFIG_VERSION, RunConfig, migrate, read_resumed
from socialworld.metrics.core import ContractMismatch
from socialworld.rundir import RunDir

V1_SWITCHES = {  # each v2 sleep recipe as a v1 file spelled it
    "default": {"utterance_pairs": True, "reference_pairs": "off", "wake_chosen": "best", "label_gate": "margin"},
    "recipe": {"utterance_pairs": True, "reference_pairs": "own", "wake_chosen": "continuation", "label_gate": "disagree"},
}


def as_v1(doc, switches, drop=("sleep.values", "train.dtype", "judge", "metrics_contract", "pair_schema")):
    """``doc`` (v2) as a v1 file would hold it: no config_version, the sleep switches, and fields
    added while v1 was current left out."""
    old = {k: v for k, v in copy.deepcopy(doc).items() if k != "config_version"}
    if "sleep" in old:
        old["sleep"] = {k: v for k, v in old["sleep"].items() if k not in ("sources", "reference_chosen", "wake_chosen")} | switches
    for key in drop:
        *parent, leaf = key.split(".")
        (old[parent[0]] if parent else old).pop(leaf, None)
    return old


def test_a_v1_loop_config_reads_as_the_v2_record_of_the_same_run(tmp_path):
    for name, sleep in (("default", SleepConfig()), ("recipe", RECIPE_SLEEP)):
        cfg = LoopConfig(out=str(tmp_path / name), sleep=sleep)
        doc = RunConfig(cfg, {}).document() | {"metrics_contract": "metrics-v1", "pair_schema": "pair-v1"}  # what v1 files lacked
        doc["train"]["dtype"] = "float32"  # v1 trained in float32: its file lacks the field, v2's default is auto
        old = as_v1(doc, V1_SWITCHES[name])
        assert "dtype" not in old["train"] and "sources" not in old["sleep"]
        assert migrate(old) == doc, name
        assert migrate(doc) == doc  # v2 reads as it is
        path = tmp_path / name / "config.yaml"
        path.parent.mkdir()
        path.write_text(yaml.safe_dump(old))
        assert stored_sleep_config(path.parent) == sleep


def test_a_v1_bench_config_reads_as_v2():
    doc = RunConfig(BenchConfig(), {}).document() | {"metrics_contract": "metrics-v1", "pair_schema": "pair-v1"}
    old = as_v1(doc, {}, drop=("scenarios", "judge", "user_scenarios", "metrics_contract", "pair_schema"))
    assert migrate(old) == doc and doc["config_version"] == CONFIG_VERSION


def test_an_unknown_version_is_named():
    with pytest.raises(ValueError, match="x.yaml: config_version 'run-config-v9'"):
        migrate({"config_version": "run-config-v9"}, "x.yaml")


def test_a_run_of_another_metrics_contract_is_refused(tmp_path):
    """A run folder scored under metrics-v1 (a v1 config without metrics_contract) is never resumed
    by a version that scores under metrics-v2: its numbers would be mixed with ours."""
    doc = RunConfig(LoopConfig(out=str(tmp_path)), {}).document()
    assert doc["metrics_contract"] == "metrics-v2"
    RunDir(tmp_path).write_config(as_v1(doc, V1_SWITCHES["default"], drop=("metrics_contract",)))
    with pytest.raises(ContractMismatch, match="scored under metrics-v1.*metrics-v2"):
        RunDir(tmp_path).write_config(doc, read=read_resumed)
    RunDir(tmp_path / "new").write_config(doc, read=read_resumed)
    RunDir(tmp_path / "new").write_config(doc, read=read_resumed)  # same contract: resumes


def test_a_v1_run_of_this_contract_and_pair_format_resumes_and_is_rewritten_as_v2(tmp_path):
    doc = RunConfig(LoopConfig(out=str(tmp_path)), {}).document()
    RunDir(tmp_path).write_config(as_v1(doc, V1_SWITCHES["default"], drop=("sleep.values", "judge")))
    RunDir(tmp_path).write_config(doc, read=read_resumed)
    assert yaml.safe_load((tmp_path / "config.yaml").read_text()) == doc


def test_a_run_of_another_pair_format_is_refused(tmp_path):
    """A run whose action pairs ended at the ACTION line (pair-v1: a v1 config without pair_schema)
    is neither resumed nor re-gated by a version that writes pair-v4: replay would mix the two."""
    doc = RunConfig(LoopConfig(out=str(tmp_path)), {}).document()
    assert doc["pair_schema"] == "pair-v4"
    RunDir(tmp_path).write_config(as_v1(doc, V1_SWITCHES["default"], drop=("pair_schema",)))
    with pytest.raises(ValueError, match="training pairs are pair-v1, this version writes pair-v4"):
        RunDir(tmp_path).write_config(doc, read=read_resumed)
    with pytest.raises(ValueError, match="pair-v1, this version builds pair-v4"):
        regate(tmp_path, 1, {})


def test_reuse_from_a_run_of_another_metrics_contract_is_refused(tmp_path):
    src = RunDir(tmp_path / "old")
    cfg = LoopConfig(out=str(tmp_path / "old"))
    src.write_config(as_v1(RunConfig(cfg, {}).document(), V1_SWITCHES["default"], drop=("metrics_contract",)))
    (src.root / "note.txt").write_text("x")
    src.commit("note.txt", "test")  # a manifest: a run folder
    mine = LoopConfig(out=str(tmp_path / "new"), reuse_from=str(src.root))
    with pytest.raises(ContractMismatch, match="scored under metrics-v1"):
        _reusable(mine, RunConfig(mine, {}).document())


def test_a_v3_config_reads_as_v4_with_the_templates_voice():
    for cfg in (LoopConfig(), BenchConfig()):
        doc = RunConfig(cfg, {}).document()
        assert doc["config_version"] == CONFIG_VERSION == "run-config-v4" and doc["npc_voice"] == "template"
        v3 = {k: v for k, v in doc.items() if k != "npc_voice"} | {"config_version": "run-config-v3"}
        assert migrate(v3) == doc
