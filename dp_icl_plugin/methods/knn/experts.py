"""Expert decoding: the records nearest to a query, each paying through its own filter, steer every token.

The kNN paper's individual accounting (Wu et al., ICLR 2024; Feldman & Zrnic 2021, Thm. 4.5) meets
clip-blend's token mechanism (Bhusal et al., Algorithm 1 lines 6–9, eq. 2, Lemmas 1–2):

1. **Selection.** The public query is embedded; every *candidate* (an active record whose cosine similarity
   reaches the public ``min_similarity``) is charged through its unit's Rényi filter, inside the filter's
   transaction; the ``k`` most similar admitted candidates are the answer's *experts* (exact search: stable,
   :mod:`dp_icl_plugin.methods.knn.index`). A unit's charge depends on its own records and the public query
   alone (its number c of candidate records), the condition under which the filter is valid.
2. **Tokens.** Each expert gives a one-shot prompt (its text and answer, or label, as one demonstration
   before the query); the prompts stay fixed for the whole answer. Per token: the zero-shot row u (query and
   tokens so far, no record; public) and each expert's row z_i are restricted to u's ``expert_top_k`` most
   likely tokens (public), clipped to [−c, c] (eq. 2), averaged with the **fixed** divisor k (never the
   number of experts present), blended with the clipped public row, and sampled at temperature τ:
   ẑ = ((1/k)·Σ_i clip_c(z_i) + clip_c(u))/2, x ~ softmax(ẑ/τ).
3. **Neighbouring relation and sensitivity.** Add/remove one unit (a record, or all of one person's records
   with ``group_by_user``). Removing a unit with c candidate records swaps at most min(c, k) experts (the next
   candidates move up; with fewer than k left, rows go): each swap moves every entry of ẑ by at most c_clip/k,
   so a token is an exponential mechanism with ε0·min(c, k), ε0 = 2c_clip/(kτ): ε0-DP and ε0-bounded-range,
   ε0²/8-zCDP (Cesar & Rogers 2021). The per-token bound is that of one replaced prompt and does not grow
   with k, while the experts' agreement does: c_clip/τ = ε0·k/2 (:meth:`PrivateKNN.expert_scale`).
4. **Accounting.** The answer's T tokens compose adaptively (each token's distribution depends on the
   released tokens before it, which are public): a unit pays T·min(αε0²/8, pure(ε0)) per candidate record
   group at every filter order (``uses`` answers of ``max_answer_tokens`` tokens fill one unit's budget,
   :func:`~dp_icl_plugin.methods.knn.retriever.token_epsilon_for_uses`). Every answer is charged for its
   worst case (all ``max_tokens`` tokens) before the first token is computed; stopping early refunds nothing.
   The ledger holds the filter's total once (:meth:`PrivateKNN.cover_event`) and records each answer as a
   :class:`~dp_icl_plugin.accounting.FilteredReleaseEvent`.

Records with neither an answer nor a label, or whose text the tokenizer cannot encode, sit idle (they paid;
they keep their slot, so the others' do not change). Generated tokens and the public row are post-processing.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

import numpy as np

from dp_icl_plugin.accounting.budget import LedgerEntry
from dp_icl_plugin.backends.base import check_logprobs
from dp_icl_plugin.backends.shared_suffix import start_rows
from dp_icl_plugin.errors import ConfigurationError
from dp_icl_plugin.mechanisms.clip_blend import clip_blend_token
from dp_icl_plugin.mechanisms.mozo import top_k_support
from dp_icl_plugin.methods.data import PrivateRecord
from dp_icl_plugin.methods.decoder import Query
from dp_icl_plugin.methods.decoding import _Decoder
from dp_icl_plugin.methods.knn.retriever import PrivateKNN, Retrieval
from dp_icl_plugin.methods.mozo import AnswerTemplate
from dp_icl_plugin.timing import FixedLatency

__all__ = ["KNNExpertDecoder"]


def _query_text(prompt: str | tuple[dict[str, str], ...]) -> str:
    """The text a query is retrieved by: a completion prompt, or a chat's last (user) message."""
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


class KNNExpertDecoder(_Decoder):
    """DP decoding with the query's nearest records as experts, each paying its own budget; see the module.

    Implements the :class:`~dp_icl_plugin.methods.decoder.Decoder` contract, so it serves the LangChain chat
    model / LLM and the LlamaIndex LLM like the other decoders.

    Args:
        knn: the private index, ledger, backend and settings (``config.k`` experts, ``min_similarity``,
            ``uses`` answers per record of ``max_answer_tokens`` tokens, ``expert_temperature``,
            ``expert_top_k``).
        template: how a record and a completion query form a prompt (default: ``AnswerTemplate(stop=None)``).
        fixed_latency: hide timing: every answer returns this many seconds after it starts (how many
            experts an answer had shows in its computation time otherwise).

    Raises:
        ConfigurationError: the retriever has no backend.
    """

    kind = "knn-experts"

    def __init__(
        self,
        knn: PrivateKNN,
        *,
        template: AnswerTemplate | None = None,
        fixed_latency: float | FixedLatency | None = None,
    ) -> None:
        if not isinstance(knn, PrivateKNN):
            raise ConfigurationError("knn must be a PrivateKNN")
        if knn.backend is None:
            raise ConfigurationError("expert decoding needs the PrivateKNN's backend (a language model)")
        super().__init__(backend=knn.backend, budget=knn.budget, max_tokens=knn.config.max_answer_tokens,
                         template=template, fixed_latency=fixed_latency)  # fmt: skip
        self.knn = knn
        self.k = knn.config.k
        self.clip, self.temperature = knn.expert_scale(self.k)
        self.top_k = knn.config.expert_top_k

    @property
    def token_epsilon(self) -> float:
        """ε0: what one token costs a unit with one candidate record (pure DP, add/remove)."""
        return self.knn.expert_epsilon

    def check(self, query: Query, *, max_tokens: int | None = None, stop: Sequence[str] | None = None) -> None:
        super().check(query, max_tokens=max_tokens, stop=stop)
        self.knn._require("decode")

    def _reserve(self, limit: int) -> int:
        return limit - 1  # the prompts stay fixed and grow by the answer: each keeps room for it

    def _charge(self, prompt, limit: int) -> tuple[LedgerEntry, Retrieval]:
        retrieval = self.knn.retrieve(_query_text(prompt), release="decode", k=self.k, tokens=limit)
        retrieval.claim()
        assert retrieval.charge is not None
        return retrieval.charge, retrieval

    def _experts(self, retrieval: Retrieval) -> list[PrivateRecord]:
        """The experts' demonstrations (private): answer, else label; records without either, or that the
        tokenizer rejects, sit idle."""
        out = []
        for record in retrieval:
            field = record.answer if record.answer is not None else record.label
            if field is None:
                continue
            text, output = record.text.reveal(), field.reveal()
            if self.knn._encodes(text) and self.knn._encodes(output):
                out.append(PrivateRecord(text, output))
        return out

    def _tokens(self, prompt, limit: int, rng: np.random.Generator, paid: Any) -> Generator[int, None, None]:
        room = self._reserve(limit)
        experts = self._experts(paid)
        prompts = [self._ids(prompt, None, reserve=room)] + [self._ids(prompt, r, reserve=room) for r in experts]
        suffix = self._public_suffix(prompt, reserve=room)
        with start_rows(self.backend, prompts, suffix=suffix, public=1) as session:  # the public prompt apart
            logprobs = check_logprobs(session.logprobs)
            for step in range(limit):
                token = self._token(logprobs, rng)
                yield token
                if step + 1 < limit:
                    logprobs = check_logprobs(session.append(token))

    def _token(self, logprobs: np.ndarray, rng: np.random.Generator) -> int:
        """One token: the public support, then clip-blend over it with the fixed divisor k."""
        public = logprobs[0]
        support = np.arange(public.size) if self.top_k == 0 else top_k_support(public, self.top_k)
        index = clip_blend_token(logprobs[1:, support], public[support], clip=self.clip, subset_size=self.k,
                                 temperature=self.temperature, rng=rng)  # fmt: skip
        return int(support[index])
