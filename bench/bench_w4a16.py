#!/usr/bin/env python3
"""W4A16 conversion of MiniLM (all-MiniLM-L6-v2), qforge RTN, AWQ and GPTQ vs ONNX Runtime's
MatMulNBitsQuantizer (RTN, block 128, symmetric): wall time, peak resident memory and the mean
cosine of sentence embeddings to float.

Usage: bench/bench_w4a16.py [--qforge build/qforge] [--work DIR] [--sentences 80]

Each conversion is a fresh subprocess, run once; its peak RSS is its ru_maxrss (os.wait4, from a
small launcher process: Linux carries peak RSS across fork and exec, so a child forked straight
from this script, which holds onnxruntime, would report this script's size).
- qforge RTN: `qforge -q convert minilm.onnx -o out.onnx --quant w4a16 --block-size 128`
- qforge AWQ: the same with `--w4-method awq --calib minilm_calib.npz` (the calibration run,
  the alpha search on 512 rows per input and the quantization, in one process)
- qforge AWQ again with OMP_WAIT_POLICY=PASSIVE (OpenMP threads sleep instead of spinning while
  they wait: on a machine busier than its cores, spinning threads take the time slices the
  working ones need)
- qforge GPTQ: the same with `--w4-method gptq --calib minilm_calib.npz` (the calibration run
  accumulating X^T X per input, then GPTQ per weight, in one process)
- ONNX Runtime: MatMulNBitsQuantizer(block_size=128, is_symmetric=True) in a fresh Python.
Evaluation: the 40 EVALUATION sentences, every model in ONNX Runtime.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "interop"))
import minilm_export  # noqa: E402
from minilm_export import mean_cosine  # noqa: E402
from bench_util import run_measured  # noqa: E402

BLOCK = 128

ORT_SCRIPT = textwrap.dedent("""
    import sys
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    model, out, block = sys.argv[1], sys.argv[2], int(sys.argv[3])
    q = MatMulNBitsQuantizer(onnx.load(model), block_size=block, is_symmetric=True)
    q.process()
    q.model.save_model_to_file(out)
""")

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qforge", type=Path, default=REPO / "build" / "qforge")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--sentences", type=int, default=len(minilm_export.CALIBRATION))
    args = parser.parse_args()
    if not args.qforge.is_file():
        print(f"no qforge binary at {args.qforge}: build it first", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_w4a16_"))
    subprocess.run([sys.executable, str(REPO / "tests" / "interop" / "minilm_export.py"),
                    str(work), "--calib", str(args.sentences)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    paths = {"model": work / "minilm.onnx", "calib": work / "minilm_calib.npz",
             "eval": work / "minilm_eval.npz"}
    with np.load(paths["calib"]) as d:
        shape = d["input_ids"].shape
    print(f"MiniLM: {paths['model']}, AWQ calibration {shape[0]} sentences x {shape[1]} tokens, "
          f"evaluation {len(minilm_export.EVALUATION)} sentences; cpus {os.cpu_count()}")

    qforge = [str(args.qforge), "-q", "convert", str(paths["model"]), "--quant", "w4a16",
              "--block-size", str(BLOCK)]
    runs = {
        ("qforge", "rtn"): qforge + ["-o", str(work / "qforge_rtn.onnx")],
        ("qforge", "awq"): qforge + ["-o", str(work / "qforge_awq.onnx"), "--w4-method", "awq",
                                     "--calib", str(paths["calib"])],
        # OpenMP threads that spin while they wait lose their time slices on a busy machine.
        ("qforge", "awq, OMP_WAIT_POLICY=PASSIVE"): qforge + [
            "-o", str(work / "qforge_awq_passive.onnx"), "--w4-method", "awq", "--calib",
            str(paths["calib"])],
        ("qforge", "gptq"): qforge + ["-o", str(work / "qforge_gptq.onnx"), "--w4-method",
                                      "gptq", "--calib", str(paths["calib"])],
        ("onnxruntime", "rtn"): [sys.executable, "-c", ORT_SCRIPT, str(paths["model"]),
                                 str(work / "ort_rtn.onnx"), str(BLOCK)],
    }
    rows = []
    for (tool, method), cmd in runs.items():
        env = {"OMP_WAIT_POLICY": "PASSIVE"} if "PASSIVE" in method else None
        wall, rss = run_measured(cmd, env)
        out = Path(cmd[cmd.index("-o") + 1]) if "-o" in cmd else work / "ort_rtn.onnx"
        rows.append((tool, method, wall, rss, mean_cosine(out, paths["model"], paths["eval"])))

    ort_wall = rows[-1][2]
    print(f"\n| tool | method | wall s | vs ORT | peak RSS MiB | mean cosine to float |")
    print("|---|---|---:|---:|---:|---:|")
    for tool, method, wall, rss, cos in rows:
        print(f"| {tool} | {method} | {wall:.2f} | {wall / ort_wall:.2f} | {rss:.0f} | {cos:.5f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
