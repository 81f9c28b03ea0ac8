"""The connection to a Spindle server: sessions, frames, retries (docs/protocol.md).

One synchronous socket per thread (so a call parked in the server blocks only its own
thread), all sharing the process's session id. Every call carries ``(session, seq)`` with
``seq`` from one process-wide counter, so a call resent after a reconnect is applied once,
and the lowest seq still waiting for its reply (``acked``, where the server's hello lists
it), so the server keeps only the replies of calls in flight. After ``fork`` the child gets a
fresh session and drops the inherited sockets unused.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import os
import select
import socket
import ssl
import threading
import time
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple, Union

from .codec import packb, set_user, unpackb
from .errors import (ObjectLost, ServerUnavailable, TLSError, TransactionError, Unauthorized, UntrustedValue,
                     error_from_reply)
from .sessions import new_secret, session_id, unnamed_key
from .embedded import EmbeddedServer

DEFAULT_ADDRESS = "127.0.0.1:7070"
PROTOCOL = 1
RETRIES = 5
FIRST_BACKOFF = 0.05
CONNECT_TIMEOUT = 5.0
# In a cluster, how long a call keeps looking for its shard's leader (an election, a node
# restart) before it gives up with ServerUnavailable.
FAILOVER_TIMEOUT = 30.0
# A call to a shard's leader that has waited this long (s) asks another node whether the
# shard's leader moved (its node may be paused or cut off), and again after as long.
LEADER_CHECK = 2.0
# In a cluster, how often (s) the presence thread checks its connection to every node.
PRESENCE_INTERVAL = 1.0

_get_ident = threading.get_ident


def shard_of(key: str, shards: int) -> int:
    """The shard holding ``key`` in a cluster of ``shards`` shards (the server's FNV-1a)."""
    h = 0xCBF29CE484222325
    for byte in key.encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h % shards


# What ``connect(tls=...)`` takes: a CA file, True (the system's CAs), False (plaintext), a
# context, or None (the environment decides).
TLSOption = Union[None, bool, str, "os.PathLike[str]", ssl.SSLContext]


def tls_context(
    ca: Optional[str] = None, cert: Optional[str] = None, key: Optional[str] = None
) -> ssl.SSLContext:
    """A TLS context for a Spindle server: trust the CA certificates in the file ``ca`` (the
    system's when None), and present the client certificate ``cert`` with its ``key`` (for
    servers with ``--tls-client-ca``). The server's certificate must name the host connected to."""
    context = ssl.create_default_context(cafile=ca)
    if cert or key:
        if not (cert and key):
            raise ValueError("a client certificate needs both cert and key (SPINDLE_TLS_CERT, SPINDLE_TLS_KEY)")
        context.load_cert_chain(cert, key)
    return context


def resolve_tls(tls: TLSOption = None) -> Optional[ssl.SSLContext]:
    """The context ``tls`` asks for; for None, ``$SPINDLE_TLS_CA`` (its presence means TLS),
    ``$SPINDLE_TLS_CERT`` and ``$SPINDLE_TLS_KEY``."""
    if isinstance(tls, ssl.SSLContext):
        return tls
    env = os.environ.get
    if tls is None:
        ca = env("SPINDLE_TLS_CA")
        return tls_context(ca, env("SPINDLE_TLS_CERT"), env("SPINDLE_TLS_KEY")) if ca else None
    if tls is False:
        return None
    ca = None if tls is True else os.fspath(tls)
    return tls_context(ca, env("SPINDLE_TLS_CERT"), env("SPINDLE_TLS_KEY"))


def parse_address(address: str) -> Tuple[str, int]:
    """``"host:port"`` (or ``"[v6]:port"``) as ``(host, port)``."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"bad spindle address {address!r}: expected HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


class Connection:
    """One TCP connection, used by one thread at a time: send a frame, read its reply."""

    # `sent` and `intact` say whether an interrupted call left the stream in step: the whole
    # request went out, and no reply was cut in the middle.
    __slots__ = ("sock", "buf", "sent", "intact", "address", "hello", "__weakref__")

    def __init__(
        self, host: str, port: int, secret: str, hello_id: int, token: Optional[str] = None,
        timeout: Optional[float] = None, user: Optional[str] = None,
        tls: Optional[ssl.SSLContext] = None,
    ) -> None:
        # The hello, too, must be answered promptly: a paused node accepts connections (the
        # kernel does) but never answers them. ``timeout`` then applies to every read.
        sock = socket.create_connection((host, port), timeout=timeout or CONNECT_TIMEOUT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.buf = b""
        self.sent = self.intact = True
        try:
            if tls is not None:
                # The handshake, within the timeout; the certificate must name ``host``.
                self.sock = sock = tls.wrap_socket(sock, server_hostname=host)
            hello = {"client": session_id(secret), "secret": secret, "protocol": PROTOCOL}
            if token:
                hello["token"] = token
            if user:
                hello["user"] = user
            reply = self.roundtrip(frame([hello_id, "hello", hello]), hello_id)
        except ssl.SSLError as exc:
            sock.close()
            # A refused client certificate shows only on the first read (TLS 1.3).
            raise TLSError(
                f"TLS with {host}:{port} failed: {exc} (does the server speak TLS? is "
                "SPINDLE_TLS_CA the CA that signed its certificate? does it want a client "
                "certificate: SPINDLE_TLS_CERT and SPINDLE_TLS_KEY?)"
            ) from exc
        except BaseException:
            sock.close()
            raise
        if reply[1] != 0:
            sock.close()
            raise error_from_reply(reply[2])
        sock.settimeout(timeout)
        self.address = f"{host}:{port}"
        self.hello = reply[2] if isinstance(reply[2], dict) else {}
        # Pickles this process's own user wrote are its own to unpickle (codec's rule).
        user = self.hello.get("user")
        set_user(user if isinstance(user, str) else None)

    def roundtrip(
        self, data: bytes, req_id: int, moved: Optional[Callable[[], Optional[str]]] = None
    ) -> List[Any]:
        """Send one request frame and return its reply ``[id, status, result]``. With
        ``moved``, ask it every ``LEADER_CHECK`` seconds of waiting where the call should go
        instead, if anywhere (raising ``LeaderMoved`` with that address)."""
        self.sent = False
        self.sock.sendall(data)
        self.sent = True
        if moved is not None:
            self.sock.settimeout(LEADER_CHECK)
        try:
            while True:
                try:
                    reply = self._read()
                except socket.timeout:
                    if moved is None:
                        raise
                    leader = moved()
                    if leader:
                        raise LeaderMoved(
                            f"{self.address} no longer leads the call's shard (paused or cut off)", leader
                        ) from None
                    continue
                if reply[0] == req_id or (reply[0] == 0 and reply[1] == 1):
                    return reply
                # A reply to some other request id cannot happen with one call in flight;
                # skip it rather than hand it to the wrong caller.
        finally:
            if moved is not None:
                self.sock.settimeout(None)

    def _read(self) -> List[Any]:
        # Strict: a value that does not decode here is an error for the call that read it,
        # never a placeholder handed to the program (the frame is read whole either way).
        return unpackb(self.read_body(), strict=True)

    def read_body(self) -> bytes:
        """The body of the next frame from the server."""
        buf = self.buf
        recv = self.sock.recv
        while len(buf) < 4:
            chunk = recv(65536)
            if not chunk:
                raise ConnectionResetError("the spindle server closed the connection")
            buf += chunk
            self.buf = buf
        end = 4 + int.from_bytes(buf[:4], "big")
        if len(buf) >= end:
            self.buf = buf[end:]
            return buf[4:end]
        # A large reply: read the rest straight into one buffer (it is on its way: no
        # leader check in the middle of it).
        self.sock.settimeout(None)
        self.intact = False
        body = bytearray(end - 4)
        view = memoryview(body)
        have = len(buf) - 4
        view[:have] = buf[4:]
        while have < len(body):
            n = self.sock.recv_into(view[have:])
            if not n:
                raise ConnectionResetError("the spindle server closed the connection")
            have += n
        self.buf = b""
        self.intact = True
        return bytes(body)

    def close(self) -> None:
        try:
            self.sock.close()
        except (OSError, AttributeError):  # AttributeError: __init__ failed to connect
            pass

    __del__ = close  # a finished thread's connection closes with it


class Presence:
    """Idle connections of a client's live sessions to every node of a cluster, kept by a
    thread.

    A node knows a session is alive while one of its connections is open there. A node that
    becomes a shard's leader ends, after the session TTL, the shard's sessions it has not
    heard from (their clients may have died with the old leader, which would have ended
    them): so a live client makes itself known to every node, not only to those it calls,
    and to nodes that join later too (the thread reads the membership at each check). The
    sessions are the process's own and those of the invocations running in it
    (:meth:`Client.scope`).
    """

    def __init__(self, client: "Client") -> None:
        self._client = weakref.ref(client)  # the thread ends once the client is gone
        self.nodes: List[str] = list(client.nodes)
        self.conns: Dict[Tuple[str, str], Connection] = {}  # by (session, node)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="spindle-presence", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """End the thread; it closes the connections (within a second)."""
        self.stopped.set()

    def forget_in_child(self) -> None:
        """After a fork: close this process's copies of the sockets (the parent keeps them
        open, so no FIN is sent); the thread did not come along."""
        for conn in self.conns.values():
            conn.close()
        self.conns.clear()

    def _run(self) -> None:
        while not self.stopped.is_set():
            client = self._client()
            if client is None:
                break
            self._check(client)
            del client
            self.stopped.wait(PRESENCE_INTERVAL)
        for conn in self.conns.values():
            conn.close()

    def _check(self, client: "Client") -> None:
        for key, conn in list(self.conns.items()):
            if _peer_closed(conn.sock):  # a node that stopped, or left
                conn.close()
                del self.conns[key]
        self._read_members()
        wanted = {(session, node) for session in client.live_sessions() for node in self.nodes}
        for key in set(self.conns) - wanted:
            self.conns.pop(key).close()
        for session, node in sorted(wanted - set(self.conns)):
            if self.stopped.is_set():
                return
            host, port = parse_address(node)
            try:
                self.conns[(session, node)] = Connection(host, port, session, 1, client.token,
                                                         timeout=PRESENCE_INTERVAL, user=client.user,
                                                         tls=client.tls)
            except Exception:  # down, or refusing: try again on the next check
                pass

    def _read_members(self) -> None:
        """The cluster's nodes, from the first connected node that tells them."""
        for key, conn in list(self.conns.items()):
            try:
                reply = conn.roundtrip(frame([2, "cluster"]), 2)
            except Exception:  # no answer in time: the stream is out of step, so drop it
                conn.close()
                del self.conns[key]
                continue
            members = cluster_nodes(reply[2]) if reply[1] == 0 else []
            if members:
                self.nodes = sorted(set(members))
                return


def cluster_nodes(cluster: Any) -> List[str]:
    """The node addresses of a cluster map (the `cluster` request's answer)."""
    members = cluster.get("nodes") if isinstance(cluster, dict) else None
    return [str(address) for address in members.values()] if isinstance(members, dict) else []


def _peer_closed(sock: socket.socket) -> bool:
    """Whether an idle connection was closed by its peer (it never sends anything unasked,
    so a readable socket is at its end)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class LeaderMoved(ConnectionError):
    """The node a call waits on stopped leading the call's shard: a voter of the shard names
    a new leader (the call is resent there with its ``(client, seq)``)."""

    def __init__(self, message: str, leader: str) -> None:
        super().__init__(message)
        self.leader = leader


def frame(request: List[Any], ship: bool = False) -> bytes:
    """A request as one length-prefixed frame (``ship``: see ``codec.packb``)."""
    body = packb(request, ship)
    return len(body).to_bytes(4, "big") + body


class Calls:
    """A session's calls in flight, and the number of its next request.

    Each call tells the server the lowest seq still waiting for its reply (``acked``): the
    client holds the replies of all calls below it and never sends them again, so the server
    forgets them. A session that may make its calls again does not (``acknowledges=False``):
    a retried function invocation replays its earlier calls' recorded replies.
    """

    def __init__(self, acknowledges: bool = True) -> None:
        self.numbers = itertools.count(1)
        self.acknowledges = acknowledges
        self._lock = threading.Lock()
        # Seqs in the order taken, which is increasing: the first is the lowest. Ordered, as
        # its first key is found at once however many were removed before it (a dict scans
        # past the holes they leave).
        self._waiting: "collections.OrderedDict[int, None]" = collections.OrderedDict()

    def start(self) -> Tuple[int, int]:
        """A new call's seq, and the ``acked`` it sends (0: none); end it with ``done``."""
        if not self.acknowledges:
            return next(self.numbers), 0
        with self._lock:
            seq = next(self.numbers)
            acked = next(iter(self._waiting), seq)
            self._waiting[seq] = None
        return seq, acked

    def done(self, seq: int) -> None:
        """The call ``seq`` has its reply, or will never be sent again (0: none was taken)."""
        if self.acknowledges and seq:
            with self._lock:
                self._waiting.pop(seq, None)


class Transaction:
    """One attempt of a transaction of a session: its number there (from the session's seq
    counter) and its age (when its first attempt began, in microseconds; a retry keeps it,
    so it grows older than newcomers and gets through)."""

    __slots__ = ("number", "age", "touched", "shards")

    def __init__(self, number: int, age: int) -> None:
        self.number = number
        self.age = age
        # Whether a call was sent as part of it (else the server never heard of it).
        self.touched = False
        # In a cluster, the shards its calls went to: its commit names them.
        self.shards: Set[int] = set()


class _Session:
    """What a client's calls run as: the session's secret, its calls, its unnamed-object numbers
    and its connections (one per thread and node). ``scope`` swaps it whole, and a call reads
    it once, so a call that started before a scope ends as it began."""

    __slots__ = ("secret", "calls", "unnamed", "local", "conns")

    def __init__(self, identity: Tuple[str, Calls, "itertools.count[int]"]) -> None:
        self.secret, self.calls, self.unnamed = identity
        self.local = threading.local()
        # Weak: a thread's connection closes when the thread ends and drops its local.
        self.conns: "weakref.WeakSet[Connection]" = weakref.WeakSet()


def _new_identity() -> Tuple[str, Calls, "itertools.count[int]"]:
    """This process's session secret, calls and unnamed-object numbers."""
    return (new_secret(), Calls(), itertools.count(1))


# One session per process, kept across disconnect()/connect() and renewed after fork.
_identity = _new_identity()


class Client:
    """A process's link to one server or cluster: its session id, seq counter and
    per-thread sockets.

    ``address`` may list several nodes of a cluster (``"h1:p1,h2:p2"``); any one that answers
    will do. In a cluster each call goes straight to the leader of its object's shard: the
    client keeps the shard map, follows ``NotLeader`` redirects, and during a failover
    resends the call (same ``seq``, so it applies once) until a new leader answers.
    """

    def __init__(
        self, address: str, server: Optional[EmbeddedServer] = None, tls: TLSOption = None
    ) -> None:
        self.address = address
        self.nodes = [a.strip() for a in address.split(",") if a.strip()] or [DEFAULT_ADDRESS]
        self.host, self.port = parse_address(self.nodes[0])
        # Cluster mode: the shard count (0 for a single server) and each shard's leader.
        self.shards = 0
        self._leaders: Dict[int, str] = {}
        # Nodes that failed to answer, until when they are avoided.
        self._down: Dict[str, float] = {}
        self.server = server
        self.token = os.environ.get("SPINDLE_TOKEN") or None
        # Who this client is to the server (``None``: the default user, with the token).
        self.user = os.environ.get("SPINDLE_USER") or None
        self.tls = resolve_tls(tls)
        # (type, version) of the user-defined classes this client has sent with `define`.
        self.defined: Set[Tuple[str, str]] = set()
        self._new_session()
        # Whether the servers take `acked` (their hello lists it): unknown until the first
        # hello, and off for good once one does not (an older server refuses the operand).
        self._acks: Optional[bool] = None
        self._presence: Optional[Presence] = None  # started on learning it is a cluster
        self._presence_lock = threading.Lock()
        # The sessions of `scope`s running now (invocations of functions), with their depths.
        self._scoped: Dict[str, int] = {}

    def _new_session(self, identity: Optional[Tuple[str, Calls, "itertools.count[int]"]] = None) -> None:
        self._state = _Session(identity or _identity)
        if identity is None:
            self._own_session = self.session
        self._conns_lock = threading.Lock()

    @property
    def session(self) -> str:
        """The session's secret: only this client's connections give it (its id, which the
        server sees, is ``sessions.session_id`` of it)."""
        return self._state.secret

    @property
    def _seq(self) -> "itertools.count[int]":
        return self._state.calls.numbers

    @property
    def _local(self) -> threading.local:
        return self._state.local

    @contextlib.contextmanager
    def scope(self, session: str) -> Iterator[None]:
        """Run the body as the session ``session`` with call numbers starting again at 1.

        A function worker runs each invocation in the session its caller named, so a retried
        invocation makes the same ``(session, seq)`` calls and gets the recorded replies of
        those the failed attempt already made (exactly-once). The scope's connections are
        closed at its end.
        """
        saved = self._state
        self._new_session((session, Calls(acknowledges=False), itertools.count(1)))
        with self._presence_lock:
            self._scoped[session] = self._scoped.get(session, 0) + 1
        try:
            yield
        finally:
            self._close_connections()
            with self._presence_lock:
                if self._scoped.get(session, 0) > 1:
                    self._scoped[session] -= 1
                else:
                    self._scoped.pop(session, None)
            self._state = saved

    def live_sessions(self) -> List[str]:
        """This process's own session and those of the scopes running now."""
        with self._presence_lock:
            return [self._own_session, *self._scoped]

    def after_fork_in_child(self) -> None:
        """Fresh session; close our copies of the inherited sockets without sending on them."""
        for conn in list(self._state.conns):
            conn.close()  # the parent's copy stays open: no FIN is sent
        self._new_session()  # after _new_identity()
        self._presence_lock = threading.Lock()
        self._scoped = {}
        if self._presence is not None:  # the next connection starts this process's own
            self._presence.forget_in_child()
            self._presence = None

    def unnamed_key(self) -> str:
        """A fresh key for an unnamed object (see ``sessions.unnamed_key``)."""
        state = self._state
        return unnamed_key(state.secret, next(state.unnamed))

    # -- requests --------------------------------------------------------------------------

    def call(self, type_name: str, key: str, method: str, args: List[Any], ship: bool = False) -> Any:
        """Call ``method`` on the object ``(type_name, key)``; ``ship``: the arguments go to a
        shared object's method (see ``codec.packb``)."""
        txn = self._txn_item(key)

        def request(seq: int, acked: int) -> List[Any]:
            # `acked` is optional: a session that does not acknowledge sends the old shape.
            if txn is not None:
                return [seq, "call", seq, _get_ident(), type_name, key, method, args, acked, txn]
            return [seq, "call", seq, _get_ident(), type_name, key, method, args] + ([acked] if acked else [])

        return self._numbered(request, key, ship)

    def create(self, type_name: str, key: str, args: List[Any], owned: bool,
               ship: bool = False, persistent: bool = False) -> bool:
        txn = self._txn_item(key)

        def request(seq: int, acked: int) -> List[Any]:
            # Optional operands: ephemeral creates keep the old shape.
            if txn is not None:
                optional = [persistent, acked, txn]
            else:
                optional = [persistent, acked] if acked else [True] if persistent else []
            return [seq, "create", seq, _get_ident(), type_name, key, args, owned, *optional]

        return self._numbered(request, key, ship)

    # -- transactions (see transactions.py) ------------------------------------------------

    def begin(self, age: Optional[int] = None) -> Transaction:
        """Start a transaction on this thread: the session's calls it makes from now on are
        part of it until ``commit``, ``abort`` or ``end``. ``age``: a retried transaction's
        (see docs/transactions.md)."""
        state = self._state
        if not state.conns:
            self.ping()  # in a cluster, its calls need the shard map from the start
        txn = Transaction(next(state.calls.numbers), age if age is not None else time.time_ns() // 1000)
        state.local.txn = txn
        return txn

    def transaction(self) -> Optional[Transaction]:
        """The transaction this thread is in, if any."""
        return getattr(self._state.local, "txn", None)

    def end(self, txn: Transaction) -> None:
        """This thread's calls are no longer part of ``txn``."""
        if getattr(self._state.local, "txn", None) is txn:
            self._state.local.txn = None

    def commit(self, txn: Transaction) -> None:
        """Make ``txn``'s changes visible to all at once, or raise ``TransactionConflict``
        (and none is). A transaction that made no call has nothing to commit."""
        self.end(txn)
        if not txn.touched:
            return
        if self.shards and txn.shards:
            # The leader of its lowest shard coordinates; a retry goes to the same shard.
            shards = sorted(txn.shards)
            self._numbered(lambda seq, _: [seq, "commit", seq, txn.number, shards], None, shard=shards[0])
        else:
            self._numbered(lambda seq, _: [seq, "commit", seq, txn.number], None)

    def abort(self, txn: Transaction) -> None:
        """Drop ``txn``: nothing it did is ever visible."""
        self.end(txn)
        if not txn.touched:
            return
        # In a cluster each shard's leader holds its part.
        for shard in sorted(txn.shards) if self.shards else [None]:
            rid = next(self._seq)
            self.request([rid, "abort", txn.number], rid, shard=shard)

    def _txn_item(self, key: str) -> Optional[List[Any]]:
        """The ``txn`` item of a call on ``key`` on this thread: its transaction's, if any.
        Its ``first`` flag: its first call (on one server), or its first call in ``key``'s
        shard (in a cluster, where each shard's leader holds its part)."""
        txn = getattr(self._state.local, "txn", None)
        if txn is None:
            return None
        first = not txn.touched
        txn.touched = True
        if self.shards:
            shard = shard_of(key, self.shards)
            first = shard not in txn.shards
            txn.shards.add(shard)
        return [txn.number, txn.age, first]

    def define(self, type_name: str, version: str, code: bytes, key: Optional[str] = None) -> Any:
        """Register the code of a user-defined type (``py:...``: True) or a compiled one
        (``wasm:...``: its methods) under ``version``; in a cluster, on the node that leads
        ``key``'s shard (each node keeps its own classes)."""
        rid = next(self._seq)
        return self.request([rid, "define", type_name, version, code], rid, key=key)

    def delete(self, key: str) -> bool:
        txn = self._txn_item(key)
        return self._numbered(lambda seq, _: [seq, "delete", seq, key] + ([txn] if txn else []), key)

    def keep(self, type_name: str, key: str, name: Optional[str]) -> str:
        if self.transaction() is not None:
            # A rename is not undone by an abort, and an object created inside has no name yet.
            raise TransactionError("spindle.keep() cannot be part of a transaction: call it before or after")
        return self._numbered(lambda seq, _: [seq, "keep", seq, type_name, key, name], key)

    def _numbered(self, request: Callable[[int, int], List[Any]], key: Optional[str], ship: bool = False,
                  shard: Optional[int] = None) -> Any:
        """Send the call ``request(seq, acked)`` builds, as one of the session's calls in
        flight until it has its reply (so no other call acknowledges it meanwhile)."""
        state, seq = self._state, 0
        try:
            seq, acked = state.calls.start()
            return self.request(request(seq, acked if self._acks else 0), seq, ship, key, state, shard)
        finally:
            state.calls.done(seq)

    def objects(self, prefix: str = "", persistent: bool = False) -> List[Any]:
        """``[name, type]`` of the named objects under ``prefix``, sorted. In a cluster each
        node lists the shards it leads, so every node is asked (one that does not answer is
        skipped: its shards' new leaders list them once elected)."""
        rid = next(self._seq)
        request = [rid, "objects", prefix] + ([True] if persistent else [])
        found = {tuple(item) for item in self.request(request, rid)}
        answered = getattr(getattr(self._local, "conn", None), "address", None)
        for node in self.nodes if self.shards else []:
            if node != answered:
                found.update(tuple(item) for item in self._ask(node, request, CONNECT_TIMEOUT) or [])
        return [list(item) for item in sorted(found)]

    def _ask(self, node: str, request: List[Any], timeout: float) -> Any:
        """``request``'s result from ``node`` on a connection of its own, every read within
        ``timeout``; ``None`` if the node does not answer or refuses."""
        try:
            conn = Connection(*parse_address(node), self.session, next(self._seq), self.token,
                              timeout=timeout, user=self.user, tls=self.tls)
        except OSError:
            return None
        try:
            reply = conn.roundtrip(frame(request), request[0])
        except OSError:
            return None
        finally:
            conn.close()
        return reply[2] if reply[1] == 0 else None

    def status(self) -> Any:
        rid = next(self._seq)
        return self.request([rid, "status"], rid)

    def ping(self) -> Any:
        rid = next(self._seq)
        return self.request([rid, "ping"], rid)

    def cluster(self) -> Any:
        """The cluster map of the node this thread talks to (``ValueError`` on a single server)."""
        rid = next(self._seq)
        return self.request([rid, "cluster"], rid)

    def request(
        self, request: List[Any], req_id: int, ship: bool = False, key: Optional[str] = None,
        state: Optional[_Session] = None, shard: Optional[int] = None,
    ) -> Any:
        """Send ``request`` on this thread's connection (in a cluster: to the leader of
        ``key``'s shard, or of ``shard``) of ``state`` (the session now, by default); resend
        it after a lost connection or a redirect."""
        data = frame(request, ship)
        state = state or self._state
        local = state.local
        delay = FIRST_BACKOFF
        attempt = 0
        # In a cluster a keyed call names its node (the shard's leader, else the first node);
        # other requests use the thread's connection to the first node.
        routed = bool(self.shards) and (key is not None or shard is not None)
        if routed and shard is None:
            shard = shard_of(key, self.shards)
        address = self._leaders.get(shard, self.nodes[0]) if routed else None
        deadline = None
        failover = False  # the call saw a node fail or an election
        previous = None  # the node that redirected us last
        while True:
            conn = None
            try:
                conn = local.conn if address is None else local.others[address]
            except (AttributeError, KeyError):
                pass
            try:
                if conn is None:
                    conn = self._open(address, state)
                moved = None
                if routed and len(self.nodes) > 1:
                    moved = functools.partial(self._leader_moved, shard, conn)
                reply = conn.roundtrip(data, req_id, moved)
            # PermissionErrors and the like, so OSErrors, but final: a refused hello or
            # handshake; a reply read whole holding a pickle not unpickled.
            except (Unauthorized, TLSError, UntrustedValue):
                raise
            except OSError as exc:  # connection lost (or refused): reconnect and resend
                failed = conn.address if conn is not None else (address or self.nodes[0])
                if conn is not None:
                    self._drop(conn, state)
                if len(self.nodes) > 1:  # another node may lead now, or say which one does
                    deadline = deadline or time.monotonic() + FAILOVER_TIMEOUT
                    failover = True
                    self._failed(failed)
                    # Ask the new leader a voter named, else the next listed node: any member
                    # says where the shard's leader is.
                    if isinstance(exc, LeaderMoved):
                        address = exc.leader
                    else:
                        address = self._next_node(failed) if routed else None
                    if time.monotonic() < deadline:
                        time.sleep(min(delay, 0.5))
                        delay *= 2
                        continue
                    raise ServerUnavailable(f"no node of {self.address} answered: {exc}") from exc
                if attempt >= RETRIES:
                    raise ServerUnavailable(
                        f"spindle server at {self.address} is unavailable: {exc}"
                    ) from exc
                attempt += 1
                time.sleep(delay)
                delay *= 2
                continue
            except BaseException:  # interrupted mid-call (Ctrl-C, a signal handler raising)
                if conn is not None and not self._withdraw(conn, request):
                    self._drop(conn, state)
                raise
            if reply[1] == 0:
                return reply[2]
            error = reply[2]
            if reply[0] == 0 and isinstance(error, list) and error[:1] == ["Timeout"]:
                # The server closed this connection for its silence (--client-timeout) before
                # it read the call: a new connection sends it.
                self._drop(conn, state)
                continue
            if isinstance(error, list) and error and error[0] == "NotLeader":
                # Not this node's shard: go to its leader (or wait out an election).
                deadline = deadline or time.monotonic() + FAILOVER_TIMEOUT
                leader = error[2] if len(error) > 2 and isinstance(error[2], str) else None
                if leader and self._down.get(leader, 0.0) > time.monotonic() and time.monotonic() < deadline:
                    # It just failed us (the node redirecting here may not know yet): ask
                    # another node instead.
                    address = self._next_node(conn.address) if routed else None
                    time.sleep(0.02)
                    continue
                if routed:
                    if leader:
                        self._leaders[shard] = leader
                    else:
                        self._leaders.pop(shard, None)
                        failover = True
                if time.monotonic() < deadline:
                    if leader and leader != conn.address:
                        # Two nodes sending us to each other are mid-election: a short pause.
                        if leader == previous:
                            time.sleep(0.005)
                        previous, address = conn.address, leader
                    else:
                        time.sleep(0.02)  # an election: elections take tens of milliseconds
                    continue
            if isinstance(error, list) and error and error[0] == "FrameTooLarge":
                self._drop(conn, state)  # the server closes it
            if failover and isinstance(error, list) and error[:1] == ["NotFound"]:
                raise ObjectLost(
                    f"{error[1]}: the leader of its shard changed during the call, and an "
                    "ephemeral object lives on its shard's leader only (persistent=True keeps "
                    "an object through failovers)",
                    "its shard's leader changed",
                )
            raise error_from_reply(error)

    def _leader_moved(self, shard: int, waiting: Connection) -> Optional[str]:
        """The address of a new leader of ``shard``, if a voter of the shard names one other
        than the node behind ``waiting`` (nodes are asked with a short timeout, so a paused
        one is skipped; a node that does not vote on the shard may name a stale leader)."""
        waiting_node = waiting.hello.get("node")
        for node in self.nodes:
            if node == waiting.address:
                continue
            cluster = self._ask(node, [next(self._seq), "cluster"], LEADER_CHECK / 2)
            if not isinstance(cluster, dict):
                continue
            here = cluster.get("node")
            for group in cluster.get("groups", []):
                if group.get("shard") != shard or here not in (group.get("voters") or []):
                    continue
                leader, address = group.get("leader") or 0, group.get("leader_address")
                if leader and leader != waiting_node and address:
                    return str(address)
        return None

    def _next_node(self, after: str) -> str:
        """The listed node after ``after`` (round the list), skipping nodes that just failed."""
        nodes = self.nodes
        start = nodes.index(after) + 1 if after in nodes else 0
        now = time.monotonic()
        for i in range(len(nodes)):
            candidate = nodes[(start + i) % len(nodes)]
            if self._down.get(candidate, 0.0) <= now:
                return candidate
        return nodes[start % len(nodes)]

    def _failed(self, address: str) -> None:
        """``address`` did not answer: forget it as a leader, avoid it for a second, and if
        it is the first node, make the next one first."""
        self._down[address] = time.monotonic() + 1.0
        for shard, leader in list(self._leaders.items()):
            if leader == address:
                del self._leaders[shard]
        if address == self.nodes[0] and len(self.nodes) > 1:
            self.nodes.append(self.nodes.pop(0))
            self.host, self.port = parse_address(self.nodes[0])

    def _withdraw(self, conn: Connection, request: List[Any]) -> bool:
        """Take back an interrupted call so its connection stays usable.

        The server answers the parked call at once with its timeout result (which is read and
        dropped here), so the thread keeps its connection and with it the locks it holds;
        dropping the connection instead would release them behind the program's back.
        False when the stream is out of step (then the caller drops the connection).
        """
        if not (conn.sent and conn.intact) or request[1] != "call":
            return False
        withdraw_id = next(self._seq)
        try:
            reply = conn.roundtrip(frame([withdraw_id, "withdraw", request[0], request[5]]), withdraw_id)
        except BaseException:
            return False
        return reply[0] == withdraw_id and reply[1] == 0

    def _open(self, address: Optional[str] = None, state: Optional[_Session] = None) -> Connection:
        """A new connection of ``state`` (the session now, by default) for this thread, to
        ``address`` (``None``: the first node)."""
        state = state or self._state
        host, port = parse_address(address) if address is not None else (self.host, self.port)
        conn = Connection(host, port, state.secret, next(state.calls.numbers), self.token,
                          user=self.user, tls=self.tls)
        if address is None:
            state.local.conn = conn
        else:
            state.local.__dict__.setdefault("others", {})[address] = conn
        features = conn.hello.get("features")
        with self._conns_lock:
            state.conns.add(conn)
            if not (isinstance(features, list) and "acked" in features):
                self._acks = False
            elif self._acks is None:
                self._acks = True
        if conn.hello.get("shards") and not self.shards:
            self._load_map(conn)
        if self.shards and self._presence is None:
            with self._presence_lock:
                if self._presence is None:
                    self._presence = Presence(self)
        return conn

    def _load_map(self, conn: Connection) -> None:
        """Learn the cluster's nodes and shard leaders from the node behind ``conn``."""
        rid = next(self._seq)
        reply = conn.roundtrip(frame([rid, "cluster"]), rid)
        if reply[1] != 0 or not isinstance(reply[2], dict):
            return
        cluster = reply[2]
        for node in cluster_nodes(cluster):
            if node not in self.nodes:
                self.nodes.append(node)
        for group in cluster.get("groups", []):
            if group.get("leader_address"):
                self._leaders[group["shard"]] = group["leader_address"]
        self.shards = int(cluster.get("shards") or 0)

    def _drop(self, conn: Connection, state: Optional[_Session] = None) -> None:
        state = state or self._state
        if getattr(state.local, "conn", None) is conn:
            del state.local.conn
        others = getattr(state.local, "others", {})
        for address, other in list(others.items()):
            if other is conn:
                del others[address]
        with self._conns_lock:
            state.conns.discard(conn)
        conn.close()

    def close(self) -> None:
        """Close every connection of this client (the session ends after its TTL)."""
        with self._presence_lock:
            presence, self._presence = self._presence, None
        if presence is not None:
            presence.stop()
        self._close_connections()

    def _close_connections(self) -> None:
        state = self._state
        with self._conns_lock:
            conns, state.conns = list(state.conns), weakref.WeakSet()
        for conn in conns:
            conn.close()
        state.local = threading.local()


# -- the process's client ------------------------------------------------------------------

_client: Optional[Client] = None
_servers: List[EmbeddedServer] = []
_connect_lock = threading.RLock()


def _listening(host: str, port: int) -> bool:
    if port == 0:
        return False
    try:
        socket.create_connection((host, port), timeout=1.0).close()
        return True
    except OSError:
        return False


def connect(address: Optional[str] = None, *, embedded: bool = True, tls: TLSOption = None) -> Client:
    """Connect this process to a Spindle server and return the client.

    The server is ``address``, else ``$SPINDLE_ADDRESS``; with neither, a private embedded
    server is started on a free loopback port for the life of this program (as ``spindle
    run`` does), and ``$SPINDLE_ADDRESS`` is set so that the program's child processes and
    cloud functions find it. No other program finds that server by accident, and its exit
    takes down no other program's objects. Programs share a server explicitly: ``spindle
    server`` (port 7070 by default) and ``connect("auto")``, which takes ``$SPINDLE_ADDRESS``
    or else the server on 127.0.0.1:7070. An address where nothing listens is a
    :class:`ServerUnavailable` naming it (never a server started there). With
    ``embedded=False`` no server is ever started: no address means "auto" (the server's own
    workers and hosts must never start a server of their own). Calling it again returns the
    same client.

    ``tls`` reaches a server that speaks TLS: the path of the CA file that signed its
    certificate, ``True`` for the system's CAs, or an ``ssl.SSLContext`` (see
    :func:`tls_context`, for a client certificate); ``False`` is plaintext. By default
    ``$SPINDLE_TLS_CA`` decides (set: TLS with that CA, and the client certificate of
    ``$SPINDLE_TLS_CERT`` and ``$SPINDLE_TLS_KEY`` when set). The embedded server is plaintext,
    so a client asking for TLS never starts one.
    """
    global _client
    with _connect_lock:
        if _client is not None and (address is None or address == _client.address) and tls is None:
            return _client
        if _client is not None:
            disconnect()
        named = address or os.environ.get("SPINDLE_ADDRESS") or ("auto" if not embedded else None)
        server = None
        if named is None:
            if resolve_tls(tls) is not None:
                raise ServerUnavailable(
                    "no spindle server address for a TLS connection: set SPINDLE_ADDRESS or "
                    "pass one to connect() (an embedded server is plaintext)"
                )
            server = EmbeddedServer("127.0.0.1", 0)
            _servers.append(server)
            address = server.address
        else:
            address = _listening_server(named)
        client = Client(address, server, tls)
        client.ping()
        os.environ["SPINDLE_ADDRESS"] = address
        _client = client
        return client


def _listening_server(address: str) -> str:
    """``address`` (or what ``"auto"`` finds) if a server listens there, else a
    :class:`ServerUnavailable` naming it."""
    if address == "auto":
        found = os.environ.get("SPINDLE_ADDRESS") or DEFAULT_ADDRESS
        if found != "auto" and _listening(*parse_address(found.split(",")[0].strip())):
            return found
        raise ServerUnavailable(
            f"no running spindle server found for connect(\"auto\") at {found}: "
            "start one with `spindle server`, or set SPINDLE_ADDRESS"
        )
    nodes = [a.strip() for a in address.split(",") if a.strip()]
    if len(nodes) > 1:  # a cluster: any listed node will do
        if not any(_listening(*parse_address(n)) for n in nodes):
            raise ServerUnavailable(f"no node of the spindle cluster at {address} is available")
    elif not nodes or not _listening(*parse_address(nodes[0])):
        raise ServerUnavailable(
            f"spindle server at {address} is unavailable: nothing listens there "
            "(start it with `spindle server`, or leave SPINDLE_ADDRESS unset and call "
            "connect() for a private embedded server)"
        )
    return address


def disconnect() -> None:
    """Close this process's connections. An embedded server keeps running until exit."""
    global _client
    with _connect_lock:
        client, _client = _client, None
    if client is not None:
        client.close()


def current() -> Client:
    """The process's client, connecting first if needed."""
    client = _client
    return client if client is not None else connect()


def _after_fork_in_child() -> None:
    global _connect_lock, _identity
    _connect_lock = threading.RLock()
    _identity = _new_identity()
    if _client is not None:
        _client.after_fork_in_child()
    for server in _servers:
        server.forget_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
