"""`qforge batch JOBS -j N [--json]`: many conversions from one file.

Each job writes the bytes a single `qforge convert` with the same options writes, whatever -j;
a failing job does not stop the others and its exit code is the batch's; two jobs writing the
same output, or one invalid job, are refused before anything runs (no output exists)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

EXIT_USAGE, EXIT_INVALID, EXIT_IO = 2, 3, 5

JOBS = """defaults:
  quant: int8-weights
jobs:
  - name: per-channel
    input: m.onnx
    output: out/a.onnx
  - name: per-tensor
    input: m.onnx
    output: out/b.onnx
    per-tensor: true
  - name: conv-only
    input: m.onnx
    output: out/c.onnx
    op_types: [Conv]
  - name: bundle
    input: m.onnx
    output: out/d.qfb
"""


@pytest.fixture
def job_dir(sample_model, tmp_path):
    def make(name: str, text: str = JOBS) -> Path:
        folder = tmp_path / name
        (folder / "out").mkdir(parents=True)
        shutil.copy(sample_model, folder / "m.onnx")
        (folder / "jobs.yaml").write_text(text)
        return folder
    return make


def outputs(folder: Path) -> dict[str, bytes]:
    """Every output file's bytes, the bundle's report.json and manifest.json included (they
    record no wall time, so the same job gives the same bytes)."""
    return {str(path.relative_to(folder)): path.read_bytes()
            for path in sorted((folder / "out").rglob("*")) if path.is_file()}


def test_j1_and_j3_write_identical_outputs_equal_to_convert(run_qforge, job_dir):
    # One folder for both runs: the bundle's manifest records the source model's path.
    folder = job_dir("j")
    rc, stdout, stderr = run_qforge("batch", folder / "jobs.yaml", "-j", "1")
    assert rc == 0, stderr
    assert stdout.count("ok ") == 4, stdout
    one = outputs(folder)
    assert len(one) == 3 + 4, sorted(one)  # three .onnx files and the bundle's four
    shutil.rmtree(folder / "out")
    (folder / "out").mkdir()
    rc, _, stderr = run_qforge("batch", folder / "jobs.yaml", "-j", "3")
    assert rc == 0, stderr
    assert outputs(folder) == one
    single = folder / "single.onnx"
    rc, _, stderr = run_qforge("convert", folder / "m.onnx", "-o", single, "--quant",
                               "int8-weights", "--per-tensor")
    assert rc == 0, stderr
    assert one["out/b.onnx"] == single.read_bytes()
    assert one["out/a.onnx"] != one["out/b.onnx"] != one["out/c.onnx"]


def test_failing_job_does_not_stop_the_others(run_qforge, job_dir):
    folder = job_dir("fail", JOBS + "  - name: broken\n    input: broken.onnx\n"
                                    "    output: out/e.onnx\n")
    (folder / "broken.onnx").write_bytes(b"this is not an onnx model")
    rc, stdout, stderr = run_qforge("batch", folder / "jobs.yaml", "-j", "2", "--json")
    lines = [json.loads(line) for line in stdout.splitlines()]
    by_name = {line["name"]: line for line in lines}
    assert sorted(by_name) == ["broken", "bundle", "conv-only", "per-channel", "per-tensor"]
    broken = by_name.pop("broken")
    assert broken["status"] == "failed" and broken["exit_code"] == EXIT_INVALID, broken
    assert "broken.onnx" in broken["error"]
    assert rc == broken["exit_code"], stderr
    for line in by_name.values():
        assert line["status"] == "ok" and line["exit_code"] == 0 and line["error"] is None, line
        assert isinstance(line["seconds"], float) and line["seconds"] > 0
        assert (Path(line["output"])).exists()
    assert not (folder / "out" / "e.onnx").exists()


def test_duplicate_outputs_are_refused_before_anything_runs(run_qforge, job_dir):
    folder = job_dir("dup", JOBS + "  - name: again\n    input: m.onnx\n"
                                   "    output: ./out/../out/a.onnx\n")
    rc, _, stderr = run_qforge("batch", folder / "jobs.yaml", "-j", "2")
    assert rc == EXIT_USAGE, stderr
    assert "'again'" in stderr and "'per-channel'" in stderr and "nothing was run" in stderr
    assert outputs(folder) == {}


def test_invalid_job_stops_everything_before_it_runs(run_qforge, job_dir):
    folder = job_dir("invalid", JOBS + "  - name: typo\n    input: m.onnx\n"
                                       "    output: out/e.onnx\n    qaunt: int8\n")
    rc, stdout, stderr = run_qforge("batch", folder / "jobs.yaml", "--json")
    assert rc == EXIT_USAGE
    assert "jobs.yaml line 21" in stderr and "'qaunt'" in stderr
    (line,) = [json.loads(text) for text in stdout.splitlines()]
    assert line["name"] == "typo" and line["status"] == "invalid"
    assert outputs(folder) == {}
    missing = job_dir("missing", JOBS + "  - name: gone\n    input: gone.onnx\n"
                                        "    output: out/e.onnx\n")
    rc, _, stderr = run_qforge("batch", missing / "jobs.yaml")
    assert rc == EXIT_IO
    assert "gone.onnx" in stderr and "does not exist" in stderr
    assert outputs(missing) == {}


def test_json_jobs_file_as_a_plain_list(run_qforge, job_dir):
    folder = job_dir("jsonlist", "")
    jobs = folder / "jobs.json"
    jobs.write_text(json.dumps([
        {"name": "w", "input": "m.onnx", "output": "out/w.onnx", "quant": "int8-weights"},
        {"input": "m.onnx", "output": "out/n.onnx", "op_types": ["Conv"],
         "quant": "int8-weights", "per_tensor": True},
    ]))
    rc, stdout, stderr = run_qforge("--json", "batch", jobs)
    assert rc == 0, stderr
    lines = [json.loads(line) for line in stdout.splitlines()]
    assert sorted(line["name"] for line in lines) == ["job-2", "w"]
    assert sorted(outputs(folder)) == ["out/n.onnx", "out/w.onnx"]
