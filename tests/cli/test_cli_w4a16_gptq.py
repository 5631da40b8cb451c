"""`convert --quant w4a16 --w4-method gptq` on the embedded sample CNN (its classifier Gemm is
the one weight that is not the output projection): the usage error without --calib, the
report (a gptq-calibrate pass and a per-weight output-error proxy, GPTQ below RTN on the
calibration rows), the written format (RTN's, value for value in layout), and the same bytes for
1 and 2 threads."""
from __future__ import annotations

import json

import onnx
from onnx import numpy_helper

EXIT_USAGE = 2


def convert(run_qforge, model, out, *flags):
    rc, stdout, stderr = run_qforge("--json", "convert", model, "-o", out, "--quant", "w4a16",
                                    "--block-size", "32", *flags)
    assert rc == 0, stderr
    return {p["pass"]: p["stats"] for p in json.loads(stdout)["passes"]}


def test_gptq_needs_calib(run_qforge, sample_model, tmp_path):
    out = tmp_path / "out.onnx"
    rc, _, stderr = run_qforge("convert", sample_model, "-o", out, "--quant", "w4a16",
                               "--w4-method", "gptq")
    assert rc == EXIT_USAGE, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--w4-method gptq" in lines[0] and "--calib" in lines[0], stderr
    assert not out.exists()


def test_gptq_report_format_and_threads(run_qforge, sample_model, sample_dir, tmp_path):
    calib = sample_dir / "calib.npz"
    rtn = tmp_path / "rtn.onnx"
    convert(run_qforge, sample_model, rtn)
    outs = {}
    for threads in (1, 2):
        outs[threads] = tmp_path / f"gptq_{threads}.onnx"
        passes = convert(run_qforge, sample_model, outs[threads], "--w4-method", "gptq",
                         "--calib", calib, "--threads", str(threads))
        stats = passes["w4a16"]
        assert passes["gptq-calibrate"]["activations"] == 1
        assert passes["gptq-calibrate"]["samples"] > 0
        assert stats["method"] == "gptq" and stats["quantized"] == 1
        (row,) = stats["gptq"]
        assert row["rows"] == passes["gptq-calibrate"]["samples"]
        assert 0 < row["output_error_gptq"] < row["output_error_rtn"], row
    assert outs[1].read_bytes() == outs[2].read_bytes()

    def int4_tensors(path):
        m = onnx.load(str(path))
        return {t.name: (t.data_type, list(t.dims)) for t in m.graph.initializer
                if "_int4" in t.name or "_scale" in t.name}

    # Same initializers, dtypes and shapes as RTN: GPTQ only changes the values.
    assert int4_tensors(outs[1]) == int4_tensors(rtn) and int4_tensors(rtn)
    a = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(outs[1])).graph.initializer}
    b = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(rtn)).graph.initializer}
    assert any((a[n] != b[n]).any() for n in int4_tensors(rtn))
