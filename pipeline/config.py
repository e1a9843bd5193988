"""Frozen configuration of an indexing run, validated once when built from the CLI's flags."""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from petal.engine.config import MAX_SEQS, MAX_TOKEN_BUDGET, ModelOptions, device_problem
from petal.pipeline.ingest.text_rule import first_surrogate
from petal.pipeline.read_only import read_only
from petal.pipeline.store.outputs import OutputConfig

METRICS = ("ip", "l2")
DEFAULT_ID_COLUMN = "id"
DEFAULT_TEXT_COLUMN = "text"


MAX_INT64 = (1 << 63) - 1  # the largest size or count a flag takes: what a manifest's or a report's integer holds
SHOWN_CHARS = 40  # of a flag's value quoted in a message (a 5000-digit value was echoed whole)


def shown(value: object) -> str:
    """``value`` for a message (a flag's text quoted, a number as it is), cut to ``SHOWN_CHARS`` with how long it
    was."""
    try:
        text = str(value)
    except ValueError:  # NOTE: an int of over 4300 digits has no str() (Python's limit)
        return "a number of over 4300 digits"
    cut = text[:SHOWN_CHARS]
    said = repr(cut) if isinstance(value, str) else cut
    return said if cut == text else f"{said}... ({len(text)} characters)"


def whole_number(digits: str, most: int = MAX_INT64) -> int | None:
    """``int(digits)`` (ASCII digits) when it is at most ``most``, else ``None``. NOTE: never ``int()`` of thousands of
    digits (Python refuses over 4300, with its own message)."""
    digits = digits.lstrip("0") or "0"
    if len(digits) > len(str(most)):
        return None
    value = int(digits)
    return value if value <= most else None


def check_column_name(flag: str, name: str) -> None:
    """``ValueError`` naming ``flag`` for a column name no Parquet file can hold (a lone surrogate)."""
    at = first_surrogate(name)
    if at is not None:
        raise ValueError(f"{flag} {name!r}: character {at + 1} is not text (a byte that is not UTF-8): no Parquet "
                         "column has that name")


def keep_versions_problem(keep_versions: int) -> str | None:
    """What is wrong with ``--keep-versions N`` (``None``: nothing). One wording for ``petal index`` and ``petal
    rebuild`` (NOTE: rebuild's was click's "0 is not in the range x>=1", index's this one)."""
    if keep_versions >= 1:
        return None
    return (f"--keep-versions {shown(keep_versions)} < 1: the live version is always kept and counts as one (1: only "
            "the live version; N: it and the N-1 before it)")


@dataclass(frozen=True)
class ReadConfig:
    """Which columns to read and how much at a time."""

    text_column: str = DEFAULT_TEXT_COLUMN
    id_column: str = DEFAULT_ID_COLUMN
    id_column_required: bool = False  # True when the user named it: absent is then an error
    batch_rows: int = 4096  # rows per Arrow record batch read (fewer when rows are large)
    # host memory budget of the rows read at once: the read and tokenize window as a whole, and the stored text and
    # kept columns as they are written; record batches are read at max_batch_bytes / READ_WINDOW_BATCHES (8)
    max_batch_bytes: int = 64 << 20
    read_buffer_bytes: int = 1 << 20  # pages are streamed through a buffer this big, never a whole row group
    read_retries: int = 3  # an OS read error is retried this many times (backoff from retry_delay_s)
    retry_delay_s: float = 0.1

    def __post_init__(self) -> None:
        for flag, column in (("--text-column", self.text_column), ("--id-column", self.id_column)):
            if not column:
                raise ValueError(f"{flag} must not be empty: give a column's name")
        if self.text_column == self.id_column:
            raise ValueError(f"--text-column and --id-column are both {self.text_column!r}")
        check_column_name("--text-column", self.text_column)
        check_column_name("--id-column", self.id_column)
        if self.batch_rows < 1:
            raise ValueError(f"batch_rows {self.batch_rows} < 1")
        if self.max_batch_bytes < 1 or self.read_buffer_bytes < 1 or self.read_retries < 0:
            raise ValueError(f"bad read limits: {self}")


SIZE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


MAX_SIZE = f"{MAX_INT64 >> 40}T"  # the largest size (2**63 - 1 bytes, rounded down to T)


def size_problem(size: int) -> str | None:
    """What is wrong with a size in bytes a user gave (``None``: nothing): over ``MAX_INT64``. NOTE: judged where a
    size is given (the flag, the API's keyword), never in ``IndexSettings``: a manifest an older petal wrote with one
    (10**30 was taken) still opens."""
    return None if size <= MAX_INT64 else f"{shown(size)} bytes is over the largest, {MAX_SIZE} (2**63 - 1 bytes)"


def parse_size(text: str) -> int:
    """``"4G"`` -> 4 * 2**30 bytes (units B, K, M, G, T; binary; an optional trailing ``iB``/``B``), at most
    ``MAX_INT64`` bytes (``ValueError`` above: a manifest's integer holds it)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    if match is None:
        raise ValueError(f"size {shown(text)} is not a number with an optional unit (K, M, G, T), e.g. 4G or 512M")
    # NOTE: exact decimal arithmetic: float() of 310 digits was infinity, and int() of it an OverflowError traceback
    size = Decimal(match.group(1)) * SIZE_UNITS[match.group(2)]
    if size > MAX_INT64:  # NOTE: was taken, and written to the manifest above what a uint64 holds
        raise ValueError(f"size {shown(text)} is over the largest, {MAX_SIZE} (2**63 - 1 bytes)")
    return int(size)


@read_only
@dataclass(frozen=True)
class IndexSettings:
    """How vectors become a FAISS index (``pipeline/index/plan.py`` reads these)."""

    factory: str = "auto"  # "auto" or a FAISS index factory string
    metric: str = "ip"
    seed: int = 1234
    flat_max_vectors: int = 50_000  # "auto": exact search up to this many vectors (when it fits the budget)
    memory_bytes: int = 8 << 30  # --index-memory: what the index build may hold in RAM; IVF above it goes on disk
    target_recall: float = 0.95  # --target-recall: recall@10 against exact search, reached by tuning
    train_points_per_centroid: int = 64  # k-means sample size per IVF list (FAISS: 30..256)
    tune_queries: int = 1000  # held-out vectors the search parameters are tuned on

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"--metric {self.metric!r} is not one of {', '.join(METRICS)}")
        if not self.factory:
            raise ValueError("--index-factory must not be empty")
        if self.memory_bytes < 1 << 20:
            raise ValueError(f"--index-memory {shown(self.memory_bytes)} bytes < 1M: give at least 1M")
        if not 0.0 < self.target_recall <= 1.0:
            raise ValueError(f"--target-recall {self.target_recall} is not in (0, 1]")
        if not 30 <= self.train_points_per_centroid <= 256:
            raise ValueError(f"train_points_per_centroid {self.train_points_per_centroid} is not in 30..256")
        if self.tune_queries < 10:
            raise ValueError(f"tune_queries {self.tune_queries} < 10")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


LimitT = TypeVar("LimitT", bound="CountOrFraction")


@dataclass(frozen=True)
class CountOrFraction:
    """A limit given as a count (``100``) or a fraction of some total (``0.01`` or ``1%``); each
    flag names itself (``FLAG``, ``NAME``) and what its fraction is of (``OF``) in messages."""

    count: int | None = None
    fraction: float | None = None
    FLAG: ClassVar[str] = "--limit"
    NAME: ClassVar[str] = "a limit"
    OF: ClassVar[str] = "the total (0.01 or 1%)"

    def __post_init__(self) -> None:
        if (self.count is None) == (self.fraction is None):
            raise ValueError(f"{self.NAME} is a count or a fraction, not both")
        if self.count is not None and self.count < 0:
            raise ValueError(f"{self.FLAG} {shown(self.count)} < 0")
        if self.count is not None and self.count > MAX_INT64:
            raise ValueError(f"{self.FLAG} {shown(self.count)} is over the largest count, 2**63 - 1")
        if self.fraction is not None and not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"{self.FLAG} fraction {self.fraction} is not between 0 and 1")

    @classmethod
    def parse(cls: type[LimitT], text: str) -> LimitT:
        value = text.strip()
        expected = f"{cls.FLAG} {shown(text)}: expected a count (100) or a fraction of {cls.OF}"
        if value.startswith("-"):
            raise ValueError(f"{expected}, never negative")
        if re.fullmatch(r"[0-9]+", value):
            count = whole_number(value)
            if count is None:
                raise ValueError(f"{expected}: the count is over the largest, 2**63 - 1")
            return cls(count=count)
        try:
            fraction = float(value[:-1]) / 100 if value.endswith("%") else float(value)
        except ValueError:  # NOTE: was Python's own words ("could not convert string to float: ''")
            raise ValueError(expected) from None
        try:
            return cls(fraction=fraction)
        except ValueError as exc:
            raise ValueError(f"{expected}: {exc}") from exc

    def allowed(self, total: int) -> int:
        """How many of ``total`` the limit accepts."""
        return self.count if self.count is not None else math.floor((self.fraction or 0.0) * total)


@dataclass(frozen=True)
class BadRowBudget(CountOrFraction):
    """``--max-bad-rows``: how many skipped rows a run accepts, a count (``100``) or a fraction of
    the rows read (``0.01`` or ``1%``). Over it, the run fails with exit 65."""

    FLAG: ClassVar[str] = "--max-bad-rows"
    NAME: ClassVar[str] = "a bad-row budget"
    OF: ClassVar[str] = "the rows (0.01 or 1%)"

    def __str__(self) -> str:
        return str(self.count) if self.count is not None else f"{self.fraction:g}"


@dataclass(frozen=True)
class RemovalLimit(CountOrFraction):
    """``--max-removed``: documents a run may remove, a count (``100``) or a fraction of the live
    version (``0.1`` or ``10%``)."""

    FLAG: ClassVar[str] = "--max-removed"
    NAME: ClassVar[str] = "--max-removed"
    OF: ClassVar[str] = "the live version (0.1 or 10%)"

    @classmethod
    def default(cls, sync: bool) -> RemovalLimit:
        return cls(fraction=0.10) if sync else cls(count=0)

    def __str__(self) -> str:
        # NOTE: exactly one of count / fraction is set (CountOrFraction's invariant), which mypy cannot see
        return str(self.count) if self.count is not None else f"{self.fraction * 100:g}%"  # type: ignore[operator]


KEEP_UNUSED_S = 7 * 86_400  # --keep-unused default: a nightly job that failed, rerun after a weekend, resumes


@dataclass(frozen=True)
class IndexJob:
    """Everything ``petal index`` was asked to do."""

    sources: tuple[str, ...]
    out: Path
    model: str | None  # None: the packaged default
    read: ReadConfig
    index: IndexSettings
    device: str = "auto"
    dtype: str = "auto"
    attention: str = "auto"
    cuda_graphs: bool = True
    max_length: int | None = None
    token_budget: int | None = None  # None: chosen for the device
    max_seqs: int = 256
    full: bool = False  # ignore the store and the live version's settings: re-embed everything
    strict: bool = False
    quiet: bool = False
    json_report: Path | None = None
    max_bad_rows: BadRowBudget | None = None  # None: any number of bad rows is skipped and reported
    keep_versions: int = 2  # the live version and the one before it (rollback)
    keep_unused_s: float = KEEP_UNUSED_S  # --keep-unused: unpublished store entries kept this long (store/retention.py)
    wait: bool = False  # queue for the writer lock instead of exiting 75
    model_options: ModelOptions = field(default_factory=ModelOptions)  # --pooling, --attention-mask, ...
    output: OutputConfig = field(default_factory=OutputConfig)  # --dim, --quantize, --output-dtype
    tokenize_workers: int | None = None  # batches tokenized at once; None: PETAL_TOKENIZE_WORKERS, else 2
    scale: ScaleConfig | None = None  # --devices/--workers/--ray: embed in worker processes; None: in this process
    sync: bool = False  # --sync: the version holds exactly the SOURCES; else additive (pipeline/jobs/removals.py)
    max_removed: Any = None  # --max-removed (a RemovalLimit); None: 0 additive, 10% with --sync
    delete: Path | None = None  # --delete IDS.parquet: ids removed in the next version (tombstones)
    keep_columns: tuple[str, ...] = ()  # --keep-columns: stored with the ids, returned with hits, filterable

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError("no SOURCE given")
        workers = self.tokenize_workers
        if workers is None:  # NOTE: resolved here, so a bad environment value fails before any work
            workers = tokenize_workers()
            object.__setattr__(self, "tokenize_workers", workers)
        if workers < 1:
            raise ValueError(f"tokenize workers {workers} < 1")
        check_lengths(self.max_length, self.token_budget, self.max_seqs)
        problem = device_problem(self.device, self.dtype, self.attention)  # NOTE: --device cpu: before any shard
        if problem is not None:
            raise ValueError(problem)
        problem = keep_versions_problem(self.keep_versions)
        if problem is not None:
            raise ValueError(problem)
        check_keep_names(self.keep_columns, list(self.keep_columns))  # the API's list is taken as it is


DEFAULT_RANGE_ROWS = 100_000  # rows of a row-group range of a large shard (--range-rows)


def ray_address_problem(address: str) -> str | None:
    """What is wrong with a ``--ray ADDRESS`` (``None``: nothing petal can tell): ``auto``, ``local``, a URL
    (``ray://host:10001``: Ray Client judges it) or ``HOST:PORT`` of a cluster's GCS. NOTE: another scheme was Ray's
    error at ``ray.init``, reported 75 (retry: it never works); ``http://`` is a dashboard's address, not a cluster's
    one."""
    if address in ("auto", "local"):
        return None
    scheme, sep, _ = address.partition("://")
    if sep:
        if scheme == "ray":
            return None
        dashboard = " (an http:// address is a dashboard's; the cluster's is HOST:6379 or ray://HOST:10001)" \
            if scheme in ("http", "https") else ""
        return f"the scheme {scheme}:// is not a Ray cluster's{dashboard}; give HOST:PORT, ray://HOST:PORT or auto"
    if not address.strip():
        return ("an empty address; give HOST:PORT, ray://HOST:PORT or auto, or --ray alone (RAY_ADDRESS, else a local "
                "Ray)")
    host, colon, port = address.rpartition(":")
    if not colon or not host.strip("[]"):
        return "not HOST:PORT, ray://HOST:PORT or auto"
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f"port {port!r} is not a number from 1 to 65535"
    return None


@dataclass(frozen=True)
class ScaleConfig:
    """``--devices``/``--workers``/``--ray``: how many processes embed, and on which devices.

    ``devices``: ``"all"``, a count (``"2"``: the first two), a comma list of CUDA device ids
    (``"0,1"``, ``"3,"``: just device 3) or ``None`` (the job's ``--device``, one device). ``workers``:
    processes in all, spread round-robin over the devices (``None``: one per device). ``ray``: run
    on Ray Data instead (``ray_address`` ``None``: a local instance or ``RAY_ADDRESS``). ``range_rows``:
    a shard of more rows (and several row groups) is handed out as row-group ranges of about that
    many rows, each committed on its own (``None``: ``DEFAULT_RANGE_ROWS``; 0: whole shards only).
    """

    devices: str | None = None
    workers: int | None = None
    ray: bool = False
    ray_address: str | None = None
    range_rows: int | None = None  # a shard of more rows is cut into row-group ranges (0: never; None: 100000)

    def __post_init__(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"--workers {self.workers} < 1: the number of worker processes is 1 or more")
        if self.range_rows is not None and self.range_rows < 0:
            raise ValueError(f"--range-rows {self.range_rows} < 0")
        if self.ray_address is not None and not self.ray:  # NOTE: was dropped, and the run went to worker processes
            raise ValueError(f"ray_address {self.ray_address!r} goes with ray=True (--ray ADDRESS): give both, or "
                             "neither")
        if self.ray and self.devices is not None:
            raise ValueError("--ray places its actors on the cluster's GPUs itself: drop --devices")
        if self.ray_address is not None:
            problem = ray_address_problem(self.ray_address)
            if problem is not None:  # NOTE: was Ray's ValueError at ray.init, reported 75 'retry' (it never works)
                raise ValueError(f"--ray {self.ray_address!r}: {problem}")
        if self.devices is not None:
            parse_devices(self.devices)  # a malformed list is a usage error now

    @property
    def split_rows(self) -> int:
        """The ``--range-rows`` in effect (0: shards are never cut)."""
        return DEFAULT_RANGE_ROWS if self.range_rows is None else self.range_rows

    def device_ids(self, visible: int) -> list[int] | None:
        """The CUDA device ids (of ``visible`` ones) to use; ``None`` without ``--devices``."""
        if self.devices is None:
            return None
        parsed = parse_devices(self.devices)
        if isinstance(parsed, list):
            ids = parsed
        elif isinstance(parsed, int):
            if parsed > visible:
                raise ValueError(f"--devices {parsed}: only {visible} CUDA device(s) visible")
            ids = list(range(parsed))
        else:  # "all"
            ids = list(range(visible))
        bad = [i for i in ids if i >= visible]
        if bad:
            raise ValueError(f"--devices {self.devices}: device {bad[0]} does not exist ({visible} visible)")
        if not ids:
            raise ValueError("--devices all: no CUDA device visible")
        return ids


def parse_devices(text: str) -> str | int | list[int]:
    """``"all"``, a count ``"N"`` or a list ``"0,1"`` (a trailing comma makes one id a list: ``"3,"``)."""
    value = text.strip().lower()
    if value == "all":
        return "all"
    if re.fullmatch(r"\d+", value):
        if int(value) < 1:
            raise ValueError(f"--devices {text!r}: give at least 1")
        return int(value)
    if re.fullmatch(r"\d+(,\d+)*,?", value):
        ids = [int(v) for v in value.split(",") if v]
        if len(set(ids)) != len(ids):
            raise ValueError(f"--devices {text!r} names a device twice")
        return ids
    raise ValueError(f"--devices {text!r} is not all, a count (2) or a list of device ids (0,1)")


def parse_keep_columns(text: str | None) -> tuple[str, ...]:
    """``"lang, url"`` -> ``("lang", "url")``; ``None`` (no flag) -> ``()``. ``ValueError`` naming the flag for
    a value without names (``''``, ``' , '``), an empty name (``'lang,,url'``) or a repeat."""
    if text is None:
        return ()
    names = tuple(name.strip() for name in text.split(","))
    if not any(names):
        raise ValueError(f"--keep-columns {text!r} names no column: give column names separated by commas "
                         "(lang,url), or leave the flag out to keep none")
    check_keep_names(names, text)
    return names


def check_keep_names(names: tuple[str, ...], given: object) -> None:
    """``--keep-columns`` names (or the API's ``keep_columns``): non-empty and distinct (``ValueError`` naming them)."""
    odd = [name for name in names if not isinstance(name, str)]
    if odd:
        raise ValueError(f"--keep-columns {given!r}: column names are strings, not {odd[0]!r}")
    if any(not name.strip() for name in names):
        raise ValueError(f"--keep-columns {given!r}: an empty column name; give column names separated by commas "
                         "(lang,url)")
    for name in names:
        check_column_name("--keep-columns", name)
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"--keep-columns {given!r} names {repeated[0]!r} twice; give each column once")


def check_lengths(max_length: int | None = None, token_budget: int | None = None, max_seqs: int = 1) -> None:
    """``--max-length``, ``--token-budget`` and ``--max-seqs`` of any command that embeds (``None``: the default),
    checked before anything loads; ``ValueError`` naming the flag."""
    if max_length is not None and max_length < 2:  # NOTE: worded as the model's own check (tokens.py no_room)
        raise ValueError(f"--max-length {shown(max_length)} leaves no token for the text: give more than the "
                         "model's special tokens take (at least 2)")
    if max_length is not None and max_length > MAX_TOKEN_BUDGET:  # NOTE: no token budget holds one such sequence
        raise ValueError(f"--max-length {shown(max_length)} is over {MAX_TOKEN_BUDGET}, the most tokens of one engine "
                         "step")
    if token_budget is not None and not 2 <= token_budget <= MAX_TOKEN_BUDGET:
        raise ValueError(f"--token-budget {shown(token_budget)} is not in 2..{MAX_TOKEN_BUDGET} (tokens in one engine "
                         "step)")
    if not 1 <= max_seqs <= MAX_SEQS:
        raise ValueError(f"--max-seqs {shown(max_seqs)} is not in 1..{MAX_SEQS} (sequences in one engine step)")


def default_token_budget(device: str, max_length: int) -> int:
    """Tokens per step: enough to saturate the device, never below one full-length sequence."""
    budget = 16384 if device == "cuda" else 4096
    return max(budget, max_length)


def tokenize_workers() -> int:
    """Batches tokenized at once (see ``petal.pipeline.ingest.tokens.tokenize_documents``): 2, so one batch's Python
    side overlaps another's Rust encoding; ``PETAL_TOKENIZE_WORKERS`` overrides (benchmarks compare)."""
    value = os.environ.get("PETAL_TOKENIZE_WORKERS", "2")
    try:
        workers = int(value)
    except ValueError:
        workers = 0
    if workers < 1:
        raise ValueError(f"PETAL_TOKENIZE_WORKERS={value!r} is not a whole number >= 1")
    return workers


def parse_duration(text: str) -> float:
    """``--keep-unused`` (store/retention.py): a number of seconds, or with a unit (``90s``, ``30m``, ``12h``,
    ``7d``); 0: none. Here, not in retention.py: a usage error must not import pyarrow (tests/test_lazy_imports.py)."""
    units = {"s": 1, "m": 60, "h": 3_600, "d": 86_400}
    number, unit = (text[:-1], text[-1]) if text[-1:].lower() in units else (text, "s")
    try:
        seconds = float(number) * units[unit.lower()]
    except ValueError:
        raise ValueError(f"--keep-unused {text!r} is not a duration: give seconds or 90s, 30m, 12h, 7d") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"--keep-unused {text!r} must be 0 or more (0: delete unused store entries at once)")
    return seconds
