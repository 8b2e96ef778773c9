"""The social world as an OpenEnv environment: the client and its types (socialworld.rollout.openenv)."""

from .client import SocialAction, SocialObservation, SocialState, SocialWorldClient

__all__ = ["SocialAction", "SocialObservation", "SocialState", "SocialWorldClient"]
