"""FlashInfer ragged prefill attention (``BatchPrefillWithRaggedKVCacheWrapper``), CUDA-graph ready.

- ``plan()`` runs on the host before each step (never inside a graph) with pinned host offsets.
- Exact-shape eager steps use a plain wrapper; padded (graph) steps use a ``use_cuda_graph``
  wrapper per sequence capacity, whose fixed indptr buffers the captured graphs read.
- GQA is native; ``causal`` comes from the model.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from petal.engine.context import ForwardContext

SUPPORTED_HEAD_DIMS = (64, 128, 256)
WORKSPACE_BYTES_PER_TOKEN = 32 * 1024  # split-KV scratch grows with the largest bucket (see ENGINE_NOTES 1.2)


def unsupported_reason(head_dim: int, dtype: torch.dtype) -> str | None:
    """Why FlashInfer cannot serve this model here, or ``None`` if it can."""
    if dtype not in (torch.bfloat16, torch.float16):
        return f"FlashInfer needs bfloat16 or float16, not {dtype}"
    if head_dim not in SUPPORTED_HEAD_DIMS:
        return f"head_dim {head_dim} has no FlashInfer prefill kernel here (supported: {SUPPORTED_HEAD_DIMS})"
    try:
        import flashinfer  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising at import
        return f"flashinfer is not importable ({exc.__class__.__name__}: {exc})"
    return None


class _Planned:
    """A wrapper plus the event after its last plan's host-to-device copies, and the offsets it was
    last planned for (a plan for the same offsets is skipped: a service answering queries of one
    length, or a bucket's repeated shape, pays the host-side plan once)."""

    def __init__(self, wrapper: Any) -> None:  # a FlashInfer prefill wrapper (FlashInfer is untyped)
        self.wrapper = wrapper
        self.event: torch.cuda.Event | None = None
        self.cu_seqlens: torch.Tensor | None = None  # [num_seqs + 1] int32 on the host, a private copy


class FlashInferAttention:
    name = "flashinfer"
    capturable = True

    def __init__(self, *, causal: bool, scale: float, device: torch.device, dtype: torch.dtype, num_heads: int,
                 num_kv_heads: int, head_dim: int, max_tokens: int, max_seqs: int, cuda_graphs: bool) -> None:
        import flashinfer

        self._flashinfer = flashinfer
        self.causal = causal
        self.scale = scale
        self.device = device
        self.dtype = dtype
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.max_tokens = max_tokens
        # NOTE: fa3 (Hopper) is FlashInfer's auto choice for these head dims; PETAL_FLASHINFER_BACKEND=fa2
        # selects the other kernel family (benchmarks compare both).
        self.backend = os.environ.get("PETAL_FLASHINFER_BACKEND", "auto")
        workspace = max(256 << 20, max_tokens * WORKSPACE_BYTES_PER_TOKEN)
        self._workspace = torch.empty(workspace, dtype=torch.uint8, device=device)
        self._eager = _Planned(flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
            self._workspace, "NHD", backend=self.backend))
        self._graph: dict[int, _Planned] = {}  # sequence capacity -> graph-mode wrapper
        self._graph_max_tokens: dict[int, int] = {}
        self._active: dict[int, _Planned] = {}
        self.cuda_graphs = cuda_graphs

    def register_capacity(self, num_seqs: int, max_tokens: int) -> None:
        """Declare a graph sequence capacity and the most tokens its buckets hold (before first use)."""
        self._graph_max_tokens[num_seqs] = max(max_tokens, self._graph_max_tokens.get(num_seqs, 0))

    def _graph_wrapper(self, num_seqs: int) -> _Planned:
        planned = self._graph.get(num_seqs)
        if planned is None:
            indptr_q = torch.zeros(num_seqs + 1, dtype=torch.int32, device=self.device)
            indptr_kv = torch.zeros(num_seqs + 1, dtype=torch.int32, device=self.device)
            wrapper = self._flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
                self._workspace, "NHD", use_cuda_graph=True, qo_indptr_buf=indptr_q, kv_indptr_buf=indptr_kv,
                backend=self.backend)
            planned = _Planned(wrapper)
            # NOTE: the first plan fixes the most rows this wrapper may ever see: plan the largest bucket.
            most = self._graph_max_tokens.get(num_seqs, self.max_tokens)
            dummy = torch.full((num_seqs + 1,), most, dtype=torch.int32).pin_memory()
            dummy[0] = 0
            self._plan(planned, dummy)
            self._graph[num_seqs] = planned
        return planned

    def _plan(self, planned: _Planned, cu_seqlens_cpu: torch.Tensor) -> None:
        if planned.cu_seqlens is not None and torch.equal(planned.cu_seqlens, cu_seqlens_cpu):
            return  # NOTE: the wrapper's device-side schedule still holds exactly this plan
        if planned.event is not None:
            # NOTE: plan() refills the wrapper's pinned scratch and copies it asynchronously; a second plan
            # before that copy ran would corrupt the schedule. Wait for the previous plan's copy only.
            planned.event.synchronize()
        planned.wrapper.plan(
            cu_seqlens_cpu, cu_seqlens_cpu, self.num_heads, self.num_kv_heads, self.head_dim,
            causal=self.causal, sm_scale=self.scale, q_data_type=self.dtype, kv_data_type=self.dtype,
            non_blocking=True,
        )
        planned.event = torch.cuda.Event()
        planned.event.record()
        planned.cu_seqlens = cu_seqlens_cpu.clone()  # the caller's pinned slot is reused for later steps

    def plan(self, ctx: ForwardContext) -> None:
        if ctx.fused_attention:
            return  # the small-batch kernel runs this step's attention (engine/layers/small_attention.py)
        planned = self._graph_wrapper(ctx.num_seqs) if ctx.padded else self._eager
        self._plan(planned, ctx.cu_seqlens_cpu)
        self._active[ctx.num_seqs if ctx.padded else -1] = planned

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        planned = self._active[ctx.num_seqs if ctx.padded else -1]
        out: torch.Tensor = planned.wrapper.run(q, k, v)
        return out
