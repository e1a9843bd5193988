"""The engine: ``step(PackedBatch) -> LazyTensor`` of pooled embeddings, on the CPU or CUDA.

On CUDA with graphs enabled, every step goes through ``engine/graphs.py`` (lazy capture per
token bucket); otherwise the model runs eagerly on the exact packed shapes.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from petal.engine.batch import PackedBatch, token_bucket
from petal.engine.config import (
    ATTENTION_BACKENDS,
    DTYPE_NAMES,
    AttentionBackendName,
    DeviceName,
    DTypeName,
    EngineConfig,
)
from petal.engine.context import ForwardContext
from petal.engine.forward import forward_pooled
from petal.engine.graphs import CudaGraphCapture, LazyGraphRunner
from petal.engine.inputs import InputLayout, StagingRing, fill_inputs, make_context
from petal.engine.layers.attention import AttentionBackend, make_attention_backend
from petal.engine.layers.linear import narrow_linear_weights
from petal.engine.layers.warmup import start_warmup
from petal.engine.lazy_tensor import HostRing, LazyTensor
from petal.engine.loader import ModelSpec, load_model
from petal.engine.small_batch import SmallBatchKernels
from petal.engine.streams import CurrentStream

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class EngineStats:
    steps: int = 0
    sequences: int = 0
    tokens: int = 0
    padded_tokens: int = 0  # tokens added to reach a graph bucket
    eager_steps: int = 0
    graph_captures: int = 0
    graph_replays: int = 0
    model_load_s: float = 0.0
    kernel_warmup_wait_s: float = 0.0  # after the load, waiting for Triton kernels to compile (see start_warmup)
    host_step_s: float = 0.0  # wall time inside step() (host preparation and launches; captures included)
    first_step_s: float = 0.0  # the first step's share of it (kernel compilation, first CUDA calls)
    buckets: dict[int, int] = field(default_factory=dict)  # graph bucket (tokens) -> steps run in it

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve_device(device: str) -> DeviceName:
    """``auto`` -> ``cuda`` when available, else ``cpu``; ``cuda`` without CUDA is an error."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device cuda was asked for, but torch sees no CUDA device ({_why_no_cuda()}); give "
                         "--device cpu, or --device auto to use CUDA where there is one")
    if device in ("cpu", "cuda"):
        return cast(DeviceName, device)
    raise ValueError(f"device {device!r} is not one of auto, cpu, cuda")


def _why_no_cuda() -> str:
    """Why ``torch.cuda.is_available()`` is false, in the user's terms."""
    import os

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a build without CUDA"
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and not hidden.strip(" ,"):
        return "CUDA_VISIBLE_DEVICES is empty"
    return f"torch {torch.__version__} is built for CUDA {torch.version.cuda}, but finds no GPU or driver"


def resolve_dtype(dtype: str, device: str) -> DTypeName:
    """``auto`` -> bfloat16 on CUDA, float32 on the CPU."""
    if dtype == "auto":
        return "bfloat16" if device == "cuda" else "float32"
    if dtype in DTYPE_NAMES:
        return cast(DTypeName, dtype)
    raise ValueError(f"dtype {dtype!r} is not one of auto, {', '.join(DTYPE_NAMES)}")


def attention_backend(name: str) -> AttentionBackendName:
    """``--attention``, checked: auto, flashinfer, torch or sdpa."""
    if name in ATTENTION_BACKENDS:
        return cast(AttentionBackendName, name)
    raise ValueError(f"attention backend {name!r} is not one of {', '.join(ATTENTION_BACKENDS)}")


class Engine:
    """Runs one model over packed batches. Not thread-safe: one caller thread drives ``step``."""

    def __init__(self, spec: ModelSpec, config: EngineConfig, model: nn.Module | None = None) -> None:
        if config.token_budget < spec.pooling.max_length:
            raise ValueError(
                f"token budget {config.token_budget} < max length {spec.pooling.max_length}: "
                "raise --token-budget or lower --max-length"
            )
        self.spec = spec
        self.config = config
        self.pooling = spec.pooling
        self.device = torch.device(config.device)
        self.dtype = TORCH_DTYPES[config.dtype]  # the GEMMs' dtype
        # NOTE: on the CPU activations stay fp32 and only Linear weights narrow (bf16 GEMMs on AMX,
        # fp32 norms/softmax/residuals); on CUDA the whole model runs in ``dtype``.
        self.activation_dtype = self.dtype if self.device.type == "cuda" else torch.float32
        if self.device.type == "cpu" and self.dtype == torch.float16:
            raise ValueError("--dtype float16 is not supported on the CPU; use bfloat16 or float32")
        self.stats = EngineStats()
        started = time.perf_counter()
        self.small = SmallBatchKernels.for_engine(config, spec.config, self.device, self.activation_dtype)
        # compiles while the weights load
        warmup = start_warmup(spec.config, self.activation_dtype, self.device, self.small.skinny_tokens,
                              self.small.skinny_options())
        if model is None:
            model = load_model(spec, self.device, self.activation_dtype)
            if self.dtype != self.activation_dtype:
                narrow_linear_weights(model, self.dtype)
        self.model = model
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.stats.model_load_s = time.perf_counter() - started
        if warmup is not None:
            # NOTE: joined here, so no other thread launches CUDA work while a graph is being captured.
            waited = time.perf_counter()
            warmup.join()
            self.stats.kernel_warmup_wait_s = time.perf_counter() - waited
        cfg = spec.config
        # NOTE: ordinary tensors even when the engine is made under inference_mode: a replay step writes into
        # them outside it (the staging and result rings, the attention's plan buffers: engine/graphs.py)
        with torch.inference_mode(False):
            self.attention: AttentionBackend = make_attention_backend(
                config.attention, device=self.device, dtype=self.activation_dtype, num_heads=cfg.num_heads,
                num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, causal=cfg.causal,
                max_tokens=config.token_budget, max_seqs=config.max_seqs, cuda_graphs=config.cuda_graphs,
            )
            self.ring = HostRing(config.steps_in_flight + 1, config.max_seqs, spec.dim, self.device)
            self._staging: StagingRing | None = None  # eager steps' inputs, made at the first eager step
            self.graphs: LazyGraphRunner | None = None
            self._stream: CurrentStream | None = None
            if self.device.type == "cuda" and config.cuda_graphs and self.attention.capturable:
                self.graphs = self._graph_runner()
                self._stream = CurrentStream(self.device)

    def _graph_runner(self) -> LazyGraphRunner:
        """CUDA graphs captured lazily per token bucket over this engine's model and pooling."""
        cfg = self.config

        def forward(ctx: ForwardContext) -> torch.Tensor:
            assert ctx.input_ids is not None and ctx.positions is not None
            return forward_pooled(self.model, self.pooling, ctx.input_ids, ctx.positions, ctx)

        return LazyGraphRunner(
            token_budget=cfg.token_budget, max_seqs=cfg.max_seqs, max_length=self.pooling.max_length, dim=self.dim,
            device=self.device, attention=self.attention, forward=forward, capture=CudaGraphCapture(self.device),
            small=self.small,
        )

    @property
    def dim(self) -> int:
        return self.spec.dim

    def describe(self) -> dict[str, Any]:
        return {
            "device": str(self.device),
            "dtype": self.config.dtype,
            "attention": self.attention.name,
            "cuda_graphs": self.graphs is not None,
            "token_budget": self.config.token_budget,
            "max_seqs": self.config.max_seqs,
            "small_batch": {"attention_tokens": self.small.attention_tokens, "mlp_tokens": self.small.mlp_tokens,
                            "skinny_tokens": self.small.skinny_tokens, "pdl": self.small.pdl},
            "gemm_epilogues": {"residual": self.small.gemm_epilogues, "gelu": self.small.gelu_epilogue},
        }

    def step(self, batch: PackedBatch) -> LazyTensor:
        """Embed every sequence of ``batch``; returns at once (``result()`` -> ``[num_seqs, dim]``)."""
        if batch.num_seqs > self.config.max_seqs:
            raise ValueError(f"batch has {batch.num_seqs} sequences, the engine takes at most {self.config.max_seqs}")
        if batch.num_tokens > self.config.token_budget:
            raise ValueError(f"batch has {batch.num_tokens} tokens, over the token budget {self.config.token_budget}")
        if batch.max_seqlen > self.pooling.max_length:
            raise ValueError(f"a sequence of {batch.max_seqlen} tokens exceeds max length {self.pooling.max_length}")
        started = time.perf_counter()
        try:
            return self._step(batch)
        finally:
            elapsed = time.perf_counter() - started
            self.stats.host_step_s += elapsed
            if self.stats.steps == 1:
                self.stats.first_step_s = elapsed

    def _step(self, batch: PackedBatch) -> LazyTensor:
        self.stats.steps += 1
        self.stats.sequences += batch.num_seqs
        self.stats.tokens += batch.num_tokens
        if self.graphs is not None:
            # NOTE: no inference_mode here: a replay runs no autograd-visible op, and its host time goes before
            # the graph starts (the runner enters it for the eager and capture runs)
            out = self.graphs.run(batch)
            assert self._stream is not None
            stream = self._stream.get()
            self.stats.graph_captures = self.graphs.captures
            self.stats.graph_replays = self.graphs.replays
            self.stats.eager_steps = self.graphs.eager_runs
            self.stats.padded_tokens = self.graphs.padded_tokens
            bucket = token_bucket(batch.num_tokens)
            self.stats.buckets[bucket] = self.stats.buckets.get(bucket, 0) + 1
            return self.ring.submit(out, stream)
        with torch.inference_mode():
            self.stats.eager_steps += 1
            out = self.run_eager(batch)
            return self.ring.submit(out)

    def embed(self, batch: PackedBatch) -> np.ndarray:
        """``step(batch).result()``: ``[num_seqs, dim]`` float32 on the host."""
        return self.step(batch).result()

    def _make_staging(self) -> StagingRing:
        # NOTE: the CPU reuses one slot (the step runs synchronously); CUDA keeps slots per step in flight.
        depth = self.config.steps_in_flight + 2 if self.device.type == "cuda" else 1
        with torch.inference_mode(False):
            self._staging = StagingRing(depth, InputLayout(self.config.token_budget, self.config.max_seqs).size,
                                        self.device)
        return self._staging

    def run_eager(self, batch: PackedBatch) -> torch.Tensor:
        """The model on the batch's exact shapes: ``[num_seqs, dim]`` float32 on the device."""
        layout = InputLayout(batch.num_tokens, batch.num_seqs)
        staging = self._staging or self._make_staging()
        slot, host = staging.acquire()
        fill_inputs(host.numpy(), layout, batch)
        buffer = host[: layout.size]
        if self.device.type == "cuda":
            buffer = buffer.to(self.device, non_blocking=True)
        ctx = make_context(buffer, host[layout.slices()["cu_seqlens"]], layout, batch.max_seqlen, self.attention,
                           padded=False, small=self.small)
        self.attention.plan(ctx)
        staging.release(slot)
        assert ctx.input_ids is not None and ctx.positions is not None
        return forward_pooled(self.model, self.pooling, ctx.input_ids, ctx.positions, ctx)
