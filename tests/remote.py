"""Functions the compute tests run on the gateway's workers.

They live in this small module (not in the test files) so that workers import them, by
reference, without importing pytest or the tests.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any, List

import spindle


def square(x: int) -> int:
    return x * x


def identity(x: Any) -> Any:
    return x


def add_to(counter: spindle.Counter, n: int) -> int:
    for _ in range(n):
        counter.increment()
    return counter.get()


def fail(message: str) -> None:
    raise ValueError(message)


def exit_with(status: int) -> None:
    sys.stdout.write("about to exit\n")
    sys.stdout.flush()
    os._exit(status)


def segfault() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


def sleep_for(seconds: float) -> str:
    time.sleep(seconds)
    return "slept"


def hog_memory(megabytes: int, hold: float) -> str:
    """Allocate and touch ``megabytes`` MiB, then wait to be killed for it."""
    block = bytearray(megabytes << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(hold)
    return f"not killed holding {len(block) >> 20} MiB"


def fork_sharing(megabytes: int, children: int) -> str:
    """Touch ``megabytes`` MiB, then fork ``children`` that share it copy-on-write and wait."""
    block = bytearray(megabytes << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    pids = []
    for _ in range(children):
        pid = os.fork()
        if pid == 0:
            time.sleep(2)
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    return f"{children} children shared {len(block) >> 20} MiB"


def chatter(n: int) -> int:
    print(f"hello {n}")
    print(f"oops {n}", file=sys.stderr)
    sys.stdout.flush()
    os.system(f"echo from-a-subprocess-{n}")  # fd-level capture: a child's output too
    os.write(1, f"raw-fd-write-{n}\n".encode())
    return n


def flood(total: int) -> str:
    chunk = b"y" * (1 << 20)
    written = 0
    while written < total:
        written += os.write(1, chunk[: total - written])
    return "flooded"


def block_on(started: spindle.Semaphore, release: spindle.Event) -> str:
    """Tell ``started``, then wait for ``release``."""
    started.release()
    if not release.wait(120):
        return "never released"
    return "released"


def wait_event(release: spindle.Event) -> bool:
    return release.wait(120)


def meet(barrier: spindle.Barrier, timeout: float) -> int:
    return barrier.wait(timeout)


def whoami(i: int) -> List[Any]:
    """``[i * i, the session this invocation runs as, pid]``."""
    return [i * i, spindle.client.current().session, os.getpid()]


def add_then_fail_once(counter: spindle.Counter, marker: str, how: str) -> int:
    """Add 1 to ``counter``; the first attempt then fails (``how``); a retry returns it."""
    counter.add(1)
    if not os.path.exists(marker):
        with open(marker, "w"):
            pass
        if how == "raise":
            raise RuntimeError("first attempt fails")
        os._exit(7)
    return counter.get()


def count_attempt_and_fail(path: str) -> None:
    with open(path, "a") as f:
        f.write("attempt\n")
    raise RuntimeError("always fails")


def blob_length(blob: spindle.Blob) -> int:
    return len(blob.get())


def nested_thread_count() -> int:
    return threading.active_count()


class Unpicklable(Exception):
    """An exception whose instances cannot be unpickled (a required argument is lost)."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"a={a}")


def raise_unpicklable() -> None:
    raise Unpicklable(1, 2)


def return_a_lock() -> Any:
    return threading.Lock()


def sleep_then_add(seconds: float, counter) -> None:
    time.sleep(seconds)
    counter.add(1)


def print_then_sleep(text: str, seconds: float) -> None:
    print(text, flush=True)
    time.sleep(seconds)


def raise_huge(size: int) -> None:
    raise ValueError(b"x" * size)


def escape(megabytes: int, hold: float, pidfile: str) -> int:
    """Double-fork a process of its own session (out of this worker's process group and, but
    for a subreaper, out of its tree) that writes its pid to ``pidfile``, touches ``megabytes``
    MiB and lives on; wait ``hold`` seconds, and return the pid."""
    read, write = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(pidfile, "w") as f:
                f.write(str(os.getpid()))
            block = bytearray(megabytes << 20)
            for i in range(0, len(block), 4096):
                block[i] = 1
            os.write(write, f"{os.getpid()}\n".encode())
            time.sleep(3600)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        line = pipe.readline()  # once it holds its memory
    if not line:
        # It died first (the kernel's OOM killer, in the worker's cgroup): the gateway kills
        # this worker for it too, as for the memory it held; this reply would be a lie.
        time.sleep(hold)
        raise RuntimeError("the escaped process died, and this worker was not killed for it")
    time.sleep(hold)
    return int(line)


def escape_then_exit(pidfile: str) -> None:
    """Double-fork a process that lives on (``escape``), then end this worker by itself."""
    escape(0, 0, pidfile)
    os._exit(3)


def own_cgroup() -> dict:
    """This process's cgroups, by controller (``/proc/self/cgroup``)."""
    with open("/proc/self/cgroup") as f:
        return {controllers: path for _, controllers, path in (line.rstrip("\n").split(":", 2) for line in f)}


def fork_until_refused(most: int) -> List[int]:
    """Start sleeping children until the kernel refuses a fork (or ``most`` of them): a fork
    bomb with a bound. Returns their pids; the last item is -1 when a fork was refused."""
    pids: List[int] = []
    for _ in range(most):
        try:
            pid = os.fork()
        except BlockingIOError:
            return pids + [-1]
        if pid == 0:
            time.sleep(3600)
            os._exit(0)
        pids.append(pid)
    return pids


def _trip(path: str) -> "Tripwire":
    with open(path, "w") as f:
        f.write("tripped")
    return Tripwire(path)


class Tripwire:
    """A value whose unpickling writes the file at ``path``: a planted pickle's payload."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (_trip, (self.path,))


def read_item(name: str, key: str) -> str:
    """Read ``key`` of the Dict ``name`` in a function: what became of it."""
    try:
        return repr(spindle.Dict(name=name)[key])
    except spindle.UntrustedValue as exc:
        return f"refused: {exc.writer}"


@spindle.shared
class Holder:
    """A user-defined object whose method takes any value: what its host made of it."""

    def take(self, value: Any) -> str:
        return type(value).__name__


def shout(i: int) -> int:
    print(f"shout {i}")
    return i


def fail_at(i: int, bad: int) -> int:
    if i == bad:
        raise ValueError(f"task {i} failed")
    return i


@spindle.transactional
def _move(src: spindle.Counter, dst: spindle.Counter, amount: int) -> bool:
    if src.get() < amount:
        return False
    src.add(-amount)
    dst.add(amount)
    return True


def transfer_many(accounts: List[spindle.Counter], n: int, seed: int) -> int:
    """``n`` random transactional transfers between ``accounts``; how many moved money."""
    import random

    rng = random.Random(seed)
    return sum(_move(*rng.sample(accounts, 2), rng.randint(1, 50)) for _ in range(n))
