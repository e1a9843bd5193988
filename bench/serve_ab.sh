#!/usr/bin/env bash
# An A/B(/C) of servers on the GPU host: `petal bench serve` of each variant taking turns (the order reversed
# every other round), on one index built once (100k texts, IVF), lone requests by default. A variant is
# NAME=DIR (a tree: this checkout, or e.g. a `git archive` of main unpacked in DIR) with optional extra
# `petal serve` flags after a colon. Run from the project root after `source .gpu/activate.sh`:
#
#     bash bench/serve_ab.sh ROUNDS new=. old=.gpu/old "nospin=.:--idle-spin-ms=0"
#
# SERVE_AB_ARGS: extra `petal bench serve` flags for every run. Prints each run's rows (p50/p99, the
# step, the Server-Timing spans), then each row's median p50 per variant and its ratio to the first.
set -euo pipefail
rounds=$1; shift
root=$PWD; out=${OUT:-$root/bench-out}; mkdir -p "$out"
args="--shape pplx-embed-0.6b --tokenizer-dir $root/.gpu/minilm-tokenizer --corpus $root/sample_data
  --index-docs 100000 --index-doc-tokens 32 --workdir /tmp/serve-ab --device cuda --seconds 2 --requests 800
  --concurrency 1 --client-processes 1 ${SERVE_AB_ARGS:-}"
one() {  # variant round
  local name=${1%%=*} spec=${1#*=}; local dir=${spec%%:*} extra=""
  [[ $spec == *:* ]] && extra=${spec#*:}
  dir=$(cd "$dir" && pwd)
  local serve_args=(); for a in $extra; do serve_args+=("--serve-arg=$a"); done
  (cd /tmp && PYTHONPATH=$dir:/tmp/site python3 -m petal.cli.main bench serve $args "${serve_args[@]}" --json \
    > "$out/ab-$name-$2.json" 2> "$out/ab-$name-$2.err") || { tail -5 "$out/ab-$name-$2.err"; exit 1; }
}
variants=("$@"); names=()
for v in "${variants[@]}"; do names+=("${v%%=*}"); done
for r in $(seq 1 "$rounds"); do
  order=("${variants[@]}")
  if [ $((r % 2)) = 0 ]; then order=(); for ((i=${#variants[@]}-1; i>=0; i--)); do order+=("${variants[i]}"); done; fi
  for v in "${order[@]}"; do one "$v" "$r"; done
done
python3 - "$out" "${names[@]}" <<'PY'
import glob, json, statistics, sys
out, names = sys.argv[1], sys.argv[2:]
rows = {}
for name in names:
    for path in sorted(glob.glob(f"{out}/ab-{name}-*.json")):
        rnd = path.rsplit("-", 1)[1][:-5]
        for r in json.load(open(path))["results"]:
            key = (r["endpoint"], r["tokens"], r["concurrency"])
            rows.setdefault(key, {}).setdefault(name, []).append(r["p50_ms"])
            spans = " ".join(f"{k} {v:.3f}" for k, v in (r.get("spans_ms") or {}).items())
            print(f"{name} r{rnd} {key[0]} {key[1]} tok x{key[2]}: p50 {r['p50_ms']:.3f} p99 {r['p99_ms']:.3f} "
                  f"step {r.get('step_ms')} | {spans}")
for key, by in rows.items():
    base = statistics.median(by[names[0]])
    cells = "  ".join(f"{n} {statistics.median(by[n]):.3f} ({statistics.median(by[n]) / base:.3f})" for n in names if n in by)
    print(f"{key[0]} {key[1]} tok x{key[2]} p50 ms: {cells}")
PY
