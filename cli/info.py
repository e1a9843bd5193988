"""``petal info INDEX``: what an index holds and how it was made."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from petal.cli.common import PATH, json_text, require_stdout, user_errors, write_stdout
from petal.pipeline.reliability.errors import quote_path

if TYPE_CHECKING:
    from petal.pipeline.layout import VersionLease
    from petal.pipeline.manifest import Manifest


class JsonFailureCommand(click.Command):
    """A command whose ``--json`` promises one JSON object on stdout whatever the outcome (petal info, petal verify):
    a usage error (exit 2: an empty INDEX, ``"$OUT"`` unset) is said there too, ``{"ok": false, "error",
    "exit_code"}``, before click prints it on stderr as it always does."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        flags = args[:args.index("--")] if "--" in args else args  # NOTE: after "--" a "--json" is INDEX
        try:
            return super().make_context(info_name, list(args), parent=parent, **extra)
        except click.UsageError as exc:
            if "--json" in flags:
                echo_json_failure(exc.format_message(), exc.exit_code)
            raise


@click.command(cls=JsonFailureCommand)
@click.argument("index_path", metavar="INDEX", type=PATH)
@click.option("--json", "as_json", is_flag=True, help="The manifest as one JSON object on stdout (a failure: "
              '{"ok": false, "error", "exit_code"}, as petal verify --json).')
@user_errors(outputs=())
def info(index_path: Path, as_json: bool) -> None:
    """Show INDEX's model, dim, metric, index type, counts, shards and version.

    The version's files are checked as an open checks them (sizes and head/tail checksums, index.faiss's
    header against the manifest: binary or float, dim, vectors, metric; ids.parquet's footer: as many ids as
    vectors, the id and stored columns; a binary index's rescore.npy shape; O(1) in the index size): a damaged
    file is said on stderr after what the manifest holds, with the exit code of petal query (65 corrupt or
    not the manifest's, 78 missing or not a regular file); petal verify checks every byte and the index kind.
    """
    from petal.pipeline.reliability.errors import PetalError

    require_stdout("petal info")  # NOTE: stdout closed at start: 74, not a description written nowhere and exit 0
    try:
        version_dir, manifest, lease = _open(index_path=index_path)
    except click.ClickException as exc:  # NOTE: --json promises one object on stdout, as petal verify's does
        if as_json:
            echo_json_failure(exc.format_message(), exc.exit_code)
        raise
    from petal.pipeline.index.open_checks import check_without_faiss
    from petal.pipeline.index.verify import check_on_open

    try:
        with lease:  # NOTE: a publish meanwhile must not prune the version under the check
            checked, damage = check_on_open(version_dir, full_fallback=False), None
            # NOTE: then what an open checks past the checksums and the header, without FAISS: ids.parquet's footer
            # (as many ids as vectors, the columns), a binary index's rescore.npy header (a version every query
            # refused with 65 was shown exit 0)
            check_without_faiss(version_dir, manifest)
    except PetalError as exc:
        checked, damage = None, exc
    if as_json:
        failure = {} if damage is None else {"ok": False, "error": str(damage), "exit_code": damage.exit_code}
        write_stdout([json_text({"path": str(version_dir), **manifest.to_dict(), **failure})], flush=True)
    else:
        write_stdout([_describe(version_dir, manifest)], flush=True)  # NOTE: a full stdout is 74 naming stdout
    if damage is not None:
        raise damage
    assert checked is not None
    if checked.manifest_problem is not None:
        click.echo(f"petal info: warning: {checked.manifest_problem}", err=True)
    elif checked.unchecked:
        click.echo(f"petal info: note: {quote_path(version_dir)} was written before head/tail checksums existed: "
                   f"{', '.join(checked.unchecked)} not checked (petal verify reads every byte)", err=True)


@user_errors(outputs=())
def _open(index_path: Path) -> tuple[Path, Manifest, VersionLease]:
    """INDEX's version directory and manifest, the version leased (``verify.open_leased``); every failure
    (``PetalError``, an ``OSError`` nothing mapped) as the ``click.ClickException`` with the exit code and message
    the command ends with."""
    from petal.pipeline.index.verify import open_leased

    return open_leased(index_path)


def echo_json_failure(message: str, exit_code: int) -> None:
    """What ``--json`` prints when there is no manifest to print: petal verify --json's failure object. A stdout that
    cannot take it is said on stderr; the failure itself keeps its message and exit code (its caller raises it)."""
    from petal.pipeline.reliability.errors import PetalIOError, one_line

    try:
        write_stdout([json_text({"ok": False, "error": message, "exit_code": exit_code})], flush=True)
    except PetalIOError as exc:
        click.echo(f"petal: warning: {one_line(str(exc))} (the --json failure object)", err=True)


def _describe(version_dir: Path, manifest: Manifest) -> str:
    from petal.pipeline.manifest import shard_names

    index, counts = manifest.index, manifest.counts
    skipped = ", ".join(f"{k} {v}" for k, v in sorted(counts.skipped.items())) or "none"
    lines = [
        f"version      {manifest.version}  ({quote_path(version_dir)})",
        f"created      {manifest.created_at}  petal {manifest.petal_version}",
        *([f"rebuilt      from {manifest.rebuilt_from} (same embeddings, other index settings)"]
          if manifest.rebuilt_from else []),
        *_model_lines(manifest),
        f"vectors      {index.num_vectors} x {manifest.dim}{_made_as(manifest)}, metric {manifest.metric}",
        f"index        {index.factory} (asked: {index.requested_factory}), {index.storage}"
        + (f", search {index.search_params}" if index.search_params else ""),
    ]
    if index.plan is not None and index.plan.reason:
        lines.append(f"             why: {index.plan.reason}")
    output = manifest.output  # output format
    if output is not None:
        kind = {"none": output.output_dtype, "int8": f"int8 ({output.int8_scheme})", "binary": "binary (Hamming)"}
        lines.append(f"output       {kind[output.quantize]}, dim {output.dim} of {output.model_dim}"
                     f"{', L2-normalised' if output.normalized else ''}")
    if index.tuning is not None:
        t = index.tuning
        reached = "" if t.reached else "  TARGET NOT REACHED"
        lines.append(f"tuning       recall@10 {t.recall_text(3)} (target {t.target_recall_at_10}), "
                     f"{t.ms_per_query:.3f} ms/query batched"
                     + (f", {t.single_query_ms_p50:.3f} ms p50 single" if t.single_query_ms_p50 is not None else "")
                     + f" on {t.queries} held-out vectors{reached}")
    if index.device is not None:
        d = index.device
        lines.append(f"built on     train {d.train or 'none needed'}, add {d.add} "
                     f"({d.gpus} GPUs seen), {index.build_seconds:.1f}s")
    if manifest.stored is not None:
        stored = (["text"] if manifest.stored.text else []) + list(manifest.stored.keep)
        # NOTE: column names are the user's (any Parquet name, a newline included): quoted as paths are
        lines.append(f"stored       {', '.join(map(quote_path, stored)) or 'nothing'} (beside the ids, by FAISS id)")
    lines += [
        f"rows         {counts.rows} read, {counts.embedded} embedded, {counts.truncated} truncated, "
        f"{counts.deleted} deleted, "
        + (f"{index.superseded} superseded (ids also in a shard that sorts later), " if index.superseded else "")
        + f"skipped: {skipped}",
        f"shards       {len(manifest.shards)}",
    ]
    names = shard_names([(s.path, s.abs_path) for s in manifest.shards])
    lines += [f"  {quote_path(name)}  {s.rows} rows, {s.embedded} embedded"
              + (f", {s.deleted} deleted" if s.deleted else "") + f", sha256 {s.sha256[:12]}"
              for s, name in zip(manifest.shards, names)]
    return "\n".join(lines)


def _model_lines(manifest: Manifest) -> list[str]:
    from petal.pipeline.manifest import ModelRecord

    model = manifest.model
    if not isinstance(model, ModelRecord):  # --vectors-column
        return [f"model        none: precomputed vectors ({quote_path(model.vectors_column)}, dim {model.dim})"]
    return [f"model        {quote_path(model.display)}",
            f"             {model.architecture}, {model.pooling} pooling, "
            f"{'normalized' if model.normalize else 'not normalized'}, max {model.max_length} tokens, "
            f"weights sha256 {model.weights_sha256[:12]}"]


def _made_as(manifest: Manifest) -> str:
    dtype = getattr(manifest.embedding, "dtype", None)  # precomputed vectors: no model dtype
    return f" ({dtype} model)" if dtype else ""
