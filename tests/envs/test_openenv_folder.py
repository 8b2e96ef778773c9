"""``envs/socialworld/``, the folder OpenEnv's hub lists: OpenEnv's own validator passes on it, its catalog
finds it, its manifest says what the environment does (the reward range, the task counts, the version),
its server app is the environment, the Dockerfile installs and starts what CI runs, and the baseline
script scores the expert and the oracle through the server as the runner scores them, counting a dead
model endpoint apart."""

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("openenv")

import socialworld  # noqa: E402
from socialworld.agents.lm.server import in_background  # noqa: E402
from socialworld.agents.scripted import ExpertPolicy, OraclePolicy  # noqa: E402
from socialworld.rollout.openenv import GRADERS, TIERS, TOOLS, SocialWorldEnvironment, make_app  # noqa: E402
from socialworld.rollout.runner import EpisodeJob, run_episodes  # noqa: E402
from socialworld.rollout.textenv import outcome  # noqa: E402
from socialworld.world.engine import PENALTY_INVALID, PENALTY_WASTE  # noqa: E402

FOLDER = Path(__file__).resolve().parents[2] / "envs" / "socialworld"
OPENENV = Path(sys.executable).parent / "openenv"


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = sys.modules[name] = importlib.util.module_from_spec(spec)  # registered first: its dataclasses look it up
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow  # OpenEnv's command line takes 10 s to start
def test_openenvs_validator_passes_on_the_folder():
    out = subprocess.run([str(OPENENV), "validate", str(FOLDER), "--level", "static", "--json"], capture_output=True, text=True, timeout=120)
    report = json.loads(out.stdout)
    assert out.returncode == 0, out.stdout[-2000:]
    assert [(c["check_id"], c["status"]) for c in report["results"] if c["check_id"] == "static.manifest"] == [("static.manifest", "pass")]


def test_the_manifest_says_what_the_environment_does():
    m = yaml.safe_load((FOLDER / "openenv.yaml").read_text())
    worst = max(PENALTY_INVALID, PENALTY_WASTE)  # progress moves within [0, 1]; one penalty a step at most
    assert m["validation"]["reward"]["range"] == [-(1 + worst), 1.0]
    env = SocialWorldEnvironment()
    assert m["validation"]["capabilities"]["declared_task_count"] == {t: env.num_tasks(t) for t in TIERS}
    assert m["validation"]["capabilities"]["declared_tools"] == list(TOOLS)
    project = (FOLDER / "pyproject.toml").read_text()
    assert m["version"] == socialworld.__version__ and f'version = "{socialworld.__version__}"' in project
    assert f"socialworld[openenv]>={socialworld.__version__}" in (FOLDER / "server" / "requirements.txt").read_text()


@pytest.mark.slow
def test_the_catalog_finds_the_folder(tmp_path):
    """OpenEnv's catalog reads committed files: the folder in a repository of its own, built and searched."""
    repo = tmp_path / "repo"
    shutil.copytree(FOLDER, repo / "envs" / "socialworld", ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-C", str(repo), "-c", "user.email=ci@example.org", "-c", "user.name=ci"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "the folder"]):
        subprocess.run(git + args, check=True, capture_output=True)
    catalog = tmp_path / "catalog.json"
    subprocess.run([str(OPENENV), "catalog", "build", "--repository", str(repo), "--repository-uri",
                    "https://github.com/socialworld/socialworld.git", "--publisher", "socialworld.dev", "--output", str(catalog)],
                   check=True, capture_output=True, text=True, timeout=120)
    found = subprocess.run([str(OPENENV), "discover", "social coordination with hidden preferences", "--catalog", str(catalog)],
                           capture_output=True, text=True, timeout=120)
    assert found.returncode == 0 and found.stdout.startswith("socialworld: ") and "path: envs/socialworld" in found.stdout


def test_the_dockerfile_installs_and_starts_what_ci_runs():
    text = (FOLDER / "server" / "Dockerfile").read_text()
    runs = re.findall(r"^RUN (.+)$", text, re.M)
    assert runs == ['pip install --no-cache-dir --find-links "$WHEELS" -r server/requirements.txt']
    assert re.findall(r"^CMD (.+)$", text, re.M) == ['["uvicorn", "server.app:app", "--host", "0.0.0.0", "--port", "8000"]']
    ci = (FOLDER.parents[1] / ".ci" / "run").read_text()
    assert "-r envs/socialworld/server/requirements.txt" in ci and "uvicorn server.app:app" in ci


@pytest.fixture(scope="module")
def scripted_url(monkeypatch_module):
    monkeypatch_module.setenv("SOCIALWORLD_SCRIPTED", "1")
    monkeypatch_module.setenv("SOCIALWORLD_MAX_SESSIONS", "2")
    app = _module(FOLDER / "server" / "app.py", "socialworld_env_app").app
    with in_background(app) as url:
        yield url


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_the_baseline_scores_the_expert_and_the_oracle_as_the_runner_does(scripted_url, specs):
    baseline = _module(FOLDER / "baseline.py", "socialworld_env_baseline")
    env = SocialWorldEnvironment()
    for policy in (ExpertPolicy, OraclePolicy):
        got = baseline.score(scripted_url, policy.policy_id, per_split=2)
        assert [r.split for r in got] == list(TIERS)
        for r in got:
            jobs = [EpisodeJob(specs[t.scenario], t.seed) for t in env.list_tasks(r.split)[:2]]
            want = [outcome(e) for e in run_episodes(policy(), jobs)]
            assert r.episodes == 2 and r.endpoint_failures == 0 and r.unparseable == 0
            assert r.grades == {g: [w[g] for w in want] for g in GRADERS}, (policy.policy_id, r.split)


def test_a_dead_model_endpoint_is_counted_apart_and_never_graded(scripted_url):
    from socialworld.agents.lm.server import bind

    baseline = _module(FOLDER / "baseline.py", "socialworld_env_baseline")
    sock = bind("127.0.0.1", 0)  # a port nothing answers on
    port = sock.getsockname()[1]
    sock.close()
    replies = baseline.ModelReplies(f"http://127.0.0.1:{port}/v1", "nobody", "none", 0.0, 16, timeout_s=5)
    got = baseline.score(scripted_url, "model", per_split=1, replies=replies)
    assert [(r.episodes, r.endpoint_failures, r.grades["pass"]) for r in got] == [(0, 1, [])] * 3


def test_a_constrained_model_replies_in_the_grammar_every_step(scripted_url, tiny_dir):
    """``--constrained`` sends each state's ``reply_regex`` to the model's server: the tiny random model,
    whose free replies never parse, behind ``socialworld serve`` parses at every step."""
    pytest.importorskip("llguidance")
    from socialworld.agents.lm.server import HFGenerate, make_app
    from socialworld.agents.models import load_hf
    from socialworld.testing import serving

    baseline = _module(FOLDER / "baseline.py", "socialworld_env_baseline")
    gen = HFGenerate(*load_hf(tiny_dir, dtype="float32"))
    with serving(make_app(gen, "tiny", max_new_tokens=16)) as url:
        free = baseline.score(scripted_url, "model", per_split=1, replies=baseline.ModelReplies(url, "tiny", "none", 0.0, 16, 60))
        constrained = baseline.score(scripted_url, "model", per_split=1,
                                     replies=baseline.ModelReplies(url, "tiny", "none", 0.0, 16, 60, constrained=True))
    assert all(r.steps and r.unparseable == r.steps for r in free)
    assert all(r.episodes == 1 and r.steps and r.unparseable == 0 for r in constrained)


def test_the_folders_app_is_the_environment():
    app = _module(FOLDER / "server" / "app.py", "socialworld_env_app_plain").app
    assert type(app) is type(make_app())


@pytest.mark.slow  # pip builds the folder's wheel
def test_the_folder_builds_as_its_own_package_beside_the_verifiers_module(tmp_path):
    """``pip wheel envs/socialworld`` gives ``openenv-socialworld`` importing as ``socialworld_openenv`` (not
    ``socialworld_verifiers``, the verifiers environment's package), with its client, server app and baseline."""
    import zipfile

    work = tmp_path / "src"
    shutil.copytree(FOLDER, work, ignore=shutil.ignore_patterns("__pycache__"))  # the build writes beside the sources
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(work), "-w", str(tmp_path)],
                   check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = tmp_path.glob("openenv_socialworld-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"socialworld_openenv/client.py", "socialworld_openenv/server/app.py", "socialworld_openenv/baseline.py"} <= names
    assert not any(n.startswith("socialworld_verifiers/") for n in names)


VERIFIERS_FOLDER = FOLDER.parent / "socialworld-verifiers"


def test_the_verifiers_package_is_laid_out_as_vf_init_lays_one_out():
    """``envs/socialworld-verifiers``: a hatchling project named as its id, at socialworld's version, whose
    package exports the Taskset and Env subclasses in ``__all__`` (what verifiers reads), and a
    README with the sections Prime's hub shows."""
    import ast
    import tomllib

    import socialworld

    project = tomllib.loads((VERIFIERS_FOLDER / "pyproject.toml").read_text())
    assert project["build-system"]["build-backend"] == "hatchling.build"
    assert project["project"]["name"] == "socialworld-verifiers" and project["project"]["version"] == socialworld.__version__
    assert project["project"]["dependencies"] == [f"socialworld[verifiers]>={socialworld.__version__}"]
    assert project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == ["socialworld_verifiers"]
    tree = ast.parse((VERIFIERS_FOLDER / "socialworld_verifiers" / "__init__.py").read_text())
    exported = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "__all__")
    assert {"SocialWorldTaskset", "SocialWorldEnv"} <= set(exported)
    readme = (VERIFIERS_FOLDER / "README.md").read_text()
    for section in ("### Overview", "**Environment ID**: `socialworld-verifiers`", "### Quickstart", "### Environment arguments", "### Metrics"):
        assert section in readme
