"""Shared fixtures for tests/cli (end-to-end runs of the binary) and tests/interop (qforge's
outputs held to onnx, ONNX Runtime and numpy references).

The binary comes from $QFORGE_BIN (default build/qforge, relative to the repo root); every test
that needs it is skipped, saying why, when it is missing.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
QFORGE_TIMEOUT_S = 300

# Figures (accuracies, sizes) that tests report; printed at the end of the run even under -q.
_FIGURES: list[str] = []


# --- helpers, also used directly by the tests through the fixtures below ------------------------


def ort_run(model_path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Runs a model in ONNX Runtime on CPU with all graph optimizations off, so what runs is
    the graph as written."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def check_full(path) -> None:
    """The Python onnx checker with full_check (shape inference included)."""
    onnx.checker.check_model(str(path), full_check=True)


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def sample_dir(repo_root) -> Path:
    return repo_root / "calib_data"


@pytest.fixture(scope="session")
def sample_model(sample_dir) -> Path:
    return sample_dir / "sample_cnn.onnx"


@pytest.fixture(scope="session")
def eval_set(sample_dir) -> dict[str, np.ndarray]:
    with np.load(sample_dir / "eval.npz") as data:
        return {key: data[key] for key in data.files}


@pytest.fixture(scope="session")
def qforge_bin(repo_root) -> Path:
    path = Path(os.environ.get("QFORGE_BIN", "build/qforge"))
    if not path.is_absolute():
        path = repo_root / path
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.skip(f"qforge binary not found at {path}: build it (scripts/test.sh) "
                    "or point QFORGE_BIN at it")
    return path


@pytest.fixture(scope="session")
def run_qforge(qforge_bin, repo_root):
    """run_qforge(*args, timeout=...) -> (returncode, stdout, stderr). Runs from the repo root
    with no terminal attached (so no progress bars) and no standard input."""

    def run(*args, timeout: float = QFORGE_TIMEOUT_S):
        env = dict(os.environ)
        env.pop("TERM", None)
        proc = subprocess.run(
            [str(qforge_bin), *map(str, args)],
            cwd=repo_root,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
        return proc.returncode, proc.stdout, proc.stderr

    return run


@pytest.fixture(name="ort_run", scope="session")
def ort_run_fixture():
    return ort_run


@pytest.fixture(name="check_full", scope="session")
def check_full_fixture():
    return check_full


@pytest.fixture(scope="session")
def report_figure():
    """report_figure(text): keeps a line of figures to print in the run's closing summary."""
    return _FIGURES.append


def pytest_terminal_summary(terminalreporter):
    if _FIGURES:
        terminalreporter.section("qforge figures")
        for line in _FIGURES:
            terminalreporter.write_line(line)
