"""Runs the runtime's data-driven gtests from pytest, so that the CI pytest step covers them:

- OnnxBackendNodes: every ONNX backend node test whose ops the runtime supports, on data made
  here by tests/interop/runtime_make_node_data.sh;
- OrtAgreement: the sample CNN and MiniLM against ONNX Runtime (the gtest makes its fixtures
  with this Python through QFORGE_PYTHON).

The unit-test binary is $QFORGE_UNIT_TESTS, else tests/qforge_unit_tests next to $QFORGE_BIN's
build folder (default build/); the tests are skipped, saying so, when it is missing.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def unit_tests() -> Path:
    path = os.environ.get("QFORGE_UNIT_TESTS")
    if path is None:
        qforge_bin = Path(os.environ.get("QFORGE_BIN", "build/qforge"))
        path = qforge_bin.parent / "tests" / "qforge_unit_tests"
    path = Path(path)
    if not path.is_absolute():
        path = REPO_ROOT / path
    if not path.is_file():
        pytest.skip(f"unit-test binary not found at {path}: build it or set QFORGE_UNIT_TESTS")
    return path


def run_gtest(binary: Path, test_filter: str, env: dict[str, str]) -> str:
    proc = subprocess.run([str(binary), f"--gtest_filter={test_filter}"],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    assert "[  SKIPPED ]" not in out, out[-4000:]
    assert re.search(r"\[  PASSED  \] [1-9]", out), out[-4000:]
    return out


def test_onnx_backend_node_tests(unit_tests: Path, tmp_path: Path) -> None:
    subprocess.run(["bash", str(REPO_ROOT / "tests/interop/runtime_make_node_data.sh"),
                    str(tmp_path), sys.executable], check=True, capture_output=True)
    out = run_gtest(unit_tests, "OnnxBackendNodes.*",
                    {"QFORGE_ONNX_NODE_TESTS": str(tmp_path / "node")})
    summary = re.search(r"ONNX node tests: (\d+) passed, (\d+) failed, (\d+) skipped", out)
    assert summary, out[-4000:]
    print(summary.group(0))
    assert int(summary.group(2)) == 0


def test_agreement_with_onnx_runtime(unit_tests: Path) -> None:
    out = run_gtest(unit_tests, "OrtAgreement.*", {"QFORGE_PYTHON": sys.executable})
    for line in out.splitlines():
        if "max |qforge - ORT|" in line:
            print(line)
