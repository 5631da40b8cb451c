#!/usr/bin/env python3
"""Latency of the qforge runtime next to ONNX Runtime, same model, same inputs, same threads.

Usage: bench/bench_runtime.py [--fixtures DIR] [--bench-bin build/bench/bench_runtime]
                              [--models cnn,minilm,resnet50,resnet50_b8] [--threads 1,2] [--runs 20] [--passive]

Models and inputs come from tests/interop/runtime_make_ort_fixtures.py (run into a temporary
folder unless --fixtures names one already made): the sample CNN (batch 32), MiniLM-L6
(batch 2, 16 tokens), and with --models resnet50,resnet50_b8 a ResNet-50-shaped CNN (random
weights, 224x224, batch 1 and 8), with --models decoder one decoder layer of the LLM graph
(TinyLlama-1.1B's layer shape, 512 tokens; the fixture script needs the qforge binary). ONNX
Runtime runs on CPU with intra_op_num_threads = threads, twice: with its graph optimizations
(fusions; what users get) and with them off (the graph as written, which is what qforge
executes). The qforge side is the Google Benchmark binary
bench/bench_runtime.cpp. Every figure is the median over --runs runs after warm-up, in ms.

On a shared or oversubscribed host, threads that spin while waiting for each other dominate
multi-threaded timings (OpenMP's default, and ONNX Runtime's thread pool). --passive turns the
spinning off on both sides: OMP_WAIT_POLICY=passive for qforge and
session.intra_op.allow_spinning=0 for ONNX Runtime.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

REPO = pathlib.Path(__file__).resolve().parents[1]


def ort_median_ms(model: pathlib.Path, feeds: dict, threads: int, optimize: bool, runs: int,
                  passive: bool) -> float:
    opts = ort.SessionOptions()
    if passive:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                     else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    for _ in range(3):
        sess.run(None, feeds)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def qforge_median_ms(bench_bin: pathlib.Path, model: pathlib.Path, inputs: pathlib.Path,
                     runs: int, passive: bool) -> dict:
    env = dict(os.environ, QFORGE_BENCH_MODEL=str(model), QFORGE_BENCH_INPUTS=str(inputs))
    if passive:
        env["OMP_WAIT_POLICY"] = "passive"
    out = subprocess.run(
        [str(bench_bin), f"--benchmark_repetitions={runs}", "--benchmark_report_aggregates_only=true",
         "--benchmark_format=json", "--benchmark_min_time=0.05"],
        env=env, check=True, capture_output=True, text=True).stdout
    result = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            threads = int(b["run_name"].split("threads:")[1].split("/")[0])
            scale = {"ms": 1.0, "us": 1e-3, "ns": 1e-6, "s": 1e3}[b["time_unit"]]
            result[threads] = b["real_time"] * scale
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixtures", type=pathlib.Path)
    ap.add_argument("--bench-bin", type=pathlib.Path, default=REPO / "build/bench/bench_runtime")
    ap.add_argument("--models", default="cnn,minilm")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--passive", action="store_true",
                    help="no spin-waiting threads on either side (for shared hosts)")
    args = ap.parse_args()
    if not args.bench_bin.is_file():
        print(f"error: {args.bench_bin} not found; build it (ninja -C build bench_runtime)",
              file=sys.stderr)
        return 1
    threads = [int(t) for t in args.threads.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        fixtures = args.fixtures
        if fixtures is None:
            fixtures = pathlib.Path(tmp)
            subprocess.run([sys.executable, str(REPO / "tests/interop/runtime_make_ort_fixtures.py"),
                            str(fixtures), "--models", args.models], check=True)
        print(f"{'model':11} {'threads':>7} {'qforge ms':>10} {'ORT ms':>8} {'ORT no-opt ms':>14}"
              f" {'qforge/ORT':>10}")
        for name in args.models.split(","):
            model = fixtures / f"{name}.onnx"
            inputs = fixtures / f"{name}_inputs.npz"
            with np.load(inputs) as data:
                feeds = {k: data[k] for k in data.files}
            ours = qforge_median_ms(args.bench_bin, model, inputs, args.runs, args.passive)
            for t in threads:
                opt = ort_median_ms(model, feeds, t, True, args.runs, args.passive)
                raw = ort_median_ms(model, feeds, t, False, args.runs, args.passive)
                q = ours.get(t, float("nan"))
                print(f"{name:11} {t:>7} {q:>10.3f} {opt:>8.3f} {raw:>14.3f} {q / opt:>10.2f}")
    print(f"(median of {args.runs} runs; host load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs; spinning {'off' if args.passive else 'on (defaults)'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
