"""Where a model load spends its time on the GPU host (issue 14: pplx-embed-0.6b shape <= 1.0 s).

    source .gpu/activate.sh && python3 bench/load_probe.py [--shape pplx-embed-0.6b] [--repeats 4]
        [--workdir /tmp/petal-load-probe] [--no-cold] [--json]

Writes random-weight checkpoints of ``--shape`` once (fp32, 2.4 GB, and bf16, 1.2 GB, for the
pplx shape) into ``--workdir`` (reused), then runs fresh child processes, each printing JSON:

* ``stream``: ``load_model`` to cuda/bf16 with its span table (CUDA context created first and shown
  apart), ``--repeats`` loads; the first load of the process is listed apart from the later ones;
* ``stream-cold``: the same after evicting the weight files from the page cache before each load
  (``posix_fadvise(DONTNEED)``; the resident fraction is printed, to show it worked);
* ``settings``: the streaming knobs (chunk size, ring slots, reader threads), one line each;
* ``before``: the loader before this change (``safe_open(device="cuda")`` tensor by tensor, the
  q|k|v and gate|up ``torch.cat``), same process layout;
* ``engine``: ``Engine(spec, EngineConfig(device="cuda"))`` in a fresh process without a CUDA
  context, as ``petal index`` builds it (``model_load`` of the run report: Triton warm-up thread
  beside the load, the CUDA context inside).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CHILD = r"""
import json, os, sys, time
started = time.perf_counter()
import torch
from petal.engine.loader import inspect_model, load_model
from petal.engine.models.stream import Spans, StreamSettings
from petal.bench.load_probe import evict, resident_fraction, before_load
imported = time.perf_counter() - started
mode, model_dir, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
settings = [StreamSettings(**s) for s in json.loads(sys.argv[4])]
spec = inspect_model(model_dir)
cuda = torch.cuda.is_available()  # the CPU only smoke-tests this probe
device, dtype = (torch.device("cuda"), torch.bfloat16) if cuda else (torch.device("cpu"), torch.float32)
sync = torch.cuda.synchronize if cuda else (lambda: None)
out = {"mode": mode, "import_s": imported, "loads": []}
if mode == "engine":
    from petal.engine.config import EngineConfig
    from petal.engine.engine import Engine
    t = time.perf_counter()
    engine = Engine(spec, EngineConfig(device=device.type, dtype=str(dtype).removeprefix("torch.")))
    out["engine_init_s"] = time.perf_counter() - t
    out["model_load_s"] = engine.stats.model_load_s
    out["kernel_warmup_wait_s"] = engine.stats.kernel_warmup_wait_s
    print(json.dumps(out))
    sys.exit(0)
t = time.perf_counter()
if cuda:
    torch.cuda.init()
    torch.empty(1, device="cuda")
    sync()
out["cuda_context_s"] = time.perf_counter() - t
for setting in settings:
    for r in range(repeats):
        resident = None
        if mode.endswith("cold"):
            evict(spec.weight_files)
            resident = resident_fraction(spec.weight_files)
        spans = Spans()
        t = time.perf_counter()
        if mode == "before":
            model = before_load(spec, device, dtype)
        else:
            model = load_model(spec, device, dtype, stream=setting, spans=spans)
        sync()
        total = time.perf_counter() - t
        out["loads"].append({"settings": setting.__dict__, "total_s": total, "resident_before": resident,
                             "spans": spans.seconds})
        del model
        if cuda:
            torch.cuda.empty_cache()
print(json.dumps(out))
"""

SETTINGS_SWEEP = [
    {"chunk_bytes": 32 << 20, "slots": 8, "readers": 4},
    {"chunk_bytes": 16 << 20, "slots": 8, "readers": 4},
    {"chunk_bytes": 64 << 20, "slots": 4, "readers": 4},
    {"chunk_bytes": 32 << 20, "slots": 8, "readers": 8},
    {"chunk_bytes": 32 << 20, "slots": 8, "readers": 2},
    {"chunk_bytes": 8 << 20, "slots": 16, "readers": 8},
    {"chunk_bytes": 16 << 20, "slots": 16, "readers": 16},
]


def evict(files: Any) -> None:
    """Drop ``files`` from the page cache (clean pages only: the probe fsyncs what it writes)."""
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_fraction(files: Any) -> float:
    """Fraction of the files' pages in the page cache (``mincore``)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    resident = total = 0
    for f in files:
        size = os.path.getsize(f)
        with open(f, "rb") as fh, mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY) as mm:
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
            if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
                return float("nan")
            resident += sum(v & 1 for v in vec)
            total += pages
    return resident / max(total, 1)


def before_load(spec: Any, device: Any, dtype: Any) -> Any:
    """The loader as it was before the streaming change: safetensors' ``safe_open(device=...)``, tensor by tensor."""
    import torch
    from safetensors import safe_open

    from petal.engine.models import model_class_for
    from petal.engine.models.build import build_empty, check_loaded

    model = build_empty(model_class_for({"model_type": spec.config.architecture}), spec.config)
    handles = [safe_open(str(f), framework="pt", device=str(device)) for f in spec.weight_files]
    where = {key: h for h in handles for key in h.keys()}  # noqa: SIM118

    def get(name: str) -> torch.Tensor:
        key = next(p + name for p in model.weight_prefixes if p + name in where)
        tensor = where[key].get_tensor(key)
        return tensor.to(dtype) if tensor.is_floating_point() else tensor

    state = {}
    for name, parts in model.weight_plan().items():
        tensors = [get(p) for p in parts]
        state[name] = tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)
    model.load_state_dict(state, strict=True, assign=True)
    check_loaded(model)
    return model


def make_checkpoints(shape_name: str, workdir: Path) -> dict[str, Path]:
    """``{"float32": dir, "bfloat16": dir}``: random weights in ``shape_name``, written once and fsynced."""
    import torch

    from petal.bench.shapes import hf_model, save_model_dir, shape
    from petal.engine.loader import default_model_dir

    s = shape(shape_name)
    dirs = {"float32": workdir / f"{shape_name}-f32", "bfloat16": workdir / f"{shape_name}-bf16"}
    if all((d / "model.safetensors").is_file() for d in dirs.values()):
        return dirs
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    hf = hf_model(s, device, torch.float32)
    try:
        tokenizer_dir = default_model_dir()
    except Exception:
        tokenizer_dir = Path(".gpu/minilm-tokenizer")
    for dtype_name, d in dirs.items():
        save_model_dir(s, hf.to(getattr(torch, dtype_name)), tokenizer_dir, d)
        fd = os.open(d / "model.safetensors", os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return dirs


def child(mode: str, model_dir: Path, repeats: int, settings: list[dict[str, int]]) -> dict[str, Any]:
    argv = [sys.executable, "-c", CHILD, mode, str(model_dir), str(repeats), json.dumps(settings)]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"mode": mode, "error": proc.stderr[-3000:]}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _setting_name(s: dict[str, int]) -> str:
    return f"chunk {s['chunk_bytes'] >> 20} MiB, {s['slots']} slots, {s['readers']} readers"


def format_runs(label: str, result: dict[str, Any]) -> list[str]:
    if "error" in result:
        return [f"{label}: FAILED\n{result['error']}"]
    lines = [f"{label}: import {result['import_s']:.2f} s, CUDA context {result.get('cuda_context_s', 0):.3f} s"]
    loads = result["loads"]
    by_setting: dict[str, list[dict[str, Any]]] = {}
    for load in loads:
        by_setting.setdefault(_setting_name(load["settings"]), []).append(load)
    first = loads[0]
    lines.append(f"  first load in the process   {first['total_s']:.3f} s  "
                 + ("" if first["resident_before"] is None else f"(resident before: {first['resident_before']:.0%}) ")
                 + " ".join(f"{k}={v:.3f}" for k, v in first["spans"].items()))
    for name, group in by_setting.items():
        later = [g for g in group if g is not first] or group
        totals = [g["total_s"] for g in later]
        spans = {k: statistics.median(g["spans"].get(k, 0.0) for g in later) for k in later[-1]["spans"]}
        resident = [g["resident_before"] for g in later if g["resident_before"] is not None]
        lines.append(f"  {name:<38} median {statistics.median(totals):.3f} s  min {min(totals):.3f} s"
                     + (f"  (resident before: {max(resident):.0%})" if resident else ""))
        lines.append("      " + " ".join(f"{k}={v:.3f}" for k, v in spans.items()))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="pplx-embed-0.6b")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/petal-load-probe"))
    parser.add_argument("--no-cold", action="store_true")
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    dirs = make_checkpoints(args.shape, args.workdir)
    print(f"checkpoints ready in {time.perf_counter() - started:.1f} s: "
          + ", ".join(f"{k} {(d / 'model.safetensors').stat().st_size / 1e9:.2f} GB" for k, d in dirs.items()),
          flush=True)
    default = SETTINGS_SWEEP[:1]
    runs: list[tuple[str, dict[str, Any]]] = []
    for dtype_name, d in dirs.items():
        runs.append((f"stream, {dtype_name} checkpoint -> bf16, warm page cache",
                     child("stream", d, args.repeats, default)))
    if not args.no_cold:
        for dtype_name, d in dirs.items():
            runs.append((f"stream, {dtype_name} checkpoint -> bf16, COLD page cache",
                         child("stream-cold", d, max(2, args.repeats // 2), default)))
    runs.append(("before (safe_open per tensor), float32 checkpoint, warm",
                 child("before", dirs["float32"], 3, default)))
    runs.append(("before (safe_open per tensor), bfloat16 checkpoint, warm",
                 child("before", dirs["bfloat16"], 3, default)))
    if not args.no_sweep:
        runs.append(("settings sweep, float32 checkpoint, warm", child("stream", dirs["float32"], 3, SETTINGS_SWEEP)))
    for dtype_name, d in dirs.items():
        runs.append((f"Engine(...) in a fresh process (model_load of the run report), {dtype_name}",
                     child("engine", d, 1, default)))
    if args.json:
        print(json.dumps([{"label": label, **result} for label, result in runs]))
        return
    for label, result in runs:
        if result.get("mode") == "engine" and "error" not in result:
            print(f"{label}: model_load {result['model_load_s']:.3f} s, whole Engine() "
                  f"{result['engine_init_s']:.3f} s, then waited {result['kernel_warmup_wait_s']:.3f} s for the "
                  "Triton warm-up")
        else:
            print("\n".join(format_runs(label, result)))
    print(f"probe took {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
