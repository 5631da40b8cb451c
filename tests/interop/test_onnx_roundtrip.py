"""Round trip of real ONNX models through `qforge convert IN -o OUT` (no --quant: a plain
import and export). The output must pass onnx's full checker, give bit-identical ONNX Runtime
outputs, and keep nodes, initializers, metadata and opsets.

QFORGE_BIN names the qforge binary (tests that need it skip without it). QFORGE_FIXTURES may
name a folder written by make_onnx_fixtures.py; otherwise the fixtures are made here.
"""
import os
import pathlib
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_onnx_fixtures  # noqa: E402

NAMES = sorted(make_onnx_fixtures.FIXTURES)


@pytest.fixture(scope="session")
def fixture_dir(tmp_path_factory):
    given = os.environ.get("QFORGE_FIXTURES")
    if given:
        path = pathlib.Path(given)
        missing = [n for n in NAMES if not (path / f"{n}.onnx").is_file()]
        if missing:
            pytest.fail(f"QFORGE_FIXTURES={given} lacks {missing}; run make_onnx_fixtures.py {given}")
        return path
    path = tmp_path_factory.mktemp("onnx_fixtures")
    make_onnx_fixtures.main([str(path)])
    return path


@pytest.fixture(scope="session")
def qforge_bin():
    path = os.environ.get("QFORGE_BIN")
    if not path:
        pytest.skip("QFORGE_BIN is not set: point it at the qforge binary (e.g. build/qforge)")
    if not os.access(path, os.X_OK):
        pytest.fail(f"QFORGE_BIN={path} is not an executable file")
    return path


def run_model(path, feeds):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def load_feeds(fixture_dir, name):
    with np.load(fixture_dir / f"{name}.npz") as data:
        return {key: data[key] for key in data.files}


def assert_tensor_equal(a, b, where):
    x, y = numpy_helper.to_array(a), numpy_helper.to_array(b)
    assert a.data_type == b.data_type, where
    assert x.dtype == y.dtype and x.shape == y.shape, where
    assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), where


def assert_attribute_equal(a, b, where):
    assert (a.name, a.type, a.doc_string) == (b.name, b.type, b.doc_string), where
    va, vb = helper.get_attribute_value(a), helper.get_attribute_value(b)
    if a.type == onnx.AttributeProto.TENSOR:
        assert_tensor_equal(va, vb, where)
    elif a.type == onnx.AttributeProto.TENSORS:
        assert len(va) == len(vb), where
        for i, (ta, tb) in enumerate(zip(va, vb)):
            assert_tensor_equal(ta, tb, f"{where}[{i}]")
    elif a.type == onnx.AttributeProto.GRAPH:
        assert_graph_equal(va, vb, f"{where}/graph")
    elif a.type == onnx.AttributeProto.GRAPHS:
        assert len(va) == len(vb), where
        for i, (ga, gb) in enumerate(zip(va, vb)):
            assert_graph_equal(ga, gb, f"{where}/graph[{i}]")
    else:
        assert va == vb, where


def assert_graph_equal(a, b, where="graph"):
    assert (a.name, a.doc_string) == (b.name, b.doc_string), where
    assert len(a.node) == len(b.node), where
    for na, nb in zip(a.node, b.node):
        at = f"{where}/node '{na.name}'"
        assert (na.name, na.op_type, na.domain, na.doc_string) == \
               (nb.name, nb.op_type, nb.domain, nb.doc_string), at
        assert list(na.input) == list(nb.input) and list(na.output) == list(nb.output), at
        assert len(na.attribute) == len(nb.attribute), at
        for aa, ab in zip(na.attribute, nb.attribute):
            assert_attribute_equal(aa, ab, f"{at}/attribute '{aa.name}'")
    assert [t.name for t in a.initializer] == [t.name for t in b.initializer], where
    for ta, tb in zip(a.initializer, b.initializer):
        assert_tensor_equal(ta, tb, f"{where}/initializer '{ta.name}'")
    for field in ("input", "output", "value_info"):
        assert list(getattr(a, field)) == list(getattr(b, field)), f"{where}/{field}"


@pytest.mark.parametrize("name", NAMES)
def test_fixture_runs_in_onnxruntime(fixture_dir, name):
    model = fixture_dir / f"{name}.onnx"
    onnx.checker.check_model(str(model), full_check=True)
    outputs = run_model(model, load_feeds(fixture_dir, name))
    assert outputs and all(np.isfinite(o).all() for o in outputs)


@pytest.mark.parametrize("name", NAMES)
def test_convert_round_trip(fixture_dir, qforge_bin, tmp_path, name):
    src = fixture_dir / f"{name}.onnx"
    out = tmp_path / f"{name}.onnx"
    result = subprocess.run([qforge_bin, "convert", str(src), "-o", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"qforge convert failed ({result.returncode}): {result.stderr}"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [], \
        "temporary files left behind"

    onnx.checker.check_model(str(out), full_check=True)

    feeds = load_feeds(fixture_dir, name)
    for i, (want, got) in enumerate(zip(run_model(src, feeds), run_model(out, feeds), strict=True)):
        assert want.dtype == got.dtype and want.shape == got.shape, f"output {i}"
        assert np.array_equal(want, got), f"output {i} differs: max |diff| {np.abs(want - got).max()}"

    a, b = onnx.load(str(src)), onnx.load(str(out))
    assert_graph_equal(a.graph, b.graph)
    assert [(p.key, p.value) for p in a.metadata_props] == [(p.key, p.value) for p in b.metadata_props]
    assert sorted((o.domain, o.version) for o in a.opset_import) == \
           sorted((o.domain, o.version) for o in b.opset_import)
    assert (a.ir_version, a.producer_name, a.producer_version, a.doc_string) == \
           (b.ir_version, b.producer_name, b.producer_version, b.doc_string)
