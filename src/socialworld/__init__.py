"""socialworld: lifelong social intelligence for language agents."""

__version__ = "0.1.0"
