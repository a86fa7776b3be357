"""The deployment files in deploy/: the systemd unit passes `systemd-analyze verify` with this
checkout's onehit-proxy in the place it names."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ANALYZE = shutil.which("systemd-analyze")


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze not installed")
def test_the_systemd_unit_verifies(tmp_path):
    unit = (ROOT / "deploy/systemd/onehit.service").read_text()
    here = str(Path(sys.executable).parent / "onehit-proxy")
    assert "/opt/onehit/bin/onehit-proxy" in unit and Path(here).exists()
    (tmp_path / "onehit.service").write_text(unit.replace("/opt/onehit/bin/onehit-proxy", here))
    out = subprocess.run([ANALYZE, "verify", str(tmp_path / "onehit.service")],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr
