"""One module per CLI command group. Each module is cheap to import (heavy imports go inside
the handler) and exposes ``register(subparsers)``, which adds its parsers and sets
``handler=<callable(args) -> int>`` as the parser default."""
