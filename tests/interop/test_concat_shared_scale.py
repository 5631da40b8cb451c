"""One scale for every input and the output of a Concat (`convert --quant int8`, on by default;
`--no-concat-shared-scale` turns it off) and, with `--add-shared-scale`, for both inputs of a
residual Add: the union of their calibrated ranges (quant/static/shared_scales.h). TensorRT keeps
a Concat in INT8 only when its inputs share one scale; ONNX Runtime must run the graph as well.

Two models: a graph made with the onnx package whose Concat joins inputs of very different
ranges, and an Inception-style CNN made and trained with PyTorch on the digits split of
calib_data/make_sample.py (a Concat of a 1x1 and a 3x3 branch), measured by top-1 on
calib_data/eval.npz in ONNX Runtime with the flag on and off.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[2]


def qdq_scales(model: onnx.ModelProto) -> dict[str, float]:
    """activation name -> the scale of the QuantizeLinear that reads it."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return {n.input[0]: float(inits[n.input[1]]) for n in model.graph.node
            if n.op_type == "QuantizeLinear"}


def dq_scale_of(model: onnx.ModelProto, value: str) -> float:
    """The scale of the DequantizeLinear producing `value`."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    node = next(n for n in model.graph.node if value in n.output)
    assert node.op_type == "DequantizeLinear", (value, node.op_type)
    return float(inits[node.input[1]])


def concat_inputs(model: onnx.ModelProto) -> list[list[str]]:
    return [list(n.input) for n in model.graph.node if n.op_type == "Concat"]


def calibrate(run_qforge, model, calib, table) -> dict[str, float]:
    rc, _, stderr = run_qforge("calibrate", model, "--calib", calib, "-o", table)
    assert rc == 0, stderr
    return {k: v["amax"] for k, v in json.loads(Path(table).read_text())["tensors"].items()}


def convert(run_qforge, model, out, *args) -> dict:
    rc, stdout, stderr = run_qforge("--json", "convert", model, "-o", out, "--quant", "int8",
                                    *args)
    assert rc == 0, stderr
    return {p["pass"]: p["stats"] for p in json.loads(stdout)["passes"]}


def two_range_graph(path: Path) -> None:
    """x [N, 8] -> a = Relu(x W1) (about 0..1) and b = x W2 (about -50..50) -> Concat(a, b) ->
    MatMul(W3) -> y [N, 4]; a is also read by MatMul(W4) -> z [N, 4]."""
    rng = np.random.default_rng(13)
    w1 = (rng.standard_normal((8, 6)) * 0.15).astype(np.float32)
    w2 = (rng.standard_normal((8, 6)) * 6.0).astype(np.float32)
    w3 = (rng.standard_normal((12, 4)) * 0.3).astype(np.float32)
    w4 = (rng.standard_normal((6, 4)) * 0.3).astype(np.float32)
    n = "N"
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["a_pre"], name="mm1"),
         helper.make_node("Relu", ["a_pre"], ["a"], name="relu"),
         helper.make_node("MatMul", ["x", "w2"], ["b"], name="mm2"),
         helper.make_node("Concat", ["a", "b"], ["c"], name="cat", axis=1),
         helper.make_node("MatMul", ["c", "w3"], ["y"], name="mm3"),
         helper.make_node("MatMul", ["a", "w4"], ["z"], name="mm4")],
        "two_ranges",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, 4]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [n, 4])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
         numpy_helper.from_array(w3, "w3"), numpy_helper.from_array(w4, "w4")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_concat_inputs_share_the_widest_range(run_qforge, ort_run, check_full, tmp_path,
                                              report_figure):
    model = tmp_path / "two_ranges.onnx"
    two_range_graph(model)
    rng = np.random.default_rng(5)
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=rng.standard_normal((64, 8)).astype(np.float32))
    x_eval = rng.standard_normal((200, 8)).astype(np.float32)
    ranges = calibrate(run_qforge, model, calib, tmp_path / "table.json")
    assert ranges["b"] > 10 * ranges["a"], ranges  # the two inputs differ by more than 10x

    shared, apart = tmp_path / "shared.onnx", tmp_path / "apart.onnx"
    stats = convert(run_qforge, model, shared, "--import-calib", tmp_path / "table.json")
    convert(run_qforge, model, apart, "--import-calib", tmp_path / "table.json",
            "--no-concat-shared-scale")
    group = stats["static-int8"]["shared_scale_groups"]
    assert group == [{"members": ["a", "b", "c"], "amax": pytest.approx(
        max(ranges["a"], ranges["b"], ranges["c"]), rel=1e-6)}], group

    m = onnx.load(shared)
    widest = np.float32(max(ranges["a"], ranges["b"], ranges["c"])) / np.float32(127)
    [inputs] = concat_inputs(m)
    # Every Concat input is a DequantizeLinear of one scale; so is the output's pair.
    for value in inputs:
        assert dq_scale_of(m, value) == pytest.approx(float(widest), rel=1e-7)
    scales = qdq_scales(m)
    assert scales["a"] == scales["b"] == scales["c"]
    assert qdq_scales(onnx.load(apart))["a"] == pytest.approx(ranges["a"] / 127, rel=1e-6)
    assert "c" in scales  # the MatMul reading the Concat quantizes its output with that scale
    assert concat_inputs(onnx.load(apart)) == [["a", "b"]]  # off: the Concat stays float

    check_full(shared)
    check_full(apart)
    ref = ort_run(model, {"x": x_eval})
    got = {name: ort_run(path, {"x": x_eval}) for name, path in (("shared", shared),
                                                                  ("apart", apart))}
    cos = {(name, k): cosine(ref[k], out[k]) for name, out in got.items() for k in (0, 1)}
    report_figure(f"Concat of ranges {ranges['a']:.2f} and {ranges['b']:.2f} (onnx graph), cosine "
                  f"to float in ONNX Runtime, shared scale / --no-concat-shared-scale: Concat's "
                  f"reader y {cos['shared', 0]:.5f} / {cos['apart', 0]:.5f}, the narrow input's "
                  f"other reader z {cos['shared', 1]:.5f} / {cos['apart', 1]:.5f}")
    # y's MatMul quantizes the Concat's output on the union range either way: sharing costs it
    # nothing. z reads the narrow input, which keeps a few of its 127 levels under the wide
    # scale: that is the price of the fusion.
    assert cos["shared", 0] > cos["apart", 0] - 1e-4
    assert cos["apart", 1] > 0.999 and cos["shared", 1] < cos["apart", 1] - 0.01


def test_residual_add_shares_by_option(run_qforge, ort_run, check_full, tmp_path):
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((4, 4)) * 5).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
         helper.make_node("Add", ["x", "h"], ["y"], name="residual")],
        "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(w, "w")])
    model = tmp_path / "residual.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), model)
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=rng.standard_normal((32, 4)).astype(np.float32))
    out = {}
    for flag in ("", "--add-shared-scale"):
        out[flag] = tmp_path / f"res{flag}.onnx"
        convert(run_qforge, model, out[flag], "--calib", calib, *([flag] if flag else []))
        check_full(out[flag])
        ort_run(out[flag], {"x": rng.standard_normal((4, 4)).astype(np.float32)})
    apart, shared = qdq_scales(onnx.load(out[""])), qdq_scales(onnx.load(out["--add-shared-scale"]))
    assert apart["x"] != apart["h"]
    assert shared["x"] == shared["h"] == max(apart["x"], apart["h"])


# --- a model made with PyTorch ---------------------------------------------------------------


def inception_cnn(path: Path) -> None:
    """A stem conv, then a 1x1 branch (ReLU) and a 3x3 branch (no activation) joined by
    torch.cat: differently ranged Concat inputs. Trained on make_sample.py's 1200 training
    digits; exported as make_sample.py exports (opset 17, TorchScript exporter)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    sys.path.insert(0, str(REPO / "calib_data"))
    import make_sample
    nn = torch.nn

    class Inception(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU())
            self.b1 = nn.Sequential(nn.Conv2d(8, 8, 1), nn.ReLU())
            self.b3 = nn.Conv2d(8, 8, 3, padding=1)
            self.head = nn.Sequential(nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                                      nn.Linear(16 * 4 * 4, 10))

        def forward(self, x):
            s = self.stem(x)
            return self.head(torch.cat([self.b1(s), self.b3(s)], dim=1))

    torch.manual_seed(make_sample.SEED)
    net = Inception()
    (x_train, y_train), _, _ = make_sample.load_splits()
    make_sample.train(net, x_train, y_train)
    torch.onnx.export(net, (torch.zeros(1, 1, 8, 8),), str(path), dynamo=False,
                      opset_version=make_sample.OPSET, input_names=["input"],
                      output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})


def test_pytorch_inception_concat(run_qforge, ort_run, check_full, sample_dir, eval_set,
                                  tmp_path, report_figure):
    model = tmp_path / "inception.onnx"
    inception_cnn(model)
    assert concat_inputs(onnx.load(model)), "the export has a Concat"
    calib = sample_dir / "calib.npz"
    shared, apart, bundle = tmp_path / "shared.onnx", tmp_path / "apart.onnx", tmp_path / "i.qfb"
    stats = convert(run_qforge, model, shared, "--calib", calib)
    convert(run_qforge, model, apart, "--calib", calib, "--no-concat-shared-scale")
    convert(run_qforge, model, bundle, "--calib", calib)
    [group] = stats["static-int8"]["shared_scale_groups"]
    m = onnx.load(shared)
    [inputs] = concat_inputs(m)
    scale = np.float32(group["amax"]) / np.float32(127)
    for value in inputs:
        assert dq_scale_of(m, value) == pytest.approx(float(scale), rel=1e-7)
    assert set(inputs) <= {n.output[0] for n in m.graph.node if n.op_type == "DequantizeLinear"}
    # The bundle's TensorRT cache carries the shared scale for every member.
    cache = (bundle / "calibration.cache").read_text().splitlines()[1:]
    cache_scales = {line.rsplit(": ", 1)[0]: np.frombuffer(
        bytes.fromhex(line.rsplit(": ", 1)[1])[::-1], dtype=np.float32)[0] for line in cache}
    for member in group["members"]:
        assert cache_scales[member] == pytest.approx(float(scale), rel=1e-6), member

    for path in (shared, apart):
        check_full(path)
    feeds = {"input": eval_set["input"]}
    acc = {name: float((ort_run(p, feeds)[0].argmax(1) == eval_set["labels"]).mean()) * 100
           for name, p in (("float", model), ("shared", shared), ("apart", apart))}
    report_figure(f"PyTorch Inception-style CNN (Concat of a 1x1 ReLU and a 3x3 branch), static "
                  f"INT8 top-1 on 397 digits in ONNX Runtime: float {acc['float']:.2f}%, shared "
                  f"Concat scale {acc['shared']:.2f}%, --no-concat-shared-scale "
                  f"{acc['apart']:.2f}%")
    assert acc["float"] > 90
    assert acc["shared"] >= acc["float"] - 1.5


@pytest.mark.parametrize("flag", ["--no-concat-shared-scale", "--add-shared-scale"])
def test_shared_scale_flags_need_int8(run_qforge, sample_model, tmp_path, flag):
    out = tmp_path / "x.onnx"
    rc, _, stderr = run_qforge("convert", sample_model, "-o", out, "--quant", "w4a16", flag)
    assert rc == 2 and "--quant int8" in stderr, stderr
    assert not out.exists()
