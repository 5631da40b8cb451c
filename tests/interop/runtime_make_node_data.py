#!/usr/bin/env python3
"""Writes the ONNX backend node tests as test data: OUT/node/<test>/model.onnx and
test_data_set_<i>/{input,output}_<j>.pb, the layout of onnx's own backend test data.

Usage: runtime_make_node_data.py OUT

onnx >= 1.17 wheels ship no node test data and `python -m onnx.backend.test.cmd_tools
generate-data` writes only the model cases, so the node cases are collected here from
onnx.backend.test.case.node and written the same way cmd_tools writes model cases.
"""
import os
import shutil
import sys

import onnx
from onnx import numpy_helper
from onnx.backend.test.case import node as node_cases


def serialize(value, value_info: onnx.ValueInfoProto) -> bytes:
    t = value_info.type
    if isinstance(value, onnx.TensorProto):
        return value.SerializeToString()
    if t.HasField("sequence_type"):
        return numpy_helper.from_list(value, value_info.name).SerializeToString()
    if t.HasField("optional_type"):
        return numpy_helper.from_optional(value, value_info.name).SerializeToString()
    if t.HasField("map_type"):
        return numpy_helper.from_dict(value, value_info.name).SerializeToString()
    return numpy_helper.from_array(value, value_info.name).SerializeToString()


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = os.path.join(sys.argv[1], "node")
    if os.path.exists(root):
        shutil.rmtree(root)
    written = 0
    for case in node_cases.collect_testcases():
        out = os.path.join(root, case.name)
        os.makedirs(out)
        with open(os.path.join(out, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        graph = case.model.graph
        for i, (inputs, outputs) in enumerate(case.data_sets):
            ds = os.path.join(out, f"test_data_set_{i}")
            os.makedirs(ds)
            for j, value in enumerate(inputs):
                with open(os.path.join(ds, f"input_{j}.pb"), "wb") as f:
                    f.write(serialize(value, graph.input[j]))
            for j, value in enumerate(outputs):
                with open(os.path.join(ds, f"output_{j}.pb"), "wb") as f:
                    f.write(serialize(value, graph.output[j]))
        written += 1
    print(f"{written} node tests in {root} (onnx {onnx.__version__})")
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
