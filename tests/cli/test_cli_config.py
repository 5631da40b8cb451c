"""`qforge convert --config FILE`: every convert option from a YAML or JSON file.

A config gives the same output bytes as the same options on the command line; command-line
flags override the file; paths in the file are relative to its folder; an unknown key, a value
of the wrong type or a missing file is one line on stderr, exit 2 (usage) or 5 (I/O), and no
output."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

EXIT_USAGE, EXIT_IO = 2, 5

# int8-weights with a flag, a list and a plain value: quick on the sample CNN.
CLI_FLAGS = ["--quant", "int8-weights", "--per-tensor", "--op-types", "Conv,Gemm",
             "--exclude", "^nothing$"]
YAML_KEYS = """quant: int8-weights
per-tensor: true
op_types: [Conv, Gemm]
exclude: "^nothing$"
"""
JSON_KEYS = {"quant": "int8-weights", "per_tensor": True, "op-types": ["Conv", "Gemm"],
             "exclude": "^nothing$"}


def convert_cli(run_qforge, model, out, *extra):
    rc, _, stderr = run_qforge("convert", model, "-o", out, *CLI_FLAGS, *extra)
    assert rc == 0, stderr
    return out.read_bytes()


def test_yaml_config_writes_the_same_bytes_as_flags(run_qforge, sample_model, tmp_path):
    want = convert_cli(run_qforge, sample_model, tmp_path / "cli.onnx")
    job = tmp_path / "job.yaml"
    job.write_text(f"input: {sample_model}\noutput: from_yaml.onnx\n" + YAML_KEYS)
    rc, _, stderr = run_qforge("convert", "--config", job)
    assert rc == 0, stderr
    got = (tmp_path / "from_yaml.onnx").read_bytes()  # output relative to the file's folder
    assert got == want


def test_json_config_writes_the_same_bytes_as_flags(run_qforge, sample_model, tmp_path):
    want = convert_cli(run_qforge, sample_model, tmp_path / "cli.onnx")
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"input": str(sample_model), "output": "from_json.onnx", **JSON_KEYS}))
    rc, _, stderr = run_qforge("convert", "--config", job)
    assert rc == 0, stderr
    assert (tmp_path / "from_json.onnx").read_bytes() == want


def test_relative_input_is_read_from_the_files_folder(run_qforge, sample_model, tmp_path):
    (tmp_path / "models").mkdir()
    shutil.copy(sample_model, tmp_path / "models" / "m.onnx")
    (tmp_path / "jobs").mkdir()
    job = tmp_path / "jobs" / "job.yaml"
    job.write_text("input: ../models/m.onnx\noutput: ../out.onnx\n" + YAML_KEYS)
    rc, _, stderr = run_qforge("convert", "--config", job)
    assert rc == 0, stderr
    assert (tmp_path / "out.onnx").read_bytes() == convert_cli(
        run_qforge, sample_model, tmp_path / "cli.onnx")


def test_command_line_overrides_the_file(run_qforge, sample_model, tmp_path):
    job = tmp_path / "job.yaml"
    # The file says per-channel Conv only into a.onnx; the command line changes the output,
    # the op types and asks per-tensor.
    job.write_text(f"input: {sample_model}\noutput: a.onnx\nquant: int8-weights\n"
                   "op-types: [Conv]\nexclude: \"^nothing$\"\n")
    out = tmp_path / "b.onnx"
    rc, _, stderr = run_qforge("convert", "--config", job, "-o", out, "--op-types", "Conv,Gemm",
                               "--per-tensor")
    assert rc == 0, stderr
    assert not (tmp_path / "a.onnx").exists()
    assert out.read_bytes() == convert_cli(run_qforge, sample_model, tmp_path / "cli.onnx")
    conv_only = tmp_path / "conv_only.onnx"
    rc, _, stderr = run_qforge("convert", "--config", job, "-o", conv_only)
    assert rc == 0, stderr
    assert conv_only.read_bytes() != out.read_bytes(), "the file's op-types were not used"


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("qforge: error: ")
    return lines[0]


def test_unknown_key_names_key_file_line_and_valid_keys(run_qforge, sample_model, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(f"input: {sample_model}\noutput: out.onnx\nquant: int8-weights\n"
                   "blocksize: 32\n")
    rc, _, stderr = run_qforge("convert", "--config", job)
    assert rc == EXIT_USAGE
    line = one_error_line(stderr)
    assert f"{job} line 4" in line and "'blocksize'" in line
    assert "block-size" in line and "quant" in line and "input" in line, line
    assert not (tmp_path / "out.onnx").exists()


def test_wrong_types_are_one_line_and_no_output(run_qforge, sample_model, tmp_path):
    cases = {
        "quant: [int8-weights, w4a16]\n": "takes one value, not a list",
        "per-tensor: 1\n": "is a flag: give true or false",
        "threads: many\n": "'threads'",
        "quant: int7\n": "'quant'",
    }
    for body, want in cases.items():
        job = tmp_path / "job.yaml"
        job.write_text(f"input: {sample_model}\noutput: out.onnx\n" + body)
        rc, _, stderr = run_qforge("convert", "--config", job)
        assert rc == EXIT_USAGE, (body, stderr)
        line = one_error_line(stderr)
        assert want in line and f"{job} line 3" in line, line
        assert not (tmp_path / "out.onnx").exists()
    bad_json = tmp_path / "job.json"
    bad_json.write_text(json.dumps({"input": str(sample_model), "output": "out.onnx",
                                    "per_tensor": "yes"}))
    rc, _, stderr = run_qforge("convert", "--config", bad_json)
    assert rc == EXIT_USAGE
    assert f"{bad_json}: 'per_tensor' is a flag" in one_error_line(stderr)


def test_missing_config_file_is_an_io_error(run_qforge, tmp_path):
    rc, _, stderr = run_qforge("convert", "--config", tmp_path / "nope.yaml")
    assert rc == EXIT_IO
    assert "nope.yaml" in one_error_line(stderr)


def test_input_and_output_from_neither_is_a_usage_error(run_qforge, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("quant: int8-weights\n")
    rc, _, stderr = run_qforge("convert", "--config", job)
    assert rc == EXIT_USAGE
    assert "IN" in one_error_line(stderr)
    rc, _, stderr = run_qforge("convert")
    assert rc == EXIT_USAGE
