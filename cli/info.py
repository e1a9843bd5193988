"""``petal info INDEX``: what an index holds and how it was made."""

from __future__ import annotations

import json
from pathlib import Path

import click

from petal.cli.common import user_errors


@click.command()
@click.argument("index_path", metavar="INDEX", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="The manifest as one JSON object on stdout.")
@user_errors
def info(index_path: Path, as_json: bool) -> None:
    """Show INDEX's model, dim, metric, index type, counts, shards and version."""
    from petal.pipeline.layout import resolve_index_dir

    version_dir, manifest = resolve_index_dir(index_path)
    if as_json:
        click.echo(json.dumps({"path": str(version_dir), **manifest}, ensure_ascii=False))
        return
    model, index, counts = manifest["model"], manifest["index"], manifest["counts"]
    skipped = ", ".join(f"{k} {v}" for k, v in sorted(counts["skipped"].items())) or "none"
    lines = [
        f"version      {manifest['version']}  ({version_dir})",
        f"created      {manifest['created_at']}  petal {manifest['petal_version']}",
        *([f"rebuilt      from {manifest['rebuilt_from']} (same embeddings, other index settings)"]
          if manifest.get("rebuilt_from") else []),
        f"model        {model['path']}",
        f"             {model['architecture']}, {model['pooling']} pooling, "
        f"{'normalized' if model['normalize'] else 'not normalized'}, max {model['max_length']} tokens, "
        f"weights sha256 {model['weights_sha256'][:12]}",
        f"vectors      {index['num_vectors']} x {manifest['dim']} ({manifest['embedding']['dtype']} model), "
        f"metric {manifest['metric']}",
        f"index        {index['factory']} (asked: {index['requested_factory']}), {index.get('storage', 'memory')}"
        + (f", search {index['search_params']}" if index["search_params"] else ""),
    ]
    if index.get("plan", {}).get("reason"):
        lines.append(f"             why: {index['plan']['reason']}")
    output = manifest.get("output")  # output format
    if output:
        kind = {"none": output["output_dtype"], "int8": f"int8 ({output['int8_scheme']})", "binary": "binary (Hamming)"}
        lines.append(f"output       {kind[output['quantize']]}, dim {output['dim']} of {output['model_dim']}"
                     f"{', L2-normalised' if output['renormalize'] or output['cosine'] else ''}")
    if index.get("tuning"):
        t = index["tuning"]
        reached = "" if t.get("reached", True) else "  TARGET NOT REACHED"
        lines.append(f"tuning       recall@10 {t['recall_at_10']:.3f} (target {t['target_recall_at_10']}), "
                     f"{t['ms_per_query']:.3f} ms/query batched"
                     + (f", {t['single_query_ms_p50']:.3f} ms p50 single" if "single_query_ms_p50" in t else "")
                     + f" on {t.get('queries', '?')} held-out vectors{reached}")
    if index.get("device"):
        d = index["device"]
        lines.append(f"built on     train {d.get('train') or 'none needed'}, add {d.get('add')} "
                     f"({d.get('gpus', 0)} GPUs seen), {index.get('build_seconds', 0):.1f}s")
    lines += [
        f"rows         {counts['rows']} read, {counts['embedded']} embedded, {counts['truncated']} truncated, "
        f"skipped: {skipped}",
        f"shards       {len(manifest['shards'])}",
    ]
    lines += [f"  {s['path']}  {s['rows']} rows, {s['embedded']} embedded, sha256 {s['sha256'][:12]}"
              for s in manifest["shards"]]
    click.echo("\n".join(lines))
