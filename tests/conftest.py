import pytest

from socialworld.spec import load_builtin_scenarios


@pytest.fixture(scope="session")
def specs():
    return load_builtin_scenarios()


def write_user_scenario(path, base="team_lunch", id="my_lunch-v1", name="My team lunch"):
    """A user's scenario file outside the package: a copy of a shipped one with its own id and name."""
    import yaml

    from socialworld.spec import builtin_scenario_files

    (src,) = [p for p in builtin_scenario_files() if p.stem == base]
    data = yaml.safe_load(src.read_text())
    data.update(id=id, name=name)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def my_lunch(tmp_path):
    """Path of a user scenario file ``my_lunch-v1`` (L0) in ``tmp_path/user``."""
    (tmp_path / "user").mkdir()
    return write_user_scenario(tmp_path / "user" / "my_lunch.yaml")


@pytest.fixture(autouse=True, scope="session")
def _cli_log_in_a_temporary_folder(tmp_path_factory):
    """The CLI sends library warnings to SOCIALWORLD_LOG (default runs/socialworld.log): keep the
    tests' out of the working tree."""
    import os

    os.environ.setdefault("SOCIALWORLD_LOG", str(tmp_path_factory.mktemp("log") / "socialworld.log"))


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny random causal LM folder (``socialworld.testing.tiny_lm``), built once per session; read it, never write into it."""
    from socialworld.testing import tiny_lm

    return tiny_lm(tmp_path_factory.mktemp("tiny-lm"))
