"""End-to-end runs of the qforge binary: --version, `inspect --json`, and `convert` on bad
input. Exit codes (DESIGN.md, ir/error.h): 2 usage, 3 invalid input, 4 unsupported, 5 I/O,
6 gate failed, 70 internal. A failure prints exactly one line on stderr (at default verbosity),
leaves no output or temporary file behind, and never touches the input."""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import pytest

EXIT_USAGE, EXIT_INVALID, EXIT_IO = 2, 3, 5


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def nonempty_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def project_version(repo_root: Path) -> str:
    cmake = (repo_root / "CMakeLists.txt").read_text()
    match = re.search(r"project\(\s*qforge\s+VERSION\s+([0-9][0-9.]*)", cmake)
    assert match, "no project(qforge VERSION ...) in CMakeLists.txt"
    return match.group(1)


# --- --version and inspect ---------------------------------------------------------------------


def test_version(run_qforge, repo_root):
    rc, stdout, stderr = run_qforge("--version")
    assert rc == 0, stderr
    assert project_version(repo_root) in stdout, f"--version printed {stdout!r}"


def opset_versions(opsets) -> dict[str, int]:
    """Accepts {"": 17} / {"ai.onnx": 17} or [{"domain": "", "version": 17}, ...]."""
    if isinstance(opsets, dict):
        return {str(k): int(v) for k, v in opsets.items()}
    assert isinstance(opsets, list), f"opsets is {type(opsets).__name__}: {opsets!r}"
    return {str(e.get("domain", "")): int(e["version"]) for e in opsets}


@pytest.mark.parametrize("json_first", [False, True], ids=["inspect-json", "global-json"])
def test_inspect_json(json_first, run_qforge, sample_model):
    args = ["--json", "inspect", sample_model] if json_first else ["inspect", sample_model, "--json"]
    rc, stdout, stderr = run_qforge(*args)
    assert rc == 0, stderr
    info = json.loads(stdout)  # the whole of stdout is one JSON document
    assert isinstance(info, dict), f"stdout is a JSON {type(info).__name__}, want an object"

    assert info["format"] == "onnx"
    versions = opset_versions(info["opsets"])
    default = versions.get("", versions.get("ai.onnx"))
    assert default == 17, f"opsets {info['opsets']!r}"

    model = onnx.load(str(sample_model))
    want_ops = collections.Counter(n.op_type for n in model.graph.node)
    assert info["op_histogram"] == dict(want_ops)
    assert info["op_histogram"]["Conv"] == 2 and info["op_histogram"]["BatchNormalization"] == 2

    params = info["parameters"]
    want_count = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    assert params["count"] == want_count > 0
    # Bytes by dtype: {"f32": {"count": N, "bytes": B}} or {"f32": B}; all f32 in the sample.
    by_dtype = next((params[k] for k in ("by_dtype", "bytes_by_dtype") if k in params),
                    params.get("bytes"))
    assert isinstance(by_dtype, dict) and len(by_dtype) == 1, \
        f"parameters should give bytes by dtype (all f32 here): {params!r}"
    (entry,) = by_dtype.values()
    assert (entry["bytes"] if isinstance(entry, dict) else entry) == 4 * want_count, params
    if isinstance(params.get("bytes"), int):
        assert params["bytes"] == 4 * want_count, params

    def io(entries):
        return {e["name"]: e["shape"] for e in entries}

    assert io(info["inputs"]) == {"input": ["batch", 1, 8, 8]}
    assert io(info["outputs"]) == {"logits": ["batch", 10]}


# --- convert on bad input ----------------------------------------------------------------------


def write_random(folder: Path) -> Path:
    path = folder / "not_a_model.onnx"
    # Starts with text whose first byte is an invalid protobuf tag, then random bytes.
    noise = np.random.default_rng(7).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    path.write_bytes(b"this is not an ONNX model\n" + noise)
    return path


def write_truncated(folder: Path, sample: Path) -> Path:
    path = folder / "truncated.onnx"
    data = sample.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def write_missing_external(folder: Path, sample: Path) -> Path:
    path = folder / "external.onnx"
    onnx.save_model(onnx.load(str(sample)), str(path), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="w.data", size_threshold=0)
    assert (folder / "w.data").is_file()
    (folder / "w.data").unlink()
    return path


def write_unknown_dtype(folder: Path, sample: Path) -> Path:
    path = folder / "bad_dtype.onnx"
    model = onnx.load(str(sample))
    model.graph.initializer[0].data_type = 99  # no such TensorProto.DataType
    path.write_bytes(model.SerializeToString())
    return path


def copy_sample(folder: Path, sample: Path) -> Path:
    path = folder / "model.onnx"
    shutil.copyfile(sample, path)
    return path


@dataclasses.dataclass(frozen=True)
class BadConvert:
    make_input: Callable[[Path, Path], Path]  # (input folder, sample) -> input model
    output: Callable[[Path, Path], Path | str]  # (input model, output folder) -> -o argument
    exit_codes: frozenset[int]
    must_name: Callable[[Path], str]  # (input model) -> text the error line must contain
    extra_args: tuple[str, ...] = ()


def out_in(folder: Path) -> Path:
    return folder / "out.onnx"


CASES = {
    "not-onnx": BadConvert(lambda d, s: write_random(d), lambda i, o: out_in(o),
                           frozenset({EXIT_INVALID}), lambda i: i.name),
    "truncated": BadConvert(write_truncated, lambda i, o: out_in(o),
                            frozenset({EXIT_INVALID}), lambda i: i.name),
    "missing-external-data": BadConvert(write_missing_external, lambda i, o: out_in(o),
                                        frozenset({EXIT_INVALID, EXIT_IO}), lambda i: "w.data"),
    "unknown-dtype": BadConvert(write_unknown_dtype, lambda i, o: out_in(o),
                                frozenset({EXIT_INVALID}), lambda i: i.name),
    "output-folder-missing": BadConvert(copy_sample, lambda i, o: out_in(o / "no_such_dir"),
                                        frozenset({EXIT_IO}), lambda i: "no_such_dir"),
    "output-is-input": BadConvert(copy_sample, lambda i, o: i,
                                  frozenset({EXIT_USAGE}), lambda i: i.name),
    # A string, since Path would normalize the other spelling away.
    "output-is-input-other-spelling": BadConvert(
        copy_sample, lambda i, o: f"{i.parent}/../{i.parent.name}/./{i.name}",
        frozenset({EXIT_USAGE}), lambda i: i.name),
    "unknown-flag": BadConvert(copy_sample, lambda i, o: out_in(o),
                               frozenset({EXIT_USAGE}), lambda i: "--no-such-flag",
                               extra_args=("--no-such-flag",)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_convert_rejects(case, run_qforge, sample_model, tmp_path):
    bad = CASES[case]
    in_dir, out_dir = tmp_path / "in", tmp_path / "out"
    in_dir.mkdir()
    out_dir.mkdir()
    model = bad.make_input(in_dir, sample_model)
    output = bad.output(model, out_dir)
    in_listing = sorted(p.name for p in in_dir.iterdir())
    in_digests = {p.name: sha256(p) for p in in_dir.iterdir()}

    rc, stdout, stderr = run_qforge("convert", model, "-o", output, "--quant", "int8-weights",
                                    *bad.extra_args)

    context = f"case {case}: exit {rc}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    assert rc in bad.exit_codes, f"want exit {sorted(bad.exit_codes)}; {context}"
    lines = nonempty_lines(stderr)
    assert len(lines) == 1, f"want exactly one line on stderr; {context}"
    assert bad.must_name(model) in lines[0], \
        f"error line should name {bad.must_name(model)!r}; {context}"
    # No output, no temporary file beside it, and the input untouched.
    assert sorted(p.name for p in out_dir.iterdir()) == [], context
    assert sorted(p.name for p in in_dir.iterdir()) == in_listing, context
    assert {p.name: sha256(p) for p in in_dir.iterdir()} == in_digests, \
        f"input modified; {context}"


# --- convert that works ------------------------------------------------------------------------


def test_convert_reads_external_data(run_qforge, sample_model, tmp_path, ort_run, eval_set):
    """The positive twin of missing-external-data: with w.data present the result is the same
    as from the single-file model."""
    ext_dir = tmp_path / "ext"
    ext_dir.mkdir()
    ext_model = ext_dir / "external.onnx"
    onnx.save_model(onnx.load(str(sample_model)), str(ext_model), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="w.data", size_threshold=0)
    digests = {p.name: sha256(p) for p in ext_dir.iterdir()}
    outs = []
    for name, src in (("from_single", sample_model), ("from_external", ext_model)):
        out = tmp_path / f"{name}.onnx"
        rc, _, stderr = run_qforge("convert", src, "-o", out, "--quant", "int8-weights")
        assert rc == 0, f"convert {src.name}: exit {rc}\n{stderr}"
        outs.append(out)
    assert {p.name: sha256(p) for p in ext_dir.iterdir()} == digests, "input modified"
    x = eval_set["input"][:64]
    (a,), (b,) = ort_run(outs[0], {"input": x}), ort_run(outs[1], {"input": x})
    np.testing.assert_array_equal(a, b)


def test_convert_is_deterministic_and_leaves_input(run_qforge, sample_model, tmp_path):
    before = sha256(sample_model)
    digests = []
    for i in range(2):
        out = tmp_path / f"run{i}.onnx"
        rc, _, stderr = run_qforge("convert", sample_model, "-o", out, "--quant", "int8-weights")
        assert rc == 0, stderr
        digests.append(sha256(out))
    assert digests[0] == digests[1], "same input and flags gave different bytes"
    assert sha256(sample_model) == before, "convert modified its input"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run0.onnx", "run1.onnx"], \
        "convert left other files beside its output"
