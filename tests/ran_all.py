"""Exits 1 unless the pytest run that `SPINDLE_TEST_RECORD=FILE` recorded ran every test it
collected, and some: a run cut short by a process exit records nothing, so it fails here
however pytest exited. Usage: python tests/ran_all.py FILE"""

import json
import sys


def main() -> int:
    path = sys.argv[1]
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError) as exc:
        print(f"error: the test run recorded nothing in {path} ({exc}): it ended before pytest "
              "finished (a process exit in a test?)", file=sys.stderr)
        return 1
    if record["collected"] == 0 or record["ran"] < record["collected"]:
        print(f"error: the test run ran {record['ran']} of the {record['collected']} tests it collected",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
