"""Learning from one's own episodes: the sleep phase's preference pairs and gating, TRL training, the wake-sleep-deploy loop."""
