import pytest

from socialworld.testing import write_user_scenario
from socialworld.world.spec import load_builtin_scenarios


def pytest_configure(config):
    """One torch thread per test process: the tests' models are tiny (threads cost more than they
    give), and the default suite runs one process per core (pytest-xdist)."""
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def specs():
    return load_builtin_scenarios()


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
