"""ctxd: keeps an agent's full history apart from its model context."""

__version__ = "0.1.0"
