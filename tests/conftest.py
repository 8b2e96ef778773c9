import pytest

from socialworld.spec import load_builtin_scenarios


@pytest.fixture(scope="session")
def specs():
    return load_builtin_scenarios()
