#!/usr/bin/env bash
# Breaks the product (or the test harness) on purpose, one way at a time, in a scratch work
# tree of HEAD, and runs the tests that must catch it. Each case runs its tests twice: on
# HEAD as it is, where they must pass (a control: a test that fails anyway proves nothing),
# then with its patch, where the run must fail for the stated reason: every pattern listed
# for it must appear in pytest's output. docs/testing.md tells what each breakage stands for.
# Usage: tests/sabotage/run.sh [NAME...] (default: all).
# Exit status: 0 when every breakage was caught, 1 when one was not, 2 on a setup error.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
here="$repo/tests/sabotage"
python="$repo/.venv/bin/python"
[ -x "$python" ] || { echo "error: no $python; run 'make setup' first" >&2; exit 2; }

# name: the tests that must catch it
declare -A tests=(
  [never-parks]="tests/test_durability.py::test_a_parked_get_does_not_survive_a_restart"
  [faults-before-load]="tests/test_durability.py::test_acknowledged_updates_survive_20_kills_exactly_once tests/test_cluster.py::test_killing_the_busiest_leader_under_load_loses_and_repeats_nothing"
  [renamed-flag]="tests/test_compute.py tests/test_shell.py tests/test_shared.py"
  [a-skip]="tests/test_objects.py"
  [stale-reads]="tests/test_cluster.py::test_a_leader_cut_off_by_a_partition_never_answers_a_read_with_stale_state"
  [open-gate]="tests/test_permissions.py"
  [unstamped]="tests/test_permissions.py::test_a_pickle_from_a_writer_who_may_not_run_code_is_never_unpickled"
  [late-backpressure]="tests/test_limits.py::test_a_client_that_does_not_read_is_not_served_more_until_it_does"
  [early-format]="tests/test_upgrade.py::test_a_rolling_upgrade_under_load_loses_no_acknowledged_call"
  [unisolated]="tests/test_serializability_workload.py tests/test_transactions.py::test_a_single_call_on_an_object_a_transaction_read_fails_its_commit"
  [unheld]="tests/test_cluster_transactions.py::test_list_append_transactions_over_shards_are_strictly_serializable"
  [http-forgets-keys]="tests/test_http.py::test_a_retry_with_the_same_idempotency_key_applies_once"
)
# name: what the failing run must say (extended regular expressions, one per line)
declare -A says=(
  [never-parks]="FAILED tests/test_durability.py::test_a_parked_get_does_not_survive_a_restart"
  [faults-before-load]="FAILED tests/test_durability.py::test_acknowledged_updates_survive_20_kills_exactly_once\[log-only\]
FAILED tests/test_durability.py::test_acknowledged_updates_survive_20_kills_exactly_once\[snapshots\]
FAILED tests/test_cluster.py::test_killing_the_busiest_leader_under_load_loses_and_repeats_nothing
acknowledged before the"
  [renamed-flag]="did not print 'spindle listening on '
ERROR tests/test_compute.py::
ERROR tests/test_shell.py::
ERROR tests/test_shared.py::"
  [a-skip]="skips not allowed in CI
tests/test_objects.py::test_event_between_threads"
  [stale-reads]="FAILED tests/test_cluster.py::test_a_leader_cut_off_by_a_partition_never_answers_a_read_with_stale_state
NOT linearizable"
  [open-gate]="FAILED tests/test_permissions.py::test_each_permission_is_allowed_to_its_role_and_refused_to_others
FAILED tests/test_permissions.py::test_the_sdk_raises_permission_denied_naming_operation_and_name"
  [unstamped]="FAILED tests/test_permissions.py::test_a_pickle_from_a_writer_who_may_not_run_code_is_never_unpickled"
  [late-backpressure]="FAILED tests/test_limits.py::test_a_client_that_does_not_read_is_not_served_more_until_it_does
the server grew by"
  [early-format]="FAILED tests/test_upgrade.py::test_a_rolling_upgrade_under_load_loses_no_acknowledged_call"
  [unisolated]="FAILED tests/test_serializability_workload.py::
FAILED tests/test_transactions.py::test_a_single_call_on_an_object_a_transaction_read_fails_its_commit"
  [unheld]="FAILED tests/test_cluster_transactions.py::test_list_append_transactions_over_shards_are_strictly_serializable"
  [http-forgets-keys]="FAILED tests/test_http.py::test_a_retry_with_the_same_idempotency_key_applies_once"
)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(never-parks faults-before-load renamed-flag a-skip stale-reads open-gate unstamped late-backpressure early-format unisolated unheld http-forgets-keys)

tree=""
cleanup() { [ -z "$tree" ] || git -C "$repo" worktree remove --force "$tree" 2>/dev/null; tree=""; }
trap cleanup EXIT

# A scratch work tree of HEAD that shares the built tools of this one (always at one path,
# so that its builds are incremental).
scratch() {
  tree="$repo/target/sabotage/tree"
  git -C "$repo" worktree remove --force "$tree" 2>/dev/null
  rm -rf "$tree"
  git -C "$repo" worktree add --quiet --detach "$tree" HEAD || exit 2
  ln -s "$repo/.venv-pypy" "$tree/.venv-pypy"
  mkdir -p "$tree/target" && ln -s "$repo/target/linearizability" "$tree/target/linearizability"
  mkdir -p "$repo/target/previous-release" && ln -s "$repo/target/previous-release" "$tree/target/previous-release"
}

# Build the spindle binary of the scratch tree into target/sabotage/NAME; print its path.
build() {
  (cd "$tree" && CARGO_TARGET_DIR="$repo/target/sabotage/$1" cargo build --release --locked --quiet -p spindle-cli) >&2 \
    || { echo "error: the build of $1 failed" >&2; return 2; }
  echo "$repo/target/sabotage/$1/release/spindle"
}

# Run the case's tests in the scratch tree with BINARY under CI; output to LOG; pytest's status.
run_tests() {
  # shellcheck disable=SC2086  # the test list splits on spaces
  (cd "$tree" && CI=true SPINDLE_BIN="$2" timeout 1200 "$python" -m pytest -q -p no:cacheprovider ${tests[$1]} >"$3" 2>&1)
}

missed=0
for name in "${names[@]}"; do
  [ -n "${tests[$name]:-}" ] || { echo "error: no breakage named $name" >&2; exit 2; }
  echo "== $name: $(head -1 "$here/$name.patch" | cut -c5-)" >&2
  scratch
  head_binary=$(build head) || exit 2
  control="$repo/target/sabotage/$name.control.log"
  if ! run_tests "$name" "$head_binary" "$control"; then
    echo "error: $name: its tests fail on HEAD too, so they prove nothing; see $control" >&2
    exit 2
  fi
  git -C "$tree" apply "$here/$name.patch" || { echo "error: $name.patch no longer applies to HEAD; update it" >&2; exit 2; }
  binary=$head_binary
  if grep -q '^+++ b/crates/' "$here/$name.patch"; then binary=$(build broken) || exit 2; fi
  log="$repo/target/sabotage/$name.log"
  run_tests "$name" "$binary" "$log"
  status=$?
  unsaid=$(while IFS= read -r pattern; do grep -qE -- "$pattern" "$log" || echo "$pattern"; done <<<"${says[$name]}")
  if [ $status -ne 0 ] && [ -z "$unsaid" ]; then
    echo "caught: $name (pytest exit $status): $(tail -1 "$log")" >&2
  else
    echo "MISSED: $name: pytest exit $status; missing from $log: ${unsaid:-nothing}" >&2
    missed=1
  fi
  cleanup
done
exit $missed
