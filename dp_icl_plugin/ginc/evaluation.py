"""In-context-learning accuracy on GINC through any :class:`NextTokenBackend`, and its reports.

Accuracy is greedy prediction over the full vocabulary: a prompt counts as correct when the model's most
likely next token equals the Bayes-optimal label. Each (k, shots) cell draws its prompts from its own
generator, seeded by (seed, k, shots), so cells are reproducible one at a time.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin._progress import progress_bar
from dp_icl_plugin.backends.base import NextTokenBackend, check_logprobs
from dp_icl_plugin.errors import ConfigurationError
from dp_icl_plugin.ginc.language import GincLanguage
from dp_icl_plugin.ginc.prompts import sample_icl_prompts

__all__ = ["AccuracyCell", "check_vocabulary", "evaluate_icl", "plot_accuracy", "to_markdown", "write_report"]


@dataclass(frozen=True)
class AccuracyCell:
    """Accuracy of one (k, shots) setting, with a 95% Wilson interval."""

    k: int
    shots: int
    n_prompts: int
    correct: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.n_prompts

    @property
    def interval(self) -> tuple[float, float]:
        z, n, p = 1.959964, self.n_prompts, self.accuracy
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return max(0.0, centre - half), min(1.0, centre + half)

    def to_dict(self) -> dict[str, Any]:
        low, high = self.interval
        return {**asdict(self), "accuracy": round(self.accuracy, 4), "ci95": [round(low, 4), round(high, 4)]}


def check_vocabulary(backend: NextTokenBackend, language: GincLanguage) -> None:
    """Refuse a model whose token ids are not the language's symbols in order."""
    if backend.vocab_size != language.config.n_symbols:
        raise ConfigurationError(
            f"the model has {backend.vocab_size} tokens; the GINC language has {language.config.n_symbols}"
        )
    if backend.encode(" ".join(language.vocab)) != list(range(language.config.n_symbols)):
        raise ConfigurationError("the model's tokenizer does not map GINC symbols to their ids")


def evaluate_icl(
    backend: NextTokenBackend,
    language: GincLanguage,
    *,
    shots: Sequence[int] = (0, 1, 2, 4, 8),
    ks: Sequence[int] = (3, 5, 10),
    n_prompts: int = 1000,
    seed: int = 0,
    progress: bool = False,
) -> list[AccuracyCell]:
    """Greedy next-token accuracy for every (k, shots) pair; prompts are drawn from pretraining concepts."""
    n_prompts = check.positive_int("n_prompts", n_prompts)
    if not shots or not ks:
        raise ConfigurationError("shots and ks must not be empty")
    check_vocabulary(backend, language)
    cells = [(int(k), int(n)) for k in ks for n in shots]
    bar = progress_bar(len(cells), desc="GINC ICL accuracy", unit="cell", enabled=progress)
    results = []
    for k, n in cells:
        rng = np.random.default_rng([seed, k, n])
        prompts = sample_icl_prompts(language, n_prompts=n_prompts, n_shots=n, k=k, rng=rng)
        predictions = check_logprobs(backend.next_token_logprobs(prompts.token_ids)).argmax(axis=1)
        results.append(AccuracyCell(k, n, n_prompts, int((predictions == prompts.labels).sum())))
        bar.update(1)
    bar.close()
    return results


def to_markdown(cells: Sequence[AccuracyCell]) -> str:
    """Accuracy (%) with rows k and columns shots."""
    shots = sorted({c.shots for c in cells})
    ks = sorted({c.k for c in cells})
    by = {(c.k, c.shots): c for c in cells}
    lines = ["| k | " + " | ".join(f"{n}-shot" for n in shots) + " |", "|---" * (len(shots) + 1) + "|"]
    for k in ks:
        row = [f"{100 * by[k, n].accuracy:.1f}" if (k, n) in by else "" for n in shots]
        lines.append(f"| {k} | " + " | ".join(row) + " |")
    n_prompts = sorted({c.n_prompts for c in cells})
    lines.append(f"\nGreedy next-token accuracy (%), {', '.join(map(str, n_prompts))} prompts per cell.")
    return "\n".join(lines)


def plot_accuracy(cells: Sequence[AccuracyCell], path: str | os.PathLike[str], *, title: str = "GINC") -> None:
    """A PNG of accuracy against shots, one line per k, with 95% intervals."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("plots need matplotlib: pip install matplotlib") from exc
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for k in sorted({c.k for c in cells}):
        row = sorted((c for c in cells if c.k == k), key=lambda c: c.shots)
        acc = np.array([100 * c.accuracy for c in row])
        err = np.array([[100 * (c.accuracy - c.interval[0]), 100 * (c.interval[1] - c.accuracy)] for c in row]).T
        ax.errorbar([c.shots for c in row], acc, yerr=err, marker="o", capsize=3, label=f"k = {k}")
    ax.set_xlabel("shots (real demonstrations)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(
    cells: Sequence[AccuracyCell], directory: str | os.PathLike[str], *, meta: dict[str, Any]
) -> dict[str, str]:
    """Write ``ginc_eval.json``, ``ginc_eval.md`` and ``ginc_eval.png`` to ``directory``; returns their paths."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "ginc_eval.json", "markdown": out / "ginc_eval.md", "plot": out / "ginc_eval.png"}
    paths["json"].write_text(json.dumps({**meta, "results": [c.to_dict() for c in cells]}, indent=2) + "\n")
    paths["markdown"].write_text(to_markdown(cells) + "\n")
    plot_accuracy(cells, paths["plot"], title=f"GINC in-context learning, {meta.get('model', 'model')} model")
    return {k: str(v) for k, v in paths.items()}
