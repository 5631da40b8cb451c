#!/usr/bin/env bash
# Makes the venv of the peer quantizers (llmcompressor) that tests/interop/test_tiny_llama.py
# compares qforge with: .venv-peers (or $QFORGE_PEERS_VENV) with tests/requirements-peers.txt.
# A venv of its own because llmcompressor pins a transformers older than the one in .venv.
# Idempotent: a second run installs nothing. The tests skip the peer, saying why, without it.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${QFORGE_PEERS_VENV:-.venv-peers}
REQUIREMENTS=tests/requirements-peers.txt

log() { printf '[setup_peers] %s\n' "$*"; }

# Prints the `name==version` pins that the venv does not hold (a local label such as +cpu is
# ignored, as pip does).
venv_missing() {
  "$VENV/bin/python" - "$REQUIREMENTS" <<'PY'
import re, sys
from importlib import metadata
bad = []
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
    if not m:
        bad.append(line)
        continue
    try:
        have = metadata.version(m.group(1)).split("+", 1)[0]
    except metadata.PackageNotFoundError:
        have = None
    if have != m.group(2):
        bad.append(f"{m.group(1)} (have {have}, want {m.group(2)})")
print("; ".join(bad))
PY
}

if ! "$VENV/bin/python" -c '' >/dev/null 2>&1; then
  log "creating $VENV"
  python3 -m venv --clear "$VENV"
fi
need=$(venv_missing)
if [[ -n "$need" ]]; then
  log "installing into $VENV: $need"
  "$VENV/bin/python" -m pip install --quiet -r "$REQUIREMENTS"
  need=$(venv_missing)
  if [[ -n "$need" ]]; then
    log "error: $VENV still lacks: $need"
    exit 1
  fi
else
  log "$VENV: all pinned packages present"
fi
