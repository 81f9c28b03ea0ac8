"""A threading program ported to spindle by changing imports prints the same result."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "port_threading"


def run(script: str, env: dict) -> str:
    out = subprocess.run(
        [sys.executable, str(EXAMPLE / script)], capture_output=True, text=True, env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_ported_program_gives_the_same_output(child_env):
    original = run("threaded.py", child_env)
    ported = run("spindled.py", child_env)
    assert original.strip()
    assert ported == original


def test_the_two_versions_differ_only_in_imports_and_shared_state_types():
    a = (EXAMPLE / "threaded.py").read_text().splitlines()
    b = (EXAMPLE / "spindled.py").read_text().splitlines()
    body_a = [line for line in a if "# port:" not in line]
    body_b = [line for line in b if "# port:" not in line]
    assert body_a == body_b
    assert any("spindle" in line for line in b if "# port:" in line)
