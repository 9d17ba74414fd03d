"""How :class:`~dp_icl_plugin.backends.server.ServerBackend` talks to its server, as one config object
(:class:`ServerSettings`): credentials, time limits, retries, concurrency and transport security. Validated when
made (a wrong type is a :class:`~dp_icl_plugin.errors.ConfigurationTypeError`); passed to
:meth:`ServerBackend.with_settings <dp_icl_plugin.backends.server.ServerBackend.with_settings>`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dp_icl_plugin import _validation as check
from dp_icl_plugin.errors import ConfigurationTypeError

__all__ = ["ServerSettings"]


@dataclass(frozen=True)
class ServerSettings:
    """A server connection's settings (the defaults are :class:`~dp_icl_plugin.backends.server.ServerBackend`'s).

    Attributes:
        api_key: default: ``DP_ICL_SERVER_API_KEY`` or ``OPENAI_API_KEY`` from the environment (kept out of reprs).
        timeout: seconds per request.
        max_retries: retries of a failed request (connection, timeout, 429, 502–504).
        backoff: the first retry's delay in seconds, doubled at each retry.
        max_concurrency: requests in flight at once.
        allow_insecure_http: allow plain http to a host other than loopback.
        verify: TLS verification: True, or a CA bundle path.
    """

    api_key: str | None = field(default=None, repr=False)
    timeout: float = 120.0
    max_retries: int = 2
    backoff: float = 0.5
    max_concurrency: int = 32
    allow_insecure_http: bool = False
    verify: bool | str = True

    def __post_init__(self) -> None:
        if self.api_key is not None and not isinstance(self.api_key, str):
            raise ConfigurationTypeError("api_key must be a string or None")
        object.__setattr__(self, "timeout", check.positive_finite("timeout", self.timeout))
        object.__setattr__(self, "max_retries", check.int_at_least("max_retries", self.max_retries, 0))
        object.__setattr__(self, "backoff", check.non_negative_finite("backoff", self.backoff))
        object.__setattr__(self, "max_concurrency", check.positive_int("max_concurrency", self.max_concurrency))
        if not isinstance(self.allow_insecure_http, bool):
            raise ConfigurationTypeError("allow_insecure_http must be a bool")
        if not isinstance(self.verify, (bool, str)):
            raise ConfigurationTypeError("verify must be a bool or a CA bundle path")

    def as_keywords(self) -> dict[str, Any]:
        """The settings as :class:`~dp_icl_plugin.backends.server.ServerBackend`'s keyword arguments."""
        return {
            "api_key": self.api_key,
            "timeout": self.timeout,
            "max_retries": self.max_retries,
            "backoff": self.backoff,
            "max_concurrency": self.max_concurrency,
            "allow_insecure_http": self.allow_insecure_http,
            "verify": self.verify,
        }
