"""socialworld as a verifiers environment, id ``socialworld-env`` (``vf-eval socialworld-env``;
``pip install -e '.[verifiers]'``). verifiers loads an environment as the importable module its id
names and reads the ``Taskset`` and ``Env`` classes listed in its ``__all__``; they live in
:mod:`socialworld.rollout.verifiers_env`, and this module, apart from the ``socialworld`` package,
imports verifiers only when verifiers loads it."""

from socialworld.rollout.verifiers_env import (
    SocialWorldData,
    SocialWorldEnv,
    SocialWorldEnvConfig,
    SocialWorldTask,
    SocialWorldTaskset,
    SocialWorldTasksetConfig,
)

__all__ = ["SocialWorldData", "SocialWorldTask", "SocialWorldTasksetConfig", "SocialWorldTaskset", "SocialWorldEnvConfig",
           "SocialWorldEnv"]
