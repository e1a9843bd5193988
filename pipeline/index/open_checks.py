"""What opening a version checks of its files past their checksums and ``index.faiss``'s header, without FAISS.

``ids.parquet``'s footer (O(1) in the ids: the row groups are decoded when a hit falls in them): as many ids as the
index holds vectors, the columns a hit needs, of the types petal writes (``row_groups.IdMap``), and the stored columns
the manifest records (``stored_columns_missing``); a binary index's ``rescore.npy`` listed, there, and of
``[vectors, dim]`` floats (its ``.npy`` header; the rows are memory-mapped, not read). Each is a ``BadInputError``
(65) naming the file (78 for a ``rescore.npy`` missing or not listed; 74/66 for the host's failure or a denied
read, ``read_errors.read_failure``).

One implementation for the two callers: ``IndexReader`` (``search.py``, ``binary.py``), which compares with what FAISS
read, and ``petal info`` (``check_without_faiss``), which compares with the manifest (the header check, run before
it, found the header's vector count and dimension to be the manifest's). NOTE: ``petal info`` ran only the checksum
and header checks: a version whose ``ids.parquet`` held fewer ids than its vectors (signed again over it) was shown
exit 0 while every ``petal query`` refused it with 65. Imports pyarrow and numpy, never FAISS.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from petal.pipeline.reliability.errors import BadInputError, ConfigError, one_line, quote_path

if TYPE_CHECKING:
    import numpy as np

    from petal.pipeline.index.row_groups import IdMap, RowGroups
    from petal.pipeline.manifest import Manifest

RESCORE_FILE = "rescore.npy"


def rescore_path(version_dir: Path, manifest: Manifest) -> Path:
    """A binary index's ``rescore.npy``: listed in the manifest and a file there, else ``ConfigError`` (78)."""
    path = version_dir / RESCORE_FILE
    if RESCORE_FILE not in manifest.index.files or not path.is_file():
        raise ConfigError(f"{quote_path(version_dir)}: {RESCORE_FILE} is missing or not listed in the manifest")
    return path


def rescore_vectors(path: Path, rows: int, dim: int) -> np.ndarray:
    """``rescore.npy`` memory-mapped: ``[rows, dim]`` floats, one row per vector of the index, or a
    ``BadInputError`` (65) naming it. NOTE: ``np.load`` parses the header with Python's tokenizer and
    ``ast``: a damaged one raises ``EOFError``, ``SyntaxError``, ``tokenize.TokenError``... (whatever the
    head/tail checksum let through: a re-signed manifest, an old version), never a traceback here."""
    import tokenize

    import numpy as np

    from petal.pipeline.index.read_errors import read_failure

    try:
        vectors = np.load(path, mmap_mode="r", allow_pickle=False)
    except (MemoryError, OSError) as exc:  # NOTE: the host's (74) or a denied read (66), not "the index is corrupt"
        raise read_failure(path, "it", exc) from exc
    except (ValueError, EOFError, SyntaxError, tokenize.TokenError, TypeError, KeyError, OverflowError) as exc:
        raise BadInputError(f"{quote_path(path)}: cannot be read ({one_line(str(exc))[:200] or type(exc).__name__}); "
                            "the index is corrupt, rebuild it") from exc
    if not isinstance(vectors, np.ndarray) or vectors.ndim != 2 or vectors.dtype.kind != "f" \
            or vectors.shape != (rows, dim):
        shape = getattr(vectors, "shape", "?")
        raise BadInputError(f"{quote_path(path)}: holds {getattr(vectors, 'dtype', '?')} {shape}, the index has "
                            f"{rows} float vectors of dim {dim}; the index is corrupt, rebuild it")
    return vectors


def open_ids(version_dir: Path, manifest: Manifest, vectors: int | None) -> tuple[RowGroups, IdMap]:
    """``ids.parquet`` opened (its footer read, memory-mapped; ``shard`` decoded as a dictionary) and checked: as many
    ids as ``vectors`` (``None``: not compared; ``petal verify`` says the count its own way), the columns a hit needs
    (``IdMap``) and those the manifest records as stored; ``BadInputError`` (65) naming the file otherwise."""
    from petal.pipeline.index.files import IDS_FILE, INDEX_FILE, open_parquet
    from petal.pipeline.index.row_groups import IdMap, RowGroups

    path = version_dir / IDS_FILE
    rows = RowGroups(open_parquet(path, read_dictionary=["shard"]), path)
    if vectors is not None and rows.num_rows != vectors:
        raise BadInputError(f"{quote_path(path)}: {rows.num_rows} ids for the {vectors} vectors of {INDEX_FILE}; the "
                            "version is damaged, rebuild it")
    id_map = IdMap(rows)
    problem = stored_columns_missing(rows, manifest)
    if problem is not None:
        raise BadInputError(problem)
    return rows, id_map


def stored_columns_missing(rows: RowGroups, manifest: Manifest) -> str | None:
    """Why ``ids.parquet`` does not hold the stored columns its manifest records (``columns``), ``None`` when it does.
    NOTE: a ``--where`` on a kept column the file lacked was a pyarrow KeyError traceback (exit 1); an empty
    version's file may lack them (there were no rows to store)."""
    from petal.pipeline.index.row_groups import column_problem

    recorded = manifest.stored
    if recorded is None or not rows.num_rows:
        return None
    missing = [n for n in (["text"] if recorded.text else []) + list(recorded.keep) if n not in rows.names]
    if not missing:
        problem = column_problem(rows, {"text": ("text",)}, nullable=("text",)) if recorded.text else None
        return None if problem is None else f"{problem}: the file does not match its manifest; rebuild the version"
    return (f"{quote_path(rows.path)} has no column {', '.join(map(quote_path, missing))}, which the manifest's "
            "columns record lists: the file does not match its manifest; the version is damaged, rebuild it")


def check_without_faiss(version_dir: Path, manifest: Manifest) -> None:
    """The checks above as ``petal info`` makes them, after ``verify.check_on_open`` (the files placed and their
    checksums and ``index.faiss``'s header matched): a binary index's ``rescore.npy``, then ``ids.parquet``, against
    the manifest's vector count and dimension (what an open compares with the index FAISS read)."""
    vectors = manifest.index.num_vectors
    if manifest.binary_index:
        rescore_vectors(rescore_path(version_dir, manifest), vectors, manifest.dim)
    open_ids(version_dir, manifest, vectors)
