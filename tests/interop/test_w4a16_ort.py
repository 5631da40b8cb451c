"""W4A16 (`qforge convert --quant w4a16`) held to onnx's checker and ONNX Runtime.

A small MLP with MatMul weights [K, N] (one K not a multiple of the block size) is quantized in
both output formats: ONNX blocked DequantizeLinear (int4, opset 21) and com.microsoft
MatMulNBits. Both must pass the checker (full_check for the blocked form), run in ORT, stay close
to the float model and agree with each other; ORT's own MatMulNBitsQuantizer (RTN, same block
size) is run beside them for comparison.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import int4_weight_error  # noqa: E402

LAYERS = [("fc1", 64, 96), ("fc2", 96, 128), ("fc3", 128, 10)]  # fc3: the output projection


def make_mlp(path, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    prev = "x"
    for i, (name, k, n) in enumerate(LAYERS):
        # PyTorch's default nn.Linear init: U(-1/sqrt(K), 1/sqrt(K)).
        w = rng.uniform(-1.0, 1.0, (k, n)).astype(np.float32) / np.float32(np.sqrt(k))
        inits.append(numpy_helper.from_array(w, f"{name}.weight"))
        out = "y" if i == len(LAYERS) - 1 else f"{name}_out"
        nodes.append(helper.make_node("MatMul", [prev, f"{name}.weight"], [out], name=name))
        prev = out
        if i < len(LAYERS) - 1:
            nodes.append(helper.make_node("Relu", [out], [f"{name}_act"], name=f"{name}_relu"))
            prev = f"{name}_act"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", LAYERS[0][1]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", LAYERS[-1][2]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture
def convert_w4a16(run_qforge, tmp_path):
    def convert(src, *extra):
        out = tmp_path / f"w4a16{'_'.join(extra).replace('-', '')}.onnx"
        rc, _, err = run_qforge("convert", str(src), "-o", str(out), "--quant", "w4a16", *extra)
        assert rc == 0, f"qforge convert --quant w4a16 {' '.join(extra)} failed ({rc}): {err}"
        return out
    return convert


@pytest.mark.parametrize("block", [32, 64])
def test_w4a16_formats_run_in_ort_close_to_float(block, convert_w4a16, tmp_path, ort_run,
                                                 check_full, report_figure):
    src = tmp_path / "mlp.onnx"
    make_mlp(src)
    x = np.random.default_rng(1).standard_normal((32, 64)).astype(np.float32)
    (ref,) = ort_run(src, {"x": x})

    blocked = convert_w4a16(src, "--block-size", str(block))
    check_full(blocked)  # int4 initializers and blocked DequantizeLinear at opset 21
    m = onnx.load(str(blocked))
    dqs = [n for n in m.graph.node if n.op_type == "DequantizeLinear"]
    assert len(dqs) == 2, "fc1 and fc2 quantized, fc3 (the output projection) left float"
    assert all(helper.get_attribute_value(a) == block
               for n in dqs for a in n.attribute if a.name == "block_size")
    (y_blocked,) = ort_run(blocked, {"x": x})

    nbits = convert_w4a16(src, "--block-size", str(block), "--int4-format", "matmulnbits")
    onnx.checker.check_model(onnx.load(str(nbits)))
    assert sum(n.op_type == "MatMulNBits" for n in onnx.load(str(nbits)).graph.node) == 2
    (y_nbits,) = ort_run(nbits, {"x": x})

    # The scale search gives some blocks a negative scale (the extreme on the 8-level side); both
    # forms carry them as they are and decode to the same weights.
    scales = [numpy_helper.to_array(t) for t in m.graph.initializer
              if t.name in {n.input[1] for n in dqs}]
    assert any((s < 0).any() for s in scales), "no negative block scale on this MLP"
    w_blocked = int4_weight_error.dequantized_weights(blocked)
    w_nbits = int4_weight_error.dequantized_weights(nbits)
    assert sorted(w_blocked) == sorted(w_nbits) and len(w_blocked) == 2
    for name, w in w_blocked.items():
        np.testing.assert_array_equal(w, w_nbits[name], err_msg=name)

    cos_blocked, cos_nbits = cosine(ref, y_blocked), cosine(ref, y_nbits)
    assert cos_blocked >= 0.99, f"blocked DequantizeLinear: cosine {cos_blocked:.5f} to float"
    assert cos_nbits >= 0.99, f"MatMulNBits: cosine {cos_nbits:.5f} to float"
    rel = np.abs(y_blocked - y_nbits).max() / np.abs(y_blocked).max()
    assert rel <= 1e-3, f"the two formats differ by {rel:.2e} relative"

    ort_cos = ort_reference_cosine(src, block, tmp_path, x, ref, ort_run)
    report_figure(f"w4a16 block {block}: cosine to float qforge blocked {cos_blocked:.5f}, "
                  f"qforge MatMulNBits {cos_nbits:.5f}, ORT RTN {ort_cos}")


def ort_reference_cosine(src, block, tmp_path, x, ref, ort_run) -> str:
    """ORT's own RTN 4-bit quantization of the same layers; a figure, not a gate. Uses
    MatMulNBitsQuantizer when it imports (it needs onnx_ir), else the MLAS kernel it calls
    (quantize_matmul_4bits) to build the same MatMulNBits nodes."""
    out = tmp_path / f"ort_rtn_{block}.onnx"
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
        quant = MatMulNBitsQuantizer(onnx.load(str(src)), block_size=block, is_symmetric=True,
                                     nodes_to_exclude=["fc3"])
        quant.process()
        quant.model.save_model_to_file(str(out))
        how = "MatMulNBitsQuantizer"
    except ImportError:
        from onnxruntime.capi._pybind_state import quantize_matmul_4bits
        model = onnx.load(str(src))
        inits = {t.name: t for t in model.graph.initializer}
        for node in model.graph.node:
            if node.op_type != "MatMul" or node.name == "fc3":
                continue
            w = numpy_helper.to_array(inits[node.input[1]])
            k, n = w.shape
            blocks = (k + block - 1) // block
            w_pad = np.pad(w, ((0, blocks * block - k), (0, 0)))
            packed = np.zeros((n, blocks, block // 2), dtype=np.uint8)
            scales = np.zeros((n, blocks), dtype=np.float32)
            zp = np.zeros((n, (blocks + 1) // 2), dtype=np.uint8)
            quantize_matmul_4bits(packed, w_pad, scales, zp, block, n, k, True)
            b_name, s_name = node.input[1] + "_ort_q", node.input[1] + "_ort_s"
            model.graph.initializer.extend([numpy_helper.from_array(packed, b_name),
                                            numpy_helper.from_array(scales.reshape(-1), s_name)])
            attrs = dict(K=k, N=n, bits=4, block_size=block)
            new = helper.make_node("MatMulNBits", [node.input[0], b_name, s_name], list(node.output),
                                   name=node.name, domain="com.microsoft", **attrs)
            node.CopyFrom(new)
        used = {i for node in model.graph.node for i in node.input}
        kept = [t for t in model.graph.initializer if t.name in used]
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept)
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
        onnx.save(model, str(out))
        how = "quantize_matmul_4bits"
    (y,) = ort_run(out, {"x": x})
    return f"{cosine(ref, y):.5f} ({how})"


def test_w4a16_scale_search_lowers_error_and_is_reported(run_qforge, tmp_path, ort_run,
                                                         report_figure):
    """--w4-scale mse (the default for rtn) against plain amax / 7, both run in ORT; bad uses of
    the flag are usage errors."""
    src = tmp_path / "mlp.onnx"
    make_mlp(src)
    x = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    (ref,) = ort_run(src, {"x": x})
    err, stats = {}, {}
    for scale in ("default", "amax", "mse"):
        out = tmp_path / f"w4_{scale}.onnx"
        flags = [] if scale == "default" else ["--w4-scale", scale]
        rc, stdout, stderr = run_qforge("--json", "convert", src, "-o", out, "--quant", "w4a16",
                                        "--block-size", "32", *flags)
        assert rc == 0, stderr
        stats[scale] = {p["pass"]: p["stats"] for p in json.loads(stdout)["passes"]}["w4a16"]
        err[scale] = float(np.square(ort_run(out, {"x": x})[0] - ref).mean())
    assert stats["default"]["scale"] == "mse" and stats["amax"]["scale"] == "amax"
    assert err["default"] == err["mse"]
    report_figure(f"w4a16 MLP block 32: output MSE to float, scale search {err['mse']:.4g}, "
                  f"amax/7 {err['amax']:.4g}")
    assert err["mse"] < err["amax"], err

    out = tmp_path / "bad.onnx"
    rc, _, stderr = run_qforge("convert", src, "-o", out, "--quant", "int8-weights",
                               "--w4-scale", "amax")
    assert rc == 2 and "--w4-scale needs --quant w4a16" in stderr, stderr
    rc, _, stderr = run_qforge("convert", src, "-o", out, "--quant", "w4a16", "--w4-scale", "best")
    assert rc == 2 and "best" in stderr, stderr
    assert not out.exists()


# --- AWQ (--w4-method awq) ------------------------------------------------------------------------

def outlier_rows(rows: int, seed: int) -> np.ndarray:
    """Inputs whose channels 3, 19, 35, 51 are 25x larger than the rest (salient channels)."""
    x = np.random.default_rng(seed).standard_normal((rows, LAYERS[0][1])).astype(np.float32)
    x[:, 3::16] *= 25.0
    return x


def test_w4a16_awq_usage_errors(run_qforge, tmp_path):
    src = tmp_path / "mlp.onnx"
    make_mlp(src)
    out = tmp_path / "out.onnx"
    rc, _, err = run_qforge("convert", src, "-o", out, "--quant", "w4a16", "--w4-method", "awq")
    assert rc == 2 and "--w4-method awq" in err and "--calib DATA" in err, err
    rc, _, err = run_qforge("convert", src, "-o", out, "--quant", "int8-weights",
                            "--w4-method", "awq")
    assert rc == 2 and "--w4-method needs --quant w4a16" in err, err
    rc, _, err = run_qforge("convert", src, "-o", out, "--quant", "w4a16", "--w4-method", "gptq")
    assert rc == 2 and "gptq" in err, err
    rc, _, err = run_qforge("convert", src, "-o", out, "--quant", "w4a16", "--calib",
                            tmp_path / "c.npz")
    assert rc == 2 and "--w4-method awq" in err, err
    assert not out.exists()


def test_w4a16_awq_mlp_beats_rtn_in_ort_and_reports_method(run_qforge, tmp_path, ort_run,
                                                          check_full, report_figure):
    src = tmp_path / "mlp.onnx"
    make_mlp(src)
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=outlier_rows(256, 2))
    x = outlier_rows(128, 3)  # held out
    (ref,) = ort_run(src, {"x": x})

    rtn = tmp_path / "rtn.onnx"
    rc, _, err = run_qforge("convert", src, "-o", rtn, "--quant", "w4a16", "--block-size", "32")
    assert rc == 0, err
    bundle = tmp_path / "awq.qfb"
    rc, out, err = run_qforge("--json", "convert", src, "-o", bundle, "--quant", "w4a16",
                              "--block-size", "32", "--w4-method", "awq", "--calib", calib)
    assert rc == 0, err
    passes = {p["pass"]: p for p in json.loads(out)["passes"]}
    assert passes["awq-calibrate"]["stats"]["samples"] == 256
    w4 = passes["w4a16"]["stats"]
    assert w4["method"] == "awq" and w4["quantized"] == 2
    assert [r["activation"] for r in w4["awq"]] == ["x", "fc1_act"]
    report = json.loads((bundle / "report.json").read_text())
    assert any(p["pass"] == "w4a16" and p["stats"]["method"] == "awq"
               for p in report["passes"]), report
    check_full(bundle / "model.onnx")

    err_rtn = float(np.square(ort_run(rtn, {"x": x})[0] - ref).mean())
    err_awq = float(np.square(ort_run(bundle / "model.onnx", {"x": x})[0] - ref).mean())
    report_figure(f"w4a16 MLP with outlier input channels, block 32: output MSE to float "
                  f"RTN {err_rtn:.4g}, AWQ {err_awq:.4g} (alpha {w4['awq'][0]['alpha']})")
    assert err_awq < 0.8 * err_rtn, f"AWQ {err_awq:.4g} vs RTN {err_rtn:.4g}"
