"""kill -9 a process at random points while it charges a ledger, many times; check the ledger after each.

Run as a fresh process (it forks, so it must not have started threads): ``python crash_harness.py LEDGER N SEED``.
Each child opens the ledger and charges in a loop, appending each committed entry's id to a release log
only after ``spend`` returned (a release follows its commit). The parent kills it with SIGKILL after a
random delay, then opens the ledger (which runs SQLite's integrity check and the ledger's own consistency
check) and verifies that every released id is a committed entry. Prints one JSON line with the counts.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time

from dp_icl_plugin import BudgetManager, PrivacyBudget, PureDPEvent


def child(ledger: str, log: str) -> None:
    manager = BudgetManager.open(ledger)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    while True:
        entry = manager.spend(PureDPEvent(1e-4, neighbouring="replace_one"), label="crash-test")
        os.write(fd, f"{entry.id}\n".encode())  # the "release": only after the charge is committed


def main() -> None:
    ledger, rounds, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    log = ledger + ".released"
    BudgetManager(PrivacyBudget(1e6, 1e-6), ledger=ledger).close()
    rng = random.Random(seed)
    violations = 0
    for _ in range(rounds):
        pid = os.fork()
        if pid == 0:
            try:
                child(ledger, log)
            finally:
                os._exit(0)
        time.sleep(rng.uniform(0.0, 0.04))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        manager = BudgetManager.open(ledger)  # integrity and consistency checks run on open
        committed = {e.id for e in manager.history()}
        manager.close()
        with open(log) if os.path.exists(log) else open(os.devnull) as fh:
            released = {int(line) for line in fh if line.strip()}
        violations += len(released - committed)
    print(
        json.dumps(
            {
                "rounds": rounds,
                "committed": len(committed),
                "released": len(released),
                "released_without_commit": violations,
            }
        )
    )


if __name__ == "__main__":
    main()
