"""Typed, frozen configuration of the engine: the model's shape, how it pools, how it runs.

The Hugging Face ``config.json`` and the sentence-transformers files are folded into these once
(``engine/loader.py``); nothing downstream reads a raw config dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, cast

PoolingMode = Literal["mean", "cls", "last"]
AttentionMaskName = Literal["causal", "bidirectional"]
DeviceName = Literal["cpu", "cuda"]
DTypeName = Literal["float32", "bfloat16", "float16"]
AttentionBackendName = Literal["auto", "flashinfer", "torch", "sdpa"]

POOLING_MODES: tuple[str, ...] = ("mean", "cls", "last")


def pooling_mode(name: str | None) -> PoolingMode | None:
    """A pooling name read from a file, checked: mean, cls or last (``None`` stays ``None``)."""
    if name is None:
        return None
    if name not in POOLING_MODES:
        raise ValueError(f"pooling mode {name!r} is not one of {', '.join(POOLING_MODES)}")
    return cast(PoolingMode, name)

ATTENTION_MASKS: tuple[str, ...] = ("causal", "bidirectional")
# sentence-transformers ``Dense`` activations (``activation_function`` in ``N_Dense/config.json``) -> ours
DENSE_ACTIVATIONS: dict[str, str] = {
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.GELU": "gelu",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.activation.SiLU": "silu",
}
SIMILARITIES: tuple[str, ...] = ("cosine", "dot", "euclidean")
DTYPE_NAMES: tuple[str, ...] = ("float32", "bfloat16", "float16")
ATTENTION_BACKENDS: tuple[str, ...] = ("auto", "flashinfer", "torch", "sdpa")


@dataclass(frozen=True)
class ModelConfig:
    """The shape of an encoder, normalised from a Hugging Face ``config.json``."""

    architecture: str  # registry name, e.g. "bert", "qwen3"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    norm_eps: float
    hidden_act: str
    causal: bool = False
    type_vocab_size: int = 0
    # NOTE: absolute position ids start here (0 for BERT, padding_idx + 1 for XLM-RoBERTa).
    position_offset: int = 0
    rope_theta: float = 10000.0
    extra: tuple[tuple[str, object], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.hidden_size <= 0 or self.num_layers <= 0 or self.num_heads <= 0:
            raise ValueError(f"model config has non-positive sizes: {self}")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}"
            )


@dataclass(frozen=True)
class PoolingConfig:
    """How token states become one vector per sequence (sentence-transformers semantics)."""

    mode: PoolingMode
    normalize: bool
    max_length: int  # tokens per sequence, special tokens included

    def __post_init__(self) -> None:
        if self.mode not in POOLING_MODES:
            raise ValueError(f"pooling mode {self.mode!r} is not one of {', '.join(POOLING_MODES)}")
        if self.max_length < 2:
            raise ValueError(f"max_length {self.max_length} < 2")


@dataclass(frozen=True)
class DenseConfig:
    """A sentence-transformers ``Dense`` module after pooling: ``activation(x @ weight.T + bias)``."""

    in_features: int
    out_features: int
    bias: bool
    activation: str  # one of DENSE_ACTIVATIONS' values
    weight_file: Path  # its model.safetensors (or pickle weights, when allowed)

    def __post_init__(self) -> None:
        if self.in_features <= 0 or self.out_features <= 0:
            raise ValueError(f"Dense {self.in_features} -> {self.out_features} has a non-positive size")
        if self.activation not in DENSE_ACTIVATIONS.values():
            raise ValueError(f"Dense activation {self.activation!r} is not one of "
                             f"{', '.join(sorted(set(DENSE_ACTIVATIONS.values())))}")


@dataclass(frozen=True)
class PromptConfig:
    """Text put in front of every input before tokenization (sentence-transformers ``prompts``)."""

    query: str = ""
    document: str = ""


@dataclass(frozen=True)
class Source:
    """Where a setting came from: a flag the user gives (``flag``; ``name`` the flag), else the model's files (or the
    index's record; ``name`` the file and key). A setting that fails is a usage error (2) naming the flag, or a bad
    configuration (78) naming the file: a user who gave no flag cannot fix it by changing one."""

    name: str
    flag: bool = False


LENGTH_FLAG = Source("--max-length", flag=True)
PROMPT_FLAG = Source("--query-prompt", flag=True)


@dataclass(frozen=True)
class Sources:
    """Where a ``ModelSpec``'s max length and prompts came from (the defaults: the flags, as a spec made by hand)."""

    max_length: Source = LENGTH_FLAG
    query_prompt: Source = PROMPT_FLAG
    document_prompt: Source = PROMPT_FLAG


@dataclass(frozen=True)
class ModelOptions:
    """What a user may say about a model that its directory does not (or says otherwise)."""

    pooling: PoolingMode | None = None  # overrides modules.json / the family default
    attention_mask: AttentionMaskName | None = None  # overrides config.json (Qwen3 family only)
    query_prompt: str | None = None  # overrides config_sentence_transformers.json's query prompt
    allow_pickle_weights: bool = False  # load pytorch_model.bin (torch.load, weights_only=True)

    def __post_init__(self) -> None:
        if self.pooling is not None and self.pooling not in POOLING_MODES:
            raise ValueError(f"--pooling {self.pooling!r} is not one of {', '.join(POOLING_MODES)}")
        if self.attention_mask is not None and self.attention_mask not in ATTENTION_MASKS:
            raise ValueError(f"--attention-mask {self.attention_mask!r} is not one of {', '.join(ATTENTION_MASKS)}")


def device_problem(device: str, dtype: str, attention: str) -> str | None:
    """What the engine refuses of ``--dtype``/``--attention`` on ``device`` (``cpu`` or ``cuda``; ``auto`` is not
    known yet: ``None``), in the flags' words: told before torch is imported where ``--device cpu`` is given."""
    if device != "cpu":
        return None
    if dtype == "float16":
        return "--dtype float16 is not supported on the CPU; use bfloat16 or float32"
    if attention not in ("auto", "sdpa"):
        return f"--attention {attention} needs CUDA; on the CPU use sdpa (or auto)"
    return None


# The most tokens and sequences one engine step may hold (--token-budget, --max-seqs). The engine sizes its buffers
# (and CUDA graphs) by them when it is built: without a bound, --max-seqs 10^20 ended in an OverflowError, 2^40 in an
# allocation failure, each a traceback after the model loaded. 2^20 tokens is 64x the CUDA default, 256x the CPU's.
MAX_TOKEN_BUDGET = 1 << 20
MAX_SEQS = 1 << 16


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs a model: where, in what precision, with which kernels."""

    device: DeviceName = "cpu"
    dtype: DTypeName = "float32"
    attention: AttentionBackendName = "auto"
    cuda_graphs: bool = True
    token_budget: int = 8192  # max tokens per step (the largest bucket)
    max_seqs: int = 256  # max sequences per step (the graphs' sequence capacity)
    steps_in_flight: int = 2
    # The small-batch path on CUDA (engine/small_batch.py): the largest bucket, in tokens, that runs each
    # fused kernel (0: never). Measured on the H200: README "Small-batch latency".
    small_attention_tokens: int = 128
    fused_mlp_tokens: int = 32
    skinny_layer_tokens: int = 128  # Qwen3 layers as four weight-streaming kernels (engine/layers/skinny_linear.py)
    pdl: bool = True  # ... launched as programmatic dependent launches (sm90+)
    attention_in_o: bool = True  # ... the 16-token bucket: the attention inside the O projection's kernel
    # CUDA, every bucket: residual adds (and BERT's up-projection GELU) in the GEMMs (engine/small_batch.py)
    gemm_epilogues: bool = True
    # Qwen3 on sm90+: buckets of at least this many tokens run the gate/up GEMM with SwiGLU in its epilogue as a
    # TMA kernel (engine/layers/tma_mlp.py; 0: never)
    tma_mlp_tokens: int = 2048

    def __post_init__(self) -> None:
        problem = device_problem(self.device, self.dtype, self.attention)
        if problem is not None:
            raise ValueError(problem)
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPE_NAMES)}")
        if self.attention not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention backend {self.attention!r} is not one of {', '.join(ATTENTION_BACKENDS)}"
            )
        if not (1 <= self.token_budget <= MAX_TOKEN_BUDGET and 1 <= self.max_seqs <= MAX_SEQS):
            raise ValueError(f"token_budget {self.token_budget} and max_seqs {self.max_seqs} must be in "
                             f"1..{MAX_TOKEN_BUDGET} and 1..{MAX_SEQS}")
        if self.steps_in_flight < 1:
            raise ValueError(f"steps_in_flight {self.steps_in_flight} < 1")
        if min(self.small_attention_tokens, self.fused_mlp_tokens, self.skinny_layer_tokens, self.tma_mlp_tokens) < 0:
            raise ValueError("small-batch token limits must be >= 0 (0 turns a kernel off)")
