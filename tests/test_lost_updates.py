"""No silent wrong answers: a cloud function that changes state it cannot share warns
spindle.LostUpdateWarning at the caller, once per site, naming the state and the fix."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from conftest import ServerProcess, gateway_args

PROGRAM = textwrap.dedent(
    """
    import warnings
    import spindle

    totals = []
    count = 0

    def add(x):
        totals.append(x)

    def bump():
        global count
        count += 1

    def collector():
        seen = {}
        def collect(k):
            seen[k] = True
        return collect

    class Account:
        def __init__(self):
            self.balance = 0

        def deposit(self, n):
            self.balance += n

        def read(self):
            return self.balance

    def pure(x, counter):
        counter.add(x)  # a shared object: its change is the server's, nothing lost
        return totals + [x]

    if __name__ == "__main__":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            acct = Account()
            counter = spindle.Counter()
            with spindle.Executor(echo=False) as ex:
                list(ex.map(add, range(5)))
                for _ in range(3):
                    ex.submit(acct.deposit, 10).result(60)
                    ex.submit(bump).result(60)
                ex.submit(collector(), "k").result(60)
                ex.submit(acct.read).result(60)
                list(ex.map(pure, range(5), [counter] * 5))
            t = spindle.Thread(target=add, args=(9,))
            t.start()
            t.join()
        for w in caught:
            print(f"{w.category.__name__}|{w.lineno}|{w.message}")
        print("totals", totals, "count", count, "balance", acct.balance, "counter", counter.get())
    """
)


def run_program(env: dict, tmp_path) -> list:
    """PROGRAM's output lines: the warnings it caught, then its state."""
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_lost_updates_warn_once_per_site_naming_the_state_and_the_fix(child_env, tmp_path):
    lines = run_program(child_env, tmp_path)
    # The program's own state is untouched (the changes stayed in the workers)...
    assert lines[-1] == "totals [] count 0 balance 0 counter 10"
    warned = [line.split("|", 2) for line in lines[:-1]]
    assert all(category == "LostUpdateWarning" for category, _, _ in warned), warned
    messages = {message.split(" ran as")[0]: (int(line), message) for _, line, message in warned}
    # ...and each site said so once: add (map and Thread alike), bump, collect, deposit.
    assert sorted(messages) == ["Account.deposit", "add", "bump", "collector.<locals>.collect"]
    source = PROGRAM.splitlines()
    line, message = messages["add"]
    assert "'totals'" in message and "spindle.Dict" in message
    assert source[line - 1].startswith("def add")  # warned at the function's definition
    assert "'count'" in messages["bump"][1]
    assert "'seen'" in messages["collector.<locals>.collect"][1]
    line, message = messages["Account.deposit"]
    assert "Account" in message and "@spindle.shared" in message


def test_spindle_lost_updates_0_in_the_servers_environment_turns_the_check_off(child_env, tmp_path):
    server_env = dict(os.environ, SPINDLE_LOST_UPDATES="0")  # its workers inherit it
    server = ServerProcess(*gateway_args(), env=server_env)
    try:
        lines = run_program(dict(child_env, SPINDLE_ADDRESS=server.address), tmp_path)
    finally:
        server.stop()
    assert lines == ["totals [] count 0 balance 0 counter 10"], "no warning, the same state"
