"""A :class:`~dp_icl_plugin.backends.base.NextTokenBackend` over an OpenAI-compatible inference server (vLLM).

Every method reads a model only through ``next_token_logprobs`` and ``start``, so this backend lets every
synthesizer, decoder and adapter run on a served deployment of any size (tensor parallelism, replicas behind
a router). Prompts are tokenised here, with the model's own tokenizer (checked against the server's
``/tokenize`` when the backend is built), and sent as token ids to ``/v1/completions`` with
``max_tokens=1`` and ``logprobs``: all prompts of a call concurrently (one request each, so the server
batches them continuously), the answer keyed by token id (``return_tokens_as_token_ids``).

Log-probabilities: by default the full vocabulary (``logprobs=-1``; the server must be started with
``--max-logprobs -1``), the same distributions as :class:`~dp_icl_plugin.backends.hf.HFBackend` on the same
weights up to the server's float arithmetic. With ``top_k=k`` the server returns only the k likeliest tokens
and :func:`~dp_icl_plugin.backends.server_rows.full_row` completes each row from that row alone (residual
mass spread evenly, capped at the smallest returned probability): still a probability vector per prompt, so
every method's privacy analysis holds; methods whose public candidate set is larger than k refuse
(:func:`~dp_icl_plugin.synthesis.method.check_top_k`). The server's ``--logprobs-mode`` must stay
``raw_logprobs`` (vLLM's default): the model's distribution before any sampling parameter.

Privacy boundary: the server receives private prompts; it belongs to the data holder (see
:mod:`~dp_icl_plugin.backends.server_http` for the URL policy, TLS, the API key and retries). Nothing is
charged here: methods charge before their first call, and a failing server ends the call in a typed
:class:`~dp_icl_plugin.errors.ServerError` with that charge kept.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.backends import gguf
from dp_icl_plugin.backends.base import Prompt
from dp_icl_plugin.backends.hf_tokenizer import TokenizerBackendBase
from dp_icl_plugin.backends.recompute import RecomputingSession
from dp_icl_plugin.backends.server_http import ServerClient
from dp_icl_plugin.backends.server_rows import full_row
from dp_icl_plugin.backends.server_settings import ServerSettings
from dp_icl_plugin.errors import ConfigurationError, ConfigurationTypeError, ServerError, ServerMismatchError

__all__ = ["ServerBackend", "load_tokenizer"]

TOKENIZER_PROBE = "DP-ICL tokenizer check: naïve café, 12,345 tokens ✓\n\tEnd."
"""Public text tokenised both here and by the server when the backend is built."""


class ServerBackend(TokenizerBackendBase):
    """Next-token log-probabilities from an OpenAI-compatible server (vLLM), prompts tokenised locally.

    Args:
        base_url: the server, e.g. ``"http://127.0.0.1:8000"`` (``/v1`` optional). Plain http only to a
            loopback host unless ``allow_insecure_http=True``.
        tokenizer: the served model's tokenizer (a ``transformers`` tokenizer); see :meth:`from_url` to load one.
        model: the served model name; default: the only model the server lists.
        top_k: None (default) for full-vocabulary rows, or k for the server's top k completed per row.
        api_key: default: ``DP_ICL_SERVER_API_KEY`` or ``OPENAI_API_KEY`` from the environment.
        timeout: seconds per request.
        max_retries: retries of a failed request (connection, timeout, 429, 502–504).
        backoff: the first retry's delay in seconds, doubled at each retry.
        max_concurrency: requests in flight at once.
        allow_insecure_http: allow plain http to a host other than loopback.
        verify: TLS verification: True, or a CA bundle path.
        transport: an ``httpx`` transport (tests).

    Raises:
        ConfigurationError: a bad setting or tokenizer, or an insecure URL.
        ServerMismatchError: the server does not serve the model, splits text differently from ``tokenizer``,
            or returns fewer log-probabilities than asked for.
        ServerError: the server failed or could not be reached (:class:`~dp_icl_plugin.errors.ServerError`'s
            subclasses say which).
    """

    def __init__(
        self,
        base_url: str,
        tokenizer: Any,
        *,
        model: str | None = None,
        top_k: int | None = None,
        api_key: str | None = None,
        timeout: float = 120.0,
        max_retries: int = 2,
        backoff: float = 0.5,
        max_concurrency: int = 32,
        allow_insecure_http: bool = False,
        verify: bool | str = True,
        transport: Any = None,
    ) -> None:
        self.top_k = None if top_k is None else check.positive_int("top_k", top_k)
        self.max_concurrency = check.positive_int("max_concurrency", max_concurrency)
        if not callable(getattr(tokenizer, "encode", None)) or not callable(getattr(tokenizer, "decode", None)):
            raise ConfigurationError("tokenizer must be a transformers tokenizer (see ServerBackend.from_url)")
        self.tokenizer = tokenizer
        self._vocab_size = len(tokenizer)
        self._client = ServerClient(
            base_url,
            api_key=api_key,
            timeout=timeout,
            max_retries=max_retries,
            backoff=backoff,
            allow_insecure_http=allow_insecure_http,
            verify=verify,
            max_connections=self.max_concurrency,
            transport=transport,
        )
        self.base_url = self._client.base_url
        self.model, max_model_len = self._served_model(model)
        self._model_id = self.model
        # one position is the answer token the completion request asks for
        self.max_length: int | None = None if max_model_len is None else max_model_len - 1
        self._pool = ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="dp-icl-server")
        self._closer = weakref.finalize(self, _close, self._pool, self._client)  # connections go with the backend
        self._check_tokenizer()
        self._check_logprobs()

    @classmethod
    def with_settings(
        cls,
        base_url: str,
        tokenizer: str | os.PathLike[str] | Any,
        settings: ServerSettings,
        *,
        model: str | None = None,
        top_k: int | None = None,
        transport: Any = None,
    ) -> ServerBackend:
        """The backend with its connection settings as one config object.

        Args:
            base_url: the server.
            tokenizer: a tokenizer, or the path or name to load one from (as :meth:`from_url`).
            settings: how to talk to the server.
            model: the served model name; default: the only model the server lists.
            top_k: None (default) for full-vocabulary rows, or k for the server's top k completed per row.
            transport: an ``httpx`` transport (tests).

        Returns:
            The backend.

        Raises:
            ConfigurationTypeError: ``settings`` is not a :class:`ServerSettings`.
            ConfigurationError: what :meth:`from_url` refuses.
            ServerError: the server failed, could not be reached or does not match.
        """
        if not isinstance(settings, ServerSettings):
            raise ConfigurationTypeError("settings must be a ServerSettings")
        return cls.from_url(
            base_url, tokenizer, model=model, top_k=top_k, transport=transport, **settings.as_keywords()
        )

    @classmethod
    def from_url(cls, base_url: str, tokenizer: str | os.PathLike[str] | Any, **kwargs: Any) -> ServerBackend:
        """The backend with ``tokenizer`` loaded when it is a path: a model folder, a ``.gguf`` file or a named
        model such as ``"smollm2-135m-instruct"`` (its cached conversion's tokenizer), from local files only.

        Args:
            base_url: the server.
            tokenizer: a tokenizer, or the path or name to load one from (:func:`load_tokenizer`).
            **kwargs: the constructor's other arguments.

        Raises:
            ConfigurationError: no tokenizer could be loaded, or what the constructor raises.
        """
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = load_tokenizer(tokenizer)
        return cls(base_url, tokenizer, **kwargs)

    # -- start-up checks (public probes only) ----------------------------------------------------------------
    def _served_model(self, wanted: str | None) -> tuple[str, int | None]:
        answer = self._client.get("/v1/models")
        cards = (answer.get("data") if isinstance(answer, dict) else None) or []
        cards = [c for c in cards if isinstance(c, dict)] if isinstance(cards, list) else []
        names = [str(c.get("id")) for c in cards]
        if wanted is None and len(names) == 1:
            wanted = names[0]
        if wanted is None:
            raise ServerMismatchError(f"{self._client.base_url} serves {names or 'no model'}: pass model=")
        if wanted not in names:
            raise ServerMismatchError(f"{self._client.base_url} does not serve {wanted!r} (it serves {names})")
        card = cards[names.index(wanted)]
        length = card.get("max_model_len")
        return wanted, int(length) if isinstance(length, int) and length > 1 else None

    def _check_tokenizer(self) -> None:
        ours = self.encode(TOKENIZER_PROBE, add_special_tokens=True)
        answer = self._client.post(
            "/tokenize", {"model": self.model, "prompt": TOKENIZER_PROBE, "add_special_tokens": True}
        )
        theirs = answer.get("tokens") if isinstance(answer, dict) else None
        if theirs != ours:
            raise ServerMismatchError(
                f"the server's tokenizer for {self.model!r} splits a probe text differently "
                "from the local tokenizer: pass the served model's own tokenizer"
            )

    def _check_logprobs(self) -> None:
        top = self._top_logprobs(self.encode(TOKENIZER_PROBE, add_special_tokens=True))
        if self.top_k is None and len(top) < self.vocab_size:
            raise ServerMismatchError(
                f"asked for the full vocabulary, the server returned {len(top)} of "
                f"{self.vocab_size} log-probabilities: start vLLM with --max-logprobs -1, "
                "or pass top_k"
            )

    # -- requests -----------------------------------------------------------------------------------------
    def _top_logprobs(self, ids: list[int]) -> dict[str, float]:
        answer = self._client.post(
            "/v1/completions",
            {
                "model": self.model,
                "prompt": ids,
                "max_tokens": 1,
                "temperature": 0.0,
                "logprobs": -1 if self.top_k is None else self.top_k,
                "return_tokens_as_token_ids": True,
            },
        )
        try:
            top = answer["choices"][0]["logprobs"]["top_logprobs"][0]
        except (KeyError, IndexError, TypeError):
            raise ServerError(f"{self.base_url}: a completion without log-probabilities") from None
        if not isinstance(top, dict):
            raise ServerError(f"{self.base_url}: a completion without log-probabilities")
        return top

    def _row(self, ids: list[int]) -> np.ndarray:
        return full_row(self._top_logprobs(ids), self.vocab_size, complete=self.top_k is None)

    def next_token_logprobs(self, prompts: Sequence[Prompt] | np.ndarray) -> np.ndarray:
        """Log-probabilities of the next token after each prompt, one completion request per prompt (concurrent).

        Args:
            prompts: the prompts, each text or token ids.

        Raises:
            ConfigurationError: an invalid prompt (nothing is sent).
            ServerError: a request failed.
        """
        ids = self._prompt_ids(prompts)  # every check before anything is sent
        futures = [self._pool.submit(self._row, x) for x in ids]
        try:
            return np.stack([f.result() for f in futures])
        finally:
            for f in futures:
                f.cancel()

    def start(self, prompts: Sequence[Prompt] | np.ndarray) -> RecomputingSession:
        """A session that sends every prompt whole at each step (the server's prefix cache keeps it cheap).

        Args:
            prompts: the prompts, each text or token ids.

        Raises:
            ConfigurationError: an invalid prompt.
        """
        return RecomputingSession(self, self._prompt_ids(prompts))

    def close(self) -> None:
        """Close the connections and the request threads (also when the backend is garbage-collected)."""
        self._closer()

    def __enter__(self) -> ServerBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        k = "full vocabulary" if self.top_k is None else f"top_k={self.top_k}"
        return f"ServerBackend(base_url={self.base_url!r}, model={self.model!r}, {k})"


def _close(pool: ThreadPoolExecutor, client: ServerClient) -> None:
    pool.shutdown(wait=False, cancel_futures=True)
    client.close()


def load_tokenizer(path_or_name: str | os.PathLike[str]) -> Any:
    """A ``transformers`` tokenizer from local files: a model folder, a ``.gguf`` file or a named model.

    Args:
        path_or_name: a model folder, a ``.gguf`` file or a named model.

    Raises:
        ConfigurationError: no tokenizer could be loaded from it.
    """
    from transformers import AutoTokenizer

    source: str | os.PathLike[str] = path_or_name
    if gguf.is_gguf(path_or_name):
        source = gguf.converted_folder(path_or_name)
    try:
        return AutoTokenizer.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ConfigurationError(
            f"no tokenizer could be loaded from {os.fspath(source)!r} ({type(exc).__name__})"
        ) from None
