"""No silent loss: every --quant (none, int8-weights, int8, w4a16) on every input kind (ONNX,
safetensors, a sharded safetensors index, a torch.save zip, a model folder) to every output kind
(.onnx, .safetensors, .qfb) either writes an output that holds every input tensor (as it was, or
quantized and dequantizing to it within the scheme's error) or exits non-zero and leaves no
file. The tensors carry a decoder's names, so the weight-only schemes quantize the Linear weight
of a weights-only input too (compressed-tensors' packed form in a .safetensors output).
Tensors are tiny, so the 60 runs take a few seconds."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import load_file, save_file

EXIT_USAGE = 2
EXIT_INVALID = 3
SCHEMES = ["none", "int8-weights", "int8", "w4a16"]
INPUTS = ["onnx", "safetensors", "index", "torch", "folder"]
OUTPUTS = [".onnx", ".safetensors", ".qfb"]
K, N = 64, 16
LINEAR = "model.layers.0.mlp.down_proj"
# Largest error of a dequantized weight, as a fraction of the tensor's amax: int8 rounds to
# amax / 127 steps; int4 blocks may clip (the scale search) and round to amax / 7 steps.
TOLERANCE = {"int8-weights": 0.5 / 127 + 1e-6, "int8": 0.5 / 127 + 1e-6, "w4a16": 0.3}


def tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(18)
    return {LINEAR + ".weight": rng.standard_normal((N, K)).astype(np.float32),
            LINEAR + ".bias": rng.standard_normal(N).astype(np.float32),
            "model.norm.weight": (1 + 0.1 * rng.standard_normal(K)).astype(np.float32)}


def onnx_tensors() -> dict[str, np.ndarray]:
    t = tensors()
    return {"model.norm.weight": t["model.norm.weight"],
            LINEAR + ".weight": np.ascontiguousarray(t[LINEAR + ".weight"].T),
            LINEAR + ".bias": t[LINEAR + ".bias"]}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("noloss")
    t = tensors()
    ot = onnx_tensors()
    nodes = [helper.make_node("Mul", ["X", "model.norm.weight"], ["h"], name="norm"),
             helper.make_node("MatMul", ["h", LINEAR + ".weight"], ["p"], name="proj/MatMul"),
             helper.make_node("Add", ["p", LINEAR + ".bias"], ["Y"], name="proj/Add")]
    graph = helper.make_graph(
        nodes, "noloss", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", N])],
        [numpy_helper.from_array(v, k) for k, v in ot.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, d / "model.onnx")
    save_file(t, str(d / "model.safetensors"))
    shards = d / "sharded"
    shards.mkdir()
    weight_map = {}
    for i, names in enumerate([[LINEAR + ".weight"], [LINEAR + ".bias", "model.norm.weight"]], 1):
        fname = f"model-{i:05d}-of-00002.safetensors"
        save_file({k: t[k] for k in names}, str(shards / fname))
        weight_map.update({k: fname for k in names})
    (shards / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    torch.save({k: torch.from_numpy(v) for k, v in t.items()}, d / "model.pt")
    folder = d / "folder"
    folder.mkdir()
    save_file(t, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": K}))
    # Tensors no rule names a Linear weight: the weight-only schemes find nothing to quantize.
    unnamed = d / "unnamed"
    unnamed.mkdir()
    save_file({"proj.weight": t[LINEAR + ".weight"], "proj.bias": t[LINEAR + ".bias"],
               "norm.weight": t["model.norm.weight"]}, str(unnamed / "model.safetensors"))
    np.savez(d / "calib.npz", X=np.random.default_rng(1).standard_normal((8, K)).astype(np.float32))
    return {"onnx": d / "model.onnx", "safetensors": d / "model.safetensors",
            "index": shards / "model.safetensors.index.json", "torch": d / "model.pt",
            "folder": folder, "unnamed": unnamed / "model.safetensors", "calib": d / "calib.npz"}


def dequantized(model: onnx.ModelProto, name: str) -> np.ndarray | None:
    """The float value of initializer `name` in `model`: itself, or what the DequantizeLinear
    reading its quantized form (name_quantized, name_int4, ...) gives back."""
    inits = {i.name: i for i in model.graph.initializer}
    if name in inits:
        return numpy_helper.to_array(inits[name]).astype(np.float32)
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear" or not node.input[0].startswith(name + "_"):
            continue
        q = numpy_helper.to_array(inits[node.input[0]]).astype(np.float32)
        scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        axis, block = attrs.get("axis", 1), attrs.get("block_size", 0)
        if scale.ndim == 0:
            return q * scale
        if block:
            full = np.repeat(scale, block, axis=axis)
            return q * full[tuple(slice(0, s) for s in q.shape)]
        shape = [1] * q.ndim
        shape[axis] = -1
        return q * scale.reshape(shape)
    return None


def unpacked(back: dict[str, np.ndarray]) -> np.ndarray:
    """q * scale of the compressed-tensors pack-quantized Linear in `back`."""
    n, k = back[LINEAR + ".weight_shape"].tolist()
    words = back[LINEAR + ".weight_packed"].view(np.uint32)
    bits = 32 * words.shape[1] // k
    parts = [(words >> np.uint32(bits * j)) & np.uint32((1 << bits) - 1) for j in range(32 // bits)]
    q = np.stack(parts, axis=-1).reshape(n, -1)[:, :k].astype(np.int64) - (1 << (bits - 1))
    scale = back[LINEAR + ".weight_scale"].astype(np.float32)
    return q * np.repeat(scale, k // scale.shape[1], axis=1)


def check_holds_every_tensor(model: onnx.ModelProto, want: dict[str, np.ndarray], scheme: str):
    for name, value in want.items():
        got = dequantized(model, name)
        assert got is not None, f"{name} is missing from the output"
        assert got.shape == value.shape, name
        err = float(np.abs(got - value).max())
        quantized = name not in {i.name for i in model.graph.initializer}
        # fp16 activations (w4a16) store the float tensors they keep in fp16.
        bound = TOLERANCE[scheme] * float(np.abs(value).max()) if quantized else 1e-3 * float(
            np.abs(value).max())
        assert err <= bound, f"{name}: max error {err} > {bound} ({scheme})"


def expected_failure(kind: str, scheme: str, suffix: str) -> tuple[int, str] | None:
    """The exit code and error a combination must stop with, or None where it must succeed."""
    if kind == "folder" and suffix != ".safetensors":
        # A folder into a graph output builds its decoder from config.json, which here names
        # the family but not the sizes.
        return EXIT_INVALID, "the decoder graph needs it"
    if kind != "onnx" and (scheme == "int8" or suffix != ".safetensors"):
        # no activations to calibrate, no graph for .onnx or .qfb
        return EXIT_USAGE, "weights-only checkpoint"
    if kind == "onnx" and suffix == ".safetensors":
        return EXIT_USAGE, "write .onnx instead"
    return None


@pytest.mark.parametrize("suffix", OUTPUTS)
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("kind", INPUTS)
def test_output_holds_every_tensor_or_nothing_is_written(kind, scheme, suffix, inputs, run_qforge,
                                                         tmp_path):
    out = tmp_path / ("out" + suffix)
    args = ["convert", inputs[kind], "-o", out, "--quant", scheme]
    if scheme == "int8":
        args += ["--calib", inputs["calib"]]
    if scheme == "w4a16":
        args += ["--block-size", "32"]
    rc, _, stderr = run_qforge(*args)
    failure = expected_failure(kind, scheme, suffix)
    if failure is not None:
        code, text = failure
        assert rc == code, (rc, stderr)
        assert text in stderr, stderr
        assert list(tmp_path.iterdir()) == [], "a failed conversion left files behind"
        return
    assert rc == 0, stderr
    want = onnx_tensors() if kind == "onnx" else tensors()
    if suffix == ".safetensors" and scheme != "none":  # the Linear weight packed, the rest as is
        back = load_file(str(out))
        assert set(back) == {k for k in want if k != LINEAR + ".weight"} | {
            LINEAR + ".weight_packed", LINEAR + ".weight_scale", LINEAR + ".weight_shape"}
        for k, v in want.items():
            if k != LINEAR + ".weight":
                np.testing.assert_array_equal(back[k], v, err_msg=k)
        value = want[LINEAR + ".weight"]
        err = float(np.abs(unpacked(back) - value).max())
        assert err <= TOLERANCE[scheme] * float(np.abs(value).max()), (scheme, err)
        return
    if suffix == ".safetensors":  # a state dict rewritten: every tensor, bit for bit
        back = load_file(str(out))
        assert set(back) == set(want)
        for k, v in want.items():
            np.testing.assert_array_equal(back[k], v, err_msg=k)
        return
    model = onnx.load(out / "model.onnx" if suffix == ".qfb" else out)
    check_holds_every_tensor(model, want, scheme)


def test_w4a16_of_tensors_without_linear_names_says_what_to_do(inputs, run_qforge, tmp_path):
    out = tmp_path / "q.safetensors"
    rc, _, stderr = run_qforge("convert", inputs["unnamed"], "-o", out, "--quant", "w4a16")
    assert rc == EXIT_USAGE
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "--quant w4a16" in lines[0] and "found no Linear weight" in lines[0]
    assert "(3 tensors)" in lines[0] and "_proj.weight" in lines[0]
    assert "without --quant" in lines[0] and "ONNX" in lines[0]
    assert not out.exists()


def test_fp16_activations_of_a_state_dict_are_refused(inputs, run_qforge, tmp_path):
    out = tmp_path / "h.safetensors"
    rc, _, stderr = run_qforge("convert", inputs["torch"], "-o", out, "--act-dtype", "fp16")
    assert rc == EXIT_USAGE, stderr
    assert "--act-dtype fp16" in stderr and "weights-only" in stderr
    assert not out.exists()


def test_torch_entries_that_are_not_tensors_are_named_by_default(run_qforge, tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    torch.save({"model": {"w": torch.ones(2, 2)}, "epoch": 3, "name": "run-1",
                "optimizer": {"step": 10}}, ckpt)
    rc, _, stderr = run_qforge("convert", ckpt, "-o", tmp_path / "w.safetensors")
    assert rc == 0, stderr
    lines = [line for line in stderr.splitlines() if "not a tensor" in line]
    assert len(lines) == 1, stderr
    assert "3 entries are not a tensor" in lines[0]
    for entry in ("'epoch' (int)", "'name' (str)", "'optimizer.step' (int)"):
        assert entry in lines[0], lines[0]
    assert set(load_file(str(tmp_path / "w.safetensors"))) == {"model.w"}
