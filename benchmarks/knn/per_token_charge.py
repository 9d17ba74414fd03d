"""What expert decoding paid per token costs the index and the ledger: one token's charge against one answer's.

Expert decoding paid per token (``KNNExpertDecoder(pay_per_token=True)``) charges every candidate's filter one
token before each token mechanism: one filter transaction over the candidates' units and one ledger record a
token, where an answer paid up front commits one of each for all its tokens. Side by side in one run, for an
index in memory and one kept on disk (its filter in SQLite) with an SQLite ledger: ``--records`` records, ``--k``
candidates a charge (the first k records, as a query's nearest), ``--calls`` timed charges of each kind after
``--calls`` untimed ones. (An index in PostgreSQL is refused for per-token answers, so it is not measured.) The
ratio that matters is a token's charge in milliseconds against a token mechanism's time on the same machine
(``benchmarks/decoding_floor.md``).

Run: ``.venv/bin/python benchmarks/knn/per_token_charge.py [--records 2000] [--k 40] [--calls 200]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from dp_icl_plugin import BudgetManager, FakeBackend, IndividualBudget, PrivacyBudget, PrivateIndex, PrivateKNN
from dp_icl_plugin.retrieval import KNNConfig
from dp_icl_plugin.retrieval.index import Candidates

sys.path.insert(0, str(Path(__file__).parent.parent))
from allowance_draws import timed  # the same median of timed calls as the allowance benchmark

TOKENS = 25  # the answer paid up front


def _embed(texts: list[str]) -> np.ndarray:  # public and fixed: the search is not what is timed
    return np.array([[1.0, (hash(t) % 1000) / 1000.0] for t in texts])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--k", type=int, default=40)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, path, ledger in (
            ("memory", None, None),
            ("SQLite (index kept on disk, ledger file)", Path(tmp) / "index", str(Path(tmp) / "ledger.db")),
        ):
            index = PrivateIndex(budget=IndividualBudget(epsilon=200.0, delta=1e-9), embedder=_embed, path=path)
            ids = index.add([f"record {i}" for i in range(args.records)], answers=["a"] * args.records)
            knn = PrivateKNN(
                index,
                budget=BudgetManager(PrivacyBudget(epsilon=1e4, delta=1e-4, neighbouring="add_remove"), ledger=ledger),
                backend=FakeBackend(["a", "b"]),
                # ε0 small enough that every charge below is admitted (a refusal costs a transaction too, but
                # the app's case is records that pay)
                config=KNNConfig(k=args.k, shards=1, max_answer_tokens=TOKENS, uses=args.calls * 2 + 2),
                releases=("decode",),
            )
            near = Candidates(np.asarray(ids[: args.k], dtype=np.int64), np.ones(args.k, dtype=np.float32))
            for _ in range(args.calls):  # a history first
                knn._charge_candidates(near, "decode", args.k, 1)
            token = timed(lambda c=near, r=knn: r._charge_candidates(c, "decode", args.k, 1), args.calls)
            answer = timed(lambda c=near, r=knn: r._charge_candidates(c, "decode", args.k, TOKENS), args.calls)
            admitted, _ = knn._charge_candidates(near, "decode", args.k, 1)
            assert len(admitted) == args.k, "the timed charges must be admitted ones"
            rows.append((name, token, answer))
            knn.budget.close()
    print(f"| index and ledger | one token's charge (ms) | one answer's charge, {TOKENS} tokens (ms) | ratio |")
    print("|---|---:|---:|---:|")
    for name, token, answer in rows:
        print(f"| {name} | {token:.2f} | {answer:.2f} | {TOKENS * token / answer:.1f}× for {TOKENS} tokens |")
    print(f"({args.records} records, {args.k} candidates a charge, median of {args.calls} calls each)")


if __name__ == "__main__":
    main()
