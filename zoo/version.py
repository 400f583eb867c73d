"""The package version, in a module of its own so that submodules can name it without
importing `zoo` (whose `__init__` imports them)."""

__version__ = "0.1.0"
