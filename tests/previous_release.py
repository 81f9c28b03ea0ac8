"""The previous release's `spindle` binary, built from this repository's history for the
rolling upgrade test (tests/test_upgrade.py). `make test` builds it before the tests run (a
build takes minutes: longer than a test may); run alone, this prints its path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class BuildError(Exception):
    pass


def fail(message: str) -> None:
    raise BuildError(message)


# The last release before cluster formats: its nodes write format 1 (no version at all).
PREVIOUS_RELEASE = "457032a"


def binary() -> str:
    """The `spindle` binary of ``PREVIOUS_RELEASE``, built once into target/previous-release
    (its dependencies' builds are kept there for the next commit pinned)."""
    target = REPO / "target" / "previous-release"
    path = target / f"spindle-{PREVIOUS_RELEASE}"
    if path.exists():
        return str(path)
    found = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{PREVIOUS_RELEASE}^{{commit}}"],
                           capture_output=True, text=True)
    if found.returncode != 0:
        fail(f"commit {PREVIOUS_RELEASE}, the previous release, is not in this clone's history "
             f"(clone it whole, or `git fetch --unshallow`): {found.stderr.strip()}")
    cargo = shutil.which("cargo")
    if cargo is None:
        fail("no `cargo` to build the previous release with")
    target.mkdir(parents=True, exist_ok=True)
    if not (target / "release").exists() and (REPO / "target" / "release").is_dir():
        # Start from this build's compiled dependencies (the same versions, mostly): only
        # the project's own crates are built again, minutes sooner.
        shutil.copytree(REPO / "target" / "release", target / "release", symlinks=True)
    with tempfile.TemporaryDirectory(dir=target, prefix="source-") as source:
        archive = Path(source) / "source.tar"
        subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", "-o", str(archive), found.stdout.strip()],
                       check=True)
        subprocess.run(["tar", "-xf", str(archive), "-C", source], check=True)
        env = dict(os.environ, CARGO_TARGET_DIR=str(target))
        built = subprocess.run([cargo, "build", "--release", "--locked", "-p", "spindle-cli"], cwd=source, env=env,
                               capture_output=True, text=True, timeout=3600)
        if built.returncode != 0:
            fail(f"building {PREVIOUS_RELEASE} failed:\n{built.stderr[-4000:]}")
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # whole or not at all
    shutil.copy2(target / "release" / "spindle", partial)
    os.replace(partial, path)
    return str(path)


if __name__ == "__main__":
    try:
        print(binary())
    except BuildError as exc:
        sys.exit(f"error: {exc}")
