"""``petal embed [TEXT...]``: one-shot embeddings, in input order, to JSON lines or ``.npy``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from cli.common import PetalClickError, device_options, user_errors


def read_inputs(path: Path, text_column: str) -> list[str]:
    """Texts from ``.parquet`` (a text column), ``.txt`` (one per line) or ``.jsonl`` ({"text": ...})."""
    from pipeline.errors import EXIT_DATAERR, EXIT_NOINPUT

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
@device_options
@user_errors
def embed(texts: tuple[str, ...], model: str | None, from_stdin: bool, input_path: Path | None, text_column: str,
          output: Path | None, max_length: int | None, device: str, dtype: str, attention: str) -> None:
    """Embed TEXT arguments, --stdin lines or an --input file; rows keep the input order."""
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

    from engine.config import EngineConfig
    from engine.engine import Engine, resolve_device, resolve_dtype
    from pipeline.encode import encode_texts
    from pipeline.run import model_spec
    from pipeline.tokens import TextTokenizer

    spec = model_spec(model, max_length)
    dev = resolve_device(device)
    budget = max(4096 if dev == "cpu" else 16384, spec.pooling.max_length)
    engine = Engine(spec, EngineConfig(device=dev, dtype=resolve_dtype(dtype, dev), attention=attention,  # type: ignore[arg-type]
                                       token_budget=budget))
    tokenizer = TextTokenizer(spec.tokenizer_file, spec.pooling.max_length)
    vectors, truncated = encode_texts(engine, tokenizer, items)
    if output is not None and output.suffix.lower() == ".npy":
        np.save(output, vectors.astype(np.float32), allow_pickle=False)
    else:
        lines = (json.dumps({"index": i, "embedding": [round(float(x), 7) for x in row]}) for i, row in
                 enumerate(vectors))
        if output is not None:
            output.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        else:
            for line in lines:
                click.echo(line)
    note = f", {truncated} truncated at {spec.pooling.max_length} tokens" if truncated else ""
    click.echo(f"petal embed: {len(items)} texts -> {vectors.shape[1]}-dim vectors{note}", err=True)
