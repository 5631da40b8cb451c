"""Layer-wise W4A16 GPTQ and AWQ of a Llama-shaped model folder (issue 18 section 6): writes a
synthetic bf16 folder (bench/bench_llm_rtn.py's shapes and writer) and random calibration ids
[N, T], runs `qforge convert DIR --quant w4a16 --w4-method gptq|awq --calib ids.npz -o OUT/`,
reads its line per layer on stderr, and stops it after --layers layers (a whole 7B-shaped model
takes hours on 2 cores): prints the prologue time, each layer's seconds and the peak RSS so far
(VmHWM of the process), then removes everything it wrote.

    .venv/bin/python bench/bench_llm_layerwise.py --shape tinyllama-1.1b --samples 128 --seq 512
    .venv/bin/python bench/bench_llm_layerwise.py --shape llama2-7b --layers 2 --workdir /big

Random weights and ids: the timings hold for any model of the shape, the errors printed do not
mean anything."""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_llm_rtn  # noqa: E402


def peak_rss_gib(pid: int) -> float:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float("nan")
    return int(re.search(r"VmHWM:\s+(\d+) kB", text)[1]) / 1024 / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(bench_llm_rtn.SHAPES), default="tinyllama-1.1b")
    ap.add_argument("--qforge", default="build/qforge")
    ap.add_argument("--workdir", default=None, help="where to write (default: a temp folder)")
    ap.add_argument("--methods", default="gptq,awq")
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--layers", type=int, default=2, help="stop after this many layers")
    args = ap.parse_args()
    s = bench_llm_rtn.SHAPES[args.shape]
    root = Path(tempfile.mkdtemp(prefix="qforge_llm_lw_", dir=args.workdir))
    try:
        src = root / "model"
        src.mkdir()
        bench_llm_rtn.write_folder(src, s, int(2e9))
        rng = np.random.default_rng(0)
        ids = rng.integers(0, s["vocab"], (args.samples, args.seq))
        np.savez(root / "ids.npz", input_ids=ids, attention_mask=np.ones_like(ids))
        print(f"{args.shape}: {s['layers']} layers, calibration {args.samples} x {args.seq} "
              f"tokens, block {args.block_size}")
        for method in args.methods.split(","):
            cmd = [args.qforge, "convert", str(src), "--quant", "w4a16", "--w4-method", method,
                   "--block-size", str(args.block_size), "--calib", str(root / "ids.npz"),
                   "--batch", "8", "-o", str(root / f"out-{method}") + "/"]
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    text=True)
            layers, rss = [], float("nan")
            for line in proc.stderr:
                rss = peak_rss_gib(proc.pid)
                if line.startswith("embedded"):
                    print(f"  {method}: {line.strip()} (at {time.perf_counter() - t0:.1f} s)")
                m = re.match(r"layer (\d+)/(\d+)\s+([\d.]+) s", line)
                if m:
                    layers.append(float(m[3]))
                    print(f"  {method}: {line.strip()}  [peak RSS {rss:.2f} GiB]", flush=True)
                    if len(layers) >= args.layers:
                        break
            proc.kill()
            proc.wait()
            if not layers:
                raise SystemExit(f"qforge {method} reported no layer (exit {proc.returncode})")
            print(f"  {method}: {np.mean(layers):.1f} s per layer over {len(layers)} layers, "
                  f"peak RSS {rss:.2f} GiB, whole model at that rate "
                  f"{np.mean(layers) * s['layers'] / 60:.1f} min")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
