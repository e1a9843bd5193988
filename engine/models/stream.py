"""Streaming a safetensors checkpoint into a model's tensors on the target device.

A model says which checkpoint tensors make each of its parameters (``weight_plan``: fused
projections are several tensors stacked along dim 0). From the files' headers alone this module
allocates every parameter once, empty, in its final dtype on the target device, and splits the
checkpoint bytes into *pieces* (a tensor, or a run of its rows, going to rows of one parameter).

* CUDA: pieces are grouped into file-contiguous *chunks* (``chunk_bytes``); reader threads
  ``pread`` chunks into a ring of pinned host buffers (the GIL is released while they read, so
  several chunks are read at once), the main thread copies each filled buffer to a device buffer
  with one asynchronous copy, then casts/places its pieces on the GPU (fp32 -> bf16, the q|k|v and
  gate|up fusions are just row offsets). Disk or page-cache reads overlap the PCIe copies; nothing
  is copied per tensor from pageable memory, and nothing is ever held whole on the host.
* CPU: a parameter that is one checkpoint tensor of its own dtype is the file's bytes, mapped
  copy-on-write (``map_cpu``): nothing is read at load, pages come from the page cache when first
  touched, and the rows of an embedding table that no text looks up are never read (a one-shot query
  touches a few of MiniLM's 30522). Other pieces (fused projections, casts) are read straight into
  their parameter's bytes or through a small buffer and cast; reads run in a few threads.

# NOTE: a mapped checkpoint must not be truncated in place while a process uses it (the next page fault
# would be a SIGBUS) and its bytes are the model: writers that replace files by rename (Hugging Face,
# sentence-transformers, cp to a new path) leave a running process its old inode. Writes to a mapped
# parameter stay in the process (copy-on-write), never reach the file.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from petal.engine.models.safetensors_header import SafetensorsError, TensorEntry, read_header
from petal.engine.models.weights import describe_unread, unread_model_tensors
from petal.engine.weight_files import named, tensor_homes


@dataclass(frozen=True)
class StreamSettings:
    """How the checkpoint is streamed (defaults measured on the H200 host; see README, start-up)."""

    chunk_bytes: int = 32 << 20  # one read / one host-to-device copy
    slots: int = 8  # pinned host buffers in the ring (CUDA)
    readers: int = 4  # threads reading the file
    map_cpu: bool = True  # CPU: parameters that are one checkpoint tensor of their dtype map the file (no read)


class Spans:
    """Seconds spent per named step (``with spans.span("name"): ...``), summed over repeats."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - started)

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds


@dataclass(frozen=True)
class Piece:
    """Rows ``[row, row + rows)`` of tensor ``entry`` of file ``file`` -> rows from ``target_row`` of ``target``."""

    file: int
    target: str
    target_row: int
    entry: TensorEntry
    row: int
    rows: int

    @property
    def begin(self) -> int:
        return self.entry.begin + self.row * self.entry.row_bytes

    @property
    def end(self) -> int:
        return self.begin + self.rows * self.entry.row_bytes

    def source(self, data: torch.Tensor) -> torch.Tensor:
        """``data`` (this piece's bytes, uint8) viewed as the checkpoint's dtype and shape."""
        if data.data_ptr() % self.entry.dtype.itemsize:
            data = data.clone()  # NOTE: safetensors does not promise aligned offsets; views need them
        typed = data.view(self.entry.dtype)
        return typed.view(self.entry.shape) if not self.entry.shape else typed.view(self.rows, *self.entry.shape[1:])

    def destination(self, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        out = tensors[self.target]
        return out if out.dim() == 0 else out[self.target_row:self.target_row + self.rows]


@dataclass(frozen=True)
class Chunk:
    """File-contiguous pieces read with one ``pread`` (and copied to the device with one copy)."""

    file: int
    begin: int
    end: int
    pieces: tuple[Piece, ...]

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def stream_tensors(files: Sequence[Path], plan: Mapping[str, tuple[str, ...]], shapes: Mapping[str, tuple[int, ...]],
                   prefixes: tuple[str, ...], device: torch.device, dtype: torch.dtype,
                   settings: StreamSettings | None = None, spans: Spans | None = None,
                   ring: bool | None = None) -> dict[str, torch.Tensor]:
    """Our parameter name -> tensor on ``device`` (floats in ``dtype``), read from safetensors ``files``.

    ``plan[name]`` lists the checkpoint names (without prefix) stacked along dim 0 into ``name``;
    the first of ``prefixes`` under which a name exists is used. Raises ``KeyError`` for a missing
    tensor and ``ValueError`` (``SafetensorsError``) for a damaged file or a shape the model does not take.
    ``ring`` picks the buffer ring (default: on CUDA only; tests run it on the CPU too).
    """
    settings = settings or StreamSettings()
    spans = spans or Spans()
    with spans.span("headers"):
        headers = [read_header(f) for f in files]
    with spans.span("plan"):
        where: dict[str, tuple[int, TensorEntry]] = tensor_homes(files, headers)
        layouts = {name: _layout(name, parts, shapes[name], prefixes, where, files) for name, parts in plan.items()}
        unread = unread_model_tensors(where, plan, prefixes)
        if unread:
            raise SafetensorsError(f"{', '.join(str(f) for f in files)}: {describe_unread(unread)}")
        ringed = device.type == "cuda" if ring is None else ring
        targets = {name: dtype if layout.dtype.is_floating_point else layout.dtype for name, layout in layouts.items()}
        mapped = {name for name, layout in layouts.items()
                  if settings.map_cpu and not ringed and device.type == "cpu" and _mappable(layout, targets[name])}
        pieces = sorted((p for name, layout in layouts.items() if name not in mapped
                         for p in _split(layout.pieces, settings.chunk_bytes)), key=lambda p: (p.file, p.begin))
        chunks = _chunks(pieces, settings.chunk_bytes)
    with spans.span("allocate"):
        tensors = {name: torch.empty(layout.shape, dtype=targets[name], device=device)
                   for name, layout in layouts.items() if name not in mapped}
    fds = [os.open(f, os.O_RDONLY) for f in files]
    try:
        if mapped:
            with spans.span("map"):
                tensors.update(_map_in_place({name: layouts[name] for name in mapped}, fds))
        if ringed:
            _through_ring(chunks, fds, files, tensors, device, settings, spans)
        else:
            _to_host(chunks, fds, files, tensors, settings, spans)
    finally:
        for fd in fds:
            os.close(fd)
    return tensors


@dataclass(frozen=True)
class _Layout:
    shape: tuple[int, ...]
    dtype: torch.dtype  # the checkpoint's
    pieces: tuple[Piece, ...]  # one whole tensor per part, at its row offset


def _layout(name: str, parts: tuple[str, ...], expected: tuple[int, ...], prefixes: tuple[str, ...],
            where: Mapping[str, tuple[int, TensorEntry]], files: Sequence[Path]) -> _Layout:
    """The parameter's shape and checkpoint dtype, and one whole-tensor piece per part (at its row offset)."""
    found: list[tuple[int, TensorEntry]] = []
    for part in parts:
        hit = next((where[p + part] for p in prefixes if p + part in where), None)
        if hit is None:
            tried = ", ".join(repr(p + part) for p in prefixes)
            raise KeyError(f"weight {part!r} not found in {', '.join(str(f) for f in files)} (tried {tried})")
        found.append(hit)
    entries = [e for _, e in found]
    if len(entries) == 1:
        shape = entries[0].shape
    elif all(e.shape and e.shape[1:] == entries[0].shape[1:] for e in entries):
        shape = (sum(e.shape[0] for e in entries), *entries[0].shape[1:])
    else:
        shape = ()  # parts that cannot be stacked: reported below with their shapes
    if shape != tuple(expected) or len({e.dtype.is_floating_point for e in entries}) > 1:
        got = " + ".join(f"{e.name} {list(e.shape)} {str(e.dtype).removeprefix('torch.')}" for e in entries)
        raise SafetensorsError(f"{files[found[0][0]]}: {got} cannot fill {name} {list(expected)}")
    pieces, row = [], 0
    for file, entry in found:
        rows = entry.shape[0] if entry.shape else 1
        pieces.append(Piece(file=file, target=name, target_row=row, entry=entry, row=0, rows=rows))
        row += rows
    return _Layout(shape, entries[0].dtype, tuple(pieces))


def _mappable(layout: _Layout, target: torch.dtype) -> bool:
    """One checkpoint tensor of the parameter's own dtype, aligned in the file: usable where it lies."""
    if len(layout.pieces) != 1:
        return False
    entry = layout.pieces[0].entry
    return entry.dtype == target and entry.nbytes > 0 and entry.begin % entry.dtype.itemsize == 0


def _map_in_place(layouts: Mapping[str, _Layout], fds: list[int]) -> dict[str, torch.Tensor]:
    """Each layout's tensor as a view of its file, mapped copy-on-write (one mapping per file, kept alive by
    the tensors that view it)."""
    maps: dict[int, mmap.mmap] = {}
    out: dict[str, torch.Tensor] = {}
    for name, layout in layouts.items():
        piece = layout.pieces[0]
        if piece.file not in maps:
            maps[piece.file] = mmap.mmap(fds[piece.file], 0, access=mmap.ACCESS_COPY)
        entry = piece.entry
        flat = torch.frombuffer(maps[piece.file], dtype=entry.dtype, count=entry.nbytes // entry.dtype.itemsize,
                                offset=entry.begin)
        out[name] = flat.view(layout.shape)
    return out


def _split(pieces: tuple[Piece, ...], chunk_bytes: int) -> Iterator[Piece]:
    """Whole-tensor pieces cut into runs of rows of at most ``chunk_bytes`` (at least one row); empty ones dropped."""
    for p in pieces:
        if p.entry.nbytes == 0:
            continue
        step = max(1, chunk_bytes // max(p.entry.row_bytes, 1)) if p.entry.shape else 1
        for start in range(0, p.rows, step):
            yield replace(p, target_row=p.target_row + start, row=p.row + start, rows=min(step, p.rows - start))


def _chunks(pieces: list[Piece], chunk_bytes: int) -> list[Chunk]:
    """Consecutive pieces of one file whose span fits ``chunk_bytes`` (a larger piece alone)."""
    chunks: list[Chunk] = []
    group: list[Piece] = []
    for p in pieces:
        if group and (p.file != group[0].file or p.end - group[0].begin > chunk_bytes or p.begin < group[-1].end):
            chunks.append(Chunk(group[0].file, group[0].begin, max(g.end for g in group), tuple(group)))
            group = []
        group.append(p)
    if group:
        chunks.append(Chunk(group[0].file, group[0].begin, max(g.end for g in group), tuple(group)))
    return chunks


def _pread_into(fd: int, buffer: np.ndarray, offset: int, path: Path) -> None:
    """Fill ``buffer`` (uint8) from ``offset`` of the open file ``fd``; the GIL is released while it reads."""
    view = buffer.data.cast("B")
    done = 0
    while done < len(view):
        try:
            n = os.preadv(fd, [view[done:]], offset + done)
        except OSError as exc:  # NOTE: a read error (EIO) names no file: 74 naming it, no damaged model
            raise named(exc, path) from None
        if n <= 0:
            raise SafetensorsError(f"{path}: ends at byte {offset + done}, inside tensor data "
                                   "(was the file truncated or replaced while loading?)")
        done += n


def _through_ring(chunks: list[Chunk], fds: list[int], files: Sequence[Path], tensors: Mapping[str, torch.Tensor],
                  device: torch.device, settings: StreamSettings, spans: Spans) -> None:
    """Chunks through a ring of (pinned, on CUDA) host buffers and one device buffer per slot.

    Reader threads fill the host buffers; the main thread issues one asynchronous copy per chunk
    and places its pieces from the device buffer. On the CPU the same code runs synchronously (tests).
    """
    if not chunks:
        return
    cuda = device.type == "cuda"
    slots = max(1, min(settings.slots, len(chunks)))
    slot_bytes = max(c.nbytes for c in chunks)
    with torch.cuda.device(device) if cuda else nullcontext():
        with spans.span("allocate_staging"):
            pinned = torch.empty(slots * slot_bytes, dtype=torch.uint8, pin_memory=cuda)
            staging = torch.empty(slots * slot_bytes, dtype=torch.uint8, device=device)
            events = [torch.cuda.Event() for _ in range(slots)] if cuda else []
        host = pinned.numpy()

        def read(k: int) -> None:
            chunk, base = chunks[k], (k % slots) * slot_bytes
            waited = time.perf_counter()
            if events and k >= slots:
                events[k % slots].synchronize()  # the copy out of this buffer (chunk k - slots) is done
            started = time.perf_counter()
            _pread_into(fds[chunk.file], host[base:base + chunk.nbytes], chunk.begin, files[chunk.file])
            spans.add("readers: wait for a free buffer", started - waited)
            spans.add("readers: pread", time.perf_counter() - started)

        pool = ThreadPoolExecutor(max_workers=max(1, min(settings.readers, slots)), thread_name_prefix="petal-load")
        futures: dict[int, Future[None]] = {}
        try:
            futures.update((k, pool.submit(read, k)) for k in range(slots))
            for k, chunk in enumerate(chunks):
                with spans.span("wait_read"):
                    futures.pop(k).result()
                with spans.span("issue_copies"):
                    base = (k % slots) * slot_bytes
                    on_device = staging[base:base + chunk.nbytes]
                    on_device.copy_(pinned[base:base + chunk.nbytes], non_blocking=cuda)
                    if events:
                        events[k % slots].record()
                    if k + slots < len(chunks):
                        futures[k + slots] = pool.submit(read, k + slots)
                    for piece in chunk.pieces:
                        start = piece.begin - chunk.begin
                        piece.destination(tensors).copy_(piece.source(on_device[start:start + piece.end - piece.begin]))
            if cuda:
                with spans.span("synchronize"):
                    torch.cuda.current_stream(device).synchronize()
        finally:
            for future in futures.values():
                future.cancel()
            pool.shutdown(wait=True)
            if cuda:
                torch.cuda.current_stream(device).synchronize()  # NOTE: no copy may still read the buffers freed below
                del host, pinned, staging  # NOTE: ``host`` (numpy) holds the pinned tensor alive until it goes too
                release = getattr(torch._C, "_host_emptyCache", None)
                if release is not None:
                    release()  # the pinned ring goes back to the driver instead of staying cached for the process


def _to_host(chunks: list[Chunk], fds: list[int], files: Sequence[Path], tensors: Mapping[str, torch.Tensor],
             settings: StreamSettings, spans: Spans) -> None:
    local = threading.local()

    def place(piece: Piece, fd: int, path: Path) -> None:
        destination = piece.destination(tensors)
        if destination.dtype == piece.entry.dtype:  # straight into the parameter's bytes
            _pread_into(fd, _bytes_of(destination), piece.begin, path)
            return
        size = piece.end - piece.begin
        buffer = getattr(local, "buffer", None)
        if buffer is None or buffer.numel() < size:
            buffer = local.buffer = torch.empty(size, dtype=torch.uint8)
        _pread_into(fd, buffer[:size].numpy(), piece.begin, path)
        destination.copy_(piece.source(buffer[:size]))

    work = [(p, fds[c.file], files[c.file]) for c in chunks for p in c.pieces]
    with spans.span("read_and_place"):
        workers = max(1, min(settings.readers, os.cpu_count() or 1, len(work)))
        if workers == 1:
            for item in work:
                place(*item)
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="petal-load") as pool:
                for future in [pool.submit(place, *item) for item in work]:
                    future.result()


def _bytes_of(tensor: torch.Tensor) -> np.ndarray:
    """The bytes of a contiguous CPU tensor as a writable uint8 array (no copy)."""
    flat = tensor.reshape(-1) if tensor.dim() else tensor.reshape(1)
    return flat.view(torch.uint8).numpy()

