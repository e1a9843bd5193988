#!/usr/bin/env bash
# GPU-host runs (see README "Benchmarks"). From the project root on the GPU host:
#   source .gpu/activate.sh && bash bench/gpu.sh STEP...
# Steps: tests | quick | full | serve | serve-faiss | serve-minilm | e2e | e2e-flagship | e2e-large | e2e-workers | e2e-warm | variants | profile | l1host | t2fair | scale | scale1. Logs and JSON go to $OUT (or ./bench-out).
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
out=${OUT:-bench-out}
mkdir -p "$out"
petal() { python3 -m petal.cli.main "$@"; }
for step in "$@"; do
  echo "=== $step $(date -u +%H:%M:%S)"
  case $step in
    info)
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
      python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
      ;;
    tests)
      # every module with CUDA tests (marked gpu or skipped without CUDA): the whole module runs
      python3 -m pytest -q -rs $(grep -l 'mark.gpu\|cuda.is_available' tests/test_*.py) 2>&1 \
        | tee "$out/gpu-tests.log" | tail -40
      ;;
    quick)
      petal bench gpu --shape pplx-embed-0.6b --scenario t1,t2,l1,ceiling --t1-docs 1024 --t2-docs 4096 \
        --latency-calls 300 --json > "$out/quick.jsonl" 2> "$out/quick.err"
      python3 -c "import json,sys; from petal.bench.gpu import format_gpu_table as f; [print(f(json.loads(l))) for l in open(sys.argv[1])]" "$out/quick.jsonl"
      tail -5 "$out/quick.err"
      ;;
    full)
      petal bench gpu --shape pplx-embed-0.6b --shape qwen3-embedding-0.6b --shape bge-m3 --shape minilm \
        --json > "$out/full.jsonl" 2> "$out/full.err"
      python3 -c "import json,sys; from petal.bench.gpu import format_gpu_table as f; [print(f(json.loads(l))) for l in open(sys.argv[1])]" "$out/full.jsonl"
      tail -5 "$out/full.err"
      ;;
    e2e)
      petal bench e2e --shape minilm --tokenizer-dir .gpu/minilm-tokenizer --docs 50000 --device cuda \
        --json > "$out/e2e.json" 2> "$out/e2e.err"
      python3 -c "import json,sys; from petal.bench.e2e import format_e2e_table as f; print(f(json.load(open(sys.argv[1]))))" "$out/e2e.json"
      tail -3 "$out/e2e.err"
      ;;
    e2e-flagship)
      petal bench e2e --shape pplx-embed-0.6b --tokenizer-dir .gpu/minilm-tokenizer --index-factory auto \
        --no-baseline --device cuda --docs 40000,120000 2> "$out/e2e-flagship.err" | tee "$out/e2e-flagship.txt"
      tail -3 "$out/e2e-flagship.err"
      ;;
    e2e-large)
      petal bench e2e --shape minilm --tokenizer-dir .gpu/minilm-tokenizer --docs 200000 --device cuda \
        --no-baseline --json > "$out/e2e-large.json" 2> "$out/e2e-large.err"
      python3 -c "import json,sys; from petal.bench.e2e import format_e2e_table as f; r=json.load(open(sys.argv[1])); print(f(r)); print(r['petal_report']['timings_s'])" "$out/e2e-large.json"
      tail -3 "$out/e2e-large.err"
      ;;
    e2e-warm)
      petal bench e2e --shape minilm --tokenizer-dir .gpu/minilm-tokenizer --docs 50000 --device cuda \
        --no-baseline --tokenize-workers 2,2,1 --json > "$out/e2e-warm.json" 2> "$out/e2e-warm.err"
      python3 -c "import json,sys; from petal.bench.e2e import format_e2e_table as f; r=json.load(open(sys.argv[1])); print(f(r)); [print(x['tokenize_workers'], x['petal_report']['timings_s'], {k: round(v, 3) for k, v in x['petal_report']['engine']['stats'].items() if k.endswith('_s')}) for x in r['runs']]" "$out/e2e-warm.json"
      tail -3 "$out/e2e-warm.err"
      ;;
    e2e-workers)
      petal bench e2e --shape minilm --tokenizer-dir .gpu/minilm-tokenizer --docs 200000 --device cuda \
        --no-baseline --tokenize-workers 2,2,1,2,1 --json > "$out/e2e-workers.json" 2> "$out/e2e-workers.err"
      python3 -c "import json,sys; from petal.bench.e2e import format_e2e_table as f; r=json.load(open(sys.argv[1])); print(f(r)); [print(x['tokenize_workers'], x['petal_report']['timings_s'], {k: round(v, 3) for k, v in x['petal_report']['engine']['stats'].items() if k.endswith('_s')}) for x in r['runs']]" "$out/e2e-workers.json"
      tail -3 "$out/e2e-workers.err"
      ;;
    serve|serve-minilm)
      # petal serve under load, 1M-vector index (needs the starlette, uvicorn, uvloop, httptools, orjson wheels in
      # .gpu/). T2_TOK_S / L1_MS: the offline `quick` numbers, when known, for the target table.
      shape=pplx-embed-0.6b; [ "$step" = serve-minilm ] && shape=minilm
      python3 -c "import uvloop, httptools, orjson" 2>/dev/null || echo "NOTE: uvloop/httptools/orjson missing: slow path"
      petal bench serve --shape "$shape" --tokenizer-dir .gpu/minilm-tokenizer --index-docs 1000000 \
        --index-doc-tokens 32 --workdir "/tmp/bench-serve-$shape" --device cuda --seconds 5 --requests 3000 \
        --client-processes 4 --json > "$out/$step.json" 2> "$out/$step.err"
      python3 -c "import json,os,sys; from petal.bench.serve import format_serve_table as f, format_targets as t; r=json.load(open(sys.argv[1])); print(f(r)); e=lambda k: float(os.environ[k]) if os.environ.get(k) else None; print(t(r, e('T2_TOK_S'), e('L1_MS')))" "$out/$step.json"
      tail -5 "$out/$step.err"
      ;;
    serve-faiss)
      # the same index searched by FAISS on the CPU (--search-device cpu), lone and 16 clients (after `serve`)
      petal bench serve --shape pplx-embed-0.6b --tokenizer-dir .gpu/minilm-tokenizer --index-docs 1000000 \
        --index-doc-tokens 32 --workdir /tmp/bench-serve-pplx-embed-0.6b --device cuda --seconds 5 --requests 2000 \
        --endpoints search --tokens 16 --concurrency 1,16 --client-processes 4 --serve-arg=--search-device=cpu \
        --json > "$out/$step.json" 2> "$out/$step.err"
      python3 -c "import json,sys; from petal.bench.serve import format_serve_table as f; print(f(json.load(open(sys.argv[1]))))" "$out/$step.json"
      tail -5 "$out/$step.err"
      ;;
    minilm)
      petal bench gpu --shape minilm --json > "$out/minilm.jsonl" 2> "$out/minilm.err"
      python3 -c "import json,sys; from petal.bench.gpu import format_gpu_table as f; [print(f(json.loads(l))) for l in open(sys.argv[1])]" "$out/minilm.jsonl"
      tail -3 "$out/minilm.err"
      ;;
    profile)
      for spec in "pplx-embed-0.6b 64 16" "pplx-embed-0.6b 128 128" "pplx-embed-0.6b 16384 512" "bge-m3 128 128" \
                  "bge-m3 16384 512"; do
        python3 bench/profile_step.py $spec 2>&1 | grep -v Warning
      done | tee "$out/profile.log"
      ;;
    l1host)
      for spec in "pplx-embed-0.6b 16" "pplx-embed-0.6b 128" "bge-m3 128"; do
        python3 bench/l1_host.py $spec 2>&1 | grep -v -i warn
      done | tee "$out/l1host.log"
      ;;
    t2fair)
      petal bench gpu --shape pplx-embed-0.6b --scenario t2 --json > "$out/t2fair.jsonl" 2> "$out/t2fair.err"
      python3 -c "import json,sys; from petal.bench.gpu import format_gpu_table as f; [print(f(json.loads(l))) for l in open(sys.argv[1])]" "$out/t2fair.jsonl"
      tail -3 "$out/t2fair.err"
      ;;
    variants)
      for v in "PETAL_NOTHING=1 16384" "PETAL_NOTHING=1 32768" "PETAL_FLASHINFER_BACKEND=fa2 16384" \
               "PETAL_FUSED_KERNELS=0 16384"; do
        set -- $v
        echo "--- $1 budget $2"
        env "$1" python3 -m petal.cli.main bench gpu --shape pplx-embed-0.6b --scenario t1,l1 --no-baseline \
          --t1-docs 1024 --latency-calls 200 --token-budget "$2" 2>/dev/null | grep -E "T1|L1"
      done | tee "$out/variants.log"
      ;;
    scale)
      # issue 16: petal index end to end, --devices 1 / 2 / ... (pplx shape, random weights, MiniLM tokenizer)
      n=$(nvidia-smi -L | wc -l); devs="1"; for d in 2 4 8; do [ "$d" -le "$n" ] && devs="$devs $d"; done
      python3 bench/scale_probe.py pplx-embed-0.6b 120000 .gpu/minilm-tokenizer in-process $devs 2>&1 \
        | grep -v -i "warn\|Writing model" | tee "$out/scale.log"
      ;;
    scale1)
      # issue 15: on one GPU, in process vs --devices 1 (target <= 3% wall) vs --devices 1 --workers 2
      # (two worker processes share GPU 0: does tokenization scale?); ~3 minutes on an H200
      python3 bench/scale_probe.py pplx-embed-0.6b 80000 .gpu/minilm-tokenizer in-process 1 1x2 2>&1 \
        | grep -v -i "warn\|Writing model" | tee "$out/scale1.log"
      ;;
    *) echo "unknown step $step" ;;
  esac
done
