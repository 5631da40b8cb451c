"""Fixtures that are costly to make (a trained model, a peer quantizer's outputs), made once per
test run and, with $QFORGE_FIXTURE_CACHE set, kept across runs under a key that changes with the
scripts that make them and the versions they ran with."""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures"


def cache_dir(tmp_path_factory, name: str, *key_files: Path, extra: str = "") -> Path:
    """A folder for a fixture that is costly to make: $QFORGE_FIXTURE_CACHE/NAME-KEY, KEY a hash
    of the scripts that make it and of the versions they ran with (so it is remade when either
    changes), or a fresh pytest tmp folder without that variable."""
    import torch
    import transformers

    root = os.environ.get("QFORGE_FIXTURE_CACHE")
    if not root:
        return tmp_path_factory.mktemp(name)
    h = hashlib.sha256()
    for path in key_files:
        h.update(Path(path).read_bytes())
    h.update(f"{sys.version}|{torch.__version__}|{transformers.__version__}|{extra}".encode())
    return Path(root) / f"{name}-{h.hexdigest()[:16]}"


def build_once(folder: Path, make) -> Path:
    """Runs make(tmp) into a sibling of `folder` and renames it into place, unless `folder` is
    already complete (holds DONE, written last)."""
    if (folder / "DONE").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    make(tmp)
    (tmp / "DONE").write_text("")
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder
