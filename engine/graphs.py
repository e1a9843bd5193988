"""Whole-model CUDA graphs, one per token bucket, captured lazily.

One class owns them: the buckets, each bucket's static input buffer, one shared memory pool, the
shared output buffer and the counters. A bucket's first batch runs eagerly (on the bucket's padded
shapes, so it also warms kernels and JIT caches); its second batch captures the graph; later batches
replay it. A bucket's inputs are filled into its own pinned host buffer; the graph's first node copies
them to the device. Attention planning (``plan()``) happens on the host before every run, outside the
graph. Embedding lookup, every layer, pooling and normalisation are inside the graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from petal.engine.batch import LARGE_BUCKET_STEP, PackedBatch, token_bucket, token_buckets
from petal.engine.context import ForwardContext
from petal.engine.inputs import InputLayout, fill_inputs, make_context

if TYPE_CHECKING:
    from petal.engine.layers.attention import AttentionBackend
    from petal.engine.small_batch import SmallBatchKernels


class Graph(Protocol):
    """The part of ``torch.cuda.CUDAGraph`` the runner uses (a stand-in replaces it in CPU tests)."""

    def replay(self) -> None: ...


GraphCapture = Callable[[Callable[[], None]], Graph]


def seq_capacity(bucket: int, max_seqs: int) -> int:
    """Sequence slots of a bucket: its batches' sequences (at most ``bucket``) plus the padding sequence."""
    return min(max_seqs, bucket) + 1


@dataclass
class BucketState:
    layout: InputLayout
    buffer: torch.Tensor  # [layout.size] int32 on the device: the graph's static inputs
    host: torch.Tensor  # [layout.size] int32 on the host (pinned on CUDA): copied to ``buffer`` by the graph itself
    ctx: ForwardContext
    copied: torch.cuda.Event | None  # CUDA: recorded by each run right after its copy of ``host``
    hits: int = 0
    graph: Graph | None = None
    pending: bool = False  # a run was launched whose copy of ``host`` may not have executed yet

    def __post_init__(self) -> None:
        self.host_numpy = self.host.numpy()
        self.host_cu_seqlens = self.host[self.layout.slices()["cu_seqlens"]]


class LazyGraphRunner:
    """Bucketed, lazily captured execution of ``forward(ctx) -> [num_seqs, dim]``.

    ``capture(fn)`` records ``fn`` into a graph and returns it (``torch.cuda.CUDAGraph`` on CUDA);
    ``run`` implements the state machine eager -> capture -> replay per bucket.
    """

    def __init__(self, *, token_budget: int, max_seqs: int, max_length: int, dim: int, device: torch.device,
                 attention: AttentionBackend, forward: Callable[[ForwardContext], torch.Tensor], capture: GraphCapture,
                 small: SmallBatchKernels | None = None) -> None:
        self.buckets = token_buckets(token_budget)
        self.max_seqs = max_seqs
        self.max_length = max_length
        self.device = device
        self.attention = attention
        self.forward = forward
        self.capture = capture
        self.small = small
        self.states: dict[int, BucketState] = {}
        largest = InputLayout(self.buckets[-1], seq_capacity(self.buckets[-1], max_seqs))
        # NOTE: every graph writes its pooled rows here; the result is copied out (engine/lazy_tensor.py)
        # before the next replay can overwrite it (same stream).
        self.output = torch.zeros(largest.num_seqs, dim, dtype=torch.float32, device=device)
        self.captures = 0
        self.replays = 0
        self.eager_runs = 0
        self.padded_tokens = 0
        self._plan = getattr(attention, "plan", None)
        register = getattr(attention, "register_capacity", None)
        if register is not None:
            for bucket in self.buckets:
                register(seq_capacity(bucket, max_seqs), bucket)

    def counters(self) -> dict[str, int]:
        return {"graph_captures": self.captures, "graph_replays": self.replays, "eager_steps": self.eager_runs,
                "padded_tokens": self.padded_tokens, "buckets_used": len(self.states)}

    def _state(self, bucket: int) -> BucketState:
        state = self.states.get(bucket)
        if state is None:
            layout = InputLayout(bucket, seq_capacity(bucket, self.max_seqs))
            buffer = torch.zeros(layout.size, dtype=torch.int32, device=self.device)
            # NOTE: max_seqlen is an upper bound baked into the graph (varlen kernels read real offsets);
            # the padding sequence is shorter than the bucket step (256), whatever the max length.
            max_seqlen = min(bucket, max(self.max_length, LARGE_BUCKET_STEP))
            ctx = make_context(buffer, torch.zeros(0, dtype=torch.int32), layout, max_seqlen, self.attention,
                               padded=True, small=self.small)
            cuda = self.device.type == "cuda"
            host = torch.zeros(layout.size, dtype=torch.int32, pin_memory=cuda)
            # NOTE: external: captured as an event-record node, so a replay records it too (not only the capture)
            copied = torch.cuda.Event(external=True) if cuda else None
            state = BucketState(layout, buffer, host, ctx, copied)
            self.states[bucket] = state
        return state

    def run(self, batch: PackedBatch) -> torch.Tensor:
        """Embed ``batch``; returns a view ``[batch.num_seqs, dim]`` of the shared output buffer.

        NOTE: a replay's host work goes before the graph starts, so a lone step waits for every microsecond of
        it, more when the thread comes back from a sleep with cold caches (bench/prelaunch_probe.py). So a
        replay is only: fill the bucket's pinned inputs, plan (FlashInfer buckets), launch. The copy of the
        inputs to the device is the graph's first node (no copy call, no staging event), and the path runs
        outside ``inference_mode`` (the buffers are ordinary tensors; the forward runs under it in the eager
        and capture runs).
        """
        bucket = token_bucket(batch.num_tokens)
        if bucket > self.buckets[-1]:
            raise ValueError(f"batch of {batch.num_tokens} tokens is over the largest bucket {self.buckets[-1]}")
        state = self.states.get(bucket)
        if state is None:
            with torch.inference_mode(False):
                state = self._state(bucket)
        self.padded_tokens += bucket - batch.num_tokens
        if state.pending:
            # NOTE: the bucket's previous run must have copied ``host`` before it is refilled; it has, unless
            # that run is still queued behind another step (then this waits until it starts, not until it ends)
            assert state.copied is not None
            state.copied.synchronize()
        fill_inputs(state.host_numpy, state.layout, batch)
        if self._plan is not None:
            state.ctx.cu_seqlens_cpu = state.host_cu_seqlens
            self._plan(state.ctx)
        if state.graph is not None:
            state.graph.replay()
            self.replays += 1
        else:
            rows = state.layout.num_seqs

            def step() -> None:
                state.buffer.copy_(state.host, non_blocking=True)
                if state.copied is not None:
                    state.copied.record()  # the current stream: the capture stream while capturing
                self.output[:rows].copy_(self.forward(state.ctx))

            with torch.inference_mode():
                if state.hits == 0:
                    step()
                    self.eager_runs += 1
                else:
                    state.graph = self.capture(step)
                    self.captures += 1
                    state.graph.replay()
                    self.replays += 1
        state.pending = state.copied is not None
        state.hits += 1
        return self.output[: batch.num_seqs]


class CudaGraphCapture:
    """Captures into one shared memory pool on a dedicated stream, after a warm-up run there."""

    def __init__(self, device: torch.device) -> None:
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device=device)

    def __call__(self, fn: Callable[[], None]) -> torch.cuda.CUDAGraph:
        current = torch.cuda.current_stream()
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            fn()  # warm-up on the capture stream (cuBLAS workspaces, lazy module loads)
        current.wait_stream(self.stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            fn()
        return graph
