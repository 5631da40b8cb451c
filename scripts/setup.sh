#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test qforge: the Debian packages
# below and a Python venv at .venv with tests/requirements.txt. Idempotent: a second run
# installs nothing and takes a second or two.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  cmake ninja-build g++ pkg-config
  # a compiler cache: build-nocuda reuses the host objects of the CUDA build (scripts/test.sh)
  ccache
  libprotobuf-dev protobuf-compiler libonnx-dev
  libcli11-dev libspdlog-dev nlohmann-json3-dev libyaml-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev
  zlib1g-dev libssl-dev
  # libFuzzer builds: clang, its sanitizer runtimes, and clang's OpenMP (the library uses it)
  clang libclang-rt-14-dev libomp-dev
  python3 python3-venv
  # the HTML report's browser test (tests/interop/test_html_report.py) renders it headless
  chromium
  # folder writers' flushes are read from a system call trace (tests/interop/test_hf_folder.py)
  strace
)
VENV=.venv
REQUIREMENTS=tests/requirements.txt

log() { printf '[setup] %s\n' "$*"; }

# --- Debian packages ------------------------------------------------------------------------
missing=()
if command -v dpkg-query >/dev/null 2>&1; then
  for pkg in "${APT_PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true)
    [[ "$status" == ii* ]] || missing+=("$pkg")
  done
else
  log "no dpkg: not a Debian machine, skipping system packages (needed: ${APT_PACKAGES[*]})"
fi
if ((${#missing[@]})); then
  SUDO=()
  if [[ $(id -u) -ne 0 ]]; then SUDO=(sudo); fi
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update
  "${SUDO[@]}" apt-get install -y "${missing[@]}"
else
  log "system packages: all present"
fi

# --- Python venv ----------------------------------------------------------------------------
bash scripts/ensure_venv.sh "$VENV" "$REQUIREMENTS" setup

# --- cuBLAS (only with nvcc): headers for the build, libcublas.so.13 loaded at run time -------
CUBLAS_PIN="nvidia-cublas==13.10.0.20"
if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  if [[ "$("$VENV/bin/python" -c 'from importlib import metadata as m; print(m.version("nvidia-cublas"))' 2>/dev/null)" != "${CUBLAS_PIN#*==}" ]]; then
    log "nvcc present: installing $CUBLAS_PIN into $VENV (~440 MB; CMake finds its headers)"
    "$VENV/bin/python" -m pip install --quiet "$CUBLAS_PIN"
  else
    log "$VENV: $CUBLAS_PIN present"
  fi
fi
