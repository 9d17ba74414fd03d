"""Pretraining a small GPT-2 on GINC documents, on a CPU, reproducibly and resumably.

The run is fixed by its step budget, not by wall-clock time: ``max_minutes`` only decides when this process
stops (after writing a checkpoint); running the same command again resumes from the checkpoint and ends with
bit-identical weights, because the batch at step s is a pure function of the seeds and s, and training state
(model, optimiser, schedule) is checkpointed exactly. Use one torch thread per process (the default): on
this 2-core machine, 2 threads next to any other process slow training several times over.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin._progress import progress_bar
from dp_icl_plugin.errors import ConfigurationError
from dp_icl_plugin.ginc.language import GincConfig, GincLanguage
from dp_icl_plugin.ginc.tokenizer import build_tokenizer

__all__ = ["GINC_METADATA", "TrainingConfig", "TrainingResult", "train"]

GINC_METADATA = "ginc.json"
_CHECKPOINT = "checkpoint"
_LOG = "training_log.jsonl"


@dataclass(frozen=True)
class TrainingConfig:
    """Model shape, data and optimisation of one training run (defaults: the committed model)."""

    n_layer: int = 4
    n_embd: int = 128
    n_head: int = 4
    seq_len: int = 256
    batch_size: int = 8
    steps: int = 10_000
    learning_rate: float = 3e-3
    warmup_steps: int = 100
    final_lr_fraction: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    n_documents: int = 1000
    document_length: int = 10_240
    validation_documents: int = 20
    data_seed: int = 1
    train_seed: int = 0
    threads: int = 1
    eval_every: int = 500

    def __post_init__(self) -> None:
        for name in (
            "n_layer",
            "n_embd",
            "n_head",
            "seq_len",
            "batch_size",
            "steps",
            "n_documents",
            "document_length",
            "validation_documents",
            "threads",
            "eval_every",
        ):
            check.positive_int(name, getattr(self, name))
        if self.n_embd % self.n_head:
            raise ConfigurationError("n_embd must be a multiple of n_head")
        if self.document_length < self.seq_len + 1:
            raise ConfigurationError("document_length must exceed seq_len")
        check.positive_finite("learning_rate", self.learning_rate)
        if not 0 <= self.warmup_steps < self.steps:
            raise ConfigurationError("warmup_steps must lie in [0, steps)")
        if not 0 < self.final_lr_fraction <= 1:
            raise ConfigurationError("final_lr_fraction must lie in (0, 1]")
        check.non_negative_finite("weight_decay", self.weight_decay)
        check.positive_finite("grad_clip", self.grad_clip)

    @property
    def tokens(self) -> int:
        return self.steps * self.batch_size * self.seq_len

    def learning_rate_at(self, step: int) -> float:
        """Linear warm-up, then cosine decay to ``final_lr_fraction`` of the peak."""
        if step < self.warmup_steps:
            return self.learning_rate * (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps)
        floor = self.final_lr_fraction
        return self.learning_rate * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


@dataclass(frozen=True)
class TrainingResult:
    output_dir: Path
    finished: bool
    step: int
    train_loss: float
    validation_loss: float
    seconds: float
    tokens_per_second: float


def _chunks(tokens: np.ndarray, seq_len: int) -> np.ndarray:
    """Non-overlapping windows of seq_len tokens from each document, shape (n_chunks, seq_len)."""
    per_doc = tokens.shape[1] // seq_len
    return tokens[:, : per_doc * seq_len].reshape(-1, seq_len)


def _batch_indices(step: int, n_chunks: int, batch_size: int, seed: int) -> np.ndarray:
    """The chunks of ``step``: a fresh permutation per epoch, a pure function of (seed, epoch)."""
    per_epoch = n_chunks // batch_size
    epoch, offset = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(n_chunks)
    return order[offset * batch_size : (offset + 1) * batch_size]


def _finished_run(out: Path, identity: dict[str, Any]) -> TrainingResult | None:
    """The result of a finished run of exactly this identity in ``out`` (its ``ginc.json``), or None."""
    try:
        meta = json.loads((out / GINC_METADATA).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(meta, dict) or {k: meta.get(k) for k in identity} != identity:
        return None
    steps = identity["training"]["steps"]
    seconds = float(meta.get("training_seconds") or 0.0)
    tokens = steps * identity["training"]["batch_size"] * identity["training"]["seq_len"]
    return TrainingResult(
        out,
        True,
        steps,
        float(meta.get("train_loss", math.nan)),
        float(meta.get("validation_loss", math.nan)),
        seconds,
        tokens / seconds if seconds else 0.0,
    )


def train(
    output_dir: str | os.PathLike[str],
    config: TrainingConfig | None = None,
    *,
    language: GincConfig | None = None,
    max_minutes: float | None = None,
    progress: bool = True,
    command: str | None = None,
    on_eval: Callable[[dict[str, Any]], None] | None = None,
) -> TrainingResult:
    """Train (or resume training) a GPT-2 on GINC and save it with ``save_pretrained`` (safetensors).

    Running the same run again resumes from its checkpoint, or returns at once if it already finished.

    Args:
        output_dir: where the model, tokenizer, ``ginc.json`` and ``training_log.jsonl`` go; a checkpoint
            lives in ``output_dir/checkpoint`` until the run finishes.
        config: the run; resuming with a different config than the checkpoint's is refused.
        language: the GINC language (default ``GincConfig()``, |V| = 150).
        max_minutes: stop after this much wall-clock time (checkpoint saved; run again to resume).
        progress: show a progress bar on stderr.
        command: the command line recorded in ``ginc.json`` (for reproducibility).
        on_eval: called with each log record (step, losses, throughput).
    """
    try:
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError("training needs torch and transformers: pip install 'dp-icl-plugin[hf]'") from exc

    config = config or TrainingConfig()
    language = language or GincConfig()
    if max_minutes is not None:
        check.positive_finite("max_minutes", max_minutes)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_dir = out / _CHECKPOINT
    identity = {"training": asdict(config), "language": language.to_dict()}
    done = _finished_run(out, identity)
    if done is not None:  # the same command again after it finished: nothing to do
        return done

    torch.set_num_threads(config.threads)
    lang = GincLanguage(language)
    data_rng = np.random.default_rng(config.data_seed)
    train_docs, _ = lang.sample_documents(config.n_documents, config.document_length, data_rng)
    valid_docs, _ = lang.sample_documents(config.validation_documents, config.document_length, data_rng)
    train_chunks = torch.from_numpy(_chunks(train_docs, config.seq_len))
    valid_chunks = torch.from_numpy(_chunks(valid_docs, config.seq_len))

    torch.manual_seed(config.train_seed)
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=language.n_symbols,
            n_positions=config.seq_len,
            n_embd=config.n_embd,
            n_layer=config.n_layer,
            n_head=config.n_head,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=0,
        )
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    step, elapsed, log_tail = 0, 0.0, []
    if (ckpt_dir / "state.pt").exists():
        state = torch.load(ckpt_dir / "state.pt", weights_only=False)
        if state["identity"] != identity:
            raise ConfigurationError(f"{ckpt_dir} belongs to a different run; remove it or use another output_dir")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, elapsed = state["step"], state["elapsed"]

    def save_checkpoint() -> None:
        ckpt_dir.mkdir(exist_ok=True)
        tmp = ckpt_dir / "state.pt.tmp"
        torch.save(
            {
                "identity": identity,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "step": step,
                "elapsed": elapsed,
            },
            tmp,
        )
        os.replace(tmp, ckpt_dir / "state.pt")

    @torch.inference_mode()
    def validation_loss() -> float:
        model.eval()
        losses = [
            model(input_ids=batch, attention_mask=torch.ones_like(batch), labels=batch).loss.item()
            for batch in valid_chunks.split(config.batch_size)
        ]
        model.train()
        return float(np.mean(losses))

    bar = progress_bar(config.steps, desc="GINC pretraining", unit="step", enabled=progress, initial=step)
    model.train()
    started, window, window_tokens = time.monotonic(), [], 0
    window_start = started
    train_loss = validation = float("nan")
    while step < config.steps:
        if max_minutes is not None and (time.monotonic() - started) / 60 >= max_minutes:
            break
        for group in optimizer.param_groups:
            group["lr"] = config.learning_rate_at(step)
        batch = train_chunks[_batch_indices(step, len(train_chunks), config.batch_size, config.train_seed)]
        loss = model(input_ids=batch, attention_mask=torch.ones_like(batch), labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        step += 1
        window.append(loss.item())
        window_tokens += batch.numel()
        bar.update(1)
        if step % config.eval_every == 0 or step == config.steps:
            now = time.monotonic()
            elapsed += now - window_start
            train_loss, validation = float(np.mean(window)), validation_loss()
            record = {
                "step": step,
                "tokens": step * config.batch_size * config.seq_len,
                "train_loss": round(train_loss, 4),
                "validation_loss": round(validation, 4),
                "lr": config.learning_rate_at(step - 1),
                "tokens_per_second": round(window_tokens / (now - window_start), 1),
                "elapsed_seconds": round(elapsed, 1),
            }
            with open(out / _LOG, "a", encoding="utf-8") as log:
                log.write(json.dumps(record) + "\n")
            log_tail.append(record)
            bar.set_postfix(loss=f"{train_loss:.3f}", val=f"{validation:.3f}")
            save_checkpoint()
            if on_eval is not None:
                on_eval(record)
            window, window_tokens, window_start = [], 0, time.monotonic()
    bar.close()
    if step < config.steps:
        elapsed += time.monotonic() - window_start
        save_checkpoint()
    finished = step >= config.steps
    if finished:
        model.save_pretrained(out, safe_serialization=True)
        build_tokenizer(lang.vocab, model_max_length=config.seq_len).save_pretrained(out)
        metadata = {
            **identity,
            "command": command,
            "validation_loss": validation,
            "train_loss": train_loss,
            "training_seconds": round(elapsed, 1),
            "torch": torch.__version__,
        }
        (out / GINC_METADATA).write_text(json.dumps(metadata, indent=2) + "\n", encoding="utf-8")
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    tokens_per_second = step * config.batch_size * config.seq_len / elapsed if elapsed else 0.0
    return TrainingResult(out, finished, step, train_loss, validation, elapsed, tokens_per_second)
