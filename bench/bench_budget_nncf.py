#!/usr/bin/env python3
"""MiniLM (all-MiniLM-L6-v2) static INT8 to an accuracy budget, qforge against NNCF's
quantize_with_accuracy_control (ONNX backend): wall time, layers kept float, final metric.

Usage: .venv-nncf/bin/python bench/bench_budget_nncf.py [--qforge build/qforge] [--work DIR]
       [--target-cosine 0.995]

.venv-nncf is a venv of its own with bench/requirements-nncf.txt, seeing .venv's packages
through a .pth file (as scripts/setup_peers.sh makes .venv-gptq):
    python3 -m venv .venv-nncf
    echo "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \\
        > "$(.venv-nncf/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_main_venv.pth"
    .venv-nncf/bin/pip install -r bench/requirements-nncf.txt

The task is tests/interop/test_accuracy_budget.py's INT8 one: the 80 CALIBRATION sentences of
tests/interop/minilm_export.py, the first 64 calibrating, the last 16 evaluating; the budget is
the output cosine over real tokens (as qforge measures it) of at least C, which for NNCF is its
metric "cosine to the float model" (float: 1.0) with max_drop 1 - C, absolute.
- qforge: `qforge convert minilm.onnx --quant int8 --calib minilm_calib.npz --target-cosine C`.
- NNCF: quantize_with_accuracy_control(model, calibration (64 sentences, one per item),
  validation (16), validation_fn, max_drop=1 - C, model_type=TRANSFORMER, subset_size=64), with
  validation_fn running the model in ONNX Runtime and returning the cosine over real tokens and
  each sentence's own for the ranking. Layers kept float: the nodes reading a DequantizeLinear
  output in NNCF's own fully quantized model (quantize() with the same parameters) that read
  none in the returned one.
Both are then measured the same way: the cosine on the 16 held-out sentences (the budget's
metric, in ONNX Runtime) and the mean sentence-embedding cosine on the 40 EVALUATION sentences.
Each tool runs once, in a fresh process; timings on a shared machine vary from run to run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "interop"))
import minilm_export  # noqa: E402

N_CALIB = 64  # the first 64 of the 80 calibrate, the last 16 evaluate (qforge's held-out fifth)

NNCF_RUN = textwrap.dedent('''
    import json, sys, time
    import numpy as np, onnx, onnxruntime as ort
    import nncf
    from nncf.parameters import ModelType
    model_path, calib_npz, n_calib, max_drop, out_path, full_path = sys.argv[1:7]
    n_calib, max_drop = int(n_calib), float(max_drop)
    names = ("input_ids", "attention_mask", "token_type_ids")
    with np.load(calib_npz) as d:
        data = {k: d[k] for k in names}
    items = [{k: data[k][i:i + 1] for k in names} for i in range(len(data["input_ids"]))]
    calib, valid = items[:n_calib], items[n_calib:]
    model = onnx.load(model_path)

    def session(m):
        o = ort.SessionOptions()
        o.intra_op_num_threads = 0
        return ort.InferenceSession(m.SerializeToString(), o, providers=["CPUExecutionProvider"])

    def real_rows(out, item):
        return out[0][item["attention_mask"][0].astype(bool)].astype(np.float64)

    def key(item):
        return item["input_ids"].tobytes()

    float_sess = session(model)
    reference = {key(it): real_rows(float_sess.run(None, it)[0], it) for it in valid}

    def cos(a, b):
        return float((a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum()))

    def validate(m, dataset):
        # The whole validation set or a ranking subset of it: each sentence by its token ids.
        sess = session(m)
        pairs = [(reference[key(it)], real_rows(sess.run(None, it)[0], it)) for it in dataset]
        per = [cos(r, q) for r, q in pairs]
        total = cos(np.concatenate([r for r, _ in pairs]), np.concatenate([q for _, q in pairs]))
        return total, per

    start = time.monotonic()
    q = nncf.quantize_with_accuracy_control(
        model, nncf.Dataset(calib), nncf.Dataset(valid), validation_fn=validate,
        max_drop=max_drop, model_type=ModelType.TRANSFORMER, subset_size=len(calib))
    seconds = time.monotonic() - start
    onnx.save(q, out_path)
    full = nncf.quantize(model, nncf.Dataset(calib), model_type=ModelType.TRANSFORMER,
                         subset_size=len(calib))
    onnx.save(full, full_path)
    print(json.dumps({"seconds": seconds, "nncf": nncf.__version__}))
''')


def quantized_nodes(model) -> set[str]:
    """Names of the compute nodes that read a DequantizeLinear output."""
    dq = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return {n.name for n in model.graph.node
            if n.op_type not in ("QuantizeLinear", "DequantizeLinear") and dq & set(n.input)}


def budget_cosine(model: Path, reference: Path, calib_npz: Path) -> float:
    """The budget's metric in ONNX Runtime: cosine over the real tokens of the 16 held-out
    sentences."""
    import onnxruntime as ort

    with np.load(calib_npz) as d:
        feeds = {k: d[k][N_CALIB:] for k in minilm_export.INPUT_NAMES}
    mask = feeds["attention_mask"].astype(bool)
    out = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
           for p in (reference, model)]
    r, q = (o[mask].astype(np.float64).ravel() for o in out)
    return float(r @ q / np.sqrt((r @ r) * (q @ q)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qforge", default=str(REPO / "build" / "qforge"))
    parser.add_argument("--work", type=Path)
    parser.add_argument("--target-cosine", type=float, default=0.995)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_budget_nncf_"))
    work.mkdir(parents=True, exist_ok=True)
    paths = {"model": work / "minilm.onnx", "calib": work / "minilm_calib.npz",
             "eval": work / "minilm_eval.npz"}
    if not all(p.exists() for p in paths.values()):
        paths = minilm_export.write_all(work)

    rows = []
    out = work / "qforge_int8.onnx"
    start = time.monotonic()
    proc = subprocess.run([args.qforge, "--json", "convert", str(paths["model"]), "-o", str(out),
                           "--quant", "int8", "--calib", str(paths["calib"]),
                           "--target-cosine", str(args.target_cosine)],
                          capture_output=True, text=True, check=True)
    seconds = time.monotonic() - start
    budget = next(p["stats"] for p in json.loads(proc.stdout)["passes"] if p["pass"] == "budget")
    kept = sum(1 for r in budget["layers"] if r["precision"] == "float")
    rows.append(("qforge", seconds, f"{kept} of {len(budget['layers'])} nodes",
                 budget["trials"], out))

    nncf_out, nncf_full = work / "nncf_int8.onnx", work / "nncf_full_int8.onnx"
    proc = subprocess.run([sys.executable, "-c", NNCF_RUN, str(paths["model"]),
                           str(paths["calib"]), str(N_CALIB), str(1.0 - args.target_cosine),
                           str(nncf_out), str(nncf_full)], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        print("NNCF failed (above)")
        return 1
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    import onnx

    full = quantized_nodes(onnx.load(nncf_full, load_external_data=False))
    left = quantized_nodes(onnx.load(nncf_out, load_external_data=False))
    rows.append((f"NNCF {info['nncf']}", info["seconds"],
                 f"{len(full - left)} of {len(full)} nodes", "-", nncf_out))
    rows.append((f"NNCF {info['nncf']} quantize() alone (no accuracy control)", float("nan"),
                 f"0 of {len(full)} nodes", "-", nncf_full))
    float_names = {n.name for n in onnx.load(paths["model"], load_external_data=False).graph.node}
    added = [n for n in onnx.load(nncf_out, load_external_data=False).graph.node
             if n.name not in float_names and n.op_type not in ("QuantizeLinear",
                                                                "DequantizeLinear")]
    print(f"nodes NNCF's returned model holds beyond the float model's and its Q/DQ pairs: "
          f"{len(added)} ({', '.join(sorted({n.op_type for n in added})) or 'none'})")

    print(f"target: output cosine >= {args.target_cosine} on the 16 held-out sentences")
    print("| tool | wall (s) | kept float | trials | cosine, 16 held-out | "
          "sentence-embedding cosine, 40 unseen |")
    print("|---|---:|---|---:|---:|---:|")
    for name, secs, kept_text, trials, model in rows:
        cos16 = budget_cosine(model, paths["model"], paths["calib"])
        cos40 = minilm_export.mean_cosine(model, paths["model"], paths["eval"])
        print(f"| {name} | {secs:.0f} | {kept_text} | {trials} | {cos16:.5f} | {cos40:.5f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
