"""A Hugging Face tokenizer for a GINC vocabulary: one word per symbol, split on whitespace.

The vocabulary is exactly the GINC symbols (|V| = ``n_symbols``, as in the papers): the delimiter "/" doubles
as the BOS, EOS and padding token, the way GPT-2 uses one token for all three, and an unknown word is an error
rather than a silent ``[UNK]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dp_icl_plugin.ginc.language import DELIMITER

__all__ = ["build_tokenizer"]


def build_tokenizer(vocab: Sequence[str], *, model_max_length: int) -> Any:
    """A ``PreTrainedTokenizerFast`` over ``vocab`` that ``AutoTokenizer.from_pretrained`` loads back."""
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError("the GINC tokenizer needs transformers: pip install 'dp-icl-plugin[hf]'") from exc

    core = Tokenizer(models.WordLevel(vocab={word: i for i, word in enumerate(vocab)}))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=DELIMITER,
        eos_token=DELIMITER,
        pad_token=DELIMITER,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
