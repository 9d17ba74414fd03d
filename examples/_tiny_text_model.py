"""A tiny, randomly initialised GPT-2 with a byte-level BPE tokenizer, built offline in a few seconds.

The examples that need a model reading arbitrary English use it to show the plumbing (its answers are
noise: it was never trained). Swap in any local Hugging Face causal LM path for real answers.
"""

from __future__ import annotations

import tempfile
from pathlib import Path


def tiny_text_model(corpus: list[str], *, vocab_size: int = 500, n_positions: int = 1024) -> Path:
    """Train a byte-level BPE on ``corpus``, build a 2-layer GPT-2 around it, save both; return the folder."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    out = Path(tempfile.mkdtemp(prefix="dp-icl-tiny-model-"))
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=vocab_size, min_frequency=1, special_tokens=["<|endoftext|>"])
    eos = "<|endoftext|>"
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, bos_token=eos, eos_token=eos, pad_token=eos, model_max_length=n_positions
    )
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=n_positions,
        n_embd=64,
        n_layer=2,
        n_head=2,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
    )
    GPT2LMHeadModel(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
