"""W4A16 models executed by `qforge run` against ONNX Runtime.

The MLP of test_w4a16_ort.py quantized by qforge in both int4 formats (blocked DequantizeLinear,
run through the runtime's fused int4 product, and com.microsoft MatMulNBits), and MatMulNBits
models built by ORT's own kernel (quantize_matmul_4bits) with and without zero points: each runs
in qforge and in ORT on the same inputs, and the outputs must agree to float rounding.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_w4a16_ort import LAYERS, make_mlp  # noqa: E402


def qforge_run(run_qforge, model, x, tmp_path, *extra):
    feeds = tmp_path / "x.npz"
    np.savez(feeds, x=x)
    out = tmp_path / "y.npz"
    rc, _, err = run_qforge("run", str(model), "--inputs", str(feeds), "-o", str(out),
                            "--device", "cpu", *extra)
    assert rc == 0, f"qforge run {model.name} failed ({rc}): {err}"
    with np.load(out) as z:
        return z["y"]


def max_rel(a, b) -> float:
    return float(np.abs(a.astype(np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


def ort_nbits_model(src, dst, block: int, symmetric: bool) -> None:
    """fc1 and fc2 as MatMulNBits built by ORT's MLAS quantizer (zero points when asymmetric)."""
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
        quantize_matmul_4bits(packed, w_pad, scales, zp, block, n, k, symmetric)
        names = [node.input[1] + s for s in ("_q", "_s", "_zp")]
        model.graph.initializer.extend([numpy_helper.from_array(packed, names[0]),
                                        numpy_helper.from_array(scales.reshape(-1), names[1])])
        inputs = [node.input[0], names[0], names[1]]
        if not symmetric:
            assert (zp != 0x88).any(), "asymmetric quantization gave only default zero points"
            model.graph.initializer.append(numpy_helper.from_array(zp.reshape(-1), names[2]))
            inputs.append(names[2])
        new = helper.make_node("MatMulNBits", inputs, list(node.output), name=node.name,
                               domain="com.microsoft", K=k, N=n, bits=4, block_size=block)
        node.CopyFrom(new)
    used = {i for node in model.graph.node for i in node.input}
    kept = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(dst))


@pytest.mark.parametrize("fmt", ["onnx-blocked", "matmulnbits"])
def test_qforge_w4a16_models_run_like_ort(fmt, run_qforge, ort_run, tmp_path, report_figure):
    src = tmp_path / "mlp.onnx"
    make_mlp(src)
    q = tmp_path / f"mlp_{fmt}.onnx"
    # f32 activations: the int4 product itself is compared (fp16 activations: the bundle test).
    rc, _, err = run_qforge("convert", str(src), "-o", str(q), "--quant", "w4a16",
                            "--block-size", "32", "--int4-format", fmt, "--act-dtype", "fp32")
    assert rc == 0, err
    ops = {n.op_type for n in onnx.load(str(q)).graph.node}
    assert ("MatMulNBits" if fmt == "matmulnbits" else "DequantizeLinear") in ops
    for batch in (1, 16, 33):
        x = np.random.default_rng(batch).standard_normal((batch, LAYERS[0][1])).astype(np.float32)
        (want,) = ort_run(q, {"x": x})
        got = qforge_run(run_qforge, q, x, tmp_path)
        err = max_rel(got, want)
        assert err <= 1e-5, f"{fmt}, batch {batch}: qforge run differs from ORT by {err:.2e}"
        one = qforge_run(run_qforge, q, x, tmp_path, "--threads", "1")
        assert np.array_equal(one, got), "output bytes depend on the thread count"
    report_figure(f"w4a16 {fmt} in qforge run vs ORT: max relative difference {err:.2e}")


@pytest.mark.parametrize("symmetric", [True, False])
def test_ort_built_matmulnbits_runs_like_ort(symmetric, run_qforge, ort_run, tmp_path):
    pytest.importorskip("onnxruntime")
    src = tmp_path / "mlp.onnx"
    make_mlp(src, seed=3)
    model = tmp_path / f"ort_nbits_{'sym' if symmetric else 'asym'}.onnx"
    try:
        ort_nbits_model(src, model, 32, symmetric)
    except ImportError as e:
        pytest.skip(f"onnxruntime lacks quantize_matmul_4bits: {e}")
    x = np.random.default_rng(7).standard_normal((5, LAYERS[0][1])).astype(np.float32)
    (want,) = ort_run(model, {"x": x})
    got = qforge_run(run_qforge, model, x, tmp_path)
    err = max_rel(got, want)
    assert err <= 1e-5, f"MatMulNBits ({'symmetric' if symmetric else 'zero points'}): {err:.2e}"


def gpu_present() -> bool:
    import shutil
    import subprocess
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


@pytest.mark.parametrize("fmt", ["onnx-blocked", "matmulnbits"])
def test_run_device_cuda_matches_cpu_or_fails_clearly(fmt, run_qforge, tmp_path):
    src = tmp_path / "mlp.onnx"
    make_mlp(src)
    q = tmp_path / f"mlp_{fmt}.onnx"
    rc, _, err = run_qforge("convert", str(src), "-o", str(q), "--quant", "w4a16",
                            "--block-size", "32", "--int4-format", fmt)
    assert rc == 0, err
    x = np.random.default_rng(0).standard_normal((16, LAYERS[0][1])).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    out = tmp_path / "cuda.npz"
    rc, _, err = run_qforge("run", str(q), "--inputs", str(tmp_path / "x.npz"), "-o", str(out),
                            "--device", "cuda")
    if not gpu_present():
        lines = [line for line in err.splitlines() if line.strip()]
        assert rc == 4, (rc, err)
        assert len(lines) == 1, err
        assert "no CUDA device" in lines[0] or "CUDA not built in" in lines[0], err
        assert not out.exists()
        return
    assert rc == 0, err
    with np.load(out) as z:
        got = z["y"]
    want = qforge_run(run_qforge, q, x, tmp_path)
    assert max_rel(got, want) <= 1e-5, "CUDA and CPU outputs differ"


# fp32 activations: the same arithmetic up to summation order; fp16 (the w4a16 default): the
# issue's bound, 1e-3 relative (ORT's CPU provider computes fp16 graphs partly in f32).
@pytest.mark.parametrize("act,bound", [("fp32", 1e-5), ("fp16", 1e-3)], ids=["fp32", "fp16"])
@pytest.mark.parametrize("fmt", ["onnx-blocked", "matmulnbits"])
def test_w4a16_bundle_runs_like_its_model(fmt, act, bound, run_qforge, ort_run, tmp_path,
                                          report_figure):
    src = tmp_path / "mlp.onnx"
    make_mlp(src, seed=5)
    bundle = tmp_path / f"mlp_{fmt}.qfb"
    rc, _, err = run_qforge("convert", str(src), "-o", str(bundle), "--quant", "w4a16",
                            "--block-size", "32", "--int4-format", fmt, "--act-dtype", act)
    assert rc == 0, err
    x = np.random.default_rng(2).standard_normal((8, LAYERS[0][1])).astype(np.float32)
    got = qforge_run(run_qforge, bundle, x, tmp_path)
    (want,) = ort_run(bundle / "model.onnx", {"x": x})
    rel = max_rel(got, want)
    report_figure(f"w4a16 {fmt} bundle, {act} activations: qforge run vs ORT max rel {rel:.2e}")
    assert rel <= bound, f"{fmt} bundle ({act}): qforge run differs from ORT by {rel:.2e}"
