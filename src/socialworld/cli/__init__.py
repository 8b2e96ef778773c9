"""The socialworld command line."""
