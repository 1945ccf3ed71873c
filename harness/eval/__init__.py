"""Accuracy next to speed: lm-evaluation-harness against a server's completions endpoint, on local data."""
