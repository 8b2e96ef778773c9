"""The client of the social world's OpenEnv server: OpenEnv's ``EnvClient`` (``.sync()`` for plain code).

    from socialworld_openenv import SocialAction, SocialWorldClient
    with SocialWorldClient(base_url="http://localhost:8000").sync() as env:
        result = env.reset(split="L1", index=0)          # a task: tier L1, its first episode
        result = env.step(SocialAction(reply="ACTION: ask(ann, venue)"))
"""

from socialworld.rollout.openenv import SocialAction, SocialObservation, SocialState, SocialWorldClient

__all__ = ["SocialAction", "SocialObservation", "SocialState", "SocialWorldClient"]
