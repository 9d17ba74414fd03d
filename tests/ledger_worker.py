"""A separate process that charges one ledger from several threads; prints its commit count.

Usage: python ledger_worker.py LEDGER EPSILON_PER_CHARGE THREADS ATTEMPTS_PER_THREAD [LEDGER_NAME]

LEDGER is an SQLite file or a ``postgresql://`` DSN; LEDGER_NAME picks a named ledger in that database
(default: "default").
"""

from __future__ import annotations

import sys
import threading

from dp_icl_plugin import BudgetExhaustedError, BudgetManager, PureDPEvent


def main() -> None:
    ledger, eps, threads, attempts = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    if len(sys.argv) > 5:
        from dp_icl_plugin.accounting.stores import PostgresStore

        manager = BudgetManager(None, ledger=PostgresStore(ledger, ledger=sys.argv[5]))
    else:
        manager = BudgetManager.open(ledger)
    committed: list[int] = []
    lock = threading.Lock()

    def charge() -> None:
        for _ in range(attempts):
            try:
                manager.spend(PureDPEvent(eps, neighbouring="replace_one"), label="hammer")
            except BudgetExhaustedError:
                continue
            with lock:
                committed.append(1)

    workers = [threading.Thread(target=charge) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    print(len(committed))


if __name__ == "__main__":
    main()
