"""``petal embed [TEXT...]``: one-shot embeddings, in input order, to JSON lines or ``.npy``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from petal.cli.common import PetalClickError, device_options, usage, user_errors
from petal.cli.options import model_options, output_options

if TYPE_CHECKING:
    import numpy as np

    from petal.pipeline.store.outputs import OutputTransform


def read_inputs(path: Path, text_column: str) -> list[str]:
    """Texts from ``.parquet`` (a text column), ``.txt`` (one per line) or ``.jsonl`` ({"text": ...})."""
    from petal.pipeline.reliability.errors import EXIT_DATAERR, EXIT_NOINPUT

    if not path.is_file():
        raise PetalClickError(f"--input {path} does not exist", EXIT_NOINPUT)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path, columns=[text_column])
        except (OSError, pa.ArrowException, KeyError) as exc:
            raise PetalClickError(f"{path}: cannot read text column {text_column!r}: {exc}", EXIT_DATAERR) from exc
        texts = table.column(0).to_pylist()
        bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
        if bad:
            raise PetalClickError(f"{path}: row {bad[0]} of {text_column!r} is not a string ({texts[bad[0]]!r})",
                                  EXIT_DATAERR)
        return texts
    if suffix == ".txt":
        return path.read_text(encoding="utf-8").splitlines()
    if suffix == ".jsonl":
        texts = []
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)["text"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise PetalClickError(f"{path}:{lineno}: expected a JSON object with a \"text\" field",
                                      EXIT_DATAERR) from exc
            if not isinstance(value, str):
                raise PetalClickError(f"{path}:{lineno}: \"text\" is not a string", EXIT_DATAERR)
            texts.append(value)
        return texts
    raise click.UsageError(f"--input {path}: expected a .parquet, .txt or .jsonl file")


@click.command()
@click.argument("texts", nargs=-1)
@click.option("--model", default=None, help="Local model directory (default: the packaged all-MiniLM-L6-v2).")
@click.option("--stdin", "from_stdin", is_flag=True, help="Read one text per line from stdin.")
@click.option("--input", "input_path", type=click.Path(path_type=Path), default=None,
              help="Read texts from a .parquet, .txt or .jsonl file.")
@click.option("--text-column", default="text", show_default=True, help="Text column of a .parquet --input.")
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
          output: Path | None, max_length: int | None, as_query: bool, calibration_index: Path | None,
          device: str, dtype: str, attention: str, pooling: str | None, attention_mask: str | None,
          query_prompt: str | None, allow_pickle_weights: bool, dim: int | None, quantize: str,
          output_dtype: str) -> None:
    """Embed TEXT arguments, --stdin lines or an --input file; rows keep the input order.

    Rows are float vectors (--output-dtype), int8 codes (--quantize int8) or packed sign bits
    (--quantize binary: dim / 8 bytes, first dimension in the high bit).
    """
    items = list(texts)
    if input_path is not None:
        items += read_inputs(input_path, text_column)
    if from_stdin:
        items += [line.rstrip("\n") for line in sys.stdin]
    if not items:
        raise click.UsageError("nothing to embed: give TEXT, --stdin or --input")
    if output is not None and output.suffix.lower() not in (".npy", ".jsonl"):
        raise click.UsageError(f"--output {output}: expected a .npy or .jsonl file")

    import numpy as np

    from petal.engine.config import EngineConfig, ModelOptions
    from petal.engine.engine import Engine, resolve_device, resolve_dtype
    from petal.pipeline.ingest.tokens import tokenizer_for
    from petal.pipeline.jobs.embed import encode_texts
    from petal.pipeline.jobs.index_run import model_spec
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
    vectors, truncated = encode_texts(engine, tokenizer, items)
    if transform.int8_scheme == "calibrated":
        transform = _calibrated(transform, calibration_index, vectors)
    rows = transform.output(vectors)
    if output is not None and output.suffix.lower() == ".npy":
        np.save(output, rows, allow_pickle=False)
    else:
        as_number = int if rows.dtype.kind in "iu" else (lambda x: round(float(x), 7))
        lines = (json.dumps({"index": i, "embedding": [as_number(x) for x in row]}) for i, row in enumerate(rows))
        if output is not None:
            output.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        else:
            for line in lines:
                click.echo(line)
    note = f", {truncated} truncated at {spec.pooling.max_length} tokens" if truncated else ""
    kind = {"none": f"{transform.output_dtype} vectors", "int8": f"int8 codes ({transform.int8_scheme})",
            "binary": "sign bits"}[transform.quantize]
    click.echo(f"petal embed: {len(items)} texts -> {transform.dim}-dim {kind}{note}", err=True)


def _calibrated(transform: OutputTransform, index_path: Path | None, vectors: np.ndarray) -> OutputTransform:
    """Calibrated int8: the ranges of an index built the same way, or ranges learned from ``vectors``."""
    from petal.pipeline.layout import resolve_index_dir
    from petal.pipeline.store.outputs import OutputTransform

    if index_path is None:
        click.echo(f"petal embed: int8 ranges learned from these {len(vectors)} texts (pass --calibration INDEX "
                   "to use an index's)", err=True)
        return usage(lambda: transform.calibrate(transform.stored(vectors)))
    _, manifest = resolve_index_dir(index_path)
    recorded = OutputTransform.from_record(manifest["output"]) if "output" in manifest else None
    if recorded is None or recorded.calibration is None or recorded.fingerprint() != transform.fingerprint() \
            or recorded.model_dim != transform.model_dim:
        raise click.UsageError(f"--calibration {index_path}: that index holds no int8 ranges for this model and "
                               f"--dim (it has {manifest.get('output', 'plain float vectors')})")
    return recorded
