"""Metrics as pure functions over records: per-episode core metrics, confidence intervals, lifelong metrics, diagnostics."""
