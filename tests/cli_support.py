"""`python -m zoo ARGS` as a user runs it: a fresh process in `cwd`, without the caller's
ZOO_DEBUG or ZOO_PLUGINS (a test names its plugins with --plugin), `env` added."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def zoo_cli(*args: str, cwd: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("ZOO_DEBUG", "ZOO_PLUGINS")}
    return subprocess.run([sys.executable, "-m", "zoo", *args], cwd=cwd, env={**clean, **env},
                          capture_output=True, text=True, timeout=timeout)
