"""Paths and fixtures' helpers shared by tests (importable from test modules, unlike conftest)."""

from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"


def tiny_text_gpt2(
    out: Path, corpus: list[str], *, vocab_size: int = 400, n_positions: int = 1024, seed: int = 0
) -> Path:
    """A randomly initialised 2-layer GPT-2 with a byte-level BPE tokenizer trained on ``corpus``, saved
    with ``save_pretrained`` (loads back with ``HFBackend.from_pretrained``); nothing is downloaded."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=vocab_size, min_frequency=1, special_tokens=["<|endoftext|>"])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=n_positions,
    )
    torch.manual_seed(seed)
    eos = tokenizer.eos_token_id
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=n_positions,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    GPT2LMHeadModel(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def write_ginc_csv(path: Path, *, label_column: str = "label") -> Path:
    """100 GINC training examples of each of concepts 0 and 1 as a CSV (``text``, ``label_column`` = c0/c1)."""
    import csv

    import numpy as np

    from dp_icl_plugin.ginc import GincConfig, GincLanguage
    from dp_icl_plugin.ginc.prompts import pta_split

    language = GincLanguage(GincConfig())
    split = pta_split(language, n_train=100, n_test=1, rng=np.random.default_rng(0))
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", label_column])
        for concept in (0, 1):
            for ex in split[concept][0]:
                writer.writerow([language.render([*ex.tokens, ex.label]), f"c{concept}"])
    return path


def steps_of(calls: list, public: int) -> list:
    """Each generation step's two backend calls (its ``public`` rows alone, then the records' rows) joined into
    the step's rows, public first; asserts that every step made exactly those two calls."""
    assert len(calls) % 2 == 0, f"{len(calls)} calls: not one public and one private call per step"
    steps = []
    for public_call, private_call in zip(calls[0::2], calls[1::2], strict=True):
        assert len(public_call) == public, f"a public call held {len(public_call)} rows, not {public}"
        if hasattr(public_call, "shape"):
            steps.append(np.vstack([public_call, private_call]))
        else:
            steps.append([*public_call, *private_call])
    return steps
