"""socialworld: lifelong social intelligence for language agents."""

__version__ = "0.2.0.dev0"
