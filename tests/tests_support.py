"""Paths shared by tests (importable from test modules, unlike conftest)."""

from pathlib import Path

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
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=n_positions, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)  # fmt: skip
    GPT2LMHeadModel(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
