"""HTTP to an OpenAI-compatible inference server: the URL policy, the API key, timeouts, bounded retries, typed errors.

The privacy boundary: the server receives private prompts (as token ids), so it must belong to the data
holder, like the process that holds the records. Plain ``http://`` is accepted only to a loopback host
(127.0.0.0/8, ::1, ``localhost``); any other host needs ``https://`` or an explicit
``allow_insecure_http=True``. The API key is read from the environment (``DP_ICL_SERVER_API_KEY``, else
``OPENAI_API_KEY``) unless given, and sent as a bearer token.

Retries: a request that fails to connect, times out, or gets HTTP 429/502/503/504 is retried at most
``max_retries`` times with exponential back-off; the whole request is one call of a backend method, so the
method's single charge (made before its first model call) is never repeated. Error messages name the HTTP
status and a cause, never a request's or a response's body: either may contain a private prompt.
"""

from __future__ import annotations

import ipaddress
import os
import time
from typing import Any
from urllib.parse import urlsplit

from dp_icl_plugin import _validation as check
from dp_icl_plugin.errors import (
    ConfigurationError,
    ServerError,
    ServerMismatchError,
    ServerRateLimitError,
    ServerUnavailableError,
)

__all__ = ["API_KEY_VARIABLES", "ServerClient", "check_base_url"]


def _json(response: Any) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


API_KEY_VARIABLES = ("DP_ICL_SERVER_API_KEY", "OPENAI_API_KEY")
_RETRIED_STATUSES = frozenset({429, 502, 503, 504})


def _is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_base_url(url: str, *, allow_insecure_http: bool) -> str:
    """The server's base URL without a trailing slash (and without a trailing ``/v1``); ConfigurationError for
    another scheme, or plain http to a non-loopback host without ``allow_insecure_http``.

    Args:
        url: the server's URL.
        allow_insecure_http: allow plain http to a host other than loopback.

    Raises:
        ConfigurationError: an empty URL, another scheme, credentials in the URL, or insecure http.
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError("the server URL must be a non-empty string such as 'http://127.0.0.1:8000'")
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError("the server URL must start with http:// or https:// and name a host")
    if parts.username is not None or parts.password is not None:  # it would show in every message and repr
        raise ConfigurationError("put no credentials in the server URL: pass api_key= or set DP_ICL_SERVER_API_KEY")
    if parts.scheme == "http" and not _is_loopback(parts.hostname) and not allow_insecure_http:
        raise ConfigurationError(
            f"plain http to {parts.hostname} would send private prompts unencrypted: use https://, or pass "
            "allow_insecure_http=True if the network between this process and the server is trusted"
        )
    base = url.strip().rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def _cause(status: int, body: str) -> str:
    """A cause for an HTTP error, from known phrases of OpenAI-compatible servers; never the body itself."""
    text = body.lower()
    if "max_logprobs" in text or ("logprobs" in text and "max allowed" in text):
        return "it limits log-probabilities: start vLLM with --max-logprobs -1 (or use a top_k it allows)"
    if "does not exist" in text and "model" in text:
        return "it does not serve this model name"
    if "maximum context length" in text or "max_model_len" in text or "too long" in text:
        return "a prompt is longer than the server's context length"
    if status in (401, 403):
        return "the API key was refused (set DP_ICL_SERVER_API_KEY or OPENAI_API_KEY)"
    if status == 404:
        return "the endpoint does not exist (is this an OpenAI-compatible server such as vLLM?)"
    return "see the server's log"


class ServerClient:
    """Blocking JSON requests to one server, safe to share between threads (one ``httpx.Client``).

    Args:
        base_url: the server's URL (:func:`check_base_url`).
        api_key: the bearer token (default: ``DP_ICL_SERVER_API_KEY`` or ``OPENAI_API_KEY``).
        timeout: seconds per request.
        max_retries: retries of a failed request.
        backoff: the first retry's delay in seconds, doubled at each retry.
        allow_insecure_http: allow plain http to a host other than loopback.
        verify: TLS verification: True, or a CA bundle path.
        max_connections: connections kept open at once.
        transport: an ``httpx`` transport (tests).

    Raises:
        ConfigurationError: a bad URL or setting.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        max_retries: int = 2,
        backoff: float = 0.5,
        allow_insecure_http: bool = False,
        verify: bool | str = True,
        max_connections: int = 64,
        transport: Any = None,
    ) -> None:
        import httpx

        self.base_url = check_base_url(base_url, allow_insecure_http=allow_insecure_http)
        self.timeout = check.positive_finite("timeout", timeout)
        self.max_retries = check.int_at_least("max_retries", max_retries, 0)
        self.backoff = check.non_negative_finite("backoff", backoff)
        key = api_key if api_key is not None else next(filter(None, map(os.environ.get, API_KEY_VARIABLES)), None)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        # trust_env=False: no proxy from HTTP_PROXY & co. (httpx would route even loopback through one, in clear)
        # and no .netrc credentials; the URL policy above is the whole story of where prompts go
        self._client = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=self.timeout,
            verify=verify,
            limits=limits,
            transport=transport,
            trust_env=False,
        )

    def get(self, path: str) -> Any:
        """The JSON answer to ``GET path``, retried as configured.

        Args:
            path: the endpoint, e.g. ``"/v1/models"``.

        Raises:
            ServerError: the answer is an HTTP error or not JSON (:class:`~dp_icl_plugin.errors.ServerRateLimitError`
                when still rate-limited after the retries).
            ServerUnavailableError: the server could not be reached through the retries.
        """
        return self._request("GET", path, None)

    def post(self, path: str, payload: dict[str, Any]) -> Any:
        """The JSON answer to ``POST path`` with ``payload``, retried as configured.

        Args:
            path: the endpoint, e.g. ``"/v1/completions"``.
            payload: the JSON body.

        Raises:
            ServerError: the answer is an HTTP error or not JSON (:class:`~dp_icl_plugin.errors.ServerRateLimitError`
                when still rate-limited after the retries).
            ServerUnavailableError: the server could not be reached through the retries.
        """
        return self._request("POST", path, payload)

    def close(self) -> None:
        """Close the connections."""
        self._client.close()

    def _request(self, method: str, path: str, payload: dict[str, Any] | None) -> Any:
        where = f"{method} {self.base_url}{path}"
        attempts = self.max_retries + 1
        for attempt in range(attempts):
            # exceptions are turned into ours outside their except blocks, so that no __context__ keeps the
            # request (its token ids) or the answer's body
            response, failure = self._attempt(method, path, payload)
            if response is not None and response.status_code < 400:
                body = _json(response)
                if body is None:
                    raise ServerError(f"{where}: the answer is not JSON")
                return body
            last = attempt == attempts - 1
            if response is not None and (response.status_code not in _RETRIED_STATUSES or last):
                raise self._error(where, response.status_code, response.text)
            if response is None and last:
                raise ServerUnavailableError(f"{where}: {failure} ({attempts} attempts)")
            time.sleep(self.backoff * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _attempt(self, method: str, path: str, payload: dict[str, Any] | None) -> tuple[Any, str]:
        """(the response, "") or (None, why it failed: a timeout or a transport error, named by type only)."""
        import httpx

        failure = ""
        try:
            return self._client.request(method, path, json=payload), ""
        except httpx.TimeoutException:
            failure = f"timed out after {self.timeout:g} s"
        except httpx.TransportError as exc:
            failure = f"the server cannot be reached ({type(exc).__name__})"
        return None, failure

    def _error(self, where: str, status: int, body: str) -> ServerError:
        message = f"{where} failed with HTTP {status}: {_cause(status, body)}"
        if status == 429:
            return ServerRateLimitError(f"{message} ({self.max_retries + 1} attempts)")
        if status >= 500:
            return ServerUnavailableError(f"{message} ({self.max_retries + 1} attempts)")
        if "max_logprobs" in body.lower() or "max allowed" in body.lower() or status == 404:
            return ServerMismatchError(message)
        return ServerError(message)
