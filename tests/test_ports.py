"""Six small public-style programs written with threading, queue, concurrent.futures and
joblib (examples/ports/NAME_stdlib.py), ported to Spindle by changing their imports alone
(NAME_spindle.py): each port prints what the original prints, run against the session's
server, and the bank account port, whose deposits into a copied object cannot add up, warns
instead of printing a wrong balance silently."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import mirrors_remote as remote

PORTS = Path(__file__).resolve().parents[1] / "examples" / "ports"
SAME_OUTPUT = ["url_fetch", "primes", "daemon_worker", "dining_philosophers", "random_search"]
IMPORT = ("import ", "from ")


def run(script: str, env: dict) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(PORTS / script)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.parametrize("name", SAME_OUTPUT + ["bank_account"])
def test_the_two_versions_differ_only_in_imports(name):
    original = (PORTS / f"{name}_stdlib.py").read_text().splitlines()
    ported = (PORTS / f"{name}_spindle.py").read_text().splitlines()
    assert [line for line in original if not line.startswith(IMPORT)] == [
        line for line in ported if not line.startswith(IMPORT)]
    changed = set(ported) - set(original)
    assert changed and all(line.startswith(IMPORT) and "spindle" in line for line in changed)


@pytest.mark.parametrize("name", SAME_OUTPUT)
def test_the_port_prints_what_the_original_prints(name, child_env):
    original = run(f"{name}_stdlib.py", child_env).stdout
    assert original.strip()
    assert run(f"{name}_spindle.py", child_env).stdout == original


def test_the_bank_account_port_warns_of_its_lost_deposits(child_env):
    assert run("bank_account_stdlib.py", child_env).stdout == "balance: 1000\n"
    ported = run("bank_account_spindle.py", child_env)
    assert "LostUpdateWarning" in ported.stderr and "Account" in ported.stderr


def test_the_joblib_import_of_the_search_port_sends_its_batches_to_spindle_workers():
    from joblib import Parallel, delayed

    from spindle.joblib import parallel_config

    with parallel_config(n_jobs=2):
        ids = Parallel()(delayed(remote.worker_id)() for _ in range(4))
    assert all(ids) and remote.worker_id() is None
