#!/usr/bin/env bash
# ensure_venv.sh VENV REQUIREMENTS LABEL: makes the Python venv VENV hold every `name==version`
# pin of REQUIREMENTS (creating it when absent or made on another machine, installing only when
# a pin differs; a local label such as +cpu is ignored, as pip does). Shared by setup.sh (.venv)
# and setup_peers.sh (.venv-peers). Idempotent.
set -euo pipefail
VENV=$1
REQUIREMENTS=$2
LABEL=$3

log() { printf '[%s] %s\n' "$LABEL" "$*"; }

# Prints the pins the venv does not hold.
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
        bad.append(line)  # not a plain pin: let pip decide
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
  # Absent, or made on another machine whose interpreter is gone: (re)create it.
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
