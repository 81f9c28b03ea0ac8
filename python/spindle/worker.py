"""A function worker: ``python -m spindle.worker``, started by the server's gateway.

docs/protocol.md ("Workers"): the worker connects to ``$SPINDLE_ADDRESS``, says
``[id, "worker", {"id": $SPINDLE_WORKER_ID, "pid": ..., "runtime": "python"}]`` and then
answers the gateway's ``[task_id, "run", payload, options]`` requests one at a time with
``[task_id, 0, report]``. The payload is a cloudpickle of ``(function, args, kwargs)``, or,
when the task's options say ``"runtime": "shell"``, a shell command (spindle/shell.py).

The process is also an ordinary Spindle client (``spindle.connect``), so the objects a
function uses reach the same server as its caller's.

Output capture works at the file-descriptor level: fds 1 and 2 point, for the worker's whole
life, at two unlinked append-only temporary files. After each task the worker reads at most
``OUTPUT_LIMIT`` bytes of each and empties them, so output written by C code and by
subprocesses is captured too, and a function printing gigabytes costs disk, not memory: at
most ``MAX_CALL_OUTPUT`` bytes of it (the server's ``--max-call-output``), cut as it comes
(live_output.py).
The gateway opens these files itself and says so with ``SPINDLE_CAPTURE=fds``: then it can
read what a call wrote before its worker died, for the ``WorkerCrashed`` report.

While a task runs, what it writes also goes to the server as it comes (live_output.py); a
caller that asked for it live (option ``"live": true``) gets it only that way, so the report
then carries no ``stdout``/``stderr``. The task runs with the thread's name set to its
``label``, so ``threading.current_thread().name`` is its ``spindle.Thread``'s name.
"""

from __future__ import annotations

import os
import pickle
import resource
import socket
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

import cloudpickle
import msgpack

import spindle
from spindle import client as _client_mod
from spindle import lost_updates
from spindle.client import Connection, parse_address
from spindle.compute.invoker import Scoped
from spindle.live_output import LiveOutput, truncation_marker

OUTPUT_LIMIT = 1 << 20  # bytes kept per stream and task (docs/protocol.md)
# Bytes of a task's output the capture files hold per stream (0: no cap).
MAX_CALL_OUTPUT = int(os.environ.get("SPINDLE_MAX_CALL_OUTPUT", 0))
# The largest report frame the server reads, and what a report needs besides result and
# output (keys, numbers, framing).
MAX_FRAME = int(os.environ.get("SPINDLE_MAX_FRAME", 64 << 20))
REPORT_OVERHEAD = 4 << 10
# An error's message and traceback are cut to this when a report would not fit otherwise.
ERROR_TEXT_LIMIT = 8 << 10

# Whether to look for lost updates (spindle/lost_updates.py): on unless the server's
# environment says SPINDLE_LOST_UPDATES=0 (bench/ml.py measures the check's cost that way).
CHECK_LOST_UPDATES = os.environ.get("SPINDLE_LOST_UPDATES", "1").strip() != "0"

# Values pickled with the C pickler directly (cloudpickle is slower and not needed).
_PLAIN = (type(None), bool, int, float, str, bytes)

_pack = msgpack.Packer(use_bin_type=True).pack
_perf = time.perf_counter
_getrusage = resource.getrusage
_RUSAGE_SELF = resource.RUSAGE_SELF


class Capture:
    """fds 1 and 2 redirected, for good, into two unlinked append-only files."""

    def __init__(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        # Append-only: whoever writes (we, C code, subprocesses sharing the fd) writes at
        # the end, which is offset 0 again after each truncation.
        if os.environ.get("SPINDLE_CAPTURE") == "fds":  # the gateway's files, already fds 1/2
            self.files = [os.dup(1), os.dup(2)]
        else:
            self.files = [self._append_only_file(t) for t in (1, 2)]
        self.saved_stderr = os.dup(2)  # the worker's own, for its own failures
        for target, fd in zip((1, 2), self.files):
            os.dup2(fd, target)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)  # a function reading stdin gets EOF, not the gateway's pipe
        os.close(devnull)
        for stream in (sys.stdout, sys.stderr):
            try:  # each print reaches the file at once, to be sent as it comes
                stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
            except (AttributeError, ValueError):
                pass
        self.stdout, self.stderr = sys.stdout, sys.stderr
        self.inodes = [os.fstat(fd).st_ino for fd in self.files]
        self.live: Optional[LiveOutput] = None  # sends the rest before the files are emptied

    @staticmethod
    def _append_only_file(target: int) -> int:
        directory = tempfile.gettempdir()
        for _ in range(100):
            path = os.path.join(directory, f"spindle-worker-{os.getpid()}-{target}-{os.urandom(6).hex()}")
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
            except FileExistsError:
                continue
            os.unlink(path)
            return fd
        raise RuntimeError("could not create a capture file")

    def reset_streams(self) -> None:
        """Undo a function's rebinding of ``sys.stdout``/``sys.stderr`` or of fds 1/2."""
        if sys.stdout is not self.stdout:
            sys.stdout = self.stdout
        if sys.stderr is not self.stderr:
            sys.stderr = self.stderr

    def collect(self) -> Tuple[bytes, bytes, int]:
        """The output written since the last call (capped), and how many bytes were cut."""
        for stream in (self.stdout, self.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        if self.live is not None:
            self.live.finish()
        out: List[bytes] = []
        cut = sum(self.live.dropped) if self.live is not None else 0
        cap = MAX_CALL_OUTPUT
        for fd in self.files:
            size = os.fstat(fd).st_size
            if size == 0:
                out.append(b"")
                continue
            keep = min(size, OUTPUT_LIMIT, cap or size)
            data = os.pread(fd, keep, 0)
            if cap and size > cap and keep == cap:
                data += truncation_marker(cap)
            out.append(data)
            cut += size - keep
            os.ftruncate(fd, 0)
        return out[0], out[1], cut

    def check_fds(self) -> None:
        """Point fds 1 and 2 back at the capture files if a function moved them."""
        for target, fd, inode in zip((1, 2), self.files, self.inodes):
            try:
                moved = os.fstat(target).st_ino != inode
            except OSError:
                moved = True
            if moved:
                os.dup2(fd, target)


def _error_of(exc: BaseException) -> Dict[str, Any]:
    """``{"type", "message", "traceback"}`` of an exception raised by a function."""
    tb = exc.__traceback__
    # Drop the worker's own frame(s): the traceback starts in the user's function.
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    lines = traceback.format_exception(type(exc), exc, tb)
    try:
        message = str(exc)
    except Exception:  # a broken __str__
        message = f"<unprintable {type(exc).__name__}>"
    return {
        "type": type(exc).__qualname__,
        "message": message,
        "traceback": "".join(lines),
    }


def _pickle_exception(exc: BaseException) -> Optional[bytes]:
    """The exception pickled, or None when it cannot round-trip through pickle."""
    try:
        data = cloudpickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(data)  # some exceptions pickle but do not unpickle (required args)
        return data
    except BaseException:
        return None


def _pickle_result(value: Any) -> bytes:
    if type(value) in _PLAIN:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _call(fn: Any, args: Any, kwargs: Any) -> Any:
    """Call the function; a ``Scoped`` one runs in the session its caller chose for it."""
    if type(fn) is not Scoped:
        return fn(*args, **kwargs)
    with _client_mod.current().scope(fn.session):
        return fn.fn(*args, **kwargs)


def _error_size(result: Optional[bytes], error: Dict[str, Any]) -> int:
    return len(result or b"") + sum(len(v) for v in error.values() if isinstance(v, str))


def run_task(payload: bytes, capture: Capture, label: Optional[str] = None) -> Dict[str, Any]:
    """Run one task and return the worker-side report."""
    capture.reset_streams()
    start = _perf()
    ok = True
    error = None
    watched = None
    thread = threading.current_thread()
    if label:
        thread.name = label
    try:
        fn, args, kwargs = pickle.loads(payload)
        if CHECK_LOST_UPDATES:
            watched = lost_updates.watch(fn.fn if type(fn) is Scoped else fn, args)
        value = _call(fn, args, kwargs or {})
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the worker stays
        ok = False
        value = exc
    finally:
        thread.name = "MainThread"
    duration = _perf() - start
    lost = lost_updates.changed(watched) if watched is not None else None
    if ok:
        try:
            result = _pickle_result(value)
        except BaseException as exc:
            ok = False
            value = TypeError(f"cannot pickle the function's result ({type(value).__name__}): {exc}")
    if not ok:
        error = _error_of(value)
        result = _pickle_exception(value)
        value = None  # drop the traceback's frames now
    stdout, stderr, truncated = capture.collect()
    capture.check_fds()
    room = MAX_FRAME - REPORT_OVERHEAD - len(stdout) - len(stderr)
    if ok and len(result) > room:
        exc = ValueError(
            f"the function's result is {len(result):,} bytes, over the {max(room, 0):,} a reply "
            "can carry: store it in a spindle.Blob or spindle.Array (or a file) and return that"
        )
        ok, error, result = False, _error_of(exc), _pickle_exception(exc)
    if not ok and _error_size(result, error) > room:
        # Too big to send whole (a huge exception): the type and the cut text still go.
        result = None
        error = {k: (v[:ERROR_TEXT_LIMIT] + " ... (cut)" if isinstance(v, str) and len(v) > ERROR_TEXT_LIMIT
                     else v) for k, v in error.items()}
        if _error_size(result, error) > room:  # even that does not fit: drop the output
            stdout, stderr = b"", b""
    report = {
        "ok": ok,
        "result": result,
        "error": error,
        "stdout": stdout,
        "stderr": stderr,
        "truncated": truncated,
        "duration": duration,
        "peak_rss": _getrusage(_RUSAGE_SELF).ru_maxrss * 1024,
    }
    if lost:
        report["lost_updates"] = lost
    return report


def run_json(payload: bytes) -> Dict[str, Any]:
    """A registered function called with plain values (the ``json`` runtime, which the HTTP
    front end invokes: docs/http.md, "Functions"): the payload is the MessagePack array
    ``[function pickle, args, kwargs]``, and the report's ``value`` is the result as a plain
    value rather than a pickle (the caller is no Python program)."""
    start = _perf()
    try:
        code, args, kwargs = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        fn = pickle.loads(code)
        value = _call(fn, list(args), dict(kwargs or {}))
        size = len(_pack(value))  # a value the caller can read, or a TypeError naming what is not
        if size > MAX_FRAME - REPORT_OVERHEAD:
            raise ValueError(f"the function's result is {size:,} bytes, over what a reply can carry")
        report = {"ok": True, "result": None, "value": value}
    except BaseException as exc:  # a failing function fails its call, not the worker
        report = {"ok": False, "result": None, "error": _error_of(exc)}
    report.update(duration=_perf() - start, peak_rss=0)
    return report


def run_other(runtime: str, payload: bytes, options: Dict[str, Any], capture: Capture) -> Dict[str, Any]:
    """Run a task of another runtime than ``python`` (``shell``: spindle/shell.py; ``json``:
    a registered function, see ``run_json``)."""
    capture.reset_streams()
    if runtime == "shell":
        from spindle import shell  # imported on first use: Python workers start as fast

        try:
            report = shell.run(payload, options)
        except BaseException as exc:  # a bug of the runtime fails the task, not the worker
            report = {"ok": False, "result": None, "error": _error_of(exc), "duration": 0.0,
                      "peak_rss": 0}
    elif runtime == "json":
        report = run_json(payload)
    else:
        message = f"this worker runs no {runtime!r} functions"
        report = {"ok": False, "result": None, "duration": 0.0, "peak_rss": 0,
                  "error": {"type": "ValueError", "message": message, "traceback": ""}}
    stdout, stderr, truncated = capture.collect()
    capture.check_fds()
    report.update(stdout=stdout, stderr=stderr, truncated=truncated)
    return report


# The worker's output capture, once `serve` set it up (declared here, before any function
# that assigns it, as every Python compiler accepts).
_capture: Optional[Capture] = None


def announce(address: str, role: str, info: Dict[str, Any]) -> Connection:
    """Connect this process (a ``worker`` or object ``host`` the server started) and open
    the connection on which it says ``role`` and then serves the server's requests. The
    process's own client (for the objects its code uses) never starts a server of its own."""
    client = spindle.connect(address, embedded=False)
    host, port = parse_address(address)
    conn = Connection(host, port, client.session, next(client._seq), client.token,
                      user=client.user, tls=client.tls)
    hello_id = next(client._seq)
    reply = conn.roundtrip(_frame([hello_id, role, info]), hello_id)
    if reply[1] != 0:
        raise SystemExit(f"spindle {role}: the server refused this {role}: {reply[2]!r}")
    return conn


def serve(address: str, worker_id: str) -> None:
    """Connect, say ``worker``, and run tasks until the server closes the connection."""
    conn = announce(address, "worker", {"id": worker_id, "pid": os.getpid(), "runtime": "python"})
    global _capture
    capture = _capture = Capture()
    capture.collect()  # start-up chatter (import warnings, say) belongs to no call
    sock = conn.sock
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    read_body = conn.read_body
    unpack = msgpack.unpackb
    sendall = sock.sendall

    def send_output(task_id: int, stream: str, data: bytes) -> None:
        body = _pack([task_id, 2, {stream: data}])
        sendall(len(body).to_bytes(4, "big") + body)

    live = capture.live = LiveOutput(capture.files, OUTPUT_LIMIT, send_output, MAX_CALL_OUTPUT)
    while True:
        try:
            body = read_body()
        except (ConnectionError, OSError):
            return  # the server closed the connection: exit cleanly
        try:
            request = unpack(body, raw=False, strict_map_key=False)
            task_id, op = request[0], request[1]
        except Exception:
            continue
        if op == "run" and len(request) >= 3:
            reap_orphans()
            options = request[3] if len(request) > 3 and isinstance(request[3], dict) else {}
            runtime = options.get("runtime", "python")
            live.start(task_id)
            try:
                if runtime == "python":
                    label = options.get("label")
                    report = run_task(request[2], capture, label if isinstance(label, str) else None)
                else:
                    report = run_other(runtime, request[2], options, capture)
            finally:
                live.finish()
            if options.get("live") is True:  # the caller has it all already
                report["stdout"] = report["stderr"] = b""
            body = _pack([task_id, 0, report])
        elif op == "ping":
            body = _pack([task_id, 0, "pong"])
        else:
            body = _pack([task_id, 1, ["ProtocolError", f"a worker does not do {op!r}", None]])
        sendall(len(body).to_bytes(4, "big") + body)


def reap_orphans() -> None:
    """Reap the children that ended: this worker is a subreaper (the server makes it one), so
    what a call's processes orphaned becomes its child, and the server kills those at the
    end of the call. No call is running now, so no status is taken from a caller's own
    ``wait``."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _frame(request: List[Any]) -> bytes:
    body = _pack(request)
    return len(body).to_bytes(4, "big") + body


def main() -> None:
    address = os.environ.get("SPINDLE_ADDRESS")
    worker_id = os.environ.get("SPINDLE_WORKER_ID")
    if not address or not worker_id:
        sys.stderr.write(
            "spindle worker: SPINDLE_ADDRESS and SPINDLE_WORKER_ID must be set "
            "(workers are started by `spindle server`)\n"
        )
        raise SystemExit(2)
    try:
        serve(address, worker_id)
    except KeyboardInterrupt:
        pass
    except BaseException:  # a worker bug: say it where the gateway's operator sees it
        text = traceback.format_exc().encode("utf-8", "replace")
        fd = _capture.saved_stderr if _capture is not None else 2
        os.write(fd, b"spindle worker: " + text)
        os._exit(1)
    # Threads a function left running must not keep a worker alive without its server.
    os._exit(0)


if __name__ == "__main__":
    main()
