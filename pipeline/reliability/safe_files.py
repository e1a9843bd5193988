"""Opening files inside the output directory without following them out of it or blocking on them.

Every file petal reads in OUT (``CURRENT``, a version's ``manifest.json``, ``index.faiss``,
``ids.parquet``, ``rescore.npy``, ``rejects.parquet``, a store entry's files) goes through here:
it must resolve to a path inside its root (a symlink out of OUT is refused, never followed) and be
a regular file (a FIFO, a device, a socket or a directory is refused before it is opened; it is
opened with ``O_NONBLOCK`` and checked again with ``fstat``, so a file swapped in between cannot
block either). A refused file is an ``UnsafeFileError``: the caller picks the exit code (the index
run repairs a damaged version; ``query`` exits 65/78).

An input file a flag names (``input_file_size``) follows the same rule outside OUT, with its own exit code: one
that is missing, not a regular file or unreadable is no input (66), naming the flag. The output directory a writer
names (``check_output_dir``: ``petal index --out``, ``petal rebuild OUT``) is judged before any work: one that is
not a directory, or that this process cannot read, enter and write (or, not there yet, create), is 73.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from petal.pipeline.reliability.errors import ConfigError, NoInputError, OutputError, quote_path

KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
         stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symlink"}

READ_CHUNK = 1 << 20  # read_regular: bytes read at a time


def name_suffix(path: Path | str) -> str:
    """The lowercased suffix a file's name ends in, from its last dot (``.npy`` of ``Out.NPY``, ``dir/.npy`` and
    ``.npy``; ``""`` for a name without a dot): what says an ``--input``'s or ``--output``'s format.

    NOTE: ``Path.suffix`` is ``""`` for a name whose only dot starts it (a dot file): ``petal embed --output .npy``
    was refused, "expected a .npy or .jsonl file", though its name ends in ``.npy``."""
    name = Path(path).name
    dot = name.rfind(".")
    return name[dot:].lower() if dot >= 0 else ""


class UnsafeFileError(ConfigError):
    """A file inside OUT that petal will not open: outside its root, or not a regular file (exit 78)."""


def _kind(mode: int) -> str:
    return KINDS.get(stat.S_IFMT(mode), "not a regular file")


def inside(path: Path, root: Path) -> bool:
    """True when ``path`` (all symlinks resolved) is ``root`` or below it (``root`` resolved too)."""
    real, real_root = os.path.realpath(path), os.path.realpath(root)
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


def link_out(path: Path, root: Path) -> Path:
    """The first of ``path``'s directories below ``root`` that leads out of ``root``, else ``path``: the link to name
    when ``path`` leads out (``OUT/versions`` linked elsewhere, not each file reached through it)."""
    try:
        parts = Path(path).relative_to(root).parts
    except ValueError:  # NOTE: not below root as written (a relative root, another spelling): the path itself
        return Path(path)
    here = Path(root)
    for part in parts[:-1]:
        here = here / part
        if not inside(here, root):
            return here
    return Path(path)


def check_regular(path: Path, root: Path) -> None:
    """Refuse ``path`` unless it stays inside ``root`` and is a regular file. ``FileNotFoundError``
    when it does not exist (a symlink whose target is missing included)."""
    path = Path(path)
    if not inside(path, root):
        link = link_out(path, root)
        through = "" if link == path else f" on the way to {quote_path(path)}"
        raise UnsafeFileError(f"{quote_path(link)} leads out of {quote_path(root)} (a symlink){through}; refusing to "
                              "follow it: remove it")
    try:
        mode = os.stat(path).st_mode  # FileNotFoundError for a missing file or a dangling symlink
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise UnsafeFileError(f"{quote_path(path)} is a symlink that never reaches a file (a loop), not a regular "
                              "file; refusing to open it: remove it") from None
    if not stat.S_ISREG(mode):
        raise UnsafeFileError(f"{quote_path(path)} is {_kind(mode)}, not a regular file; refusing to open it: "
                              "remove it")


def open_regular(path: Path, root: Path, flags: int = os.O_RDONLY) -> int:
    """A file descriptor of ``path`` (see ``check_regular``), opened without blocking."""
    check_regular(path, root)
    fd = os.open(os.path.realpath(path), flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafeFileError(f"{quote_path(path)} is {_kind(mode)}, not a regular file; refusing to read it")
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: Path, root: Path, max_bytes: int | None = None) -> bytes:
    """The bytes of ``path`` (at most ``max_bytes``), refused like ``check_regular``.

    NOTE: read a chunk at a time, never ``read(max_bytes)``: that allocates ``max_bytes`` up front, 64 MiB for every
    manifest of a few KiB (an open under a memory limit failed there, a MemoryError traceback)."""
    fd = open_regular(path, root)
    try:
        with os.fdopen(fd, "rb", closefd=False) as fh:
            if max_bytes is None:
                return fh.read()
            chunks: list[bytes] = []
            left = max_bytes
            while left > 0 and (chunk := fh.read(min(left, READ_CHUNK))):
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)
    finally:
        os.close(fd)


def input_file_size(flag: str, path: Path) -> int:
    """The size in bytes of the input file ``flag`` names (``petal embed --input``, ``petal query --vector-file``,
    ``petal index --delete``; the API's ``delete=``), once it is known to be one this process can read; else
    ``NoInputError`` (66, sysexits' "cannot open input") naming the flag and the path: it does not exist, is not a
    regular file (a directory, a FIFO, a device) or cannot be opened for reading (permission). Nothing is read,
    and a FIFO never blocks (opened non-blocking): a missing file costs no import of torch, FAISS or Arrow. An
    empty file (0) is for the caller to judge; one that opens but is not what the flag takes is the caller's 65.

    NOTE: the flag's click type must not check the path (``click.Path(readable=False)``): click's own check makes
    an unreadable file a usage error (2)."""
    where = f"{flag} {quote_path(path)}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise NoInputError(f"{where}: no such file") from None
    except OSError as exc:  # permission denied, a symlink loop, a name too long
        raise NoInputError(f"{where}: cannot be read ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if stat.S_ISDIR(info.st_mode):
        raise NoInputError(f"{where} is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise NoInputError(f"{where} is not a regular file (a FIFO, a device or a socket)")
    return info.st_size


def check_input_path(flag: str, path: Path) -> None:
    """An input file or directory ``flag`` names (``petal bench``'s ``--corpus``, ``--tokenizer-dir``, ``--index``)
    that this process can read (a directory: list and enter); else ``NoInputError`` (66) naming the flag and the
    path: it is not there, or permission denied. Nothing is opened. What it holds is for the reader to judge.

    NOTE: the flag's click type must not check the path (``click.Path(readable=False)``): click's own check makes
    an unreadable path a usage error (2)."""
    where = f"{flag} {quote_path(path)}"
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise NoInputError(f"{where}: no such file or directory") from None
    except OSError as exc:  # a directory above it that cannot be entered, a symlink loop
        raise NoInputError(f"{where}: cannot be read ({exc.strerror or exc})") from None
    if not _can(path, os.R_OK | (os.X_OK if stat.S_ISDIR(info.st_mode) else 0)):
        raise NoInputError(f"{where}: cannot be read (Permission denied)")


def check_output_dir(name: str, path: Path, create: bool = True) -> None:
    """Before any work (sources, model, lock): ``path``, the output directory ``name`` names (``--out``, ``OUT``),
    is a directory this process can list, enter and write, or, not there yet and ``create``, one it can create
    (its nearest existing parent is a directory it can enter and write); else ``OutputError`` (73, "cannot create
    output") naming ``name`` and the path, one line. Without ``create`` (``petal rebuild``), a ``path`` that is not
    there or not a directory holds no index: that is for the caller (78), only permissions are judged here. Nothing
    is created or opened (a FIFO in its place never blocks): the kernel is asked (``access``, for the effective ids:
    root without CAP_DAC_OVERRIDE is refused like anyone).

    NOTE: the argument's click type must not check the path (``click.Path(readable=False)``): click's own check
    makes an unreadable directory a usage error (2)."""
    where = f"{name} {quote_path(path)}"
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError) as exc:
        if not create:
            return
        if isinstance(exc, NotADirectoryError):  # a file where a directory above it belongs
            raise OutputError(f"{where}: cannot be created ({exc.strerror or exc})") from None
        _check_creatable(where, Path(path).absolute().parent)
        return
    except OSError as exc:  # a directory above it that cannot be entered
        raise OutputError(f"{where}: cannot be {'created' if create else 'reached'} ({exc.strerror or exc})") from None
    if not stat.S_ISDIR(info.st_mode):
        if not create:
            return
        kind = KINDS.get(stat.S_IFMT(info.st_mode), "a file")
        raise OutputError(f"{where} is {kind}, not a directory")
    if not _can(path, os.R_OK | os.X_OK):
        raise OutputError(f"{where}: cannot be read (Permission denied); petal reads and writes its output "
                          "directory")
    if not _can(path, os.W_OK):
        raise OutputError(f"{where}: cannot be written ({why_not_writable(path)}); petal reads and writes its "
                          "output directory")


def _check_creatable(where: str, parent: Path) -> None:
    """The nearest existing directory above a missing output directory lets this process create it."""
    while True:
        try:
            info = os.stat(parent)
            break
        except FileNotFoundError:
            if parent.parent == parent:
                return  # nothing exists up to the root (cannot happen on a sane system): mkdir will say
            parent = parent.parent
        except OSError as exc:  # permission denied on a directory above, a file where a directory belongs
            raise OutputError(f"{where}: cannot be created ({exc.strerror or exc})") from None
    if not stat.S_ISDIR(info.st_mode):
        raise OutputError(f"{where}: cannot be created: {quote_path(parent)} is not a directory")
    if not _can(parent, os.W_OK | os.X_OK):
        reason = why_not_writable(parent) if _can(parent, os.X_OK) else "Permission denied"
        raise OutputError(f"{where}: cannot be created in {quote_path(parent)} ({reason})")


def _can(path: Path, mode: int) -> bool:
    return os.access(path, mode, effective_ids=os.access in os.supports_effective_ids)


READ_ONLY = "Read-only file system"  # strerror(EROFS)


def why_not_writable(path: Path) -> str:
    """Why this process may not write the directory ``path``: ``Read-only file system`` where its mount is (EROFS:
    no permission fixes it), else ``Permission denied``."""
    with contextlib.suppress(OSError):
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return READ_ONLY
    return "Permission denied"
