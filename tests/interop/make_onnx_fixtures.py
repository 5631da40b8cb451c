#!/usr/bin/env python3
"""Writes the ONNX fixtures that the interop tests round-trip through qforge.

Usage: make_onnx_fixtures.py OUT_DIR

Each model NAME.onnx comes with NAME.npz holding one array per graph input, ready for
onnxruntime. Models are exported with PyTorch's TorchScript exporter (dynamo=False, opset 17)
or built with onnx.helper; seeds are fixed so the files are the same on every run.
"""
import argparse
import pathlib
import sys

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class CnnBn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.pool = torch.nn.MaxPool2d(2)
        self.fc = torch.nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(x, 1))


class AttentionBlock(torch.nn.Module):
    """A pre-norm transformer block written out by hand: nn.TransformerEncoderLayer does not
    export with the TorchScript exporter of torch 2.13 (its traced is_causal argument of
    scaled_dot_product_attention is a Tensor, which the op rejects)."""

    def __init__(self, d_model=32, heads=4, ff=64):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(d_model)
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.proj = torch.nn.Linear(d_model, d_model)
        self.norm2 = torch.nn.LayerNorm(d_model)
        self.ff1 = torch.nn.Linear(d_model, ff)
        self.ff2 = torch.nn.Linear(ff, d_model)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        split = lambda y: y.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        q, k, v = split(q), split(k), split(v)
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.ff2(torch.nn.functional.gelu(self.ff1(self.norm2(x))))


def export_torch(model, example, path, dynamic_batch=True, **kwargs):
    model.eval()
    axes = {"input": {0: "batch"}, "output": {0: "batch"}} if dynamic_batch else None
    torch.onnx.export(model, (example,), str(path), dynamo=False, opset_version=OPSET,
                      input_names=["input"], output_names=["output"], dynamic_axes=axes,
                      **kwargs)
    np.savez(path.with_suffix(".npz"), input=example.numpy())


def add_metadata(path, **props):
    model = onnx.load(str(path))
    for key, value in props.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save_model(model, str(path))


def make_mlp(out):
    torch.manual_seed(0)
    export_torch(Mlp(), torch.randn(4, 16), out / "mlp.onnx")
    add_metadata(out / "mlp.onnx", source="qforge fixtures", model="mlp")


def make_cnn_bn(out):
    torch.manual_seed(1)
    model = CnnBn()
    with torch.no_grad():  # non-trivial running statistics, so BN is not an identity
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    # Without constant folding the exporter keeps BatchNormalization as a node in eval mode.
    export_torch(model, torch.randn(2, 3, 8, 8), out / "cnn_bn.onnx", do_constant_folding=False)
    ops = [n.op_type for n in onnx.load(str(out / "cnn_bn.onnx")).graph.node]
    assert "BatchNormalization" in ops, ops


def make_transformer_block(out):
    torch.manual_seed(2)
    export_torch(AttentionBlock(), torch.randn(2, 6, 32), out / "transformer_block.onnx",
                 dynamic_batch=False)


def make_external(out):
    torch.manual_seed(3)
    path = out / "external.onnx"
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(), torch.nn.Linear(128, 8))
    export_torch(model, torch.randn(3, 64), path)
    proto = onnx.load(str(path))
    onnx.save_model(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="external.onnx.data", size_threshold=1024)


def make_subgraph(out):
    """x -> If(reduce_sum(x) > 0) then x * 2 + a else x - b, branches built with onnx.helper."""
    rng = np.random.default_rng(4)
    a = numpy_helper.from_array(rng.standard_normal((2, 3)).astype(np.float32), "a")
    b = numpy_helper.from_array(rng.standard_normal((2, 3)).astype(np.float32), "b")
    two = numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")
    out_info = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 3])
    then_graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["doubled"], name="then_mul"),
         helper.make_node("Add", ["doubled", "a"], ["then_out"], name="then_add")],
        "then_branch", [], [out_info("then_out")], initializer=[two])
    else_graph = helper.make_graph(
        [helper.make_node("Sub", ["x", "b"], ["else_out"], name="else_sub")],
        "else_branch", [], [out_info("else_out")])
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], name="sum", keepdims=0),
        helper.make_node("Constant", [], ["zero"], name="zero",
                         value=helper.make_tensor("zero_value", TensorProto.FLOAT, [], [0.0])),
        helper.make_node("Greater", ["total", "zero"], ["cond"], name="positive"),
        helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_graph,
                         else_branch=else_graph),
    ]
    graph = helper.make_graph(nodes, "subgraph", [out_info("x")], [out_info("y")],
                              initializer=[a, b], doc_string="If with two branches")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="make_onnx_fixtures", ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    onnx.save_model(model, str(out / "subgraph.onnx"))
    x = rng.standard_normal((2, 3)).astype(np.float32)
    np.savez(out / "subgraph.npz", x=np.abs(x))  # positive sum: the then branch runs


FIXTURES = {
    "mlp": make_mlp,
    "cnn_bn": make_cnn_bn,
    "transformer_block": make_transformer_block,
    "external": make_external,
    "subgraph": make_subgraph,
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=pathlib.Path)
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, make in FIXTURES.items():
        make(args.out_dir)
        onnx.checker.check_model(str(args.out_dir / f"{name}.onnx"), full_check=True)
        print(f"wrote {args.out_dir / name}.onnx")
    return 0


if __name__ == "__main__":
    sys.exit(main())
