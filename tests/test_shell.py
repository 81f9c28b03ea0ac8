"""`spindle sh`: shell commands as functions (the gateway's ``shell`` runtime), run by the
real ``spindle`` binary against a real server and its worker processes.

The module's server has its own ``--fs`` directory (``SPINDLE_FS``), so the files the
commands write are this module's alone. Timing is never asserted against a budget: where
order matters (streaming, ``--async``) the command waits for a file the test creates only
after it saw what it expects, so a wrong order deadlocks into a clear failure instead.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List

import cloudpickle
import msgpack
import pytest

import spindle
from conftest import ServerProcess, gateway_args, wait_until
from spindle.shell import DRAIN_GRACE

# A bound on a failure only (a hung client), never a performance budget.
HANG = 60


class Shell:
    """The module's server and a way to run ``spindle sh`` against it."""

    def __init__(self, server: ServerProcess, fs: Path) -> None:
        self.server = server
        self.fs = fs
        self.binary = server.binary
        self.env = dict(os.environ)
        self.env["SPINDLE_ADDRESS"] = server.address
        self.env["SPINDLE_FS"] = str(fs)
        self.env.pop("SPINDLE_TOKEN", None)

    def run(self, *args: str, cwd: object = None, input: bytes = None,
            timeout: float = HANG) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.binary, "sh", *args], env=self.env, cwd=cwd, input=input,
            capture_output=True, timeout=timeout,
        )

    def popen(self, *args: str, **kwargs) -> subprocess.Popen:
        return subprocess.Popen([self.binary, "sh", *args], env=self.env, **kwargs)


@pytest.fixture(scope="module")
def sh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shell]:
    fs = tmp_path_factory.mktemp("spindle-fs").resolve()
    server = ServerProcess("--session-ttl", "1", "--fs", str(fs), *gateway_args())
    try:
        yield Shell(server, fs)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def sh1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shell]:
    """A server with one worker: Python and shell tasks share it."""
    fs = tmp_path_factory.mktemp("spindle-fs-1").resolve()
    server = ServerProcess("--session-ttl", "1", "--fs", str(fs), *gateway_args(1))
    try:
        yield Shell(server, fs)
    finally:
        server.stop()


def running(args: str) -> bool:
    """Whether a process with this command line runs (zombies do not count)."""
    ps = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True).stdout
    return any(line.split(None, 1)[1:] == [args] for line in ps.splitlines() if not line.startswith("Z"))


def local(command: str) -> subprocess.CompletedProcess:
    """The same command run here, by bash, with pipefail (as --pipe reports)."""
    return subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, timeout=HANG)


# -- exit status and output --------------------------------------------------------------------


def test_the_exit_status_is_the_commands(sh):
    assert sh.run("exit 3").returncode == 3
    assert sh.run("true").returncode == 0
    assert sh.run("kill -TERM $$").returncode == 128 + 15  # as bash reports a signal


def test_stdout_and_stderr_stay_apart(sh):
    done = sh.run("echo out; echo err >&2; echo out2")
    assert done.returncode == 0
    assert done.stdout == b"out\nout2\n"
    assert done.stderr == b"err\n"


def test_several_words_make_one_command_line(sh):
    done = sh.run("echo", "-n", "a", "b")
    assert done.stdout == b"a b"


def test_a_missing_command_is_127_with_bashs_message(sh):
    done = sh.run("no-such-command-here")
    assert done.returncode == 127
    assert b"no-such-command-here: command not found" in done.stderr


def test_binary_output_and_long_lines_arrive_intact(sh):
    data = bytes(range(256)) * 1024 + b"x" * 300_000  # a 300 KB line: cut in 64 KiB chunks
    (sh.fs / "blob.bin").write_bytes(data)
    done = sh.run("cat blob.bin; printf tail")
    assert done.stdout == data + b"tail"


def test_output_streams_while_the_command_runs(sh):
    """The command prints a line, then waits until the test has seen it: only a streamed line
    can be seen before the command ends."""
    marker = sh.fs / "seen-first-line"
    command = (
        "echo first; for i in $(seq 1 600); do [ -e seen-first-line ] && break; sleep 0.05; done; "
        "[ -e seen-first-line ] && echo second"
    )
    client = sh.popen(command, stdout=subprocess.PIPE)
    try:
        assert client.stdout.readline() == b"first\n"
        assert client.poll() is None, "the client ended before the command did"
        marker.touch()  # only now may the command finish
        assert client.stdout.read() == b"second\n"
        assert client.wait(HANG) == 0
    finally:
        client.kill()
        client.wait()


def test_output_held_back_by_a_slow_reader_is_never_dropped(sh):
    """The reader takes nothing until the command has ended and the drain grace has passed,
    so the worker's pump is blocked on the full stream with lines still in the command's
    pipe: all of them must still come, and the status with them."""
    marker = sh.fs / "slow-reader-ended"
    command = (
        'head -c 200000 /dev/zero | tr "\\0" x | fold -w100; echo; '
        "for i in $(seq 300); do echo L$i; sleep 0.002; done; touch slow-reader-ended"
    )
    client = sh.popen(command, stdout=subprocess.PIPE)
    try:
        assert wait_until(marker.exists, deadline=HANG)
        time.sleep(DRAIN_GRACE + 1)  # not a budget: what it takes for the old loss to show
        out = client.stdout.read().decode()
        assert client.wait(HANG) == 0
    finally:
        client.kill()
        client.wait()
    lines = out.splitlines()
    assert lines[:2000] == ["x" * 100] * 2000
    assert lines[2000:] == [f"L{i}" for i in range(1, 301)]


def test_a_partial_line_is_not_held_back(sh):
    marker = sh.fs / "seen-prompt"
    command = "printf 'prompt> '; while [ ! -e seen-prompt ]; do sleep 0.05; done; echo answer"
    client = sh.popen("--timeout", "60", command, stdout=subprocess.PIPE)
    try:
        assert os.read(client.stdout.fileno(), 100) == b"prompt> "
        marker.touch()
        assert client.stdout.read() == b"answer\n"
        assert client.wait(HANG) == 0
    finally:
        client.kill()
        client.wait()


# -- options ------------------------------------------------------------------------------------


def test_async_returns_and_the_command_runs_after_the_client_exited(sh):
    go, result = sh.fs / "async-go", sh.fs / "async-result"
    done = sh.run("--async", "while [ ! -e async-go ]; do sleep 0.05; done; echo ran > async-result")
    assert done.returncode == 0
    assert done.stdout == b""
    assert not result.exists()
    go.touch()  # the client has exited: only a detached function can see this
    assert wait_until(result.exists, deadline=HANG)
    assert wait_until(lambda: result.read_text() == "ran\n")


def test_async_prints_the_call_id_that_ps_and_kill_know(sh):
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sh.binary, *args], env=sh.env, capture_output=True, text=True,
                              timeout=HANG)

    commands = [f"sleep 600 # async-id-{n}" for n in range(2)]
    ids = []
    for command in commands:
        started = sh.run("--async", command)
        assert started.returncode == 0 and started.stdout == b""
        match = re.fullmatch(rb"CallId: (\d+)\n", started.stderr)
        assert match, started.stderr
        ids.append(match.group(1).decode())
    assert ids[0] != ids[1]
    for call, command in zip(ids, commands):
        rows = {line.split()[0]: line for line in cli("ps").stdout.splitlines()[1:]}
        assert command in rows[call]
        assert cli("kill", call).returncode == 0
        assert wait_until(lambda: command not in cli("ps").stdout)


def test_async_output_goes_nowhere(sh):
    """A detached command's output is not kept in its worker's capture files (nobody reads
    its report): the command sees their sizes stay 0 while it writes."""
    sizes = sh.fs / "async-sizes"
    command = (
        "head -c 3000000 /dev/zero; head -c 3000000 /dev/zero >&2; "
        "stat -L -c %s /proc/$PPID/fd/1 /proc/$PPID/fd/2 > async-sizes.tmp; mv async-sizes.tmp async-sizes"
    )
    assert sh.run("--async", command).returncode == 0
    assert wait_until(sizes.exists, deadline=HANG)
    assert sizes.read_text() == "0\n0\n"


def test_verbose_prints_the_request_id_duration_and_memory(sh):
    done = sh.run("-v", "echo $SPINDLE_REQUEST_ID")
    lines = done.stderr.decode().splitlines()
    assert re.fullmatch(r"RequestId: [0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", lines[0])
    assert re.fullmatch(r"Duration: \d+ ms Memory Used: \d+ MB", lines[1]), lines
    assert done.stdout.decode() == lines[0].split()[1] + "\n", "the command sees its request id"


def test_a_script_file_runs_with_its_arguments(sh, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text('echo "args: $*"\necho "in $(pwd)"\nexit 7\n')
    done = sh.run("-f", str(script), "one", "two")
    assert done.returncode == 7
    assert done.stdout == f"args: one two\nin {sh.fs}\n".encode()


def test_environment_variables_and_stdin(sh):
    assert sh.run("-e", "GREETING=hello there", "echo $GREETING").stdout == b"hello there\n"
    data = b"".join(b"%d\n" % i for i in range(100000))
    done = sh.run("-i", "wc -l", input=data)
    assert done.stdout.strip() == b"100000"
    assert sh.run("cat").stdout == b"", "without -i the command's stdin is empty"


def test_object_commands_are_on_the_path(sh):
    done = sh.run("readlink -f $(command -v counter) $(command -v pipe)")
    target = os.path.realpath(sh.binary).encode()
    assert done.stdout.split() == [target, target]


def test_bad_usage_is_refused(sh):
    done = sh.run()
    assert done.returncode == 2 and b"nothing to run" in done.stderr
    done = sh.run("--pipe", "true || false")
    assert done.returncode == 2 and b"`||`" in done.stderr
    done = sh.run("--pipe", "echo 'a | b")
    assert done.returncode == 2 and b"unterminated" in done.stderr
    assert b"--async" in subprocess.run([sh.binary, "sh", "--help"], capture_output=True).stdout


# -- SPINDLE_FS ---------------------------------------------------------------------------------


def test_files_in_spindle_fs_are_shared_by_functions_and_the_client(sh):
    (sh.fs / "input.txt").write_text("from the client\n")
    assert sh.run("tr a-z A-Z < input.txt > output.txt").returncode == 0
    assert (sh.fs / "output.txt").read_text() == "FROM THE CLIENT\n"
    assert sh.run("cat output.txt").stdout == b"FROM THE CLIENT\n"


def test_the_command_runs_in_the_clients_directory_inside_spindle_fs(sh, tmp_path):
    sub = sh.fs / "a" / "b"
    sub.mkdir(parents=True)
    assert sh.run("pwd", cwd=sub).stdout == f"{sub}\n".encode()
    assert sh.run("pwd", cwd=tmp_path).stdout == f"{sh.fs}\n".encode(), "outside it: its root"


def test_background_processes_end_with_the_command(sh):
    done = sh.run("sleep 1000 & setsid sleep 1001 & (sleep 1002 &) ; echo started")
    assert done.returncode == 0 and done.stdout == b"started\n"
    for leftover in ("sleep 1000", "sleep 1001", "sleep 1002"):
        assert not running(leftover), f"{leftover} outlived its command"


def invoke_python(sh: Shell, fn) -> object:
    """Call ``fn()`` (pickled by value) on the server's worker pool; its result."""
    client = spindle.Client(sh.server.address)
    try:
        rid = next(client._seq)
        report = client.request([rid, "invoke", "python", cloudpickle.dumps((fn, (), {})), {}], rid)
    finally:
        client.close()
    assert report["ok"], report["error"]
    return cloudpickle.loads(report["result"])


def test_a_warm_worker_carries_no_process_from_one_call_into_the_next(sh1):
    """One worker runs a Python task that leaves a subprocess running, then shell commands
    that leave theirs: each call's processes end with it, so nothing of one call (a user's)
    is around in the next (another user's), and the worker still serves."""

    def start_child():
        import subprocess

        return subprocess.Popen(["sleep", "1003"]).pid

    pid = invoke_python(sh1, start_child)
    assert isinstance(pid, int)
    assert wait_until(lambda: not running("sleep 1003"), deadline=HANG), "the task's subprocess outlived its call"
    done = sh1.run("sleep 1004 & setsid sleep 1005 & echo started")
    assert done.stdout == b"started\n"
    assert wait_until(lambda: not running("sleep 1004") and not running("sleep 1005"), deadline=HANG)
    done = sh1.run("echo again")
    assert done.returncode == 0 and done.stdout == b"again\n", done.stderr


def test_pipe_stages_beyond_the_workers_are_refused(sh1):
    done = sh1.run("--pipe", "seq 1 10000000 | wc -l", timeout=HANG)
    assert done.returncode == 2
    assert b"2 stages" in done.stderr and b"at most 1" in done.stderr
    assert sh1.run("seq 1 10 | wc -l").stdout.strip() == b"10", "in one function it runs"


# -- parallel calls -----------------------------------------------------------------------------


def test_twenty_parallel_calls_from_one_shell_lose_and_mix_no_lines(sh):
    script = (
        f'for i in $(seq 1 20); do "{sh.binary}" sh '
        '"for j in \\$(seq 1 300); do echo line-$i-\\$j-abcdefghijklmnopqrstuvwxyz; done" & done; wait'
    )
    done = subprocess.run(["bash", "-c", script], env=sh.env, capture_output=True, timeout=HANG * 2)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 20 * 300
    assert all(re.fullmatch(r"line-\d+-\d+-abcdefghijklmnopqrstuvwxyz", line) for line in lines)
    assert sorted(lines) == sorted(
        f"line-{i}-{j}-abcdefghijklmnopqrstuvwxyz" for i in range(1, 21) for j in range(1, 301)
    )
    for i in range(1, 21):  # each call's lines in order
        mine = [int(line.split("-")[2]) for line in lines if line.startswith(f"line-{i}-")]
        assert mine == list(range(1, 301))


# -- pipes --------------------------------------------------------------------------------------


def test_a_pipe_across_functions_equals_the_local_pipe(sh):
    command = "seq 1 100000 | grep 7 | wc -l"
    done = sh.run("--pipe", command)
    assert done.returncode == 0, done.stderr
    assert done.stdout == local(command).stdout
    assert done.stdout.strip() == b"40951"


def test_pipe_stages_keep_quoted_bars_and_send_stderr_to_the_client(sh):
    done = sh.run("--pipe", "echo 'a|b' | tr '|' - | (cat; echo note >&2)")
    assert done.stdout == b"a-b\n"
    assert done.stderr == b"note\n"


def test_a_pipe_whose_middle_stage_fails(sh):
    command = "seq 1 100000 | (exit 3) | wc -l"
    done = sh.run("--pipe", command)
    assert done.returncode == 3 == local(command).returncode
    assert done.stdout.strip() == b"0"
    done = sh.run("--pipe", "seq 1 10 | no-such-filter | cat")
    assert done.returncode == 127
    assert b"no-such-filter: command not found" in done.stderr


def test_a_reader_that_stops_early_breaks_the_pipe_upstream(sh):
    command = "seq 1 100000000 | head -n 2"
    done = sh.run("--pipe", command)
    assert done.stdout == b"1\n2\n"
    assert done.returncode == 141 == local(command).returncode  # seq got SIGPIPE


# -- failures -----------------------------------------------------------------------------------


def test_a_function_killed_mid_stream_ends_the_client_with_the_error(sh):
    started = time.monotonic()
    done = sh.run("--timeout", "1", "echo start; sleep 1007 & setsid sleep 1006 & sleep 1008")
    assert time.monotonic() - started < 30, "the client waited for the command"
    assert done.stdout == b"start\n"
    assert b"FunctionTimeout" in done.stderr
    assert done.returncode == 124
    # The command's own session went with its worker.
    for leftover in ("sleep 1007", "sleep 1006", "sleep 1008"):
        assert wait_until(lambda: not running(leftover), deadline=HANG), f"{leftover} outlived its worker"


def test_a_pipe_stage_killed_mid_stream_ends_the_whole_pipe(sh):
    started = time.monotonic()
    # The middle stage would hang for far longer than the bound below, which only bounds a
    # failure (the client waiting for it).
    done = sh.run("--pipe", "--timeout", "2", "seq 1 1000000000 | sleep 1009 | cat")
    assert time.monotonic() - started < 30, "the client waited for the other stages"
    assert done.returncode == 124
    assert b"FunctionTimeout" in done.stderr
    assert wait_until(lambda: not running("sleep 1009"), deadline=HANG), "a stage outlived its worker"
    # The pool is fine afterwards.
    assert sh.run("echo ok").stdout == b"ok\n"


def test_a_function_over_its_memory_is_killed_and_reported(sh):
    hog = f"{sys.executable} -c 'x = bytearray(b\"1\") * (400 << 20); import time; time.sleep(60)'"
    done = sh.run("--memory", "100", f"echo before; {hog}")
    assert done.stdout == b"before\n"
    assert b"WorkerCrashed" in done.stderr and b"memory limit" in done.stderr
    assert done.returncode == 128 + 9


def test_a_client_without_a_server_says_so(sh, tmp_path):
    env = dict(sh.env, SPINDLE_ADDRESS="127.0.0.1:1")
    done = subprocess.run([sh.binary, "sh", "true"], env=env, capture_output=True, timeout=HANG)
    assert done.returncode == 255
    assert b"no Spindle server" in done.stderr


# -- the protocol -------------------------------------------------------------------------------


def invoke_shell(sh: Shell, spec: Dict[str, object], options: Dict[str, object] = None) -> Dict[str, object]:
    client = spindle.Client(sh.server.address)
    try:
        rid = next(client._seq)
        return client.request([rid, "invoke", "shell", msgpack.packb(spec), options or {}], rid)
    finally:
        client.close()


def test_the_shell_runtime_without_a_stream_reports_the_output(sh):
    report = invoke_shell(sh, {"command": "echo out; echo err >&2; exit 4"})
    assert report["ok"] is True
    assert report["result"] == 4
    assert (report["stdout"], report["stderr"]) == (b"out\n", b"err\n")
    assert report["duration"] > 0 and report["peak_rss"] > 0
    (sh.fs / "a").mkdir(exist_ok=True)
    report = invoke_shell(sh, {"command": "pwd", "cwd": "a"})
    assert report["stdout"] == f"{sh.fs / 'a'}\n".encode()
    report = invoke_shell(sh, {"command": "pwd", "cwd": "../.."})
    assert report["stdout"] == f"{sh.fs}\n".encode(), "a cwd outside SPINDLE_FS is not used"


def test_a_bad_shell_payload_is_a_failed_report(sh):
    client = spindle.Client(sh.server.address)
    try:
        rid = next(client._seq)
        report = client.request([rid, "invoke", "shell", b"\xc1", {}], rid)
    finally:
        client.close()
    assert report["ok"] is False
    assert "bad shell payload" in report["error"]["message"]


def test_a_failing_pump_still_ends_the_stream_and_the_task(sh):
    """The stdout pump fails (its key is no queue): the task waits for its other helpers,
    puts the stream's end marker, and reports the failure; the next task runs normally."""
    client = spindle.Client(sh.server.address)
    try:
        client.create("Queue", "pump-fails-stream", [0], False)
        client.create("Counter", "pump-fails-not-a-queue", [0], False)
        spec = {"command": "echo out; echo err >&2", "stream": "pump-fails-stream",
                "stdout": "pump-fails-not-a-queue"}
        report = invoke_shell(sh, spec)
        assert report["ok"] is False
        items = []
        while client.call("Queue", "pump-fails-stream", "qsize", []):
            items.append(client.call("Queue", "pump-fails-stream", "get", []))
        assert items[-1] is None, f"no end marker: {items}"
        assert [2, b"err\n"] in items
    finally:
        client.delete("pump-fails-stream")
        client.delete("pump-fails-not-a-queue")
        client.close()
    for _ in range(8):  # every worker of the pool is fine
        assert sh.run("echo ok").stdout == b"ok\n"


def test_unknown_runtimes_are_refused(sh):
    client = spindle.Client(sh.server.address)
    try:
        rid = next(client._seq)
        with pytest.raises(TypeError, match="unknown runtime 'cobol'.*python, shell"):
            client.request([rid, "invoke", "cobol", b"", {}], rid)
    finally:
        client.close()
