#!/usr/bin/env python3
"""Where W4A16 round-to-nearest loses accuracy on MiniLM (all-MiniLM-L6-v2): the mean cosine of
sentence embeddings to float, per block size and per MatMul, against ONNX Runtime's RTN.

Usage: bench/w4a16_rtn_study.py [--qforge build/qforge] [--work DIR] [--blocks-only]

1. Block sizes 32, 64 and 128: qforge RTN (its default per-block scale search), qforge GPTQ on
   the 80 calibration sentences, and ONNX Runtime's MatMulNBitsQuantizer (RTN, symmetric); for
   both RTNs also the total weight error, sum((W - dequantized W)^2) over the 36 MatMuls.
   --blocks-only stops after this table.
2. Each of the 36 MatMuls quantized alone at block 128 (every other one left float with
   --exclude): its loss 1 - cosine, and the losses summed by kind of projection.
3. The fewest MatMuls, most sensitive first, that RTN must leave float to reach cosine 0.98.
Evaluation: the 40 EVALUATION sentences, every model in ONNX Runtime.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "interop"))
import int4_weight_error  # noqa: E402
import minilm_export  # noqa: E402
from bench_w4a16 import ORT_SCRIPT  # noqa: E402  (MatMulNBitsQuantizer, RTN, symmetric)

TARGET = 0.98


class Evaluator:
    """Mean cosine of a model's sentence embeddings to the float model's (computed once)."""

    def __init__(self, reference: Path, eval_npz: Path):
        self.feeds = minilm_export.load_feeds(eval_npz)
        self.reference = minilm_export.ort_embeddings(reference, self.feeds)

    def cosine(self, path: Path) -> float:
        got = minilm_export.ort_embeddings(path, self.feeds)
        return float(minilm_export.cosine_rows(self.reference, got).mean())


def kind_of(name: str) -> str:
    for key, kind in (("query", "Q"), ("key", "K"), ("value", "V"),
                      ("attention/output", "attention output"), ("intermediate", "FFN up"),
                      ("output/dense", "FFN down")):
        if key in name:
            return kind
    return "other"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qforge", type=Path, default=REPO / "build" / "qforge")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--blocks-only", action="store_true", help="only table 1")
    args = parser.parse_args()
    if not args.qforge.is_file():
        print(f"no qforge binary at {args.qforge}: build it first", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="w4a16_rtn_study_"))
    paths = minilm_export.write_all(work)
    model = paths["model"]
    ev = Evaluator(model, paths["eval"])

    def qforge(out: Path, *flags: str) -> float:
        subprocess.run([str(args.qforge), "-q", "convert", str(model), "-o", str(out), "--quant",
                        "w4a16", *flags], check=True)
        return ev.cosine(out)

    print("| block | qforge RTN | ORT RTN | qforge GPTQ | weight error qforge RTN | ORT RTN |")
    print("|---:|---:|---:|---:|---:|---:|")
    for block in (32, 64, 128):
        rtn = qforge(work / f"rtn_{block}.onnx", "--block-size", str(block))
        gptq = qforge(work / f"gptq_{block}.onnx", "--block-size", str(block), "--w4-method",
                      "gptq", "--calib", str(paths["calib"]))
        ort_out = work / f"ort_{block}.onnx"
        subprocess.run([sys.executable, "-c", ORT_SCRIPT, str(model), str(ort_out), str(block)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        err_rtn, _ = int4_weight_error.total_weight_error(model, work / f"rtn_{block}.onnx")
        err_ort, _ = int4_weight_error.total_weight_error(model, ort_out)
        print(f"| {block} | {rtn:.5f} | {ev.cosine(ort_out):.5f} | {gptq:.5f} | {err_rtn:.2f} "
              f"| {err_ort:.2f} |", flush=True)
    if args.blocks_only:
        return 0

    graph = onnx.load(str(model)).graph
    weights = {i.name for i in graph.initializer}
    names = [n.name for n in graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    loss = {}
    for name in names:
        alone = f"^(?!{re.escape(name)}$).*$"  # every MatMul but this one stays float
        loss[name] = 1.0 - qforge(work / "alone.onnx", "--block-size", "128", "--exclude", alone)
    total = 1.0 - qforge(work / "all.onnx", "--block-size", "128")
    print(f"\nBlock 128, one MatMul at a time: sum of the 36 losses {sum(loss.values()):.4f}, "
          f"loss with all 36 quantized {total:.4f}")
    by_kind: dict[str, list[float]] = {}
    for name, value in loss.items():
        by_kind.setdefault(kind_of(name), []).append(value)
    print("\n| projection | MatMuls | summed loss | largest |")
    print("|---|---:|---:|---:|")
    for kind, values in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
        print(f"| {kind} | {len(values)} | {sum(values):.4f} | {max(values):.4f} |")
    ranked = sorted(names, key=lambda n: -loss[n])
    print("\nMost sensitive: " + ", ".join(f"{n} {loss[n]:.4f}" for n in ranked[:6]))

    print(f"\nLeaving the k most sensitive MatMuls float (RTN on the rest, block 128):")
    print("| k | mean cosine |")
    print("|---:|---:|")
    for k in range(1, len(ranked) + 1):
        keep = "^(" + "|".join(re.escape(n) for n in ranked[:k]) + ")$"
        cos = qforge(work / "keep.onnx", "--block-size", "128", "--exclude", keep)
        print(f"| {k} | {cos:.4f} |", flush=True)
        if cos >= TARGET:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
