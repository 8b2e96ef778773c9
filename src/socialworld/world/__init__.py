"""The social world: scenario specs (frozen data), the seeded forkable simulator, what the agent sees, dialogue assessment."""
