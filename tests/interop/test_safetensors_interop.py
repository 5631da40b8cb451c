"""safetensors interop with the reference implementation (safetensors 0.8, torch).

Run from the repository root with the venv's Python:
    QFORGE_BIN=build/qforge .venv/bin/python -m pytest tests/interop/test_safetensors_interop.py

- The library-level checks live in the unit-test binary (SafetensorsInterop.*, which needs
  QFORGE_PYTHON); this runs them with this Python so the interop suite covers them.
- The CLI checks drive `qforge inspect` and `qforge convert` on files save_file wrote; a CLI that
  refuses them fails the test.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("safetensors")

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "interop" / "fixtures" / "make_safetensors.py"
EXIT_INVALID = 3


def _binary(env_name, default):
    path = pathlib.Path(os.environ.get(env_name, ROOT / default))
    if not path.is_file():
        pytest.skip(f"{path} not built; build it or set {env_name}")
    return path


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    folder = tmp_path_factory.mktemp("safetensors")
    subprocess.run([sys.executable, str(FIXTURES), "write", str(folder)], check=True)
    return folder


def _qforge(command, *args):
    qforge = str(_binary("QFORGE_BIN", "build/qforge"))
    return subprocess.run([qforge, command, *map(str, args)], capture_output=True, text=True)


def test_library_interop_suite_passes_with_this_python():
    tests = _binary("QFORGE_UNIT_TESTS", "build/tests/qforge_unit_tests")
    run = subprocess.run([str(tests), "--gtest_filter=SafetensorsInterop.*"], capture_output=True,
                         text=True, env={**os.environ, "QFORGE_PYTHON": sys.executable})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "[  PASSED  ] 4 tests." in run.stdout, run.stdout
    assert "SKIPPED" not in run.stdout, run.stdout


def test_inspect_lists_every_tensor(fixtures):
    run = _qforge("inspect", fixtures / "py_meta.safetensors", "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    expected = json.loads((fixtures / "expected.json").read_text())
    assert report["format"] == "safetensors"
    got = {t["name"]: (t["dtype"], t["shape"]) for t in report["tensors"]}
    assert got == {n: (t["dtype"], t["shape"]) for n, t in expected["tensors"].items()}


def test_inspect_rejects_a_truncated_file_in_one_line(fixtures, tmp_path):
    data = (fixtures / "py_meta.safetensors").read_bytes()
    bad = tmp_path / "truncated.safetensors"
    bad.write_bytes(data[:-3])
    run = _qforge("inspect", bad)
    assert run.returncode == EXIT_INVALID, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "truncated.safetensors" in lines[0], run.stderr


def test_convert_writes_what_save_file_writes(fixtures, tmp_path):
    out = tmp_path / "out.safetensors"
    run = _qforge("convert", fixtures / "py_plain.safetensors", "-o", out)
    assert run.returncode == 0, run.stderr
    assert out.read_bytes() == (fixtures / "py_plain.safetensors").read_bytes()
    check = subprocess.run([sys.executable, str(FIXTURES), "check", str(fixtures), str(out)],
                           capture_output=True, text=True)
    assert check.returncode == 1 and "metadata" in check.stdout  # only the metadata differs
