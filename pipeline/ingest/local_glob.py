"""A local glob SOURCE expanded as ``glob.glob(pattern, recursive=True)`` names its matches, minus two hazards.

NOTE: ``glob.glob`` skips a directory it may not list without a word: under ``--sync``, ``lake/*/*.parquet`` with
``lake/part=2`` unreadable removed that partition's shards at exit 0 (a directory SOURCE said 66). And its ``**``
follows symlinked directories with no record of where it has been: two loop links (``up -> ..``, ``up2 -> ../..``)
made ``data/**/*.parquet`` run without end, its memory growing; one gave 41 copies of each file. Here every directory
a wildcard needs listed is listed or said (``unreadable``: permission denied, 66; ``problems``: another error, 65),
and ``**`` walks each real directory once, as a directory SOURCE does.

The rules are ``glob``'s otherwise, but for hidden names: a component with ``*``, ``?`` or ``[...]`` matches names
case-sensitively (``fnmatchcase``) and not those starting with ``.`` or ``_`` unless it starts with ``.`` or ``_``
itself (glob's rule for ``.``, extended to ``_`` as a directory SOURCE skips both: ``data/**/*.parquet`` read Spark's
``data/_temporary/`` attempts); ``**`` alone as a component is zero or more directories, none hidden (and, last,
every file and directory below too); a literal component names what is there, hidden or not (the last one, a
dangling symlink too, as ``lexists`` says); a pattern ending in ``/`` names directories only.
"""

from __future__ import annotations

import fnmatch
import glob
import os
from collections.abc import Callable
from pathlib import Path

from petal.pipeline.ingest.skipped_names import hidden_name


def expand_glob(pattern: str, on_error: Callable[[Path, OSError], None], skip_hidden: bool = True) -> list[str]:
    """The paths ``pattern`` (``~`` expanded) matches, sorted; a directory that cannot be listed goes to
    ``on_error(directory, exc)`` and matches nothing. ``skip_hidden=False``: hidden names too (the error's hint)."""
    parts = Path(os.path.expanduser(pattern)).parts
    fixed = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts))
    paths = [Path(*parts[:fixed]) if fixed else Path(".")]
    rest = parts[fixed:]
    directories_only = pattern.endswith(os.sep)  # NOTE: 'd/*/' names directories only, as glob's does
    for i, part in enumerate(rest):
        last = i == len(rest) - 1 and not directories_only
        if part == "**":
            seen: set[tuple[int, int]] = set()
            paths = [p for path in paths for p in _tree(path, last, seen, on_error, skip_hidden)]
        elif glob.has_magic(part):
            paths = [p for path in paths for p in _matching(path, part, last, on_error, skip_hidden)]
        else:
            paths = [path / part for path in paths
                     if (os.path.lexists(path / part) if last else (path / part).is_dir())]
    return sorted({os.fspath(p) for p in paths})


def _listing(directory: Path, on_error: Callable[[Path, OSError], None]) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as entries:
            return sorted(entries, key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        on_error(directory, exc)
        return []


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()  # NOTE: follows a symlink, as glob does
    except OSError:
        return False


def _matching(directory: Path, part: str, last: bool, on_error: Callable[[Path, OSError], None],
              skip_hidden: bool) -> list[Path]:
    """The names in ``directory`` that ``part`` matches (directories only unless ``last``)."""
    hidden_ok = not skip_hidden or hidden_name(part)  # a wildcard part hidden itself
    return [directory / e.name for e in _listing(directory, on_error)
            if (hidden_ok or not hidden_name(e.name)) and fnmatch.fnmatchcase(e.name, part)
            and (last or _is_dir(e))]


def _tree(root: Path, files_too: bool, seen: set[tuple[int, int]],
          on_error: Callable[[Path, OSError], None], skip_hidden: bool) -> list[Path]:
    """``root`` and every directory below it (with ``files_too``, every other entry too), not through names starting
    with ``.`` or ``_`` (unless not ``skip_hidden``), following symlinked directories, each real directory once
    (``seen``: shared by one ``**``)."""
    found: list[Path] = []
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            st = os.stat(directory)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in seen:  # NOTE: a symlink loop, or a directory reached twice
            continue
        seen.add((st.st_dev, st.st_ino))
        found.append(directory)
        below = []
        for entry in _listing(directory, on_error):
            if skip_hidden and hidden_name(entry.name):
                continue
            if _is_dir(entry):
                below.append(directory / entry.name)
            elif files_too:
                found.append(directory / entry.name)
        stack.extend(reversed(below))
    return found
