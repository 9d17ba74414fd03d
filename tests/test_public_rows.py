"""Public rows computed apart from private ones (issue 27; found by the cold review of its row isolation).

DPS-MOZO's zero-shot row, clip-blend's public prompt and the synthesizers' public prompts fix the support or
the centre of every token: the analyses treat them as public, so they must be the same bits on neighbouring
datasets. Fixed forward shapes keep rows apart only where no layer reads across rows; a quantised layer with
a per-batch scale does (measured by the review: a tiny Llama under ``torch.ao`` dynamic quantisation moved the
zero-shot row by 6.1e-3 when one drawn record was long instead of short). Here a backend that couples every
row of a call to the call's longest prompt stands in for any such model or server: the public rows must not
move, on every method, because they never share a call with a record's row. Each test failed before the
methods sent the public rows on their own (``public=`` in :mod:`dp_icl_plugin.backends.shared_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from dp_icl_plugin import (
    BudgetManager,
    ConfigurationError,
    FakeBackend,
    PrivacyBudget,
    PrivateDataset,
    PrivateRecord,
    TangSynthesizer,
)
from dp_icl_plugin.backends.public_rows import StackedSession, public_apart, start_apart
from dp_icl_plugin.backends.recompute import RecomputingSession
from dp_icl_plugin.decoding.decoders import ClipBlendDecoder, MozoDecoder
from dp_icl_plugin.steps import aggregation_step, mozo_step
from dp_icl_plugin.steps import clip_blend_step as clip_blend_module

WORDS = ["a", "b", "c", "d", "e", "f", "g", "h", "Text:", "Label:", "<eos>", "/"]


class CoupledBackend(FakeBackend):
    """Every row of a call is shifted by the call's longest prompt (a per-batch scale, as a quantised layer
    with dynamic per-tensor scales, or a server batching requests, may apply): rows in one call are coupled."""

    def next_token_logprobs(self, prompts: Sequence[object] | np.ndarray) -> np.ndarray:  # type: ignore[override]
        ids = self._prompt_ids(prompts)  # type: ignore[arg-type]
        out = super().next_token_logprobs(ids).astype(np.float64)
        out[:, 0] += 1e-3 * max(len(p) for p in ids)  # the coupling
        out -= np.logaddexp.reduce(out, axis=1, keepdims=True)
        return out.astype(np.float32)

    def start(self, prompts: Sequence[object] | np.ndarray) -> RecomputingSession:  # type: ignore[override]
        return RecomputingSession(self, prompts)  # type: ignore[arg-type]  # every step through the coupled call


def _records(long: bool) -> list[PrivateRecord]:
    records = [PrivateRecord(" ".join("abcdefgh"[(i + j) % 8] for j in range(2)), "ab"[i % 2]) for i in range(10)]
    if long:
        records = [PrivateRecord(" ".join("abcdefgh" * 20), r.label) if r is records[4] else r for r in records]
    return records


def _spy(monkeypatch: pytest.MonkeyPatch, module: object, name: str, public_arg: int) -> list[np.ndarray]:
    seen: list[np.ndarray] = []
    real = getattr(module, name)

    def spy(*args: object, **kwargs: object) -> object:
        seen.append(np.array(args[public_arg], copy=True))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return seen


@pytest.mark.parametrize("method", ["mozo", "clip-blend"])
def test_a_decoders_public_row_does_not_move_with_a_neighbouring_record(
    method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    public_rows = []
    for long in (False, True):
        data = PrivateDataset(_records(long), labels=["a", "b"])
        budget = BudgetManager(PrivacyBudget(100.0, 1e-3))
        backend = CoupledBackend(WORDS, eos_token="<eos>", seed=2)
        if method == "mozo":
            seen = _spy(monkeypatch, mozo_step, "mozo_token", 1)
            decoder: MozoDecoder | ClipBlendDecoder = MozoDecoder(
                data, backend=backend, budget=budget, n_queries=1, beta=0.5, max_tokens=4, n_shots=10, top_k=5
            )  # every record drawn at every token: the long one beside the zero-shot row
        else:
            seen = _spy(monkeypatch, clip_blend_module, "clip_blend_token", 1)
            decoder = ClipBlendDecoder(
                data,
                backend=backend,
                budget=budget,
                n_queries=1,
                subset_size=10,
                population_size=10,
                temperature=1.0,
                max_tokens=4,
                rng_subset=np.random.default_rng(0),
            )
            assert len(decoder._subset) == 10  # s = N: every record in the fixed subset, the long one too
        decoder.generate("c d", rng=np.random.default_rng(5), max_tokens=4)
        public_rows.append(np.stack(seen[:1]))  # the first token's public row (later ones follow other tokens)
        monkeypatch.undo()
    assert np.array_equal(public_rows[0], public_rows[1]), "the public row moved with a private record's length"


def test_the_synthesizers_public_rows_do_not_move_with_a_neighbouring_record(monkeypatch: pytest.MonkeyPatch) -> None:
    # PTA: the public prompt and the base prompt both public, both apart from the records' prompts
    public_rows = []
    for long in (False, True):
        data = PrivateDataset(_records(long), public_label_counts={"a": 5, "b": 5})
        seen: list[np.ndarray] = []
        real = aggregation_step.limit_vocabulary

        def spy(probs: np.ndarray, seen: list = seen, real: object = real, **kwargs: object) -> np.ndarray:
            seen.append(np.array(probs, copy=True))  # the public row's probabilities, each token
            return real(probs, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(aggregation_step, "limit_vocabulary", spy)
        method = TangSynthesizer(noise_multiplier=1.0, max_tokens=1, n_prompts=5, records_per_prompt=1, top_k=5)
        method.synthesize(
            data,
            labels=["a"],
            backend=CoupledBackend(WORDS, seed=2),
            budget=BudgetManager(PrivacyBudget(100.0, 1e-3)),
            rng=np.random.default_rng(0),
        )
        public_rows.append(seen[0])
        monkeypatch.undo()
    assert np.array_equal(public_rows[0], public_rows[1])


# ------------------------------------------------------------------------------------------------ plumbing
def test_public_apart_makes_two_calls_and_keeps_the_rows_order() -> None:
    calls: list[list[int]] = []

    def compute(rows: list[int]) -> np.ndarray:
        calls.append(list(rows))
        return np.array([[float(r), 0.0] for r in rows])

    out = public_apart(None, [7, 8, 9], 1, compute)
    assert calls == [[7], [8, 9]] and out[:, 0].tolist() == [7.0, 8.0, 9.0]
    calls.clear()
    assert public_apart(None, [7], 1, compute)[:, 0].tolist() == [7.0] and calls == [[7]]  # no records: one call
    calls.clear()
    public_apart(None, [7, 8], 0, compute)
    assert calls == [[7, 8]]
    with pytest.raises(ConfigurationError, match="public must be"):
        public_apart(None, [7], 2, compute)


def test_a_stacked_session_steps_both_sessions_and_closes_both() -> None:
    backend = FakeBackend(WORDS, seed=1)
    prompts = [[0, 1], [2, 3, 4], [5]]
    with backend.start(prompts) as whole, start_apart(backend, prompts, 1, backend.start) as apart:
        assert isinstance(apart, StackedSession) and apart.n_prompts == 3
        assert np.array_equal(apart.lengths, whole.lengths) and np.allclose(apart.logprobs, whole.logprobs)
        assert np.allclose(apart.append(3), whole.append(3))
        assert np.allclose(apart.append([1, 2, 3]), whole.append([1, 2, 3]))
    with pytest.raises(ConfigurationError, match="closed"):
        apart.append(1)


def test_a_stacked_session_closes_the_public_one_when_the_second_fails_to_start() -> None:
    opened: list[RecomputingSession] = []
    backend = FakeBackend(WORDS, seed=1)

    def start(rows: list[list[int]]) -> RecomputingSession:
        if len(opened) == 1:
            raise RuntimeError("out of memory")
        opened.append(RecomputingSession(backend, rows))
        return opened[-1]

    with pytest.raises(RuntimeError):
        start_apart(backend, [[0], [1]], 1, start)
    with pytest.raises(ConfigurationError, match="closed"):
        opened[0].append(1)


def test_a_stacked_session_closes_every_session_even_when_one_fails_to_close() -> None:
    class Failing(RecomputingSession):
        def close(self) -> None:
            super().close()
            raise RuntimeError("close failed")

    backend = FakeBackend(WORDS, seed=1)
    first, second = Failing(backend, [[0]]), RecomputingSession(backend, [[1]])
    with pytest.raises(RuntimeError):
        StackedSession([first, second]).close()
    with pytest.raises(ConfigurationError, match="closed"):
        second.append(1)
