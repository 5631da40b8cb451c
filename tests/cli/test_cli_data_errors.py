"""Bad data and the per-layer error report, end to end: NaN or Inf in a float input of the
calibration or comparison data is refused (exit 3, one line naming the file, the input, how many
values and the first sample, nothing written) or dropped with --drop-bad-samples; data the
model rejects names the file and sample; `compare` lists its layers worst first, never lists
identical ones, and writes non-finite figures as "inf" / "-inf" strings (README, JSON output)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

EXIT_INVALID = 3

PROGRESS_PREFIXES = ("calibrate: ", "compare: ")


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines()
            if line.strip() and not (line.startswith(PROGRESS_PREFIXES) and "samples (" in line)]


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def mlp(path: Path) -> Path:
    """x [N, 4] -> MatMul -> Relu -> MatMul -> y [N, 3]."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 3)).astype(np.float32), "w2")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"])],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], [w1, w2])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def scaled_pair(path: Path, a: float, b: float, z: float) -> Path:
    """x [N, 4] -> xa = x*a, xb = x*b, xz = x*z, same = Relu(x) -> out = Concat(all)."""
    consts = [numpy_helper.from_array(np.array(v, np.float32), n)
              for n, v in (("ka", a), ("kb", b), ("kz", z))]
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "ka"], ["xa"]), helper.make_node("Mul", ["x", "kb"], ["xb"]),
         helper.make_node("Mul", ["x", "kz"], ["xz"]), helper.make_node("Relu", ["x"], ["same"]),
         helper.make_node("Concat", ["xa", "xb", "xz", "same"], ["out"], axis=1)],
        "pair", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 16])], consts)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def clean_x(rows: int = 16) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((rows, 4)).astype(np.float32)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data_errors")


@pytest.fixture(scope="module")
def model(work) -> Path:
    return mlp(work / "mlp.onnx")


BAD_CASES = {
    # name: (positions set to a value, values count, samples count, first sample)
    "one_inf": ([(7, 2, np.inf)], 1, 1, 7),
    "few_nan": ([(3, 0, np.nan), (3, 1, np.nan), (11, 3, -np.inf)], 3, 2, 3),
    "all_nan": (None, 64, 16, 0),
}


def bad_data(work: Path, case: str) -> Path:
    x = clean_x()
    cells, *_ = BAD_CASES[case]
    if cells is None:
        x[:] = np.nan
    else:
        for r, c, v in cells:
            x[r, c] = v
    path = work / f"{case}.npz"
    np.savez(path, x=x)
    return path


@pytest.mark.parametrize("case", sorted(BAD_CASES))
@pytest.mark.parametrize("command", ["calibrate", "convert"])
def test_nonfinite_input_is_refused_and_nothing_written(run_qforge, work, model, case, command):
    data = bad_data(work, case)
    _, values, samples, first = BAD_CASES[case]
    out = work / f"{command}_{case}.{'json' if command == 'calibrate' else 'onnx'}"
    args = (["calibrate", model, "--calib", data, "-o", out] if command == "calibrate" else
            ["convert", model, "-o", out, "--quant", "int8", "--calib", data])
    rc, _, stderr = run_qforge(*args)
    assert rc == EXIT_INVALID, stderr
    [line] = error_lines(stderr)
    assert f"'{data}'" in line and "input 'x'" in line, line
    assert f"{values} NaN or Inf value(s) in {samples} of 16 samples" in line, line
    assert f"the first at sample {first};" in line and "--drop-bad-samples" in line, line
    assert not out.exists()
    assert list(work.glob(f".{out.name}*")) == [], "no temporary file left"


def test_drop_bad_samples_counts_them_and_uses_the_rest(run_qforge, work, model):
    data = bad_data(work, "few_nan")
    table = work / "dropped.json"
    rc, _, stderr = run_qforge("calibrate", model, "--calib", data, "-o", table,
                               "--drop-bad-samples", "--method", "minmax")
    assert rc == 0, stderr
    assert "dropped 2 sample(s) holding NaN or Inf in a float input; 14 kept" in stderr, stderr
    assert json.loads(table.read_text())["samples"] == 14

    # The same ranges as calibrating on the 14 clean samples alone.
    x = np.load(data)["x"]
    kept = x[np.isfinite(x).all(axis=1)]
    np.savez(work / "kept.npz", x=kept)
    clean_table = work / "kept.json"
    rc, _, stderr = run_qforge("calibrate", model, "--calib", work / "kept.npz", "-o",
                               clean_table, "--method", "minmax")
    assert rc == 0, stderr
    assert json.loads(table.read_text()) == json.loads(clean_table.read_text())

    out = work / "dropped_int8.onnx"
    rc, _, stderr = run_qforge("convert", model, "-o", out, "--quant", "int8", "--calib", data,
                               "--drop-bad-samples")
    assert rc == 0, stderr
    assert out.exists()


def test_drop_bad_samples_fails_when_none_is_left(run_qforge, work, model):
    data = bad_data(work, "all_nan")
    out = work / "none_left.json"
    rc, _, stderr = run_qforge("calibrate", model, "--calib", data, "-o", out,
                               "--drop-bad-samples")
    assert rc == EXIT_INVALID, stderr
    [line] = error_lines(stderr)
    assert "all 16 sample(s) hold NaN or Inf" in line and f"'{data}'" in line, line
    assert not out.exists()


def test_drop_bad_samples_needs_calibration_data(run_qforge, work, model):
    rc, _, stderr = run_qforge("convert", model, "-o", work / "x.onnx", "--quant", "int8-weights",
                               "--drop-bad-samples")
    assert rc == 2, stderr
    assert "--drop-bad-samples" in stderr


def test_compare_refuses_or_drops_bad_samples(run_qforge, work, model):
    data = bad_data(work, "one_inf")
    rc, stdout, stderr = run_qforge("compare", model, model, "--data", data, "--json")
    assert rc == EXIT_INVALID, stderr
    [line] = error_lines(stderr)
    assert line.startswith("qforge: error: comparison data") and "input 'x'" in line, line
    assert stdout == ""
    rc, stdout, stderr = run_qforge("compare", model, model, "--data", data, "--json",
                                    "--drop-bad-samples")
    assert rc == 0, stderr
    assert json.loads(stdout)["samples"] == 15


def embedding(path: Path) -> Path:
    """ids [N, 4] int64 -> Gather over 10 rows -> MatMul -> y."""
    rng = np.random.default_rng(2)
    table = numpy_helper.from_array(rng.standard_normal((10, 4)).astype(np.float32), "table")
    w = numpy_helper.from_array(rng.standard_normal((4, 2)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"]),
         helper.make_node("MatMul", ["e", "w"], ["y"])],
        "embed", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 2])], [table, w])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_token_id_past_the_vocabulary_names_file_and_sample(run_qforge, work):
    model = embedding(work / "embed.onnx")
    ids = np.full((12, 4), 3, np.int64)
    ids[9, 1] = 99999
    data = work / "ids.npz"
    np.savez(data, ids=ids)
    out = work / "embed_int8.onnx"
    rc, _, stderr = run_qforge("convert", model, "-o", out, "--quant", "int8", "--calib", data,
                               "--batch", "4")
    assert rc == EXIT_INVALID, stderr
    [line] = error_lines(stderr)
    assert f"calibration data '{data}' sample 9: " in line and "Gather" in line, line
    assert "99999" in line, line
    assert not out.exists()
    rc, _, stderr = run_qforge("compare", model, model, "--data", data)
    assert rc == EXIT_INVALID, stderr
    assert f"comparison data '{data}' sample 9: " in stderr, stderr


def as_float(v) -> float:
    """A figure as written: a number, or "inf" / "-inf" / "nan"."""
    assert isinstance(v, (int, float)) or v in ("inf", "-inf", "nan"), v
    return float(v)


def test_compare_lists_the_worst_layers_first_and_never_identical_ones(run_qforge, work):
    ref = scaled_pair(work / "pair_f.onnx", 1.0, 1.0, 0.0)
    quant = scaled_pair(work / "pair_q.onnx", 1.01, 1.5, 0.1)
    data = work / "pair.npz"
    np.savez(data, x=clean_x())
    rc, stdout, stderr = run_qforge("compare", ref, quant, "--data", data, "--json")
    assert rc == 0, stderr
    doc = json.loads(stdout)
    layers = {layer["name"]: layer for layer in doc["layers"]}
    assert [layer["name"] for layer in doc["layers"]] == ["xz", "xb", "xa", "same"]
    assert layers["xz"]["sqnr_db"] == "-inf" and layers["xz"]["cosine"] == 0.0
    assert layers["xb"]["sqnr_db"] == pytest.approx(10 * math.log10(1 / 0.25), abs=1e-4)
    assert layers["xa"]["sqnr_db"] == pytest.approx(40.0, abs=0.01)
    assert layers["same"]["sqnr_db"] == "inf" and layers["same"]["cosine"] == 1.0
    assert all(v is not None for row in doc["layers"] + doc["outputs"] for v in row.values())

    rc, text, stderr = run_qforge("compare", ref, quant, "--data", data)
    assert rc == 0, stderr
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("per-layer SQNR"))
    assert lines[at] == "per-layer SQNR, worst 3 of 4 values both models compute (1 identical):"
    assert [line.split()[0] for line in lines[at + 1:]] == ["xz", "xb", "xa"]


def test_compare_a_model_with_itself_is_exact_everywhere(run_qforge, work, model):
    data = work / "clean.npz"
    np.savez(data, x=clean_x())
    rc, stdout, stderr = run_qforge("compare", model, model, "--data", data, "--json")
    assert rc == 0, stderr
    doc = json.loads(stdout)
    assert doc["layers"] and all(layer["sqnr_db"] == "inf" for layer in doc["layers"])
    assert all(layer["cosine"] == 1.0 for layer in doc["layers"])
    assert doc["outputs"][0]["sqnr_db"] == "inf"


def test_compare_json_figures_are_numbers_or_the_documented_strings(run_qforge, work, model):
    data = work / "clean.npz"
    np.savez(data, x=clean_x())
    quant = work / "mlp_int8.onnx"
    rc, _, stderr = run_qforge("convert", model, "-o", quant, "--quant", "int8", "--calib", data)
    assert rc == 0, stderr
    rc, stdout, stderr = run_qforge("compare", model, quant, "--data", data, "--json")
    assert rc == 0, stderr
    doc = json.loads(stdout)
    sqnrs = [as_float(layer["sqnr_db"]) for layer in doc["layers"]]
    assert sqnrs == sorted(sqnrs), "worst first"
    for row in doc["layers"] + doc["outputs"]:
        assert isinstance(row["cosine"], float) and isinstance(row["max_abs_error"], float), row
        assert not math.isnan(as_float(row["sqnr_db"]))
