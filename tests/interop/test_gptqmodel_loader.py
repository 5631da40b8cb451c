"""The real GPTQ/AWQ loader: transformers with GPTQModel (and optimum) loads qforge's gptq,
gptq-v2 and awq folders on the CPU, each module dequantizes to exactly qforge's q * fp16(scale),
and the logits match transformers loading the compressed-tensors folder of the same quantization
(test_quant_layouts.py's `test_gptqmodel_*`). GPTQModel 7.3.6 needs numpy 2.2 and .venv pins 2.4,
so it lives in .venv-gptq (scripts/setup_peers.sh), which sees .venv's packages through a .pth;
this test runs those tests with that venv's Python and fails when any of them fails or skips."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest


def test_gptqmodel_loads_qforge_layouts(repo_root, qforge_bin, report_figure):
    python = repo_root / os.environ.get("QFORGE_GPTQ_VENV", ".venv-gptq") / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{python} does not exist: scripts/setup_peers.sh makes the GPTQModel venv")
    if "gptqmodel" in sys.modules:
        pytest.skip("already running inside the GPTQModel venv")
    env = dict(os.environ, QFORGE_BIN=str(qforge_bin))
    proc = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
         "tests/interop/test_quant_layouts.py", "-k", "gptqmodel"],
        cwd=repo_root, env=env, capture_output=True, text=True, timeout=1800)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert re.search(r"\b8 passed\b", out) and "skipped" not in out, out[-6000:]
    for line in out.splitlines():
        if "through GPTQModel" in line:
            report_figure(line.strip())
