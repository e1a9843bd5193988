"""``petal embed [TEXT...]``: one-shot embeddings, in input order, to JSON lines or ``.npy``."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from petal.cli.common import PetalClickError, device_options, usage, user_errors
from petal.cli.options import model_options, output_options

if TYPE_CHECKING:
    import numpy as np

    from petal.pipeline.store.outputs import OutputTransform


def read_inputs(path: Path, text_column: str, id_column: str | None = None) -> tuple[list, list | None]:
    """Texts (``None`` for a null) from ``.parquet`` (a text column, ids from ``id_column``), ``.txt`` (one per
    line) or ``.jsonl`` ({"text": ..., "id": ...}), and their ids (``None`` without ``id_column``)."""
    from petal.pipeline.reliability.errors import EXIT_DATAERR, EXIT_NOINPUT

    if not path.is_file():
        raise PetalClickError(f"--input {path} does not exist", EXIT_NOINPUT)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        columns = [text_column] + ([id_column] if id_column else [])
        try:
            table = pq.read_table(path, columns=columns)
        except (OSError, pa.ArrowException, KeyError) as exc:
            raise PetalClickError(f"{path}: cannot read column(s) {', '.join(map(repr, columns))}: {exc}",
                                  EXIT_DATAERR) from exc
        column_type = table.schema.field(text_column).type
        if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)
                or pa.types.is_binary(column_type) or pa.types.is_large_binary(column_type)):
            raise PetalClickError(f"{path}: text column {text_column!r} has type {column_type}, not text",
                                  EXIT_DATAERR)
        ids = table.column(id_column).to_pylist() if id_column else None
        return table.column(text_column).to_pylist(), ids
    if suffix == ".txt":
        return path.read_text(encoding="utf-8").splitlines(), None
    if suffix == ".jsonl":
        texts: list = []
        ids: list = []
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                value = record["text"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise PetalClickError(f"{path}:{lineno}: expected a JSON object with a \"text\" field",
                                      EXIT_DATAERR) from exc
            if value is not None and not isinstance(value, str):
                raise PetalClickError(f"{path}:{lineno}: \"text\" is not a string", EXIT_DATAERR)
            texts.append(value)
            ids.append(record.get(id_column) if id_column else None)
        return texts, ids if id_column else None
    raise click.UsageError(f"--input {path}: expected a .parquet, .txt or .jsonl file")


@click.command()
@click.argument("texts", nargs=-1)
@click.option("--model", default=None, help="Local model directory (default: the packaged all-MiniLM-L6-v2).")
@click.option("--stdin", "from_stdin", is_flag=True, help="Read one text per line from stdin.")
@click.option("--input", "input_path", type=click.Path(path_type=Path), default=None,
              help="Read texts from a .parquet, .txt or .jsonl file.")
@click.option("--text-column", default="text", show_default=True, help="Text column of a .parquet --input.")
@click.option("--id-column", default=None,
              help="Id column of a .parquet --input (or key of a .jsonl one): each output line carries its id.")
@click.option("--output", "output", type=click.Path(path_type=Path), default=None,
              help="Write FILE.npy (float32 rows) or FILE.jsonl instead of JSON lines on stdout.")
@click.option("--max-length", type=int, default=None, help="Truncate texts to N tokens (default: the model's).")
@click.option("--query", "as_query", is_flag=True, help="Embed the texts as queries (with the query prompt).")
@click.option("--calibration", "calibration_index", type=click.Path(path_type=Path), default=None,
              help="--quantize int8 without a model scheme: use the per-dimension ranges of this index "
                   "(default: learn them from the texts being embedded).")
@device_options
@model_options
@output_options
@user_errors
def embed(texts: tuple[str, ...], model: str | None, from_stdin: bool, input_path: Path | None, text_column: str,
          id_column: str | None, output: Path | None, max_length: int | None, as_query: bool,
          calibration_index: Path | None,
          device: str, dtype: str, attention: str, pooling: str | None, attention_mask: str | None,
          query_prompt: str | None, allow_pickle_weights: bool, dim: int | None, quantize: str,
          output_dtype: str) -> None:
    """Embed TEXT arguments, --stdin lines or an --input file; rows keep the input order.

    Rows are float vectors (--output-dtype), int8 codes (--quantize int8) or packed sign bits
    (--quantize binary: dim / 8 bytes, first dimension in the high bit).
    """
    items: list = list(texts)
    ids: list | None = None
    if input_path is not None:
        read, ids = read_inputs(input_path, text_column, id_column)
        ids = [None] * len(items) + ids if ids is not None else None
        items += read
    elif id_column is not None:
        raise click.UsageError("--id-column goes with --input FILE.parquet or FILE.jsonl")
    if from_stdin:
        items += [line.rstrip("\n") for line in sys.stdin]
    if not items:
        raise click.UsageError("nothing to embed: give TEXT, --stdin or --input")
    from petal.pipeline.ingest.text_rule import describe_skips, skip_reason

    # NOTE: the rule of petal index: null, undecodable and invisible texts are skipped and counted; outputs keep
    # input positions (JSON lines: "embedding": null, "skipped": reason; .npy: a NaN row, or zeros for codes)
    skipped = {i: why for i, text in enumerate(items) if (why := skip_reason(text)) is not None}
    if len(skipped) == len(items):
        from petal.pipeline.reliability.errors import EXIT_NOINPUT

        raise PetalClickError(f"nothing to embed: {describe_skips(skipped)}", EXIT_NOINPUT)
    if output is not None and output.suffix.lower() not in (".npy", ".jsonl"):
        raise click.UsageError(f"--output {output}: expected a .npy or .jsonl file")

    import numpy as np

    from petal.engine.config import EngineConfig, ModelOptions
    from petal.engine.engine import Engine, resolve_device, resolve_dtype
    from petal.pipeline.ingest.tokens import tokenizer_for
    from petal.pipeline.jobs.embed import encode_texts
    from petal.pipeline.jobs.model import model_spec
    from petal.pipeline.store.outputs import OutputConfig, OutputTransform

    options = usage(lambda: ModelOptions(pooling=pooling, attention_mask=attention_mask,  # type: ignore[arg-type]
                                         query_prompt=query_prompt, allow_pickle_weights=allow_pickle_weights))
    output_config = usage(lambda: OutputConfig(dim=dim, quantize=quantize, output_dtype=output_dtype))
    if calibration_index is not None and quantize != "int8":
        raise click.UsageError("--calibration goes with --quantize int8")
    spec = model_spec(model, max_length, options)
    transform = usage(lambda: OutputTransform.for_model(spec, output_config))
    dev = resolve_device(device)
    budget = max(4096 if dev == "cpu" else 16384, spec.pooling.max_length)
    engine = Engine(spec, EngineConfig(device=dev, dtype=resolve_dtype(dtype, dev), attention=attention,  # type: ignore[arg-type]
                                       token_budget=budget))
    tokenizer = tokenizer_for(spec, "query" if as_query or query_prompt is not None else "document")
    kept = [i for i in range(len(items)) if i not in skipped]
    texts_in = [t.decode("utf-8") if isinstance(t, bytes) else t for t in (items[i] for i in kept)]
    vectors, truncated = encode_texts(engine, tokenizer, texts_in)
    if transform.int8_scheme == "calibrated":
        transform = _calibrated(transform, calibration_index, vectors)
    embedded = transform.output(vectors)
    rows = np.full((len(items), *embedded.shape[1:]), np.nan if embedded.dtype.kind == "f" else 0, embedded.dtype)
    rows[kept] = embedded
    if output is not None and output.suffix.lower() == ".npy":
        np.save(output, rows, allow_pickle=False)
    else:
        as_number = int if rows.dtype.kind in "iu" else (lambda x: round(float(x), 7))

        def json_line(i: int) -> str:
            record: dict = {"index": i}
            if ids is not None:
                record["id"] = ids[i]
            if i in skipped:
                record.update(embedding=None, skipped=skipped[i])
            else:
                record["embedding"] = [as_number(x) for x in rows[i]]
            return json.dumps(record, default=str)

        lines = (json_line(i) for i in range(len(items)))
        if output is not None:
            output.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        else:
            for line in lines:
                click.echo(line)
    note = f", {truncated} truncated at {spec.pooling.max_length} tokens" if truncated else ""
    kind = {"none": f"{transform.output_dtype} vectors", "int8": f"int8 codes ({transform.int8_scheme})",
            "binary": "sign bits"}[transform.quantize]
    click.echo(f"petal embed: {len(items)} texts -> {len(kept)} {transform.dim}-dim {kind}, "
               f"{describe_skips(skipped)}{note}", err=True)


def _calibrated(transform: OutputTransform, index_path: Path | None, vectors: np.ndarray) -> OutputTransform:
    """Calibrated int8: the ranges of an index built the same way, or ranges learned from ``vectors``."""
    from petal.pipeline.layout import resolve_index_dir
    from petal.pipeline.manifest import output_to_dict

    if index_path is None:
        click.echo(f"petal embed: int8 ranges learned from these {len(vectors)} texts (pass --calibration INDEX "
                   "to use an index's)", err=True)
        return usage(lambda: transform.calibrate(transform.stored(vectors)))
    _, manifest = resolve_index_dir(index_path)
    recorded = manifest.output
    if recorded is None or recorded.calibration is None or \
            replace(recorded, calibration=None) != replace(transform, calibration=None):
        had = "plain float vectors" if recorded is None else output_to_dict(replace(recorded, calibration=None))
        raise click.UsageError(f"--calibration {index_path}: that index holds no int8 ranges for this model and "
                               f"--dim (it has {had})")
    return recorded
