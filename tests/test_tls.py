"""TLS with real processes and sockets: `spindle cert` makes a development CA, a server with
`--tls-cert` speaks only TLS (objects, functions whose workers connect back over TLS), a
client without the CA is refused, plaintext to the TLS port gets a readable error and no
hang, mutual TLS refuses clients and peers without a certificate, and a cluster's nodes
talk to each other over mutual TLS (docs/security.md, "TLS")."""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import stat
import subprocess
from pathlib import Path
from typing import Iterator, List, Optional

import msgpack
import pytest

import spindle
from spindle.client import Client, TLSOption
from conftest import ServerProcess, gateway_args, server_binary, wait_until
from test_cluster import SHARDS, Node

PLAINTEXT_REFUSED = "this port speaks TLS: connect with TLS"


def make_certs(directory: Path) -> Path:
    subprocess.run([server_binary(), "cert", "--out", str(directory)], check=True, capture_output=True)
    return directory


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_certs(tmp_path_factory.mktemp("certs"))


def tls_args(certs: Path, mutual: bool = False) -> List[str]:
    args = ["--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server-key.pem")]
    return args + (["--tls-client-ca", str(certs / "ca.pem")] if mutual else ["--tls-ca", str(certs / "ca.pem")])


def no_tls_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPINDLE_TLS_")}
    env.pop("SPINDLE_ADDRESS", None)
    return env


@pytest.fixture(scope="module")
def tls_server(certs: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(*tls_args(certs), *gateway_args(2), env=no_tls_env())
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def mtls_server(certs: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(*tls_args(certs, mutual=True), *gateway_args(2), env=no_tls_env())
    yield proc
    proc.stop()


def client_context(certs: Path) -> ssl.SSLContext:
    return spindle.tls_context(str(certs / "ca.pem"), str(certs / "client.pem"), str(certs / "client-key.pem"))


@contextlib.contextmanager
def connected_with_tls(address: str, tls: TLSOption) -> Iterator[spindle.Client]:
    """This process talks to ``address`` with ``tls`` for the block (then to the session's server)."""
    saved = os.environ["SPINDLE_ADDRESS"]
    client = spindle.connect(address, embedded=False, tls=tls)
    try:
        yield client
    finally:
        spindle.connect(saved, embedded=False, tls=False)


def test_spindle_cert_makes_a_ca_and_certificates_for_local_names(tmp_path: Path) -> None:
    out = tmp_path / "dev"
    done = subprocess.run([server_binary(), "cert", "--out", str(out), "--name", "spindle.test"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for name in ["ca.pem", "server.pem", "client.pem"]:
        assert (out / name).read_text().startswith("-----BEGIN CERTIFICATE-----")
    for name in ["ca-key.pem", "server-key.pem", "client-key.pem"]:
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name
    decoded = ssl._ssl._test_decode_cert(str(out / "server.pem"))  # type: ignore[attr-defined]
    names = set(decoded["subjectAltName"])
    assert {("DNS", "localhost"), ("IP Address", "127.0.0.1"), ("DNS", "spindle.test")} <= names
    assert any(kind == "IP Address" and value.rstrip() in ("::1", "0:0:0:0:0:0:0:1") for kind, value in names)
    # The server certificate verifies against the CA (OpenSSL's check, not the writer's).
    context = ssl.create_default_context(cafile=str(out / "ca.pem"))
    assert context.get_ca_certs()[0]["subject"] == ((("commonName", "Spindle development CA"),),)
    again = subprocess.run([server_binary(), "cert", "--out", str(out)], capture_output=True, text=True)
    assert again.returncode != 0 and "exists" in again.stderr


def test_a_client_with_the_ca_uses_objects_on_a_tls_server(tls_server: ServerProcess, certs: Path, uniq: str) -> None:
    with connected_with_tls(tls_server.address, str(certs / "ca.pem")) as client:
        assert client.tls is not None
        counter = spindle.Counter(name=f"{uniq}-c")
        assert counter.add(5) == 5
        words = spindle.Dict(name=f"{uniq}-d")
        words["tls"] = [1, 2]
        assert dict(words) == {"tls": [1, 2]}


def test_a_client_without_the_ca_is_refused_with_a_clear_error(tls_server: ServerProcess) -> None:
    with pytest.raises(spindle.TLSError, match="certificate verify failed"):
        Client(tls_server.address, tls=True).ping()  # the system's CAs only


def test_plaintext_to_a_tls_port_gets_a_clear_error_not_a_hang(tls_server: ServerProcess) -> None:
    host, port = tls_server.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        body = msgpack.packb([1, "hello", {"client": "plain", "protocol": 1}])
        sock.sendall(len(body).to_bytes(4, "big") + body)
        data = b""
        while chunk := sock.recv(4096):  # the reply, then the end of the connection
            data += chunk
    length = int.from_bytes(data[:4], "big")
    assert len(data) == 4 + length
    reply = msgpack.unpackb(data[4:])
    assert reply[:2] == [0, 1] and reply[2][0] == "ProtocolError" and PLAINTEXT_REFUSED in reply[2][1], reply
    with pytest.raises(spindle.ProtocolError, match=PLAINTEXT_REFUSED):
        Client(tls_server.address, tls=False).ping()
    status = subprocess.run([server_binary(), "status", "--address", tls_server.address],
                            capture_output=True, text=True, env=no_tls_env(), timeout=60)
    assert status.returncode == 1 and PLAINTEXT_REFUSED in status.stderr


def test_a_stalled_handshake_does_not_hold_up_other_clients(tls_server: ServerProcess, certs: Path) -> None:
    host, port = tls_server.address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as stalled:
        stalled.sendall(b"\x16\x03\x01")  # the start of a handshake record, and no more
        assert Client(tls_server.address, tls=str(certs / "ca.pem")).ping() == "pong"


def test_stalled_handshakes_count_against_max_connections(certs: Path) -> None:
    """Connections that never finish their handshake hold descriptors and handshake state:
    they count against --max-connections, and past it a new connection is closed at once."""
    server = ServerProcess(*tls_args(certs), "--max-connections", "3", env=no_tls_env())
    host, port = server.address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(certs / "ca.pem"))

    def handshake() -> None:
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            context.wrap_socket(sock, server_hostname=host).close()

    stalled = [socket.create_connection((host, int(port)), timeout=30) for _ in range(3)]
    try:
        for sock in stalled:
            sock.sendall(b"\x16\x03\x01")  # the start of a handshake record, and no more
        with pytest.raises(OSError):  # an SSLError, or the connection reset
            handshake()
        stalled.pop().close()

        def served() -> bool:
            try:
                handshake()
                return True
            except OSError:
                return False
        assert wait_until(served, 10)
    finally:
        for sock in stalled:
            sock.close()
        server.stop()


def test_the_cli_connects_with_tls_ca(tls_server: ServerProcess, certs: Path) -> None:
    status = subprocess.run(
        [server_binary(), "status", "--address", tls_server.address, "--tls-ca", str(certs / "ca.pem")],
        capture_output=True, text=True, env=no_tls_env(), timeout=60,
    )
    assert status.returncode == 0 and tls_server.address in status.stdout, status.stderr


def test_mutual_tls_refuses_a_client_without_a_certificate_and_serves_one_with_it(
    mtls_server: ServerProcess, certs: Path, uniq: str
) -> None:
    with pytest.raises(spindle.TLSError, match="certificate required"):
        Client(mtls_server.address, tls=str(certs / "ca.pem")).ping()
    with connected_with_tls(mtls_server.address, client_context(certs)):
        assert spindle.Counter(name=f"{uniq}-m").add(2) == 2
    cli = [server_binary(), "status", "--address", mtls_server.address, "--tls-ca", str(certs / "ca.pem")]
    refused = subprocess.run(cli, capture_output=True, text=True, env=no_tls_env(), timeout=60)
    assert refused.returncode == 1 and "CertificateRequired" in refused.stderr, refused.stderr
    identity = ["--tls-cert", str(certs / "client.pem"), "--tls-key", str(certs / "client-key.pem")]
    served = subprocess.run(cli + identity, capture_output=True, text=True, env=no_tls_env(), timeout=60)
    assert served.returncode == 0, served.stderr


def double(x: int) -> int:
    return 2 * x


@spindle.shared
class Tally:
    def __init__(self) -> None:
        self.total = 0

    def add(self, n: int) -> int:
        self.total += n
        return self.total


def test_functions_and_shared_objects_run_on_a_mutual_tls_server(mtls_server: ServerProcess, certs: Path) -> None:
    # Workers and object hosts connect back over TLS with the server's certificate.
    with connected_with_tls(mtls_server.address, client_context(certs)):
        with spindle.Executor(max_workers=2) as executor:
            assert list(executor.map(double, range(4))) == [0, 2, 4, 6]
        tally = Tally()
        assert tally.add(3) == 3 and tally.add(4) == 7


def test_a_tls_cluster_with_a_client_ca_serves_and_refuses_peers_without_a_certificate(
    tmp_path: Path, certs: Path
) -> None:
    extra = tls_args(certs, mutual=True)
    nodes: List[Node] = []
    try:
        for node_id in (1, 2, 3):
            join: Optional[str] = nodes[0].address if nodes else None
            nodes.append(Node(node_id, tmp_path / f"n{node_id}", join, *extra))
        client = Client(",".join(n.address for n in nodes), tls=client_context(certs))

        def settled() -> bool:
            try:
                view = client.cluster()
            except (OSError, spindle.SpindleError):
                return False
            groups = view["groups"] + [view["metadata"]]
            return len(view["nodes"]) == 3 and len(groups) == SHARDS + 1 and all(
                g["leader"] and len(g["voters"]) == 3 for g in groups
            )

        # Replication runs over the nodes' own links: only mutual TLS reaches a node.
        assert wait_until(settled, 60), client.cluster()
        with connected_with_tls(client.address, client_context(certs)):
            for i in range(8):
                assert spindle.Counter(name=f"tls-cluster-{i}").add(i) == i
        # A would-be peer with the CA but no certificate of its own.
        with pytest.raises(spindle.TLSError, match="certificate required"):
            Client(nodes[1].address, tls=str(certs / "ca.pem")).ping()
    finally:
        for node in nodes:
            node.stop()
