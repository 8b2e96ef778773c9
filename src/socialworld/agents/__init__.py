"""Agents: the policy registry and model specs, scripted policies (random, expert, oracle), language-model policies."""
