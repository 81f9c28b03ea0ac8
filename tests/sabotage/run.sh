#!/usr/bin/env bash
# Breaks the product (or the test harness) on purpose, one way at a time, in a scratch work
# tree of HEAD, and runs the tests that must catch it: each must fail. docs/testing.md tells
# what each breakage stands for. Usage: tests/sabotage/run.sh [NAME...] (default: all).
# Exit status: 0 when every breakage was caught, 1 when one was not, 2 on a setup error.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
here="$repo/tests/sabotage"
python="$repo/.venv/bin/python"
[ -x "$python" ] || { echo "error: no $python; run 'make setup' first" >&2; exit 2; }

# name: the tests that must fail once its patch is applied
declare -A catches=(
  [never-parks]="tests/test_durability.py::test_a_parked_get_does_not_survive_a_restart"
  [faults-before-load]="tests/test_durability.py::test_acknowledged_updates_survive_20_kills_exactly_once tests/test_cluster.py::test_killing_the_busiest_leader_under_load_loses_and_repeats_nothing"
  [renamed-flag]="tests/test_compute.py tests/test_shell.py tests/test_shared.py"
  [a-skip]="tests/test_objects.py"
)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(never-parks faults-before-load renamed-flag a-skip)

missed=0
for name in "${names[@]}"; do
  [ -n "${catches[$name]:-}" ] || { echo "error: no breakage named $name" >&2; exit 2; }
  tree=$(mktemp -d)
  git -C "$repo" worktree add --quiet --detach "$tree" HEAD || exit 2
  echo "== $name: $(head -1 "$here/$name.patch" | cut -c5-)" >&2
  if ! git -C "$tree" apply "$here/$name.patch"; then
    echo "error: $name.patch no longer applies to HEAD; update it" >&2
    git -C "$repo" worktree remove --force "$tree"; exit 2
  fi
  binary="$repo/target/release/spindle"
  if grep -q '^+++ b/crates/' "$here/$name.patch"; then
    # Its own target directory, so the main build stays as it was.
    (cd "$tree" && CARGO_TARGET_DIR="$repo/target/sabotage" cargo build --release --locked --quiet -p spindle-cli) || exit 2
    binary="$repo/target/sabotage/release/spindle"
  fi
  # shellcheck disable=SC2086  # the test list splits on spaces
  (cd "$tree" && CI=true SPINDLE_BIN="$binary" timeout 1200 "$python" -m pytest -q -p no:cacheprovider \
     ${catches[$name]} >"$tree.log" 2>&1)
  status=$?
  if [ $status -ne 0 ]; then
    echo "caught: $name (pytest exit $status): $(tail -1 "$tree.log")" >&2
    grep -E '^(FAILED|ERROR) ' "$tree.log" | head -5 >&2
  else
    echo "MISSED: $name: the tests passed with it; see $tree.log" >&2
    missed=1
  fi
  git -C "$repo" worktree remove --force "$tree"
done
exit $missed
