"""The CLI's help and empty listings say what they should: `spindle cluster` names all its
subcommands, `spindle status --help` gives each default once, and `spindle objects` says
when there are none."""

from __future__ import annotations

import subprocess

import spindle
from conftest import ServerProcess, connected_to, server_binary


def spindle_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([server_binary(), *args], capture_output=True, text=True, timeout=60)


def test_cluster_help_names_every_subcommand():
    summary = next(line for line in spindle_cli("--help").stdout.splitlines()
                   if line.strip().startswith("cluster "))
    first_line = spindle_cli("cluster", "--help").stdout.splitlines()[0]
    for subcommand in ("local", "status", "add", "remove"):
        assert f"`{subcommand}`" in summary
        assert f"`{subcommand}`" in first_line


def test_status_help_shows_each_default_once():
    help_text = spindle_cli("status", "--help").stdout
    address = next(line for line in help_text.splitlines() if "--address" in line)
    assert address.count("default") == 1 and address.count("SPINDLE_ADDRESS") == 1
    for variable in ("SPINDLE_TLS_CA", "SPINDLE_TLS_CERT", "SPINDLE_TLS_KEY"):
        assert help_text.count(variable) == 1


def test_objects_says_so_when_there_are_none():
    server = ServerProcess()
    try:
        empty = spindle_cli("objects", "--address", server.address)
        assert empty.returncode == 0 and empty.stdout == ""
        assert "no named objects" in empty.stderr
        prefixed = spindle_cli("objects", "jobs.", "--address", server.address)
        assert 'no named objects starting with "jobs."' in prefixed.stderr
        persistent = spindle_cli("objects", "--persistent", "--address", server.address)
        assert "no persistent objects" in persistent.stderr
        with connected_to(server):
            spindle.Counter(name="jobs.done")
            listed = spindle_cli("objects", "--address", server.address)
        assert listed.stdout.split() == ["jobs.done", "Counter"] and listed.stderr == ""
    finally:
        server.stop()
