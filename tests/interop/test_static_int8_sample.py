"""Static INT8 (`qforge convert --quant int8`) on the embedded sample CNN, per calibration
method, held to the float model and to ONNX Runtime's quantize_static on the same calibration
data: top-1 on calib_data/eval.npz within 0.5 points of float and not below ONNX Runtime's
(QDQ, per-channel int8 weights, symmetric int8 activations). The output must pass the onnx
checker (full_check) and run in ONNX Runtime, with graph optimizations off and on (ORT then fuses
the Gemm Q/DQ pattern into QGemm, so the pattern must be one it recognises)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat,
                                      QuantType, quantize_static)

METHODS = ["minmax", "percentile", "entropy", "mse"]
ORT_METHODS = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
               "entropy": CalibrationMethod.Entropy}
MAX_DROP_POINTS = 0.5


def top1(logits: np.ndarray, labels: np.ndarray) -> float:
    return float((logits.argmax(axis=1) == labels).mean()) * 100.0


class NpzReader(CalibrationDataReader):
    """One sample per call: ONNX Runtime's entropy calibrator needs batches of equal shape."""

    def __init__(self, x: np.ndarray):
        self._it = iter([{"input": x[i:i + 1]} for i in range(len(x))])

    def get_next(self):
        return next(self._it, None)


@pytest.fixture(scope="module")
def calib_x(sample_dir) -> np.ndarray:
    with np.load(sample_dir / "calib.npz") as data:
        return data["input"]


@pytest.fixture(scope="module")
def float_top1(sample_model, eval_set, ort_run) -> float:
    return top1(ort_run(sample_model, {"input": eval_set["input"]})[0], eval_set["labels"])


@pytest.fixture(scope="module")
def ort_top1(sample_model, calib_x, eval_set, ort_run, tmp_path_factory) -> dict[str, float]:
    """ONNX Runtime quantize_static's top-1 per calibration method."""
    out_dir = tmp_path_factory.mktemp("ort_static")
    result = {}
    for name, method in ORT_METHODS.items():
        out = out_dir / f"ort_{name}.onnx"
        quantize_static(str(sample_model), str(out), NpzReader(calib_x),
                        quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        calibrate_method=method,
                        extra_options={"ActivationSymmetric": True, "CalibPercentile": 99.99})
        result[name] = top1(ort_run(out, {"input": eval_set["input"]})[0], eval_set["labels"])
    return result


def quantize(run_qforge, sample_model, sample_dir, out, *flags) -> None:
    rc, _, stderr = run_qforge("convert", sample_model, "-o", out, "--quant", "int8", "--calib",
                               sample_dir / "calib.npz", *flags)
    assert rc == 0, stderr


def check_qdq_rules(path) -> None:
    """DESIGN.md's rules, read from the file: symmetric (zero points 0), int8 values, activation
    scales per-tensor, per-channel scales only on constant weights, BatchNorm folded."""
    model = onnx.load(path)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    ops = [n.op_type for n in model.graph.node]
    assert "BatchNormalization" not in ops
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 13
    for node in model.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        zero_point = inits[node.input[2]]
        assert not zero_point.any(), f"{node.name}: zero point must be 0"
        scale = inits[node.input[1]]
        assert (scale > 0).all()
        if node.op_type == "QuantizeLinear":
            assert scale.ndim == 0 and zero_point.dtype == np.int8, f"{node.name}: per-tensor int8"
        elif node.input[0] in inits:  # a constant weight (int8) or bias (int32)
            assert inits[node.input[0]].dtype in (np.int8, np.int32)
            if inits[node.input[0]].dtype == np.int8:
                assert inits[node.input[0]].min() >= -127
        else:
            assert scale.ndim == 0, f"{node.name}: activations are per-tensor"
    assert ops.count("QuantizeLinear") == 5  # input, 2 Relu outputs, Flatten output, Relu output


@pytest.mark.parametrize("method", METHODS)
def test_static_int8_accuracy(method, run_qforge, sample_model, sample_dir, eval_set, ort_run,
                              check_full, float_top1, ort_top1, tmp_path, report_figure):
    out = tmp_path / f"sample_int8_{method}.onnx"
    quantize(run_qforge, sample_model, sample_dir, out, "--method", method)
    check_full(out)
    check_qdq_rules(out)
    got = top1(ort_run(out, {"input": eval_set["input"]})[0], eval_set["labels"])
    # ONNX Runtime has no MSE calibrator: hold mse to the best of ONNX Runtime's methods.
    peer = ort_top1[method] if method in ort_top1 else max(ort_top1.values())
    peer_name = f"ORT {method}" if method in ort_top1 else "best ORT method"
    report_figure(f"sample CNN static int8 {method:10s}: qforge top-1 {got:.2f}%, "
                  f"{peer_name} {peer:.2f}%, float {float_top1:.2f}%")
    assert got >= float_top1 - MAX_DROP_POINTS, f"{method}: {got:.2f}% vs float {float_top1:.2f}%"
    assert got >= peer, f"{method}: qforge {got:.2f}% below {peer_name} {peer:.2f}%"


def test_static_int8_int32_bias_and_ort_fusion(run_qforge, sample_model, sample_dir, eval_set,
                                               check_full, float_top1, tmp_path, report_figure):
    out = tmp_path / "sample_int8_bias32.onnx"
    quantize(run_qforge, sample_model, sample_dir, out, "--int32-bias", "--method", "minmax")
    check_full(out)
    check_qdq_rules(out)
    model = onnx.load(out)
    int32 = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT32}
    bias_dq = [n for n in model.graph.node
               if n.op_type == "DequantizeLinear" and n.input[0] in int32 and n.input[2] in int32]
    assert len(bias_dq) == 4, "one int32 bias (with an int32 zero point) per Conv and Gemm"
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.optimized_model_filepath = str(tmp_path / "ort_optimized.onnx")
    sess = ort.InferenceSession(str(out), opts, providers=["CPUExecutionProvider"])
    fused = {n.op_type for n in onnx.load(opts.optimized_model_filepath).graph.node}
    # Input-side Q/DQ (TensorRT's placement) is enough for ORT's QGemm; its QLinearConv would
    # also need a quantized Conv output, so ORT runs those Convs in float on dequantized values.
    assert "QGemm" in fused, f"ORT did not fuse the Gemm QDQ pattern: {sorted(fused)}"
    got = top1(sess.run(None, {"input": eval_set["input"]})[0], eval_set["labels"])
    report_figure(f"sample CNN static int8 minmax int32 bias (ORT optimized): top-1 {got:.2f}%")
    assert got >= float_top1 - MAX_DROP_POINTS
