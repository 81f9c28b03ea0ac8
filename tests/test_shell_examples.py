"""The serverless-shell examples of examples/shell/, run as real scripts.

Each script runs under bash against a server of its own (its shared directory, SPINDLE_FS,
is the test's temporary directory) with `spindle` on PATH, on a small generated corpus, and
its output is checked against the same computation done locally in Python.
"""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import ServerProcess, gateway_args, server_binary

REPO = Path(__file__).resolve().parents[1]
SHELL = REPO / "examples" / "shell"
ARCHIVES = 6


@pytest.fixture(scope="module")
def shell_env(tmp_path_factory) -> dict:
    """A server for these scripts and the environment to run them in, with a corpus made."""
    fs = tmp_path_factory.mktemp("fs")
    server = ServerProcess("--fs", str(fs), *gateway_args(max_workers=8))
    bindir = Path(server_binary()).parent
    env = dict(os.environ, SPINDLE_ADDRESS=server.address, SPINDLE_FS=str(fs),
               PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    subprocess.run([sys.executable, str(SHELL / "make_corpus.py"), str(fs / "corpus"),
                    "--archives", str(ARCHIVES), "--pages", "40"], check=True, capture_output=True)
    yield env
    server.stop()


def run(env: dict, script: str, *args: str) -> str:
    done = subprocess.run(["bash", str(SHELL / script), *args], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"{script}: exit {done.returncode}\n{done.stderr}"
    return done.stdout


def pages(env: dict) -> list[list[bytes]]:
    """Each archive's page records, read locally."""
    corpus = Path(env["SPINDLE_FS"]) / "corpus"
    names = (corpus / "index").read_text().split()
    return [gzip.decompress((corpus / n).read_bytes()).split(b"WARC/1.0")[1:] for n in names]


def sizes(archive: list[bytes]) -> list[int]:
    return [int(m) for r in archive for m in re.findall(rb"\nContent-Length: (\d+)", r)]


def test_average_page_size_stateless_figure_9(shell_env):
    every = [s for archive in pages(shell_env) for s in sizes(archive)]
    assert len(every) == ARCHIVES * 40
    assert run(shell_env, "average.sh", str(Path(shell_env["SPINDLE_FS"]) / "corpus")).strip() == \
        str(sum(every) // len(every))


def test_average_page_size_stateful_figure_11(shell_env):
    per_archive = [sum(s) // len(s) for s in map(sizes, pages(shell_env))]
    out = run(shell_env, "average_stateful.sh", str(Path(shell_env["SPINDLE_FS"]) / "corpus"))
    assert out.strip() == str(sum(per_archive) // ARCHIVES)


def test_gathering_on_a_barrier_figure_10(shell_env):
    out = run(shell_env, "gathering.sh", "6")
    # The CRUCIAL shell prints the arrival number, 1 to the number of parties.
    assert out.strip() in {str(i) for i in range(1, 7)}


def test_domain_ranking_with_a_shared_treemap(shell_env):
    mentions = Counter(m.decode() for archive in pages(shell_env) for r in archive
                       for m in re.findall(rb'href="http://([^/"]*)', r))
    out = run(shell_env, "domains.sh", str(Path(shell_env["SPINDLE_FS"]) / "corpus"), "5")
    ranked = [line.split() for line in out.strip().splitlines()]
    want = sorted(mentions.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    assert len(want) == 5  # the corpus mentions enough domains to rank five
    assert [(d, int(n)) for n, d in ranked] == want
