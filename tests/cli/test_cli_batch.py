"""`qforge batch JOBS -j N [--json]`: many conversions from one file.

Each job writes the bytes a single `qforge convert` with the same options writes, whatever -j;
a failing job does not stop the others and its exit code is the batch's; two jobs writing the
same output, or one invalid job, are refused before anything runs (no output exists); a job
whose child is killed fails with exit 70 and leaves nothing in its output folder."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

EXIT_USAGE, EXIT_INVALID, EXIT_IO, EXIT_INTERNAL = 2, 3, 5, 70

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


@pytest.fixture(scope="module")
def large_model(tmp_path_factory) -> Path:
    """A chain of eight 2048x2048 MatMuls: 128 MiB of weights, so that writing them takes a
    convert long enough (over 100 ms) for the test to kill it mid-write."""
    rng = np.random.default_rng(0)
    width, layers = 2048, 8
    weights = [numpy_helper.from_array(rng.random((width, width), dtype=np.float32), f"w{i}")
               for i in range(layers)]
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i - 1}", f"w{i}"], [f"h{i}"])
             for i in range(layers)]
    graph = helper.make_graph(
        nodes, "large", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info(f"h{layers - 1}", TensorProto.FLOAT, [1, width])], weights)
    path = tmp_path_factory.mktemp("large") / "large.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              path)
    return path


def child_of(parent: int, path: str) -> int | None:
    """The pid of a child process of `parent` with an argument ending in `path` (a job's child
    gets its output as --output=PATH)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode().split("\0")
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if ppid == parent and any(arg.endswith(path) for arg in cmdline):
            return int(entry)
    return None


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_job_killed_by_a_signal_fails_and_leaves_nothing(qforge_bin, repo_root, job_dir,
                                                         large_model, as_json):
    folder = job_dir("killed-json" if as_json else "killed",
                     "jobs:\n  - name: small\n    input: m.onnx\n    output: out/small.onnx\n"
                     "    quant: int8-weights\n"
                     f"  - name: large\n    input: {large_model}\n    output: out/large.onnx\n"
                     "    quant: none\n")
    out = folder / "out"
    env = {key: value for key, value in os.environ.items() if key != "TERM"}
    batch = subprocess.Popen(
        [str(qforge_bin), "batch", str(folder / "jobs.yaml"), "-j", "2",
         *(["--json"] if as_json else [])],
        cwd=repo_root, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=env)
    # Kill the large job's child once its writer has a temporary file beside the output:
    # SIGKILL runs no destructors, so only the batch can clean that file up.
    pid, seen = None, None
    deadline = time.monotonic() + 60
    try:
        while batch.poll() is None and time.monotonic() < deadline:
            pid = pid or child_of(batch.pid, str(out / "large.onnx"))
            if pid is not None:
                seen = next((name for name in os.listdir(out)
                             if name.startswith(f".large.onnx.tmp-{pid}-")), None)
                if seen is not None:
                    os.kill(pid, signal.SIGKILL)
                    break
        stdout, stderr = batch.communicate(timeout=60)
    finally:
        if batch.poll() is None:
            batch.kill()
    assert seen is not None, (f"the large job (pid {pid}) finished before its temporary file "
                              "was seen; make large_model bigger\n" + stdout + stderr)

    assert batch.returncode == EXIT_INTERNAL, stdout + stderr
    error = f"convert died from signal {int(signal.SIGKILL)} (Killed)"
    if as_json:
        by_name = {line["name"]: line for line in map(json.loads, stdout.splitlines())}
        assert sorted(by_name) == ["large", "small"], stdout
        small, large = by_name["small"], by_name["large"]
        assert small["status"] == "ok" and small["exit_code"] == 0, small
        assert large["status"] == "failed", large
        assert large["exit_code"] == 128 + signal.SIGKILL, large
        assert large["error"].startswith(error), large
    else:
        lines = stdout.splitlines()
        assert len(lines) == 2, stdout
        assert any(line.startswith("ok      small -> ") for line in lines), stdout
        assert any(line.startswith("FAILED  large -> ") and
                   f"exit {128 + signal.SIGKILL}: {error}" in line for line in lines), stdout
        assert "batch: 1 of 2 jobs passed" in stderr, stderr
    # The small job's output is all that is left: no large.onnx, no temporary file.
    assert sorted(os.listdir(out)) == ["small.onnx"], f"{seen} was seen before the kill"
    onnx.checker.check_model(str(out / "small.onnx"))
