#!/usr/bin/env python3
"""Static INT8 of MiniLM (all-MiniLM-L6-v2), qforge vs ONNX Runtime's quantize_static: wall time,
peak resident memory and the mean cosine of sentence embeddings to float, for each calibration
method on 256 sentences: entropy, percentile and minmax on both sides; mse on qforge alone (ONNX
Runtime has no MSE calibrator; its fourth method, Distribution, is not an int8 range search).

Usage: bench/bench_static_int8.py [--qforge build/qforge] [--work DIR] [--sentences 256]
                                  [--methods entropy,percentile,minmax,mse] [--pad-to N]
                                  [--spread-lengths]

The sentences are padded to the longest of them (16 tokens), or with --pad-to to N tokens, as a
calibration set tokenized with padding="max_length" is; both tools get the same arrays.
--spread-lengths replaces them with sequences of spread lengths, as real text has: lengths
round(lognormal(log 28, 0.7)) clipped to 4-128 (numpy default_rng(7); median 25), each a
sentence's ids repeated to its length between its first and last token, padded to 128.

Each run is a fresh subprocess, run once; its peak RSS is its ru_maxrss (os.wait4, from a small
launcher process, see bench_util.py). Timings on a shared machine vary from run to run.
- qforge: `qforge convert minilm.onnx --quant int8 --calib minilm_calib.npz --method M
  --op-types MatMul --exclude 'layer\\.\\d+/output/dense/MatMul'` (BatchNorm folding, calibration
  and QDQ in one process; the data streams in batches of 32).
- ONNX Runtime: quantize_static (QDQ, per-channel int8 weights, symmetric int8 activations,
  op_types_to_quantize MatMul, the same six nodes excluded, CalibPercentile 99.99) in a fresh
  Python; calibration data one sentence per get_next(), since its entropy and percentile
  calibrators stack batches and need them of one shape. quantize_static has no extra option for
  the histogram size (ORT 1.31 forwards only CalibTensorRangeSymmetric, CalibMovingAverage,
  CalibMovingAverageConstant, CalibMaxIntermediateOutputs and CalibPercentile to the
  calibrator, and its entropy calibrator defaults to 128 bins), so the script wraps
  onnxruntime.quantization.quantize.create_calibrator to pass num_bins=2048: both tools build
  2048-bin histograms (ORT's over [-amax, amax]; qforge's of |x| in power-of-two bins, of which
  1025 to 2048 cover [0, amax]).
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

EXCLUDE = r"layer\.\d+/output/dense/MatMul"
METHODS = {"entropy": "Entropy", "percentile": "Percentile", "minmax": "MinMax", "mse": None}

ORT_SCRIPT = textwrap.dedent("""
    import re, sys
    import numpy as np, onnx
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat,
                                          QuantType, quantize_static)
    import importlib
    # The module, not the function onnxruntime.quantization.quantize that shadows its name.
    ort_quantize = importlib.import_module("onnxruntime.quantization.quantize")
    make_calibrator = ort_quantize.create_calibrator
    def with_2048_bins(*args, **kwargs):  # quantize_static cannot set num_bins itself
        kwargs["extra_options"] = {**kwargs.get("extra_options", {}), "num_bins": 2048}
        return make_calibrator(*args, **kwargs)
    ort_quantize.create_calibrator = with_2048_bins
    model, calib, out, method, exclude = sys.argv[1:6]
    with np.load(calib) as d:
        feeds = {k: d[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    class Rows(CalibrationDataReader):
        def __init__(self):
            n = len(feeds["input_ids"])
            self.it = iter([{k: v[i:i + 1] for k, v in feeds.items()} for i in range(n)])
        def get_next(self):
            return next(self.it, None)
    names = [n.name for n in onnx.load(model).graph.node
             if n.op_type == "MatMul" and re.search(exclude, n.name)]
    quantize_static(model, out, Rows(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    calibrate_method=getattr(CalibrationMethod, method),
                    op_types_to_quantize=["MatMul"], nodes_to_exclude=names,
                    extra_options={"ActivationSymmetric": True, "CalibPercentile": 99.99})
""")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qforge", type=Path, default=REPO / "build" / "qforge")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--methods", default=",".join(METHODS),
                        help="comma-separated, from " + ", ".join(METHODS))
    parser.add_argument("--pad-to", type=int, default=None,
                        help="pad the calibration sentences to N tokens (default: the longest)")
    parser.add_argument("--spread-lengths", action="store_true",
                        help="calibrate on sequences of 4-128 tokens (median 25), padded to 128")
    args = parser.parse_args()
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        print(f"unknown method(s) {unknown}: use {', '.join(METHODS)}", file=sys.stderr)
        return 2
    if not args.qforge.is_file():
        print(f"no qforge binary at {args.qforge}: build it first", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_static_int8_"))
    # The export loads torch; a child process keeps that out of this one.
    subprocess.run([sys.executable, str(REPO / "tests" / "interop" / "minilm_export.py"),
                    str(work), "--calib", str(args.sentences)]
                   + ([] if args.pad_to is None else ["--calib-pad-to", str(args.pad_to)]),
                   check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    paths = {"model": work / "minilm.onnx", "calib": work / "minilm_calib.npz",
             "eval": work / "minilm_eval.npz"}
    if args.spread_lengths:
        spread_lengths(paths["calib"])
    with np.load(paths["calib"]) as d:
        shape = d["input_ids"].shape
    print(f"MiniLM: {paths['model']}, calibration {shape[0]} sentences x {shape[1]} tokens, "
          f"evaluation {len(minilm_export.EVALUATION)} sentences; cpus {os.cpu_count()}")

    rows = []
    for method in methods:
        ort_method = METHODS[method]
        out = work / f"qforge_{method}.onnx"
        wall, rss = run_measured([str(args.qforge), "-q", "convert", str(paths["model"]), "-o",
                                  str(out), "--quant", "int8", "--calib", str(paths["calib"]),
                                  "--method", method, "--op-types", "MatMul", "--exclude",
                                  EXCLUDE])
        rows.append(("qforge", method, wall, rss, mean_cosine(out, paths["model"], paths["eval"])))
        if ort_method is None:
            continue
        out = work / f"ort_{method}.onnx"
        wall, rss = run_measured([sys.executable, "-c", ORT_SCRIPT, str(paths["model"]),
                                  str(paths["calib"]), str(out), ort_method, EXCLUDE])
        rows.append(("onnxruntime", method, wall, rss,
                     mean_cosine(out, paths["model"], paths["eval"])))

    print(f"\n| tool | method | wall s | peak RSS MiB | mean cosine to float |")
    print("|---|---|---:|---:|---:|")
    for tool, method, wall, rss, cos in rows:
        print(f"| {tool} | {method} | {wall:.2f} | {rss:.0f} | {cos:.5f} |")
    return 0


def spread_lengths(path: Path) -> None:
    """Rewrites the calibration set at `path` as sequences of spread lengths (module docstring)."""
    np.savez(path, **minilm_export.spread_lengths(minilm_export.load_feeds(path)))


if __name__ == "__main__":
    sys.exit(main())
