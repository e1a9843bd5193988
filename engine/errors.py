"""Engine errors, importable without torch (the CLI maps them to exit codes on every path)."""

from __future__ import annotations


class ModelError(ValueError):
    """A model directory that is missing, unsafe or not understood (a configuration error)."""


class ModelFlagError(ModelError):
    """A user's setting the model cannot take (``--attention-mask causal`` of a BERT model, a ``--max-length`` past
    its positions): judged against the model, but the flag's fault, so callers that map errors to exit codes make it
    a usage error (2) naming the flag, not a configuration error (78), as ``--device cuda`` without CUDA."""
