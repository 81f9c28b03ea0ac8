"""Sessions as capabilities (the server's ``spindle_proto::session``): a session is named by a
random secret that only its client holds; the id it says ``hello`` with is a digest of the
secret, and the server refuses that id without the secret. An unnamed object's key is a
digest of the secret and the object's number: unguessable, and the same when a retried
function makes its calls again."""

from __future__ import annotations

import hashlib
import secrets

SECRET_SESSION_PREFIX = "#"


def new_secret() -> str:
    """A fresh session secret: 128 random bits."""
    return secrets.token_hex(16)


def session_id(secret: str) -> str:
    """The id of the session whose secret is ``secret``."""
    return SECRET_SESSION_PREFIX + _digest("spindle session", secret)


def unnamed_key(secret: str, n: int) -> str:
    """The key of the ``n``-th unnamed object of the session whose secret is ``secret``."""
    return "~" + _digest("spindle unnamed object", secret, str(n))


def _digest(*parts: str) -> str:
    """The first 128 bits of SHA-256 over ``parts``, each ended by a zero byte, in hex."""
    return hashlib.sha256(b"".join(p.encode() + b"\0" for p in parts)).hexdigest()[:32]
