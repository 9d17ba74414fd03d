"""The error tree of dp-icl-plugin.

::

    DPICLError
    ├── ConfigurationError (also ValueError)      bad parameters, caught before anything is charged
    │   ├── UnsupportedEventError                 no accountant (or not the one asked for) can handle an event
    │   ├── CalibrationError                      no parameter in the search range meets the target
    │   └── BudgetMismatchError                   a ledger opened with a budget other than its own
    ├── BudgetExhaustedError                      a charge refused: it would overspend (nothing committed)
    │   └── ShareExhaustedError                   a decoder's n_queries answers all given
    ├── ReleaseFailedError                        a private computation failed after its charge (fixed message)
    ├── LedgerError                               a ledger file that cannot be used
    │   ├── LedgerFormatError                     not a dp-icl ledger (foreign or newer schema)
    │   │   └── FilterMismatchError               a privacy filter file of another index or budget
    │   └── LedgerCorruptError                    torn, truncated or inconsistent
    │       └── FilterRolledBackError             a privacy filter restored from a backup (spend given back)
    └── BackendError                              a model backend failed
        ├── ModelFileError (also ConfigurationError)  a model file that cannot be used (named in the message)
        └── ServerError                           an inference server failed (HTTP status and cause named)
            ├── ServerUnavailableError            unreachable, timed out or failing after the bounded retries
            ├── ServerRateLimitError              still rate-limited (HTTP 429) after the bounded retries
            └── ServerMismatchError (also ConfigurationError)  another model or tokenizer, or a server
                                                  that cannot give what the backend needs (--max-logprobs)

Messages never contain private text: only parameters, counts and file paths.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

__all__ = [
    "AllowanceSpentError",
    "BackendError",
    "BudgetExhaustedError",
    "BudgetMismatchError",
    "CalibrationError",
    "ConfigurationError",
    "ConfigurationTypeError",
    "DPICLError",
    "FilterMismatchError",
    "FilterRolledBackError",
    "LedgerCorruptError",
    "LedgerError",
    "LedgerFormatError",
    "ModelFileError",
    "NothingStoredError",
    "ReleaseFailedError",
    "ServerError",
    "ServerMismatchError",
    "ServerRateLimitError",
    "ServerUnavailableError",
    "ShareExhaustedError",
    "UnsupportedEventError",
    "WeakReleaseWarning",
    "after_charge",
    "iterate_after_charge",
]

T = TypeVar("T")


class DPICLError(Exception):
    """Base class of every error raised by dp-icl-plugin."""


class WeakReleaseWarning(UserWarning):
    """A configuration whose releases would be paid for yet carry (almost) nothing of the private data: the
    message gives the figure that decides it (:mod:`dp_icl_plugin.planning`) and the setting to change."""


class ConfigurationError(DPICLError, ValueError):
    """A parameter is invalid; raised before any budget is spent."""


class ConfigurationTypeError(ConfigurationError, TypeError):
    """A parameter has the wrong type (a dataset that is not a ``PrivateDataset``, an ``rng`` that is not a
    ``numpy.random.Generator``, ...); raised before any budget is spent. Caught as a ``ConfigurationError`` or as
    a ``TypeError``."""


class UnsupportedEventError(ConfigurationError):
    """No accountant (or not the requested one) can analyse this privacy event."""


class CalibrationError(ConfigurationError):
    """No value in the calibration search range meets the privacy target."""


class BudgetMismatchError(ConfigurationError):
    """A ledger was opened with a budget different from the one it was created with."""


class BudgetExhaustedError(DPICLError):
    """A charge was refused because it would exceed the budget; nothing was committed.

    Attributes:
        requested_epsilon: ε of the refused event on its own, at the budget's δ.
        remaining_epsilon: budget ε minus the ε already spent (at the budget's δ).
        total_epsilon: ε of everything spent plus the refused event.

    Args:
        message: the explanation (no private text); the keyword arguments set the attributes of the same name.
    """

    def __init__(
        self,
        message: str,
        *,
        requested_epsilon: float,
        remaining_epsilon: float,
        total_epsilon: float,
    ) -> None:
        super().__init__(message)
        self.requested_epsilon = requested_epsilon
        self.remaining_epsilon = remaining_epsilon
        self.total_epsilon = total_epsilon


class AllowanceSpentError(BudgetExhaustedError):
    """A draw on an allowance was refused: the draws under its cover would pass its filter's caps
    (:mod:`~dp_icl_plugin.accounting.allowance`); nothing was committed. The ledger itself may have room: the
    allowance is what is spent."""


class ShareExhaustedError(BudgetExhaustedError):
    """A decoder refused an answer beyond the ``n_queries`` its budget share was calibrated for; nothing was
    committed (the ledger may still have room: a new decoder takes a new share).

    Attributes:
        requested_epsilon: ε of the refused answer on its own, at the ledger's δ.
        remaining_epsilon: 0.0, what the share has left.
        total_epsilon: ``inf``: the share has no room for another answer at any ε.
        n_queries: the answers the share covered.

    Args:
        message: the explanation (no private text); the keyword arguments set the attributes of the same name.
    """

    def __init__(self, message: str, *, requested_epsilon: float, n_queries: int) -> None:
        super().__init__(
            message, requested_epsilon=requested_epsilon, remaining_epsilon=0.0, total_epsilon=float("inf")
        )
        self.n_queries = n_queries


class ReleaseFailedError(DPICLError):
    """A private computation failed after its release was charged (the charge stands, nothing was released).

    Raised in place of whatever failed (a backend or server error, running out of memory, NaN log-probabilities,
    a tokenizer): its type, message and arguments are always the same, and it carries no cause or context, so
    neither can depend on the private records the computation read. What it still reveals is *that* a release
    failed: records are checked when a decoder, synthesizer or index is built so that no record can make one
    fail later, and the failures left (the machine's, the server's) do not depend on the data. Reproduce a
    failure on public data to see its cause.
    """

    MESSAGE = (
        "the private computation failed after its release was charged (the charge stands; nothing was "
        "released). The cause is not reported because it could depend on private records."
    )

    def __init__(self) -> None:
        super().__init__(self.MESSAGE)


def after_charge(compute: Callable[[], T]) -> T:
    """Run a private computation whose release is already charged: any exception becomes
    :class:`ReleaseFailedError`, raised outside the handler so that it has no ``__context__`` either (``raise
    ... from None`` would keep the original, with its message, in ``__context__``). ``KeyboardInterrupt`` and
    other non-``Exception`` signals pass through.

    Args:
        compute: the computation, called once with no arguments.

    Returns:
        What ``compute`` returns.

    Raises:
        ReleaseFailedError: ``compute`` raised an ``Exception``.
    """
    failed = False
    try:
        return compute()
    except Exception:
        failed = True
    assert failed
    raise ReleaseFailedError()


def iterate_after_charge(pieces: Iterator[T]) -> Iterator[T]:
    """:func:`after_charge` for a computation that yields its release piece by piece (closing this closes it).

    Args:
        pieces: the computation's iterator of pieces.

    Yields:
        The pieces of ``pieces``, in order.

    Raises:
        ReleaseFailedError: advancing ``pieces`` raised an ``Exception``.
    """
    try:
        while True:
            failed = False
            try:
                piece = next(pieces)
            except StopIteration:
                return
            except Exception:
                failed = True
            if failed:
                raise ReleaseFailedError()
            yield piece
    finally:
        close = getattr(pieces, "close", None)
        if close is not None:
            close()


class LedgerError(DPICLError):
    """A ledger store cannot be opened or used."""


class NothingStoredError(LedgerError):
    """Nothing is stored at the place given (no ledger file, no index of that name) yet."""


class LedgerFormatError(LedgerError):
    """The file is not a dp-icl-plugin ledger, or was written by an incompatible version."""


class FilterMismatchError(LedgerFormatError):
    """A per-record privacy filter file that belongs to another index or was made with another budget."""


class LedgerCorruptError(LedgerError):
    """The ledger file is damaged (torn write, truncation, foreign edits)."""


class FilterRolledBackError(LedgerCorruptError):
    """A per-record privacy filter that counts fewer releases than a ledger records under its cover: restored from
    a backup or rolled back, it would give its records back budget they spent."""


class BackendError(DPICLError):
    """A model backend failed to produce next-token distributions."""


class ModelFileError(BackendError, ConfigurationError):
    """A model file cannot be used (missing, truncated, not GGUF, an unsupported architecture or quantisation);
    raised while the backend is built, before anything private is read or charged."""


class ServerError(BackendError):
    """An inference server answered with an error; the message names the HTTP status and the cause, never the
    request's or the response's text (either may contain a private prompt)."""


class ServerUnavailableError(ServerError):
    """The server could not be reached, timed out or kept failing (HTTP 5xx) through the bounded retries."""


class ServerRateLimitError(ServerError):
    """The server kept answering HTTP 429 (rate limit) through the bounded retries."""


class ServerMismatchError(ServerError, ConfigurationError):
    """The server serves another model or tokenizer than the backend's, or cannot give what the backend needs
    (full-vocabulary log-probabilities need ``--max-logprobs -1``); raised when the backend is built, before
    anything private is sent or charged."""
