"""The ``shell`` runtime: a function that is a shell command (``spindle sh``).

docs/protocol.md ("The shell runtime"). The payload is a MessagePack map::

    {"command": str, "script": bin|nil, "args": [str]|nil, "stream": key|nil,
     "stdin": key|nil, "stdout": key|nil, "cwd": str|nil, "env": {str: str}|nil}

The worker runs ``bash -c COMMAND`` (or ``bash SCRIPT ARGS...`` when ``script`` is given) in
``$SPINDLE_FS`` (or the directory ``cwd`` names inside it), with the object commands
(``counter``, ``pipe``, ...: ``$SPINDLE_COMMANDS``) first on its ``PATH``. The report's
``result`` is the command's exit status (128 + N when a signal N killed it), ``ok`` is true
whenever the command ran.

Streams go through ``Queue`` objects of the state tier, with back-pressure (a full queue
blocks the pump, and so the command's writes):

- ``stream``: the command's stdout and stderr as items ``[fd, bin]`` (fd 1 or 2; chunks cut at
  line ends when possible, at most 64 KiB), then one ``nil`` once both are at end of file.
- ``stdout``: instead, stdout goes to this queue in the pipe encoding (``bin`` chunks of at
  most 64 KiB, then ``nil``), for the next stage of a pipe; stderr still goes to ``stream``.
- ``stdin``: a queue in the pipe encoding copied into the command's stdin.

A queue that disappears (``NotFound``: the client deleted it, or the reader at the other end
went away) is a broken pipe: the pump closes its end, so the command gets ``SIGPIPE`` or
``EPIPE`` as with a local pipe. A pump stops only at the end of its pipe (or at a broken
pipe): back-pressure never drops output.

The command runs in a session (and process group) of its own. When it exits, the processes it
left behind in the background are killed, as a FaaS sandbox is frozen when its function
returns: those of its session, and those that left it (``setsid``) but carry this task's mark
in their environment (``SPINDLE_SHELL_TASK``); the worker is their subreaper while the task
runs, so orphans stay in its tree. Nothing else is touched: the children of Python tasks run
by the same worker are not the shell's, and only the pids killed are reaped.

A detached task (the invoke option ``detach``, ``spindle sh --async``) without a stream sends
the command's output to /dev/null: nobody reads its report.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Set

import msgpack

from spindle import client as _client_mod
from spindle.errors import ObjectNotFound

CHUNK = 64 << 10  # largest item put in a stream or pipe queue
PARTIAL_LINE_WAIT = 0.02  # seconds a partial line waits for its end before it goes anyway
POLL = 0.1  # seconds between checks of a helper's stop flag
# Once the command and its leftovers are gone, how long a pump waits, idle, for data on a
# pipe that is not at its end (a process outside our reach holds it open) before it stops.
# Never applies to data already in the pipe: that is read to the end, however slowly the
# stream's reader takes it.
DRAIN_GRACE = 2.0

_PR_SET_CHILD_SUBREAPER = 36
# The variable marking the processes of one task (see _kill_leftovers).
TASK_MARK = "SPINDLE_SHELL_TASK"
# Worker variables a command does not need (the id is a one-time secret already used).
_PRIVATE_ENV = ("SPINDLE_WORKER_ID", "SPINDLE_CAPTURE", "SPINDLE_MAX_FRAME", "SPINDLE_COMMANDS",
                "SPINDLE_MAX_CALL_OUTPUT")

_helpers: Optional[ThreadPoolExecutor] = None


class BrokenPipe(Exception):
    """The queue at the other end of a stream is gone."""


def _pool() -> ThreadPoolExecutor:
    """Threads for pumps and copiers, kept across tasks (each keeps its connection). A task
    waits for all of its helpers before it ends, so the next task finds them free."""
    global _helpers
    if _helpers is None:
        _helpers = ThreadPoolExecutor(max_workers=3, thread_name_prefix="spindle-shell")
    return _helpers


def _set_subreaper(on: bool) -> None:
    """While a shell task runs, orphans of its command become the worker's children, so its
    leftovers can be found (a Python task's orphans go to init as usual)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: leftovers are found in the session only
        pass


# -- the state tier ----------------------------------------------------------------------------


def _put(key: str, item: Any) -> None:
    """A blocking ``put``; a missing queue is a broken pipe."""
    try:
        _client_mod.current().call("Queue", key, "put", [item])
    except ObjectNotFound as exc:
        raise BrokenPipe(str(exc)) from None


def _get(key: str) -> Any:
    """A blocking ``get`` with ``seq = 0``: its reply (up to 64 KiB) is not kept by the server
    for exactly-once resends, which a stream read once has no use for."""
    client = _client_mod.current()
    rid = next(client._seq)
    return client.request([rid, "call", 0, threading.get_ident(), "Queue", key, "get", []], rid)


def _delete(key: str) -> None:
    try:
        _client_mod.current().delete(key)
    except Exception:
        pass


# -- pumps ------------------------------------------------------------------------------------


def _pump(fd: int, emit: Callable[[bytes], None], stop: threading.Event) -> None:
    """Read ``fd`` to its end and ``emit`` what comes, in chunks of at most ``CHUNK`` bytes cut
    after a newline when there is one (a partial line goes after ``PARTIAL_LINE_WAIT``).

    Only the end of ``fd`` (or a broken pipe: ``emit`` raising ``BrokenPipe``) ends the copy,
    however long ``emit`` blocks on back-pressure. ``stop`` says the command and its leftovers
    are gone: from then on, ``DRAIN_GRACE`` seconds of silence on a pipe that is not at its
    end (someone outside our reach holds it) end it too. Closes ``fd``: a writer still writing
    then gets ``SIGPIPE``."""
    buf = bytearray()
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    idle_since: Optional[float] = None
    try:
        eof = False
        while not eof:
            if not poller.poll((PARTIAL_LINE_WAIT if buf else POLL) * 1000):
                if buf:  # a partial line waited long enough
                    emit(bytes(buf))
                    buf.clear()
                elif stop.is_set():  # idle: nothing in the pipe, and no end yet
                    now = time.monotonic()
                    if idle_since is None:
                        idle_since = now
                    elif now - idle_since >= DRAIN_GRACE:
                        break
                continue
            idle_since = None
            data = os.read(fd, CHUNK)
            if not data:
                break
            buf += data
            while len(buf) < CHUNK and poller.poll(0):  # take what is there already
                data = os.read(fd, CHUNK - len(buf))
                if not data:
                    eof = True
                    break
                buf += data
            while len(buf) >= CHUNK:
                cut = buf.rfind(b"\n", 0, CHUNK) + 1 or CHUNK
                emit(bytes(buf[:cut]))
                del buf[:cut]
            cut = buf.rfind(b"\n") + 1
            if cut:
                emit(bytes(buf[:cut]))
                del buf[:cut]
        if buf:
            emit(bytes(buf))
    except BrokenPipe:
        pass
    finally:
        os.close(fd)


def _pump_to_pipe(fd: int, key: str, stop: threading.Event) -> None:
    """stdout into the next stage's pipe queue: bin chunks, then nil."""
    try:
        _pump(fd, lambda chunk: _put(key, chunk), stop)
        _put(key, None)
    except BrokenPipe:
        pass


def _pump_to_stream(fd: int, which: int, key: str, stop: threading.Event) -> None:
    _pump(fd, lambda chunk: _put(key, [which, chunk]), stop)


def _copy_stdin(key: str, fd: int, stop: threading.Event) -> None:
    """The pipe queue ``key`` into the command's stdin (``fd``, non-blocking), until nil (end
    of file), a command that stopped reading (a broken pipe: the queue is deleted, so the
    writer upstream gets one too), a deleted queue (the writer died, or the command ended
    first), or ``stop`` (the command and its leftovers are gone) while a write waits.
    Closes ``fd``."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    try:
        while True:
            try:
                item = _get(key)
            except ObjectNotFound:
                return
            if item is None:
                return
            view = memoryview(item)
            while view:
                if not poller.poll(POLL * 1000):
                    if stop.is_set():  # nobody of ours reads it any more
                        _delete(key)
                        return
                    continue
                view = view[os.write(fd, view):]
    except OSError:  # EPIPE: the command closed its stdin
        _delete(key)
    finally:
        os.close(fd)


# -- leftovers ----------------------------------------------------------------------------------


def _children(pid: int) -> List[int]:
    out: List[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(p) for p in f.read().split())
        except (OSError, ValueError):
            pass
    return out


def _session(pid: int) -> Optional[int]:
    """The session id of ``pid`` (from /proc/PID/stat), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[3])  # state, ppid, pgrp, session
    except (OSError, ValueError, IndexError):
        return None


def _marked(pid: int, mark: bytes) -> bool:
    """Whether ``pid``'s environment carries this task's mark."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return mark in b"\0" + f.read()
    except OSError:
        return False


def _kill_leftovers(session: int, mark: bytes, killed: Set[int]) -> None:
    """Kill what the command (the leader of session ``session``, exited but not reaped yet)
    left behind, and reap it.

    Ours are the worker's descendants in that session, or outside it (``setsid``) with the
    task's ``mark`` in their environment, or killed already (``killed``: zombies have no
    environment left). A process in the worker's own session is never ours (a process cannot
    join another session than its own or a new one): Python tasks' children stay. Only the pids
    killed are reaped, one by one, never ``waitpid(-1)``."""
    me = os.getpid()
    own = _session(me)
    for _ in range(1000):
        ours: List[int] = []
        todo = _children(me)
        while todo:
            pid = todo.pop()
            sid = _session(pid)
            if sid is None or sid == own:
                continue  # gone, or not ours (and neither are its children)
            if pid == session:  # the command itself: exited, reaped by our caller
                todo.extend(_children(pid))
                continue
            if pid in killed or sid == session or _marked(pid, mark):
                ours.append(pid)
            todo.extend(_children(pid))
        if not ours:
            return
        try:
            os.killpg(session, signal.SIGKILL)
        except OSError:
            pass
        for pid in ours:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            killed.add(pid)
        for pid in _children(me):
            if pid in killed:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        killed.discard(pid)
                except ChildProcessError:
                    killed.discard(pid)
        time.sleep(0.001)


# -- the task -----------------------------------------------------------------------------------


def _fs() -> str:
    """The gateway exports SPINDLE_FS; elsewhere, the server's default."""
    fs = os.environ.get("SPINDLE_FS") or os.path.join(tempfile.gettempdir(), f"spindle-fs-{os.getuid()}")
    os.makedirs(fs, mode=0o700, exist_ok=True)
    return os.path.realpath(fs)


def _workdir(fs: str, cwd: Optional[str]) -> str:
    """``cwd`` when it is a directory inside SPINDLE_FS (absolute, or relative to it), else
    SPINDLE_FS itself."""
    if not cwd:
        return fs
    path = os.path.realpath(os.path.join(fs, cwd))
    if (path == fs or path.startswith(fs.rstrip(os.sep) + os.sep)) and os.path.isdir(path):
        return path
    return fs


def _environment(extra: Any) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _PRIVATE_ENV}
    commands = os.environ.get("SPINDLE_COMMANDS")
    if commands:
        env["PATH"] = commands + os.pathsep + env.get("PATH", os.defpath)
    if isinstance(extra, dict):
        env.update({str(k): str(v) for k, v in extra.items() if v is not None})
    return env


def _failed(kind: str, message: str, start: float) -> Dict[str, Any]:
    return {
        "ok": False,
        "result": None,
        "error": {"type": kind, "message": message, "traceback": ""},
        "duration": time.perf_counter() - start,
        "peak_rss": 0,
    }


def _exit_status(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def run(payload: bytes, options: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Run one shell task (``options``: the invoke's); the worker adds the captured output
    to the report."""
    start = time.perf_counter()
    try:
        spec = msgpack.unpackb(payload, raw=False)
        if not isinstance(spec, dict):
            raise ValueError("the payload must be a map")
        command = spec.get("command") or ""
        script = spec.get("script")
        args = [str(a) for a in spec.get("args") or []]
        stream, stdin_key, stdout_key = spec.get("stream"), spec.get("stdin"), spec.get("stdout")
        if not isinstance(command, str) or not (script is None or isinstance(script, bytes)):
            raise ValueError("command must be a string and script bytes or nil")
    except Exception as exc:
        return _failed("ValueError", f"bad shell payload: {exc}", start)
    # Nobody reads a detached task's report: output that goes to no stream goes nowhere
    # (not into the worker's capture files, which would grow as long as the command writes).
    unread = subprocess.DEVNULL if (options or {}).get("detach") is True else None
    mark = os.urandom(16).hex()
    env = _environment(spec.get("env"))
    env[TASK_MARK] = mark
    script_path = None
    _set_subreaper(True)
    try:
        if script is not None:
            fd, script_path = tempfile.mkstemp(prefix="spindle-sh-", suffix=".sh")
            with os.fdopen(fd, "wb") as f:
                f.write(script)
            argv = ["bash", script_path, *args]
        else:
            argv = ["bash", "-c", command, *(["spindle-sh", *args] if args else [])]
        fs = _fs()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if stdin_key else subprocess.DEVNULL,
                stdout=subprocess.PIPE if (stream or stdout_key) else unread,
                stderr=subprocess.PIPE if stream else unread,
                cwd=_workdir(fs, spec.get("cwd")),
                env=env,
                # Its own session: its leftovers are found, and killed, without touching the
                # worker's other children (a Python task's subprocesses).
                start_new_session=True,
            )
        except OSError as exc:
            return _failed(type(exc).__name__, f"cannot run bash: {exc}", start)
        return _supervise(proc, stream, stdin_key, stdout_key, f"\0{TASK_MARK}={mark}\0".encode(), start)
    finally:
        _set_subreaper(False)
        if script_path is not None:
            try:
                os.unlink(script_path)
            except OSError:
                pass


def _supervise(proc: subprocess.Popen, stream: Optional[str], stdin_key: Optional[str],
               stdout_key: Optional[str], mark: bytes, start: float) -> Dict[str, Any]:
    """Run the helpers (pumps, stdin copier) while the command runs; then kill its leftovers,
    wait for every helper and end the stream, whatever failed (the first failure is raised
    after that: the task never leaves a helper running into the next one)."""
    pool = _pool()
    stop = threading.Event()
    helpers: List[Future] = []
    copier: Optional[Future] = None
    failure: Optional[BaseException] = None
    try:
        if proc.stdout is not None:
            fd = os.dup(proc.stdout.fileno())
            proc.stdout.close()
            if stdout_key:
                helpers.append(pool.submit(_pump_to_pipe, fd, stdout_key, stop))
            else:
                helpers.append(pool.submit(_pump_to_stream, fd, 1, stream, stop))
        if proc.stderr is not None:
            fd = os.dup(proc.stderr.fileno())
            proc.stderr.close()
            helpers.append(pool.submit(_pump_to_stream, fd, 2, stream, stop))
        if proc.stdin is not None:
            fd = os.dup(proc.stdin.fileno())
            proc.stdin.close()
            os.set_blocking(fd, False)
            copier = pool.submit(_copy_stdin, stdin_key, fd, stop)
            helpers.append(copier)
        # Exited, but not reaped yet: its pid (its session's id) stays reserved meanwhile.
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    except BaseException as exc:
        failure = exc
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    duration = time.perf_counter() - start
    _kill_leftovers(proc.pid, mark, set())
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = _exit_status(status)
    stop.set()
    if copier is not None and not copier.done():
        _delete(stdin_key)  # the command stopped reading: a broken pipe upstream
    for helper in helpers:
        try:
            helper.result()
        except BaseException as exc:
            failure = failure or exc
    if stream:
        try:
            _put(stream, None)
        except BrokenPipe:
            pass
        except Exception as exc:
            failure = failure or exc
    if failure is not None:
        raise failure
    return {
        "ok": True,
        "result": proc.returncode,
        "error": None,
        "duration": duration,
        "peak_rss": usage.ru_maxrss * 1024,
    }
