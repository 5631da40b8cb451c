"""What the Python benchmarks share: running a command as a fresh process and measuring its wall
time and peak RSS (ru_maxrss from os.wait4 in a small launcher process, so the figure is the
command's own and not this script's)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

LAUNCHER = textwrap.dedent("""
    import os, subprocess, sys, time
    start = time.perf_counter()
    proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    print(time.perf_counter() - start, usage.ru_maxrss, os.waitstatus_to_exitcode(status))
""")


def run_measured(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one fresh process running `cmd`; raises if it fails."""
    proc = subprocess.run([sys.executable, "-c", LAUNCHER, *cmd], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    fields = proc.stdout.split()
    if proc.returncode != 0 or len(fields) != 3 or fields[2] != "0":
        raise RuntimeError(f"{cmd[0]} failed:\n{proc.stderr[-2000:]}")
    return float(fields[0]), int(fields[1]) / 1024.0  # ru_maxrss is KiB on Linux
