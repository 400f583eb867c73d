"""The GPU run's carried wheels (tools/gpu_wheels.py) still cover what the project imports.

The lent GPU machines have no network: what the GPU run imports beyond their image must be
carried. A dependency added to the project, or a plugin that starts importing a new
package at registration, would make the first GPU run fail at collection; this test fails
here instead, naming it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_gpu_run_needs_nothing_beyond_the_image_and_the_carried_wheels():
    out = subprocess.run([sys.executable, "tools/gpu_wheels.py", "--check"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "every model and backend registers" in out.stdout


def test_a_refused_import_fails_the_check():
    """Without the carried RDKit, the drug model's export (its dataset, its molecules) fails
    and the check says so; registering it imports no RDKit, so only the export is run."""
    code = ("import sys; sys.path.insert(0, 'tools'); import gpu_wheels as g; del g.CARRY['rdkit']; "
            "sys.exit(g.check(models=('mpnn.freesolv',)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1, out.stdout[-2000:]
    assert "('rdkit', 'rdkit')" in out.stdout
