#!/usr/bin/env bash
# Makes the venv of the peer quantizers (llmcompressor) that tests/interop/test_tiny_llama.py
# compares qforge with: .venv-peers (or $QFORGE_PEERS_VENV) with tests/requirements-peers.txt.
# A venv of its own because llmcompressor pins a transformers older than the one in .venv.
# Then builds llama-cpp-python into .venv (tests/requirements-llama-cpp.txt), which loads qforge's
# GGUF files in tests/interop/test_gguf_*.py, and .venv-gptq with GPTQModel, which loads qforge's
# gptq and awq folders in tests/interop/test_gptqmodel_loader.py.
# Idempotent: a second run installs nothing. The tests skip the peer, saying why, without it.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${QFORGE_PEERS_VENV:-.venv-peers}
REQUIREMENTS=tests/requirements-peers.txt

bash scripts/ensure_venv.sh "$VENV" "$REQUIREMENTS" setup_peers

# llama.cpp's Python binding, in .venv beside the gguf package (tests/requirements-llama-cpp.txt).
# Built from source once: only the library, for the machine's baseline CPU, no tools.
export CMAKE_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=OFF"
export CMAKE_BUILD_PARALLEL_LEVEL=${QFORGE_JOBS:-2}
# A build that fails here (a compiler or CMake problem on an unusual machine) leaves the GGUF
# tests that need llama.cpp skipping with that reason, not the whole run red.
if ! bash scripts/ensure_venv.sh .venv tests/requirements-llama-cpp.txt setup_llama_cpp; then
  echo "[setup_llama_cpp] warning: llama-cpp-python did not build; the llama.cpp tests skip" >&2
fi

# GPTQModel (tests/requirements-gptq.txt) in .venv-gptq: a venv that sees .venv's packages
# through a .pth file, with its own numpy (GPTQModel 7.3.6 needs 2.2; .venv pins 2.4).
GPTQ_VENV=${QFORGE_GPTQ_VENV:-.venv-gptq}
if ! "$GPTQ_VENV/bin/python" -c '' >/dev/null 2>&1; then
  python3 -m venv --clear "$GPTQ_VENV"
fi
# (Its real path: a .venv that is a link, as in a worktree beside the checkout, may go away.)
main_site=$(.venv/bin/python -c \
  'import os, sysconfig; print(os.path.realpath(sysconfig.get_paths()["purelib"]))')
gptq_site=$("$GPTQ_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$main_site" > "$gptq_site/zz_main_venv.pth"
if ! bash scripts/ensure_venv.sh "$GPTQ_VENV" tests/requirements-gptq.txt setup_gptq; then
  # Without it test_gptqmodel_loader.py skips, saying that the venv is missing.
  echo "[setup_gptq] warning: GPTQModel did not install; removing $GPTQ_VENV" >&2
  rm -rf "$GPTQ_VENV"
fi
