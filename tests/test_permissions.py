"""Users, roles and permissions, through real server processes, the ``spindle`` command and
the protocol: each permission of each role allowed and refused, credentials checked, changes
kept across a restart, and refusals audited without flooding the log."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any, Dict, Iterator, List, Optional

import pytest

import spindle
from conftest import REPO, ServerProcess, gateway_args, pythonpath_for_tests, server_binary, wait_until
from spindle.client import Connection, frame
from spindle.sessions import new_secret

TOKEN = "the-servers-own-token"


def cli(address: str, *args: str, user: Optional[str] = None, token: Optional[str] = TOKEN,
        stdin: Optional[str] = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, SPINDLE_ADDRESS=address)
    env.pop("SPINDLE_USER", None)
    env.pop("SPINDLE_TOKEN", None)
    if user:
        env["SPINDLE_USER"] = user
    if token:
        env["SPINDLE_TOKEN"] = token
    return subprocess.run([server_binary(), *args], env=env, capture_output=True, text=True, timeout=60,
                          input=stdin)


def add_user(address: str, name: str, *roles: str) -> str:
    """Add user ``name`` with ``roles`` as the default user; its new token."""
    args = ["user", "add", name]
    for role in roles:
        args += ["--role", role]
    out = cli(address, *args)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


class Session:
    """One connection as a user; ``ask`` sends a request and returns its reply."""

    def __init__(self, address: str, user: Optional[str], token: Optional[str]) -> None:
        host, port = address.rsplit(":", 1)
        self.conn = Connection(host, int(port), new_secret(), 1, token, user=user)
        self.next = 10

    def ask(self, *request: Any) -> List[Any]:
        self.next += 1
        return self.conn.roundtrip(frame([self.next, *request]), self.next)

    def ok(self, *request: Any) -> Any:
        reply = self.ask(*request)
        assert reply[1] == 0, reply
        return reply[2]

    def denied(self, *request: Any) -> str:
        reply = self.ask(*request)
        assert reply[1] == 1 and reply[2][0] == "PermissionDenied", reply
        return reply[2][1]

    def close(self) -> None:
        self.conn.close()


@pytest.fixture(scope="module")
def acl_server(tmp_path_factory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("acl-data")
    proc = ServerProcess("--token", TOKEN, "--data-dir", str(data), *gateway_args(1))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def users(acl_server) -> Dict[str, str]:
    """Users of ``acl_server`` and their tokens: an app's reader and writer, a coder who may
    define types and invoke functions but owns no data, and an administrator."""
    address = acl_server.address
    roles = {
        "app-reader": ["read:app/"],
        "app-writer": ["read,write,create:app/"],
        "coder": ["define:py:tests.", "invoke"],
    }
    for role, rules in roles.items():
        out = cli(address, "role", "add", role, *rules)
        assert out.returncode == 0, out.stderr
    return {
        "reader": add_user(address, "reader", "app-reader"),
        "writer": add_user(address, "writer", "app-writer"),
        "coder": add_user(address, "coder", "coder"),
        "boss": add_user(address, "boss", "admin"),
    }


def session(server: ServerProcess, users: Dict[str, str], name: str) -> Session:
    return Session(server.address, name, users[name])


def test_each_permission_is_allowed_to_its_role_and_refused_to_others(acl_server, users):
    owner = Session(acl_server.address, None, TOKEN)
    owner.ok("create", 1, 0, "Dict", "app/config", [], False, True)
    owner.ok("create", 2, 0, "Counter", "other/hits", [], False, True)
    reader, writer, coder = (session(acl_server, users, n) for n in ("reader", "writer", "coder"))
    try:
        # read: the reader reads the app's objects and nothing else, lists only those.
        assert reader.ok("call", 1, 0, "Dict", "app/config", "get", ["k"]) is None
        assert reader.ok("call", 2, 0, "Dict", "app/config", "len", []) == 0
        assert "may not get on 'other/hits'" in reader.denied("call", 3, 0, "Counter", "other/hits", "get", [])
        assert [name for name, _ in reader.ok("objects", "")] == ["app/config"]
        # write: refused to the reader, allowed to the writer under app/ only.
        message = reader.denied("call", 4, 0, "Dict", "app/config", "setitem", ["k", 1])
        assert message == "user 'reader' may not setitem on 'app/config': that needs the write permission"
        writer.ok("call", 1, 0, "Dict", "app/config", "setitem", ["k", 1])
        assert reader.ok("call", 5, 0, "Dict", "app/config", "get", ["k"]) == 1
        writer.denied("call", 2, 0, "Counter", "other/hits", "add", [1])
        # create, delete and keep: the writer's under app/, nobody else's.
        writer.ok("create", 3, 0, "Counter", "app/new", [], False, True)
        reader.denied("create", 6, 0, "Counter", "app/mine", [], False, True)
        # ...but attaching to an existing object (a create of it, as SDKs do) is a read.
        reader.ok("create", 13, 0, "Dict", "app/config", [], False, True)
        writer.denied("create", 4, 0, "Counter", "elsewhere", [], False, True)
        reader.denied("delete", 7, "app/new")
        owner.ok("call", 3, 0, "Counter", "other/hits", "add", [1])
        writer.denied("delete", 5, "other/hits")
        assert writer.ok("delete", 6, "app/new") is True
        # An unnamed object is the writer's own (its key is its capability); naming it takes
        # create on the name.
        key = "~" + "0" * 32
        writer.ok("create", 7, 0, "Counter", key, [], True)
        writer.ok("call", 8, 0, "Counter", key, "add", [2])
        writer.denied("keep", 9, "Counter", key, "other/taken")
        assert writer.ok("keep", 10, "Counter", key, "app/kept") == "app/kept"
        # Retyping another user's object: it is a delete and a create, both refused.
        writer.denied("delete", 11, "other/hits")
        writer.denied("create", 12, 0, "Dict", "other/hits", [], False, True)
        assert owner.ok("call", 4, 0, "Counter", "other/hits", "get", []) == 1
        # define and invoke: the coder's alone (define only under its type prefix).
        for user in (reader, writer):
            user.denied("define", "py:tests.Thing", "v1", b"code")
            user.denied("invoke", "python", b"x", {})
        coder.denied("define", "py:elsewhere.Thing", "v1", b"code")
        defined = coder.ask("define", "py:tests.Thing", "v1", b"code")
        assert defined[1] == 0 or defined[2][0] != "PermissionDenied", defined
        # Defining a version that is defined already changes nothing: anyone may (SDKs do,
        # before they create); another version, not.
        assert reader.ok("define", "py:tests.Thing", "v1", b"other code") is True
        reader.denied("define", "py:tests.Thing", "v2", b"other code")
        invoked = coder.ask("invoke", "python", b"not a pickle", {})
        assert invoked[1] == 0 and "UnpicklingError" in str(invoked[2]), invoked
        # The coder owns no data.
        coder.denied("call", 1, 0, "Dict", "app/config", "get", ["k"])
        # admin: managing users and roles is the administrator's.
        for user in (reader, writer, coder):
            assert "needs the admin permission" in user.denied("acl", "users", {})
            user.denied("acl", "set_user", {"name": "mallory", "token": "x" * 20, "roles": ["admin"]})
        assert reader.ok("acl", "whoami", {}) == {"user": "reader"}
    finally:
        for s in (owner, reader, writer, coder):
            s.close()


def test_a_reader_calls_the_compiled_methods_that_leave_the_state(acl_server, users):
    """Whether a compiled object's method writes is known once it ran: a reader's call runs,
    and one that would change the object, or call another, is refused and changes nothing (nor
    is it logged). A method's calls to other objects need the caller's permission."""
    bank = REPO / "examples" / "wasm" / "build" / "bank.wasm"
    if not bank.is_file():
        pytest.fail(f"{bank} is missing: run `make wasm` (part of `make setup`)")
    owner = Session(acl_server.address, None, TOKEN)
    reader, writer = session(acl_server, users, "reader"), session(acl_server, users, "writer")
    try:
        owner.ok("define", "wasm:perm-bank", "v1", bank.read_bytes())
        owner.ok("create", 1, 0, "wasm:perm-bank", "app/account", ["v1", [100]], False, True)
        assert reader.ok("call", 1, 0, "wasm:perm-bank", "app/account", "balance", []) == 100
        message = reader.denied("call", 2, 0, "wasm:perm-bank", "app/account", "deposit", [5])
        assert message == ("user 'reader' may not deposit on 'app/account': that needs the write permission "
                           "(wasm:perm-bank.deposit changes the object's state)")
        assert reader.ok("call", 3, 0, "wasm:perm-bank", "app/account", "balance", []) == 100
        # Inside a transaction a reader's call is refused outright (its writes would be the
        # transaction's, known only at commit).
        refused = reader.ask("call", 4, 0, "wasm:perm-bank", "app/account", "balance", [], 0, [1, 0, True])
        assert refused[1] == 1 and refused[2][0] == "PermissionDenied", refused
        assert writer.ok("call", 1, 0, "wasm:perm-bank", "app/account", "deposit", [5]) == 105
        assert reader.ok("call", 5, 0, "wasm:perm-bank", "app/account", "balance", []) == 105
        # Outside the reader's rules nothing runs at all.
        owner.ok("create", 2, 0, "wasm:perm-bank", "other/account", ["v1", [1]], False, True)
        assert "may not balance on 'other/account'" in reader.denied("call", 6, 0, "wasm:perm-bank", "other/account",
                                                                     "balance", [])
        # A method's calls to other objects need the caller's permission for each.
        owner.ok("create", 3, 0, "wasm:perm-bank", "app/savings", ["v1", [0]], False, True)
        message = reader.denied("call", 7, 0, "wasm:perm-bank", "app/account", "transfer", ["app/savings", 1])
        assert message.endswith("(wasm:perm-bank.transfer calls other objects)"), message
        assert writer.ok("call", 2, 0, "wasm:perm-bank", "app/account", "transfer", ["app/savings", 5]) == 100
        refused = writer.ask("call", 3, 0, "wasm:perm-bank", "app/account", "transfer", ["other/account", 5])
        assert refused[1] == 1 and "may not deposit on 'other/account'" in refused[2][1], refused
        assert owner.ok("call", 4, 0, "wasm:perm-bank", "app/account", "balance", []) == 100, "nothing moved"
        assert owner.ok("call", 5, 0, "wasm:perm-bank", "other/account", "balance", []) == 1
        assert owner.ok("call", 6, 0, "wasm:perm-bank", "app/savings", "balance", []) == 5
    finally:
        for s in (owner, reader, writer):
            s.close()


def test_the_cli_manages_users_and_roles_and_reports_refusals(acl_server, users):
    address = acl_server.address
    out = cli(address, "user", "list", user="boss", token=users["boss"])
    assert out.returncode == 0, out.stderr
    listed = dict(line.split("\t") for line in out.stdout.splitlines())
    assert listed["reader"] == "app-reader" and listed["boss"] == "admin"
    out = cli(address, "role", "list", user="boss", token=users["boss"])
    assert "app-writer\tread,write,create:app/" in out.stdout.splitlines()
    assert "admin\tall\t(built-in)" in out.stdout.splitlines()
    # Refusals are errors on stderr with a failing exit status.
    out = cli(address, "user", "list", user="reader", token=users["reader"])
    assert out.returncode == 1 and "PermissionDenied" in out.stderr and out.stdout == ""
    for bad in (["role", "add", "x", "reed:app/"], ["role", "add", "x", "invoke:app/"],
                ["user", "add", "x", "--role", "no-such-role"], ["role", "remove", "app-reader"],
                ["role", "remove", "admin"], ["user", "add", "default", "--role", "admin"]):
        out = cli(address, *bad)
        assert out.returncode == 1 and out.stderr.startswith("spindle: "), (bad, out.stderr)
    # A password read from stdin: too short is refused, a long one works.
    out = cli(address, "user", "add", "pat", "--role", "app-reader", "--password-stdin", stdin="short\n")
    assert out.returncode == 1 and "12 characters" in out.stderr
    out = cli(address, "user", "add", "pat", "--role", "app-reader", "--password-stdin",
              stdin="correct horse battery\n")
    assert out.returncode == 0 and out.stdout == "", out.stderr
    out = cli(address, "user", "whoami", user="pat", token="correct horse battery")
    assert out.stdout.strip() == "pat", out.stderr


def test_wrong_credentials_are_refused_alike(acl_server, users):
    host, port = acl_server.address.rsplit(":", 1)
    for user, token in (("reader", "wrong"), ("nobody", users["reader"]), ("reader", None),
                        (None, users["reader"]), ("~node", TOKEN)):
        with pytest.raises(spindle.Unauthorized):
            Connection(host, int(port), new_secret(), 1, token, user=user)
    # Users exist: a hello without credentials is refused too.
    with pytest.raises(spindle.Unauthorized, match="needs credentials"):
        Connection(host, int(port), new_secret(), 1)


def test_the_sdk_raises_permission_denied_naming_operation_and_name(acl_server, users):
    out = subprocess.run(
        [sys.executable, "-c", """
import spindle
spindle.connect(embedded=False)
spindle.Dict(name="app/sdk")["k"] = 2
try:
    spindle.Counter(name="not-app/c")
except spindle.PermissionDenied as e:
    print("denied:", e)
"""],
        env=dict(os.environ, SPINDLE_ADDRESS=acl_server.address, SPINDLE_USER="writer",
                 SPINDLE_TOKEN=users["writer"], PYTHONPATH=pythonpath_for_tests()),
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "denied: user 'writer' may not create on 'not-app/c': that needs the create permission")


def test_a_removed_user_can_do_nothing_more_and_a_changed_role_applies_at_once(acl_server, users):
    address = acl_server.address
    token = add_user(address, "temp", "app-reader")
    temp = Session(address, "temp", token)
    try:
        temp.ok("call", 1, 0, "Dict", "app/config", "len", [])
        out = cli(address, "role", "add", "app-reader", "read:app/public/")
        assert out.returncode == 0, out.stderr
        temp.denied("call", 2, 0, "Dict", "app/config", "len", [])
        assert cli(address, "role", "add", "app-reader", "read:app/").returncode == 0
        temp.ok("call", 3, 0, "Dict", "app/config", "len", [])
        # A new credential (a leaked token rotated) ends the connections made with the old one.
        rotated = Session(address, "temp", token)
        new_token = add_user(address, "temp", "app-reader")
        reply = rotated.ask("call", 1, 0, "Dict", "app/config", "len", [])
        assert reply[1] == 1 and reply[2][0] == "Unauthorized", reply
        rotated.close()
        temp.close()
        token = new_token
        temp = Session(address, "temp", token)
        assert cli(address, "user", "remove", "temp").returncode == 0
        reply = temp.ask("call", 4, 0, "Dict", "app/config", "len", [])
        assert reply[1] == 1 and reply[2][0] == "Unauthorized", reply
    finally:
        temp.close()
    host, port = address.rsplit(":", 1)
    with pytest.raises(spindle.Unauthorized):
        Connection(host, int(port), new_secret(), 1, token, user="temp")


def test_users_and_roles_survive_a_restart_and_are_stored_hashed(tmp_path):
    data = tmp_path / "data"
    proc = ServerProcess("--token", TOKEN, "--data-dir", str(data))
    try:
        assert cli(proc.address, "role", "add", "ops", "all:ops/").returncode == 0
        token = add_user(proc.address, "olga", "ops")
    finally:
        proc.stop()
    stored = (data / "acl").read_bytes()
    assert b"olga" in stored and token.encode() not in stored and b"$argon2id$" in stored
    assert (data / "acl").stat().st_mode & 0o777 == 0o600
    proc = ServerProcess("--token", TOKEN, "--data-dir", str(data))
    try:
        olga = Session(proc.address, "olga", token)
        olga.ok("create", 1, 0, "Counter", "ops/c", [], False, True)
        olga.denied("create", 2, 0, "Counter", "dev/c", [], False, True)
        olga.close()
    finally:
        proc.stop()


def test_a_server_without_a_token_keeps_an_administrator(tmp_path):
    """Without --token, the first user must be an administrator, and the last one stays:
    otherwise nobody could manage the server's users again."""
    proc = ServerProcess("--data-dir", str(tmp_path / "data"))
    try:
        out = cli(proc.address, "user", "add", "alice", "--role", "readonly", token=None)
        assert out.returncode == 1 and "no user with the admin role" in out.stderr
        out = cli(proc.address, "user", "add", "root", "--role", "admin", token=None)
        assert out.returncode == 0, out.stderr
        root = out.stdout.strip()
        # From now on credentials are needed, and the administrator stays while others exist.
        assert cli(proc.address, "status", token=None).returncode == 1
        out = cli(proc.address, "user", "add", "alice", "--role", "readonly", user="root", token=root)
        assert out.returncode == 0, out.stderr
        out = cli(proc.address, "user", "remove", "root", user="root", token=root)
        assert out.returncode == 1 and "no user with the admin role" in out.stderr
        assert cli(proc.address, "status", user="root", token=root).returncode == 0
    finally:
        proc.stop()


def test_refusals_name_the_user_and_are_logged_once_a_minute(tmp_path):
    log = tmp_path / "server.log"
    with open(log, "w") as stderr:
        proc = ServerProcess("--token", TOKEN, stderr=stderr)
    try:
        token = add_user(proc.address, "nosy", "readonly")
        nosy = Session(proc.address, "nosy", token)
        for i in range(30):
            nosy.denied("create", i + 1, 0, "Counter", f"c{i}", [], False)
        nosy.close()
    finally:
        proc.stop()
    lines = log.read_text().splitlines()
    refusals = [line for line in lines if "refused:" in line]
    assert len(refusals) == 1, refusals
    assert "user 'nosy' may not create on 'c0'" in refusals[0]
    changes = [line for line in lines if "users and roles:" in line]
    assert len(changes) == 1 and "set user 'nosy'" in changes[0] and token not in changes[0]


def run_as(server: ServerProcess, user: Optional[str], token: str, script: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, SPINDLE_ADDRESS=server.address, SPINDLE_TOKEN=token,
               PYTHONPATH=pythonpath_for_tests())
    env.pop("SPINDLE_USER", None)
    if user:
        env["SPINDLE_USER"] = user
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)


PLANT = """
import os, spindle
import remote
spindle.connect(embedded=False)
# Unpickling this would write a file: the attack's payload.
spindle.Dict(name="app/planted")["plugin"] = remote.Tripwire(os.environ["TRIPWIRE"])
print("stored")
"""


def test_a_pickle_from_a_writer_who_may_not_run_code_is_never_unpickled(acl_server, users, tmp_path):
    """The stored-pickle attack by a user who may write but not run code: the pickle is
    stored (writing is allowed) but stamped with its writer, and no reader unpickles it, not
    the server's own user, not a function; its writer reads it back."""
    tripwire = tmp_path / "tripped"
    os.environ["TRIPWIRE"] = str(tripwire)
    try:
        out = run_as(acl_server, "writer", users["writer"], PLANT)
        assert out.stdout.strip() == "stored", out.stderr
        assert not tripwire.exists(), "writing must not unpickle"
        read = """
import spindle, remote
spindle.connect(embedded=False)
planted = spindle.Dict(name="app/planted")
try:
    planted["plugin"]
    print("unpickled")
except spindle.UntrustedValue as e:
    print("refused:", e.writer)
with spindle.Executor(echo=False) as ex:
    print("function:", ex.submit(remote.read_item, "app/planted", "plugin").result(60))
"""
        out = run_as(acl_server, None, TOKEN, read)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0] == "refused: writer", out.stdout
        assert lines[1] == "function: refused: writer", out.stdout
        assert not tripwire.exists(), "no reader may unpickle it"
        # Its writer may (the code is hers to run on herself), and so may whoever trusts her.
        own = """
import spindle
spindle.connect(embedded=False)
print(type(spindle.Dict(name="app/planted")["plugin"]).__name__)
"""
        out = run_as(acl_server, "writer", users["writer"], own)
        assert out.stdout.strip() == "Tripwire", out.stderr
        assert tripwire.exists()
        tripwire.unlink()
        out = run_as(acl_server, None, TOKEN, "import spindle\nspindle.trust('writer')\n" + own)
        assert out.stdout.strip() == "Tripwire", out.stderr
        tripwire.unlink()
        # An object host refuses it as an argument, too.
        out = run_as(acl_server, None, TOKEN, """
import spindle, remote
spindle.connect(embedded=False)
print(remote.Holder(name="app/holder").take(1))
""")
        assert out.stdout.strip() == "int", out.stderr
        out = run_as(acl_server, "writer", users["writer"], """
import os, spindle, remote
spindle.connect(embedded=False)
try:
    print(remote.Holder(name="app/holder").take(remote.Tripwire(os.environ["TRIPWIRE"])))
except spindle.UntrustedValue as e:
    print("host refused:", e.writer)
""")
        assert out.stdout.strip() == "host refused: writer", out.stdout + out.stderr
        assert not tripwire.exists()
    finally:
        os.environ.pop("TRIPWIRE", None)


def test_a_pickle_from_a_writer_who_may_run_code_is_read_as_before(acl_server, users):
    out = run_as(acl_server, None, TOKEN, """
import fractions, spindle
spindle.connect(embedded=False)
spindle.Dict(name="app/trusted")["x"] = fractions.Fraction(1, 3)
""")
    assert out.returncode == 0, out.stderr
    out = run_as(acl_server, "reader", users["reader"], """
import spindle
spindle.connect(embedded=False)
print(spindle.Dict(name="app/trusted")["x"])
""")
    assert out.stdout.strip() == "1/3", out.stderr


def test_calls_are_seen_and_killed_by_their_user_and_admins_only(acl_server, users):
    """`spindle ps`, `kill` and `logs` (the `calls` request) over the calls a user may see."""
    from spindle.compute.invoker import make_payload

    tinker = add_user(acl_server.address, "tinker", "coder")  # invokes too, but not this call
    coder = session(acl_server, users, "coder")
    boss, reader = session(acl_server, users, "boss"), session(acl_server, users, "reader")
    other = Session(acl_server.address, "tinker", tinker)
    try:
        payload = make_payload(time.sleep, (120,), {}, None)
        coder.conn.sock.sendall(frame([99, "invoke", "python", payload, {"function": "time.sleep"}]))
        running = lambda: [r for r in boss.ok("calls", "list") if r["user"] == "coder" and r["state"] == "running"]  # noqa: E731
        assert wait_until(lambda: bool(running()))
        row = running()[0]
        assert row["function"] == "time.sleep"
        assert [r["id"] for r in coder.ok("calls", "list")] == [row["id"]]
        assert other.ok("calls", "list") == []
        for request in (("calls", "kill", row["id"]), ("calls", "logs", row["id"], False)):
            refused = other.ask(*request)
            assert refused[1] == 1 and refused[2][0] == "NotFound", refused
        assert "may not look at or stop function calls" in reader.denied("calls", "list")
        coder.conn.sock.sendall(frame([100, "calls", "kill", row["id"]]))
        replies = {}  # the kill's and the invocation's own, in either order
        while len(replies) < 2:
            reply = coder.conn._read()
            replies[reply[0]] = reply
        assert replies[100][1:] == [0, True]
        killed = replies[99]
        assert killed[1] == 1 and killed[2][0] == "WorkerCrashed" and "spindle kill" in killed[2][1]
    finally:
        for s in (coder, boss, reader, other):
            s.close()
