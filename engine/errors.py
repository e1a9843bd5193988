"""Engine errors, importable without torch (the CLI maps them to exit codes on every path)."""

from __future__ import annotations


class ModelError(ValueError):
    """A model directory that is missing, unsafe or not understood (a configuration error)."""
