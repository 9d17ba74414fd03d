"""Small validators shared by every public entry point; each raises ConfigurationError."""

from __future__ import annotations

import math
import unicodedata
from numbers import Integral, Real

from dp_icl_plugin.errors import ConfigurationError, ConfigurationTypeError


def real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ConfigurationTypeError(f"{name} must be a real number, got {type(value).__name__}")
    result = float(value)
    if math.isnan(result):
        raise ConfigurationError(f"{name} must not be NaN")
    return result


def positive_finite(name: str, value: object) -> float:
    """Return ``value`` as a float, requiring 0 < value < inf."""
    result = real(name, value)
    if not (0.0 < result < math.inf):
        raise ConfigurationError(f"{name} must be positive and finite, got {result!r}")
    return result


def non_negative_finite(name: str, value: object) -> float:
    """Return ``value`` as a float, requiring 0 <= value < inf."""
    result = real(name, value)
    if not (0.0 <= result < math.inf):
        raise ConfigurationError(f"{name} must be non-negative and finite, got {result!r}")
    return result


def probability_open(name: str, value: object) -> float:
    """Return ``value`` as a float, requiring 0 < value < 1 (e.g. δ)."""
    result = real(name, value)
    if not (0.0 < result < 1.0):
        raise ConfigurationError(f"{name} must lie in the open interval (0, 1), got {result!r}")
    return result


def probability_half_open(name: str, value: object) -> float:
    """Return ``value`` as a float, requiring 0 < value <= 1 (e.g. a sampling rate)."""
    result = real(name, value)
    if not (0.0 < result <= 1.0):
        raise ConfigurationError(f"{name} must lie in (0, 1], got {result!r}")
    return result


def int_at_least(name: str, value: object, low: int) -> int:
    """Return ``value`` as an int, requiring value >= low (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ConfigurationTypeError(f"{name} must be an integer, got {type(value).__name__}")
    result = int(value)
    if result < low:
        raise ConfigurationError(f"{name} must be at least {low}, got {result}")
    return result


def positive_int(name: str, value: object) -> int:
    """Return ``value`` as an int, requiring value >= 1."""
    return int_at_least(name, value, 1)


def order(name: str, value: object) -> float:
    """Return a Rényi order as a float, requiring 1 < value < inf."""
    result = real(name, value)
    if not (1.0 < result < math.inf):
        raise ConfigurationError(f"{name} must be a Rényi order in (1, inf), got {result!r}")
    return result


def has_text(value: str) -> bool:
    """Whether ``value`` has a visible character (not only spaces, separators, controls or zero-width marks)."""
    return any(not unicodedata.category(ch).startswith(("Z", "C")) for ch in value)
