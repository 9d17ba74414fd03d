"""A tiny GPT-2 that copies from its context (induction heads), for the canary and membership audits.

The GINC model does not repeat random sequences it sees in its prompt, so neither a planted canary nor a
member demonstration changes its answers. This model does: it is trained on token streams in which earlier
spans repeat later (the induction-head task), so given ``... w1 w2 w3 w4 417 ... w1 w2 w3 w4`` it answers
``417``. That is the behaviour of a real LLM that leaks its demonstrations, in 0.6 M parameters.

Vocabulary (word level, one token per word, split on whitespace and punctuation; decoding joins tokens with
spaces): ``<|endoftext|>``, ``[UNK]``, a few punctuation marks and template words, 600 three-letter
"names" (``bak``, ``mir``, ...) and the 900 three-digit numbers ``100`` ... ``999`` (the secrets).

The model is trained once (seeded) and cached in ``results/copy_model/`` (2.5 MB, committed); every audit
loads it with :meth:`dp_icl_plugin.backends.HFBackend.from_pretrained`, the loader users call. The committed
weights took 22,259 steps of 64 sequences, 420 s on one H100 (``--device cuda``; ``training.json``). Induction
heads form late: in that run's progress lines (printed every 50 steps) the loss sat on a plateau for about
3,000 steps before copy accuracy jumped to ~0.9; its ``training.json`` kept only the last 5 points (a retrain
now keeps them all). On 2 CPU cores, 2 minutes of training (``--retrain --seconds 120 --out /tmp/cm``) reach 375
steps at copy accuracy 0.09, and that model ranks the secret first for 0 of 100 canaries in context: so the
model is cached, not retrained on each run.

    python benchmarks/audit/copy_model.py                                # load and check that it copies
    python benchmarks/audit/copy_model.py --retrain --device cuda        # train again (7 minutes on an H100)
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
CACHE = HERE / "results" / "copy_model"
EOS, UNK = "<|endoftext|>", "[UNK]"
PUNCTUATION = [";", ":", ",", ".", "/", "|", "?", "-"]
TEMPLATE_WORDS = ["rec", "ok", "text", "label", "answer", "question", "record"]
NAMES = ["".join(t) for t in itertools.product("bdfgklmnprstvz", "aeiou", "bdfgklmnprstvz")][:600]
NUMBERS = [str(n) for n in range(100, 1000)]
N_POSITIONS = 256


def vocabulary() -> list[str]:
    """All tokens, in id order (``<|endoftext|>`` = 0)."""
    return [EOS, UNK, *PUNCTUATION, *TEMPLATE_WORDS, *NAMES, *NUMBERS]


def build_tokenizer() -> Any:
    """A word-level fast tokenizer (the ``tokenizers`` library) wrapped for ``transformers``."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate(vocabulary())}
    core = Tokenizer(WordLevel(vocab, unk_token=UNK))
    core.pre_tokenizer = Whitespace()  # \w+|[^\w\s]+: "417," -> "417", ","
    return PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=EOS, bos_token=EOS, pad_token=EOS, unk_token=UNK, model_max_length=N_POSITIONS
    )


def copy_batch(rng: np.random.Generator, batch: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Token streams of fresh segments and repeats of earlier spans (the in-context copying task).

    A fresh segment is 3–9 random tokens (mostly names and numbers, some punctuation and template words)
    ended by a separator; with probability 0.45 the next piece instead repeats an earlier span of 3–12
    tokens, so the only way to predict it past its first token is to find it earlier in the context.
    Returns the tokens and a mask of the positions predictable only by copying (for the copy accuracy).
    """
    first_name = 2 + len(PUNCTUATION) + len(TEMPLATE_WORDS)
    first_number = first_name + len(NAMES)
    out = np.zeros((batch, length), dtype=np.int64)
    copied = np.zeros((batch, length), dtype=bool)
    # fresh tokens, drawn in one go: 55 % names, 30 % numbers, 15 % punctuation and template words
    u = rng.random((batch, length))
    fresh = np.where(
        u < 0.55,
        rng.integers(first_name, first_number, (batch, length)),
        np.where(
            u < 0.85,
            rng.integers(first_number, first_number + len(NUMBERS), (batch, length)),
            rng.integers(2, first_name, (batch, length)),
        ),
    )
    separators = rng.integers(2, 5, (batch, length))
    for b in range(batch):
        row, mask, pos = out[b], copied[b], 0
        while pos < length:
            if pos > 12 and rng.random() < 0.45:
                span = int(rng.integers(3, 13))
                start = int(rng.integers(0, pos - 3))
                n = min(span, pos - start, length - pos)
                row[pos : pos + n] = row[start : start + n]
                mask[pos + 1 : pos + n] = True
                pos += n
            else:
                n = min(int(rng.integers(3, 10)), length - pos)
                row[pos : pos + n] = fresh[b, pos : pos + n]
                pos += n
                if pos < length:
                    row[pos] = separators[b, pos]
                    pos += 1
    return out, copied


def train(
    out: Path = CACHE,
    *,
    seed: int = 0,
    steps: int = 40_000,
    seconds: float = 420.0,
    device: str = "cpu",
    batch: int = 64,
    length: int = 128,
    progress: bool = True,
) -> dict[str, Any]:
    """Train the copying GPT-2 (stops after ``steps`` or ``seconds``), save model and tokenizer to ``out``."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    tokenizer = build_tokenizer()
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=N_POSITIONS,
        n_embd=128,
        n_layer=2,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    model = GPT2LMHeadModel(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 100))
    started, loss_value, step = time.monotonic(), float("nan"), 0
    history: list[tuple[int, float, float]] = []
    for step in range(1, steps + 1):
        # Lengths vary up to the full window, so every position the audits use is trained.
        width = length if step % 4 else N_POSITIONS
        tokens, copied = copy_batch(rng, batch if width == length else batch // 2, width)
        ids = torch.as_tensor(tokens, device=device)
        out_ = model(input_ids=ids, labels=ids)
        loss = out_.loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 50 == 0:
            loss_value = loss.item()
            # accuracy on the positions only copying can predict (the logits at t - 1 predict token t)
            guess = out_.logits[:, :-1].argmax(-1).cpu().numpy() == tokens[:, 1:]
            accuracy = float(guess[copied[:, 1:]].mean())
            history.append((step, round(loss_value, 3), round(accuracy, 3)))
            if progress:
                print(
                    f"\rtraining the copy model: step {step}, loss {loss_value:.3f}, copy accuracy "
                    f"{accuracy:.3f}, {time.monotonic() - started:.0f} s",
                    end="",
                    flush=True,
                )
            if accuracy > 0.98 and len(history) > 2 and history[-2][2] > 0.98 and history[-3][2] > 0.98:
                break  # converged
        if time.monotonic() - started > seconds:
            break
    if progress:
        print()
    out.mkdir(parents=True, exist_ok=True)
    model.eval().to("cpu").save_pretrained(out)
    tokenizer.save_pretrained(out)
    meta = {
        "seed": seed,
        "steps": step,
        "loss": round(loss_value, 4),
        "device": device,
        "seconds": round(time.monotonic() - started, 1),
        "history": history,
    }
    (out / "training.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def load_backend(path: Path = CACHE, *, device: str = "cpu") -> Any:
    """The copy model through the library's loader (:meth:`HFBackend.from_pretrained`)."""
    from dp_icl_plugin.backends import HFBackend

    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no copy model at {path}: python benchmarks/audit/copy_model.py --retrain")
    return HFBackend.from_pretrained(path, device=device, dtype="float32")


def random_canaries(rng: np.random.Generator, n: int, *, prefix_len: int = 4) -> list[tuple[str, str]]:
    """``n`` (prefix, secret) pairs: ``prefix_len`` random distinct names and a random 3-digit number."""
    names = rng.permutation(len(NAMES))
    out = []
    for i in range(n):
        picked = names[(i * prefix_len) % len(NAMES) : (i * prefix_len) % len(NAMES) + prefix_len]
        out.append((" ".join(NAMES[j] for j in picked), str(rng.choice(NUMBERS))))
    return out


def secret_rank(backend: Any, context: str, prefix: str, secret: str) -> int:
    """Rank of the secret's token among the whole vocabulary after ``context`` then ``prefix`` (1 = top)."""
    ids = backend.encode(f"{context} {prefix}", add_special_tokens=True)
    room = backend.max_length - 1
    logprobs = backend.next_token_logprobs([ids[-room:]])[0]
    (token,) = backend.encode(secret)
    return int((logprobs > logprobs[token]).sum()) + 1


def check_copies(backend: Any, *, n: int = 50, seed: int = 123) -> dict[str, float]:
    """How often the secret ranks first after ``prefix secret ; <3 other records> ; prefix`` and after the
    prefix alone (0-shot), on ``n`` fresh random canaries."""
    rng = np.random.default_rng(seed)
    canaries = random_canaries(rng, 4 * n)
    with_context, zero_shot = [], []
    for i in range(n):
        prefix, secret = canaries[i]
        others = [f"{p} {s}" for p, s in canaries[n + 3 * i : n + 3 * i + 3]]
        records = [f"{prefix} {secret}", *others]
        order = rng.permutation(len(records))
        context = " ; ".join(records[j] for j in order) + " ;"
        with_context.append(secret_rank(backend, context, prefix, secret))
        zero_shot.append(secret_rank(backend, ";", prefix, secret))
    return {
        "n": n,
        "rank1_in_context": float(np.mean(np.equal(with_context, 1))),
        "median_rank_in_context": float(np.median(with_context)),
        "rank1_zero_shot": float(np.mean(np.equal(zero_shot, 1))),
        "median_rank_zero_shot": float(np.median(zero_shot)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=CACHE)
    parser.add_argument("--retrain", action="store_true", help="train again even if the cache exists")
    parser.add_argument("--steps", type=int, default=40_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=420.0, help="stop training after this long")
    parser.add_argument("--device", default="cpu", help="where to train (cuda: 7 minutes on an H100)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    if args.retrain or not (args.out / "config.json").is_file():
        print(
            train(
                args.out, seed=args.seed, steps=args.steps, seconds=args.seconds, device=args.device, batch=args.batch
            )
        )
    backend = load_backend(args.out)
    print(backend)
    print(json.dumps(check_copies(backend, n=100), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
