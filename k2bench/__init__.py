"""k2bench: continuous benchmarking for LLM serving.

The code lives in the top-level folders (harness/, engine/, workloads/, dashboard/)
and is imported as k2bench.harness, k2bench.engine, ...; see pyproject.toml.
"""

__version__ = "0.1.0"
