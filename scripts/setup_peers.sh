#!/usr/bin/env bash
# Makes the venv of the peer quantizers (llmcompressor) that tests/interop/test_tiny_llama.py
# compares qforge with: .venv-peers (or $QFORGE_PEERS_VENV) with tests/requirements-peers.txt.
# A venv of its own because llmcompressor pins a transformers older than the one in .venv.
# Idempotent: a second run installs nothing. The tests skip the peer, saying why, without it.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${QFORGE_PEERS_VENV:-.venv-peers}
REQUIREMENTS=tests/requirements-peers.txt

bash scripts/ensure_venv.sh "$VENV" "$REQUIREMENTS" setup_peers
