"""A call's output at its caller, as it comes: the server forwards what the function writes
(``[id, 2, {"stdout"|"stderr": bytes}]``, docs/protocol.md "Functions"), and each whole line
is printed here at once with the call's ``[name]`` prefix, as Ray prefixes its workers'.

Bounded as the worker's report was: at most ``OUTPUT_LIMIT`` bytes per stream are kept as
the future's ``stdout``/``stderr``, and a line longer than ``LONGEST_LINE`` is printed in
parts rather than held.
"""

from __future__ import annotations

import sys
from typing import Dict

OUTPUT_LIMIT = 1 << 20  # bytes kept per stream and call, as the worker keeps
LONGEST_LINE = 64 << 10


class LiveOutput:
    """One attempt's output: kept, and echoed line by line when ``echo``."""

    __slots__ = ("label", "echo", "kept", "partial", "received")

    def __init__(self, label: str, echo: bool) -> None:
        self.label = label
        self.echo = echo
        self.kept: Dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self.partial: Dict[str, bytes] = {"stdout": b"", "stderr": b""}
        self.received = {"stdout": 0, "stderr": 0}

    def feed(self, stream: str, data: bytes) -> None:
        if stream not in self.kept or not isinstance(data, bytes):
            return
        self.received[stream] += len(data)
        kept = self.kept[stream]
        kept += data[: max(0, OUTPUT_LIMIT - len(kept))]
        if not self.echo:
            return
        text = self.partial[stream] + data
        end = text.rfind(b"\n") + 1
        if end == 0 and len(text) > LONGEST_LINE:
            end = len(text)
        self.partial[stream] = text[end:]
        if end:
            write(self.label, stream, text[:end])

    def close(self) -> None:
        """The call ended: print the last line even without its newline."""
        for stream, rest in self.partial.items():
            if rest:
                write(self.label, stream, rest)
        self.partial = {"stdout": b"", "stderr": b""}

    def output(self, stream: str) -> bytes:
        return bytes(self.kept[stream])


def write(label: str, stream: str, data: bytes) -> None:
    """Print ``data`` on this process's ``stream``, each line prefixed with ``[label]``."""
    out = sys.stdout if stream == "stdout" else sys.stderr
    if out is None or not data:
        return
    prefix = f"[{label}] "
    lines = data.decode("utf-8", "replace").splitlines(True)
    text = "".join(prefix + (line if line.endswith("\n") else line + "\n") for line in lines)
    try:
        out.write(text)
        out.flush()
    except (OSError, ValueError):
        pass
