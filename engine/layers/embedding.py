"""Embedding tables whose weights always come from a checkpoint (no random init)."""

from __future__ import annotations

from torch import nn


class Embedding(nn.Embedding):
    """``nn.Embedding`` (Hugging Face name ``weight``) without the random init.

    # NOTE: ``nn.Embedding.reset_parameters`` runs ``normal_``, which on the meta device goes through
    # torch's Python decompositions and imports ``torch._dynamo`` (0.7 s on the 2-core CPU) for values
    # that the checkpoint replaces anyway. The loader checks that every parameter was loaded.
    """

    def reset_parameters(self) -> None:
        """No init: the table is created empty and filled by ``load_state_dict(assign=True)``."""
