"""What a ``petal serve`` process is allowed to take: request limits, queue bounds, batching, auth."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
API_KEY_ENV = "PETAL_API_KEY"
PACKAGED_MODEL_NAME = "all-MiniLM-L6-v2"
# NOTE: the engine thread waits out --max-wait-ms in a condition's wait, which raises past the platform's time_t
# (inf, 1e308): the engine thread died and every request hung unanswered while /ready said ready. A partial batch
# held for more than a minute helps no client (theirs time out first)
MAX_WAIT_MS = 60_000.0


def model_name(path: Path) -> str:
    """The default model id: the directory's name (the packaged MiniLM's is ``all-MiniLM-L6-v2``; a snapshot of the
    Hugging Face cache's, its model id, never the revision hash that names the directory)."""
    from petal.engine.loader import default_model_dir
    from petal.engine.resolve import cached_model_id

    try:
        if path.resolve() == default_model_dir().resolve():
            return PACKAGED_MODEL_NAME
    except Exception:  # no packaged model: the directory name
        pass
    return cached_model_id(path) or path.name


@dataclass(frozen=True)
class Limits:
    """Per-request limits; a request over one gets a 4xx naming it."""

    max_texts: int = 256  # texts (or vectors) per request
    max_tokens_per_text: int | None = None  # None: the model's max length
    max_k: int = 1000
    max_body_bytes: int = 4 << 20

    def __post_init__(self) -> None:
        if min(self.max_texts, self.max_k, self.max_body_bytes) < 1:
            raise ValueError("request limits must be >= 1")
        if self.max_tokens_per_text is not None and self.max_tokens_per_text < 1:
            raise ValueError(f"--max-tokens-per-text {self.max_tokens_per_text} < 1")


@dataclass(frozen=True)
class ServeSettings:
    """Batching, overload and index-following settings of one server."""

    limits: Limits = Limits()
    max_wait_ms: float = 0.0  # hold a partial batch this long for more requests (0: launch at once)
    max_queue_texts: int = 4096  # sequences waiting for the engine; beyond it: 503 + Retry-After
    max_body_bytes_in_flight: int = 64 << 20  # body bytes all requests hold at once; beyond it: 503 + Retry-After
    max_answer_bytes_in_flight: int = 256 << 20  # answer bytes held unsent at once (one always goes); beyond: 503
    retry_after_s: int = 1
    reload_interval_s: float = 1.0  # how often OUT/CURRENT is checked for a new version
    drain_timeout_s: float = 30.0  # SIGTERM: how long in-flight requests may take to finish
    header_timeout_s: float = 30.0  # how long a request line and headers may take to arrive once begun (then 408)
    keep_alive_s: float = 5.0  # how long an idle keep-alive connection (or a new one that sends nothing) is kept
    body_timeout_s: float = 60.0  # how long a request's body may take to arrive once its handler reads it (then 408)
    send_timeout_s: float = 60.0  # how long an answer may wait for its client to read (then the connection is aborted)
    search_threads: int = 4  # reading stored text and metadata (include) runs in this many threads
    api_key: str | None = None
    served_model_name: str | None = None  # the `model` id of /v1/models (default: the model directory's name)
    search_device: str = "cpu"  # cpu: FAISS; cuda: a GPU copy of the vectors (serve/gpu_search.py, gpu_ivf.py)
    search_dtype: str = "float16"  # the GPU copy's dtype (float16 or float32)
    search_exact: bool = False  # cuda: score every vector of an IVF index, not only its probed lists
    # NOTE: the engine and search threads share the GIL with the event loop; with Python's default 5 ms a
    # thread that wants the GIL back (to launch the next step) can wait 5 ms behind a busy loop
    switch_interval_ms: float = 0.5
    engine_spin_ms: float | None = None  # the engine thread's spin before it sleeps (None: 2 ms on CUDA, 0 on CPU)

    def __post_init__(self) -> None:
        # NOTE: first: NaN passes every comparison below (and click's FloatRange): --drain-timeout-s nan exited 1 with
        # a traceback at the stop, --header-timeout-s nan answered every request 400, --keep-alive-s nan hung every
        # connection, --body-timeout-s nan answered 500, --switch-interval-ms nan aborted the process
        durations = {"--max-wait-ms": self.max_wait_ms, "--reload-interval-s": self.reload_interval_s,
                     "--drain-timeout-s": self.drain_timeout_s, "--header-timeout-s": self.header_timeout_s,
                     "--keep-alive-s": self.keep_alive_s, "--body-timeout-s": self.body_timeout_s,
                     "--send-timeout-s": self.send_timeout_s, "--switch-interval-ms": self.switch_interval_ms,
                     "--engine-spin-ms": self.engine_spin_ms}
        for flag, value in durations.items():
            if value is not None and math.isnan(value):
                raise ValueError(f"{flag} {value} is not a number")
        name = self.served_model_name
        if name is not None and name.endswith("/"):
            # NOTE: /v1/models listed it, and its own path (/v1/models/ID/, a trailing slash) was no route (404).
            # A leading '/' or a '//' inside is served (/v1/models//x, /v1/models/a//b reach the model's route)
            raise ValueError(f"--served-model-name {name!r}: a model id may not end with '/' (its path "
                             "/v1/models/ID/ is no route, as every path with a trailing slash); give it as 'org/name'")
        if not 0 <= self.max_wait_ms <= MAX_WAIT_MS:
            raise ValueError(f"--max-wait-ms {self.max_wait_ms:g}: from 0 to {MAX_WAIT_MS:g}")
        if self.max_queue_texts < self.limits.max_texts:
            raise ValueError(f"--max-queue-texts {self.max_queue_texts} is below --max-texts {self.limits.max_texts}: "
                             "a full request could never be queued")
        if self.max_body_bytes_in_flight < self.limits.max_body_bytes:
            raise ValueError(f"--max-body-bytes-in-flight {self.max_body_bytes_in_flight} is below --max-body-bytes "
                             f"{self.limits.max_body_bytes}: a body of the largest size could never be read")
        if self.max_answer_bytes_in_flight < 1024:  # NOTE: the CLI's bound, for a caller building it directly
            raise ValueError(f"--max-answer-bytes-in-flight {self.max_answer_bytes_in_flight} < 1024")
        if self.engine_spin_ms is not None and not 0 <= self.engine_spin_ms <= 1000:
            raise ValueError(f"--engine-spin-ms {self.engine_spin_ms}: from 0 to 1000")
        if self.switch_interval_ms <= 0:
            raise ValueError(f"--switch-interval-ms {self.switch_interval_ms} must be > 0")
        if min(self.header_timeout_s, self.keep_alive_s, self.body_timeout_s, self.send_timeout_s) <= 0:
            raise ValueError("--header-timeout-s, --keep-alive-s, --body-timeout-s and --send-timeout-s must be > 0")
        if self.reload_interval_s <= 0 or self.drain_timeout_s < 0 or self.search_threads < 1:
            raise ValueError("--reload-interval-s must be > 0, --drain-timeout-s >= 0, threads >= 1")
        if self.search_device not in ("cpu", "cuda") or self.search_dtype not in ("float16", "float32"):
            raise ValueError(f"--search-device {self.search_device} / --search-dtype {self.search_dtype}: "
                             "cpu or cuda / float16 or float32")
        if self.api_key is not None:
            # NOTE: a key read from a file or a secret often ends in a newline, which no header can carry (and
            # the server strips around the header's token): the key is what is between the whitespace
            key = self.api_key.strip()
            if not key:
                raise ValueError("--api-key (or PETAL_API_KEY) is empty")
            if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in key):
                raise ValueError("--api-key (or PETAL_API_KEY) holds a control character, which no HTTP header "
                                 "can carry")
            object.__setattr__(self, "api_key", key)
