"""Rotary position embeddings (NeoX / "rotate half" layout, as Qwen3), positions per token."""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """RoPE tables for ``positions [T]`` (restarting per sequence); ``apply_rotary`` rotates q and k."""

    def __init__(self, head_dim: int, max_positions: int, theta: float) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.theta = theta
        # NOTE: not a buffer: models are built on the meta device and only checkpoint tensors are loaded.
        self._cache: torch.Tensor | None = None

    def cos_sin(self, device: torch.device) -> torch.Tensor:
        """``[max_positions, D]`` float32: cos of each frequency in the first half, sin in the second."""
        if self._cache is None or self._cache.device != device:
            exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device) / self.head_dim
            inv_freq = 1.0 / (self.theta**exponents)
            pos = torch.arange(self.max_positions, dtype=torch.float32, device=device)
            freqs = torch.outer(pos, inv_freq)  # [P, D/2]
            self._cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
        return self._cache

    def tables(self, positions: torch.Tensor) -> RopeTables:
        return RopeTables(positions, self.cos_sin(positions.device))


class RopeTables:
    """One step's rotary inputs, shared by every layer: positions and the cos|sin table.

    ``cos_sin(dtype)`` gathers per-token ``(cos, sin)`` once, for the torch path; fused kernels
    read ``positions`` and ``table`` directly.
    """

    def __init__(self, positions: torch.Tensor, table: torch.Tensor) -> None:
        self.positions = positions  # [T] int32
        self.table = table  # [max_positions, D] float32
        self._gathered: tuple[torch.Tensor, torch.Tensor] | None = None

    def cos_sin(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)``, each ``[T, 1, D/2]`` in ``dtype``."""
        if self._gathered is None:
            gathered = self.table.index_select(0, self.positions)  # [T, D]
            half = gathered.shape[1] // 2
            self._gathered = (gathered[:, :half].to(dtype)[:, None, :], gathered[:, half:].to(dtype)[:, None, :])
        return self._gathered


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """NeoX rotation of ``q [T, Hq, D]`` and ``k [T, Hk, D]`` with ``cos``/``sin`` ``[T, 1, D/2]``."""
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
