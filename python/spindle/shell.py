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
``EPIPE`` as with a local pipe. When the command exits, processes it left behind in the
background are killed (the worker is their subreaper), as a FaaS sandbox is frozen when its
function returns.
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
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable, Dict, List, Optional

import msgpack

from spindle import client as _client_mod
from spindle.errors import ObjectNotFound

CHUNK = 64 << 10  # largest item put in a stream or pipe queue
PARTIAL_LINE_WAIT = 0.02  # seconds a partial line waits for its end before it goes anyway
POLL = 0.1  # seconds between checks of a pump's stop flag
# After the command exited (and its leftovers were killed), how long the pumps may take to
# reach end of file before they stop reading (a process outside our reach holds the pipe).
DRAIN_GRACE = 2.0

_PR_SET_CHILD_SUBREAPER = 36
# Worker variables a command does not need (the id is a one-time secret already used).
_PRIVATE_ENV = ("SPINDLE_WORKER_ID", "SPINDLE_CAPTURE", "SPINDLE_MAX_FRAME", "SPINDLE_COMMANDS")

_helpers: Optional[ThreadPoolExecutor] = None
_subreaper = False


class BrokenPipe(Exception):
    """The queue at the other end of a stream is gone."""


def _pool() -> ThreadPoolExecutor:
    """Threads for pumps and copiers, kept across tasks (each keeps its connection)."""
    global _helpers
    if _helpers is None:
        _helpers = ThreadPoolExecutor(max_workers=3, thread_name_prefix="spindle-shell")
    return _helpers


def _become_subreaper() -> None:
    """Orphans of our commands become our children, so leftovers can be found and killed."""
    global _subreaper
    if _subreaper:
        return
    _subreaper = True
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: leftovers are not reaped
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
    Closes ``fd``: a writer still writing then gets ``SIGPIPE``."""
    buf = bytearray()
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    try:
        eof = False
        while not eof:
            wait = PARTIAL_LINE_WAIT if buf else POLL
            if not poller.poll(wait * 1000):
                if buf:
                    emit(bytes(buf))
                    buf.clear()
                if stop.is_set():
                    break
                continue
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
            if stop.is_set():
                break
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


def _copy_stdin(key: str, pipe: Any) -> None:
    """The pipe queue ``key`` into the command's stdin, until nil (end of file), a command
    that stopped reading (the queue is deleted: the writer upstream gets a broken pipe), or
    a deleted queue (the writer died, or the command ended first)."""
    fd = pipe.fileno()
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
                view = view[os.write(fd, view):]
    except (BrokenPipeError, OSError):
        _delete(key)
    finally:
        try:
            pipe.close()
        except OSError:
            pass


# -- leftovers ----------------------------------------------------------------------------------


def _children(pid: str = "self") -> List[int]:
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


def _kill_leftovers() -> None:
    """Kill the processes a finished command left behind (and reap them)."""
    for _ in range(200):
        kids = _children()
        if not kids:
            return
        tree: List[int] = []
        todo = list(kids)
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo.extend(_children(str(pid)))
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        time.sleep(0.001)


# -- the task -----------------------------------------------------------------------------------


def _fs() -> str:
    fs = os.environ.get("SPINDLE_FS") or os.path.join(tempfile.gettempdir(), "spindle-fs")
    os.makedirs(fs, exist_ok=True)
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


def run(payload: bytes) -> Dict[str, Any]:
    """Run one shell task; the worker adds the captured output to the report."""
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
    _become_subreaper()
    script_path = None
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
                stdout=subprocess.PIPE if (stream or stdout_key) else None,
                stderr=subprocess.PIPE if stream else None,
                cwd=_workdir(fs, spec.get("cwd")),
                env=_environment(spec.get("env")),
            )
        except OSError as exc:
            return _failed(type(exc).__name__, f"cannot run bash: {exc}", start)
        return _supervise(proc, stream, stdin_key, stdout_key, start)
    finally:
        if script_path is not None:
            try:
                os.unlink(script_path)
            except OSError:
                pass


def _supervise(proc: subprocess.Popen, stream: Optional[str], stdin_key: Optional[str],
               stdout_key: Optional[str], start: float) -> Dict[str, Any]:
    pool = _pool()
    stop = threading.Event()
    pumps: List[Future] = []
    if proc.stdout is not None:
        fd = os.dup(proc.stdout.fileno())
        proc.stdout.close()
        if stdout_key:
            pumps.append(pool.submit(_pump_to_pipe, fd, stdout_key, stop))
        else:
            pumps.append(pool.submit(_pump_to_stream, fd, 1, stream, stop))
    if proc.stderr is not None:
        fd = os.dup(proc.stderr.fileno())
        proc.stderr.close()
        pumps.append(pool.submit(_pump_to_stream, fd, 2, stream, stop))
    copier = pool.submit(_copy_stdin, stdin_key, proc.stdin) if stdin_key else None
    _, status, usage = os.wait4(proc.pid, 0)
    duration = time.perf_counter() - start
    proc.returncode = _exit_status(status)
    _kill_leftovers()
    if copier is not None:
        if not copier.done():
            _delete(stdin_key)  # the command stopped reading: a broken pipe upstream
        copier.result()
    deadline = time.monotonic() + DRAIN_GRACE
    for pump in pumps:
        try:
            pump.result(max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            stop.set()
    for pump in pumps:
        pump.result()
    if stream:
        try:
            _put(stream, None)
        except BrokenPipe:
            pass
    return {
        "ok": True,
        "result": proc.returncode,
        "error": None,
        "duration": duration,
        "peak_rss": usage.ru_maxrss * 1024,
    }
