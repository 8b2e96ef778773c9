"""socialworld as a verifiers environment, id ``socialworld-verifiers`` (``vf-eval socialworld-verifiers``).

verifiers loads an environment as the importable module its id names and reads the ``Taskset`` and
``Env`` subclasses listed in its ``__all__``. They live in :mod:`socialworld.rollout.verifiers_env`
(the ``socialworld`` package, installed with its ``verifiers`` extra); this package is what Prime's
Environments Hub lists."""

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
