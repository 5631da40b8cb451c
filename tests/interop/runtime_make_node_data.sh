#!/usr/bin/env bash
# Writes the ONNX backend node tests (DIR/node/<test>/model.onnx + test_data_set_0/*.pb) that
# tests/unit/runtime/test_onnx_backend_nodes.cpp runs when QFORGE_ONNX_NODE_TESTS=DIR/node.
# The onnx wheel ships no node test data; runtime_make_node_data.py makes it offline from the
# test cases inside the wheel.
#
# Usage: tests/interop/runtime_make_node_data.sh DIR [PYTHON]
#   PYTHON defaults to $QFORGE_PYTHON, then .venv/bin/python at the repository root.
set -euo pipefail
if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 DIR [PYTHON]" >&2
  exit 2
fi
out=$1
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${2:-${QFORGE_PYTHON:-$root/.venv/bin/python}}
if [[ ! -x $python ]]; then
  echo "error: no Python at '$python' (pass it as the second argument or set QFORGE_PYTHON)" >&2
  exit 1
fi
mkdir -p "$out"
"$python" "$here/runtime_make_node_data.py" "$out"
echo "run with: QFORGE_ONNX_NODE_TESTS=$out/node"
