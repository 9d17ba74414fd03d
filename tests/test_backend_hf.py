"""HFBackend over tiny, randomly initialised GPT-2 models built on the spot (never downloaded).

Checks that batching (left padding, masks, position ids, micro-batches) and KV-cached incremental decoding
reproduce per-prompt full forward passes, that validation and failures map to the package's errors without
echoing prompt text, and that the core package stays importable without torch.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests_support import REPO_ROOT  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from dp_icl_plugin.backends import IncrementalSession, NextTokenBackend  # noqa: E402
from dp_icl_plugin.backends.base import check_logprobs  # noqa: E402
from dp_icl_plugin.backends.hf import HFBackend, HFIncrementalSession  # noqa: E402
from dp_icl_plugin.errors import BackendError, ConfigurationError, ModelFileError  # noqa: E402
from dp_icl_plugin.ginc.language import symbol_names  # noqa: E402
from dp_icl_plugin.ginc.tokenizer import build_tokenizer  # noqa: E402

torch.set_num_threads(1)

VOCAB = 150
N_POSITIONS = 64
TOL = 1e-4
CANARY = "zzsecretzz"
# Distinct lengths in 1..40, so every micro-batch mixes lengths and needs padding.
LENGTHS = [1, 40, 7, 13, 2, 25, 33, 5, 18, 9, 29, 3]


def _config(vocab_size: int = VOCAB) -> GPT2Config:
    return GPT2Config(
        vocab_size=vocab_size,
        n_positions=N_POSITIONS,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )


def _tokenizer() -> object:
    return build_tokenizer(symbol_names(VOCAB), model_max_length=N_POSITIONS)


class Without:
    """The same backend without the named methods (so a method falls back to whole prompts)."""

    def __init__(self, inner: HFBackend, *names: str) -> None:
        self._inner, self._hidden = inner, names

    def __getattr__(self, name: str):
        if name in self._hidden:
            raise AttributeError(name)
        return getattr(self._inner, name)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-gpt2")
    torch.manual_seed(0)
    GPT2LMHeadModel(_config()).save_pretrained(out)
    _tokenizer().save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def backend(model_dir: Path) -> HFBackend:
    return HFBackend.from_pretrained(model_dir, dtype="float32", device="cpu", micro_batch_size=3)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = np.random.default_rng(1234)
    return [rng.integers(0, VOCAB, size=n).tolist() for n in LENGTHS]


def _reference(model: object, ids: list[int]) -> np.ndarray:
    """Next-token log-probabilities of one unpadded prompt, straight from the model."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1, :VOCAB].float()
        return torch.log_softmax(logits, dim=-1).numpy()


def _logsumexp(rows: np.ndarray) -> np.ndarray:
    return np.logaddexp.reduce(rows.astype(np.float64), axis=-1)


# ---------------------------------------------------------------------------------------------- batching


def test_loaded_backend_properties(backend: HFBackend, model_dir: Path) -> None:
    assert backend.vocab_size == VOCAB
    assert backend.eos_token_id == 0
    assert backend.max_length == N_POSITIONS
    assert backend.model_id == str(model_dir)
    assert backend.micro_batch_size == 3
    assert str(backend.device) == "cpu"
    assert next(backend.model.parameters()).dtype == torch.float32
    assert not backend.model.training


def test_single_prompt_matches_the_model_itself(backend: HFBackend, prompts: list[list[int]]) -> None:
    for p in prompts[:4]:
        got = backend.next_token_logprobs([p])[0]
        np.testing.assert_allclose(got, _reference(backend.model, p), atol=TOL, rtol=0)


def test_batched_equals_unbatched(backend: HFBackend, prompts: list[list[int]]) -> None:
    batched = backend.next_token_logprobs(prompts)
    single = np.stack([backend.next_token_logprobs([p])[0] for p in prompts])
    assert batched.shape == (len(prompts), VOCAB)
    assert np.abs(batched - single).max() <= TOL
    # Rows genuinely differ between prompts, so a mix-up of rows would be caught.
    for i in range(1, len(prompts)):
        assert np.abs(batched[i] - batched[0]).max() > 100 * TOL

    # The comparison is sensitive: ignoring the padding mask and positions changes the answer.
    width = max(LENGTHS)
    short = prompts[0]
    padded = torch.tensor([[0] * (width - len(short)) + short])
    with torch.inference_mode():
        naive = torch.log_softmax(backend.model(input_ids=padded).logits[0, -1, :VOCAB].float(), -1).numpy()
    assert np.abs(naive - single[0]).max() > 100 * TOL


def test_result_rows_follow_input_order(backend: HFBackend, prompts: list[list[int]]) -> None:
    batched = backend.next_token_logprobs(prompts)
    order = np.random.default_rng(7).permutation(len(prompts))
    shuffled = backend.next_token_logprobs([prompts[i] for i in order])
    assert np.abs(shuffled - batched[order]).max() <= TOL


@pytest.mark.parametrize("pair", [(1, 64), (2, 5)])
def test_micro_batch_size_does_not_change_results(
    backend: HFBackend, prompts: list[list[int]], pair: tuple[int, int]
) -> None:
    a, b = (HFBackend(backend.model, backend.tokenizer, device="cpu", micro_batch_size=m) for m in pair)
    assert np.abs(a.next_token_logprobs(prompts) - b.next_token_logprobs(prompts)).max() <= TOL
    assert np.abs(a.next_token_logprobs(prompts) - backend.next_token_logprobs(prompts)).max() <= TOL


def test_prompt_containers(backend: HFBackend) -> None:
    as_lists = backend.next_token_logprobs([[1, 2, 3], [4, 5, 6]])
    as_array = backend.next_token_logprobs(np.array([[1, 2, 3], [4, 5, 6]]))
    as_tuples = backend.next_token_logprobs(((1, 2, 3), np.array([4, 5, 6], dtype=np.int32)))
    np.testing.assert_array_equal(as_array, as_lists)
    np.testing.assert_array_equal(as_tuples, as_lists)


def test_prompt_of_exactly_max_length_is_accepted(backend: HFBackend) -> None:
    ids = [i % VOCAB for i in range(N_POSITIONS)]
    out = backend.next_token_logprobs([ids, [5]])
    np.testing.assert_allclose(out[0], _reference(backend.model, ids), atol=TOL, rtol=0)


# ---------------------------------------------------------------------------------------------- sessions


def test_cached_equals_uncached(backend: HFBackend, prompts: list[list[int]]) -> None:
    rng = np.random.default_rng(99)
    sequences = [list(p) for p in prompts]
    n = len(prompts)
    session = backend.start(prompts)
    assert session.n_prompts == n
    np.testing.assert_array_equal(session.lengths, LENGTHS)
    assert np.abs(session.logprobs - backend.next_token_logprobs(prompts)).max() <= TOL
    steps: list[object] = [
        rng.integers(0, VOCAB, size=n),
        7,  # one id for every prompt
        rng.integers(0, VOCAB, size=n).tolist(),
        np.int64(149),
        rng.integers(0, VOCAB, size=n).astype(np.int32),
        0,
    ]
    previous = session.logprobs
    for step, new in enumerate(steps, start=1):
        out = session.append(new)  # type: ignore[arg-type]
        per_prompt = np.broadcast_to(np.asarray(new), (n,))
        for seq, token in zip(sequences, per_prompt, strict=True):
            seq.append(int(token))
        assert out.shape == (n, VOCAB) and out.dtype == np.float32
        np.testing.assert_array_equal(session.lengths, np.array(LENGTHS) + step)
        np.testing.assert_array_equal(session.logprobs, out)
        assert np.abs(out - backend.next_token_logprobs(sequences)).max() <= TOL
        assert np.abs(out - previous).max() > 100 * TOL  # appending really changed the context
        previous = out
    session.close()
    # The caller's prompts are not mutated by appending.
    assert [len(p) for p in prompts] == LENGTHS


def test_session_results_are_copies(backend: HFBackend) -> None:
    session = backend.start([[1, 2], [3]])
    lengths, logprobs = session.lengths, session.logprobs
    lengths[:] = 0
    logprobs[:] = 0.0
    np.testing.assert_array_equal(session.lengths, [2, 1])
    assert np.all(session.logprobs < 0)
    out = session.append(4)
    out[:] = 0.0
    assert np.all(session.logprobs < 0)


def test_session_with_text_prompts(backend: HFBackend) -> None:
    with backend.start(["a b c", "d"]) as session:
        np.testing.assert_array_equal(session.lengths, [3, 1])
        out = session.append([4, 5])
    np.testing.assert_allclose(out, backend.next_token_logprobs([[1, 2, 3, 4], [4, 5]]), atol=TOL, rtol=0)


def test_session_up_to_max_positions_then_refuses(backend: HFBackend) -> None:
    ids = [i % VOCAB for i in range(N_POSITIONS - 1)]
    session = backend.start([ids, [3, 4]])
    out = session.append([9, 9])
    np.testing.assert_allclose(out, backend.next_token_logprobs([[*ids, 9], [3, 4, 9]]), atol=TOL, rtol=0)
    before = session.logprobs
    with pytest.raises(ConfigurationError, match="positions"):
        session.append([1, 1])
    # The refused step changed nothing.
    np.testing.assert_array_equal(session.lengths, [N_POSITIONS, 3])
    np.testing.assert_array_equal(session.logprobs, before)


# ---------------------------------------------------------------------------------------------- text, vocabulary


def test_text_prompts_and_tokenisation(backend: HFBackend) -> None:
    by_text = backend.next_token_logprobs(["a b c"])
    by_ids = backend.next_token_logprobs([[1, 2, 3]])
    np.testing.assert_array_equal(by_text, by_ids)
    assert np.abs(by_text - backend.next_token_logprobs([[1, 2, 4]])).max() > 100 * TOL
    assert backend.encode("a b c") == [1, 2, 3]
    assert backend.encode("/ z ab") == [0, 26, 27]
    assert backend.decode([1, 2, 3]) == "a b c"
    assert backend.decode(np.array([27, 28])) == "ab ac"
    words = " ".join(symbol_names(VOCAB)[1:])
    assert backend.decode(backend.encode(words)) == words
    assert backend.encode(words) == list(range(1, VOCAB))


def test_rows_are_normalised_float32(backend: HFBackend, prompts: list[list[int]]) -> None:
    out = backend.next_token_logprobs(prompts)
    assert out.dtype == np.float32
    assert out.shape == (len(prompts), VOCAB)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(_logsumexp(out), 0.0, atol=1e-5)


def test_vocab_size_is_capped_by_the_tokenizer() -> None:
    torch.manual_seed(1)
    model = GPT2LMHeadModel(_config(vocab_size=160))  # padded embedding: 10 rows that are no token
    backend = HFBackend(model, _tokenizer(), device="cpu")
    assert backend.vocab_size == VOCAB
    out = backend.next_token_logprobs([[1, 2, 3], "d e"])
    assert out.shape == (2, VOCAB)
    np.testing.assert_allclose(np.exp(out.astype(np.float64)).sum(axis=1), 1.0, atol=1e-5)
    # The full 160-way softmax would not be normalised over the first 150 entries.
    with torch.inference_mode():
        wide = torch.log_softmax(model(input_ids=torch.tensor([[1, 2, 3]])).logits[0, -1], -1).numpy()
    assert abs(np.exp(wide[:VOCAB].astype(np.float64)).sum() - 1.0) > 1e-3
    with pytest.raises(ConfigurationError):
        backend.next_token_logprobs([[155]])  # a model row but not a token
    with backend.start([[1, 2]]) as session, pytest.raises(ConfigurationError):
        session.append(155)


# ---------------------------------------------------------------------------------------------- errors


BAD_PROMPTS = {
    "empty batch": [],
    "empty id list": [[1, 2], []],
    "empty text": [""],
    "whitespace text": ["   "],
    "id == vocab": [[1, VOCAB]],
    "negative id": [[-1, 2]],
    "bare string": "a b c",
    "too long": [[1] * (N_POSITIONS + 1)],
    "too long text": [" ".join(["a"] * (N_POSITIONS + 1))],
    "float ids": [[1.0, 2.0]],
    "bool ids": [[True, False]],
    "none prompt": [None],
    "nested ids": [[[1, 2]]],
    "bytes prompt": [b"a b"],
    "not a sequence": 3,
}


@pytest.mark.parametrize("bad", BAD_PROMPTS.values(), ids=BAD_PROMPTS.keys())
def test_invalid_prompts_are_configuration_errors(backend: HFBackend, bad: object) -> None:
    with pytest.raises(ConfigurationError):
        backend.next_token_logprobs(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        backend.start(bad)  # type: ignore[arg-type]


def test_unknown_word_is_not_echoed(backend: HFBackend) -> None:
    for call in (
        lambda: backend.next_token_logprobs(["a b", f"c {CANARY} d"]),
        lambda: backend.start([f"{CANARY}"]),
        lambda: backend.encode(f"a {CANARY}"),
    ):
        with pytest.raises(ConfigurationError) as info:
            call()
        assert CANARY not in str(info.value)
        assert CANARY not in repr(info.value)
        assert info.value.__cause__ is None or CANARY not in str(info.value.__cause__)
    with pytest.raises(ConfigurationError):
        backend.encode(123)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad",
    [[1, 2, 3], [1], np.array([[1], [2]]), np.array([1.0, 2.0]), [1, VOCAB], -1, VOCAB, np.array([True, False]), "a"],
    ids=["too many", "too few", "2-d", "floats", "id == vocab", "negative scalar", "scalar == vocab", "bools", "text"],
)
def test_append_rejects_bad_ids(backend: HFBackend, bad: object) -> None:
    session = backend.start([[1, 2], [3]])
    before = session.logprobs
    with pytest.raises(ConfigurationError):
        session.append(bad)  # type: ignore[arg-type]
    np.testing.assert_array_equal(session.lengths, [2, 1])
    np.testing.assert_array_equal(session.logprobs, before)
    session.close()


def test_append_after_close(backend: HFBackend) -> None:
    session = backend.start([[1, 2]])
    session.append(3)
    session.close()
    with pytest.raises(ConfigurationError, match="closed"):
        session.append(3)
    with backend.start([[1, 2]]) as other:
        other.append(3)
    with pytest.raises(ConfigurationError, match="closed"):
        other.append(3)


def test_from_pretrained_missing_directory(tmp_path: Path) -> None:
    # An absolute path that does not exist is no valid hub id either, so nothing is fetched; the error says
    # which it is (transformers said "Repo id must use alphanumeric chars")
    with pytest.raises(ModelFileError, match="no such model folder"):
        HFBackend.from_pretrained(tmp_path / "no" / "such" / "model", device="cpu")
    with pytest.raises(ModelFileError, match="no such model folder"):
        HFBackend.from_pretrained("./no-such-model", device="cpu")
    with pytest.raises(ModelFileError, match="folder without a config"):
        HFBackend.from_pretrained(tmp_path, device="cpu")  # exists, but holds no model


def test_a_name_that_is_no_model_here_is_refused_at_once_with_the_close_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a typo spent 46 s retrying an unreachable hub, then said "check your internet connection"
    from dp_icl_plugin.backends import model_reference

    probes: list[str] = []
    monkeypatch.setattr(model_reference, "_hub_reachable", lambda: probes.append("probe") or False)
    with pytest.raises(ConfigurationError, match="Did you mean 'smollm2-135m-instruct'"):
        HFBackend.from_pretrained("smollm2-135m", device="cpu")
    assert probes == []  # a typo of a named model needs no network at all
    with pytest.raises(ConfigurationError, match="hub is unreachable"):
        HFBackend.from_pretrained("some-org/some-model-not-cached", device="cpu")
    assert probes == ["probe"]
    monkeypatch.undo()  # the real probe: HF_HUB_OFFLINE answers it without a connection
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert model_reference._hub_reachable() is False


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_a_device_this_machine_lacks_is_a_configuration_error(model_dir: Path) -> None:
    # device="cuda" without a GPU raised a bare AssertionError from inside torch
    for device in ("cuda", "cuda:0"):
        with pytest.raises(ConfigurationError, match="torch sees no CUDA GPU"):
            HFBackend.from_pretrained(model_dir, device=device)


@pytest.mark.parametrize("dtype", ["int32", "no_such_dtype", "complex64", "bool", "Tensor"])
def test_bad_dtype_name(model_dir: Path, dtype: str) -> None:
    with pytest.raises(ConfigurationError):
        HFBackend.from_pretrained(model_dir, dtype=dtype, device="cpu")


def test_non_floating_torch_dtype_object_is_a_configuration_error(model_dir: Path) -> None:
    with pytest.raises(ConfigurationError):
        HFBackend.from_pretrained(model_dir, dtype=torch.int32, device="cpu")


def test_dtype_name_is_applied(model_dir: Path) -> None:
    half = HFBackend.from_pretrained(model_dir, dtype="bfloat16", device="cpu")
    assert next(half.model.parameters()).dtype == torch.bfloat16
    out = half.next_token_logprobs([[1, 2, 3]])
    assert out.dtype == np.float32
    np.testing.assert_allclose(_logsumexp(out), 0.0, atol=1e-4)


def test_bad_constructor_arguments(backend: HFBackend) -> None:
    with pytest.raises(ConfigurationError):
        HFBackend(backend.model, backend.tokenizer, device="cpu", micro_batch_size=0)
    with pytest.raises(ConfigurationError):
        HFBackend(backend.model, backend.tokenizer, device="not-a-device")


@pytest.mark.timeout(60)
def test_forward_failure_is_a_backend_error(backend: HFBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    session = backend.start([[1, 2], [3]])
    expected = backend.next_token_logprobs([[1, 2, 4]])

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("simulated device failure")

    with monkeypatch.context() as m:
        m.setattr(backend.model, "forward", broken)
        with pytest.raises(BackendError) as info:
            backend.next_token_logprobs([[1, 2, 3]])
        assert isinstance(info.value.__cause__, RuntimeError)
        with pytest.raises(BackendError):
            backend.start([[1, 2, 3]])
        with pytest.raises(BackendError):
            session.append(4)
    # The lock was released and the model works again.
    np.testing.assert_allclose(backend.next_token_logprobs([[1, 2, 4]]), expected, atol=TOL, rtol=0)


def test_a_bad_row_comes_back_as_computed_and_callers_judge_it(
    backend: HFBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NaN logits come back as NaN rows, never as an error: whether a call raised would depend on its prompt, a
    private record's maybe (review of issue 30: HFBackend raised on a record's NaN row before the methods could
    stand the public row in for it). A public caller refuses such a row with check_logprobs."""
    original = backend.model.forward

    def nan_forward(*args: object, **kwargs: object) -> object:
        out = original(*args, **kwargs)
        out.logits = torch.full_like(out.logits, float("nan"))
        return out

    session = backend.start([[1, 2]])
    with monkeypatch.context() as m:
        m.setattr(backend.model, "forward", nan_forward)
        rows = backend.next_token_logprobs([[1, 2, 3]])
        assert rows.shape == (1, VOCAB) and np.isnan(rows).all()
        with pytest.raises(BackendError, match="NaN"):
            check_logprobs(rows)
        with backend.start([[1, 2, 3]]) as other:
            assert np.isnan(other.logprobs).all()
        assert np.isnan(session.append(3)).all()
    session.close()
    assert np.all(np.isfinite(backend.next_token_logprobs([[1, 2, 3]])))


POISON = 7  # a token id: a prompt holding it makes the model's row NaN (as an fp16 overflow on one input might)


def _poison_rows(backend: HFBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    original = backend.model.forward

    def forward(*args: object, **kwargs: object) -> object:
        out = original(*args, **kwargs)
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        bad = (ids == POISON).any(dim=1)
        if bool(bad.any()):
            logits = out.logits.clone()
            logits[bad] = float("nan")
            out.logits = logits
        return out

    monkeypatch.setattr(backend.model, "forward", forward)


@pytest.mark.parametrize("release", ["tang", "mozo-decoder", "clip-blend-decoder"])
def test_a_record_the_model_returns_nan_for_cannot_fail_the_release(
    backend: HFBackend, monkeypatch: pytest.MonkeyPatch, release: str
) -> None:
    """The NaN comes from inside the model, for the rows holding one record: the release completes and is charged
    once (before the fix, ReleaseFailedError after the charge whenever that record was drawn: on D ∪ {it}, not
    on D)."""
    from dp_icl_plugin import PRESETS, BudgetManager, PrivacyBudget, PrivateDataset, PrivateRecord, TangSynthesizer
    from dp_icl_plugin.decoding.decoders import ClipBlendDecoder, MozoDecoder
    from dp_icl_plugin.templates.answer import ANSWER_PRESETS

    names = symbol_names(VOCAB)
    label = names[5]
    records = [PrivateRecord(f"{names[3]} {names[POISON]} {names[4]}", label)]
    records += [PrivateRecord(f"{names[i]} {names[i + 1]}", label) for i in range(10, 20)]
    budget = BudgetManager(PrivacyBudget(1e4, 1e-3))
    rng = np.random.default_rng(0)
    with monkeypatch.context() as m:
        _poison_rows(backend, m)
        if release == "tang":
            data = PrivateDataset(records, public_label_counts="observed")
            method = TangSynthesizer(
                noise_multiplier=1.0,
                max_tokens=3,
                n_prompts=11,
                records_per_prompt=1,
                top_k=5,
                template=PRESETS["ginc"],
            )
            demos = method.synthesize(data, backend=backend, budget=budget, rng=rng)
            assert len(demos) == 1
        else:
            common = {"backend": backend, "budget": budget, "n_queries": 2, "max_tokens": 3}
            template = ANSWER_PRESETS["ginc"]
            decoder = (
                MozoDecoder(PrivateDataset(records), beta=0.5, top_k=5, n_shots=11, template=template, **common)
                if release == "mozo-decoder"
                else ClipBlendDecoder(
                    PrivateDataset(records),
                    subset_size=11,
                    temperature=1.0,
                    rng_subset=rng,
                    template=template,
                    **common,
                )
            )
            decoder.generate(f"{names[8]} {names[9]}", rng=rng)
    assert len(budget.history()) == 1


# ---------------------------------------------------------------------------------------------- chat template


def test_chat_template(backend: HFBackend) -> None:
    tokenizer = _tokenizer()
    chat = HFBackend(backend.model, tokenizer, device="cpu")
    assert not chat.has_chat_template
    with pytest.raises(ConfigurationError):
        chat.apply_chat_template([{"role": "user", "content": "a b"}])

    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} / {% endfor %}"
    assert chat.has_chat_template
    ids = chat.apply_chat_template([{"role": "user", "content": "a b"}])
    assert ids == [1, 2, 0]
    assert all(type(t) is int for t in ids)
    two = chat.apply_chat_template(
        [{"role": "user", "content": "c"}, {"role": "assistant", "content": "d e"}], add_generation_prompt=False
    )
    assert two == [3, 0, 4, 5, 0]
    # The ids are a usable prompt.
    assert chat.next_token_logprobs([ids]).shape == (1, VOCAB)

    for bad in ([], [{"content": "a"}], ["a b"]):
        with pytest.raises(ConfigurationError):
            chat.apply_chat_template(bad)  # type: ignore[arg-type]
    with pytest.raises((ConfigurationError, BackendError)) as info:
        chat.apply_chat_template([{"role": "user", "content": f"a {CANARY}"}])
    assert CANARY not in str(info.value)

    tokenizer.chat_template = "{{ messages[5]['content'] }}"  # fails when rendered
    with pytest.raises(BackendError):
        chat.apply_chat_template([{"role": "user", "content": "a"}])


# ---------------------------------------------------------------------------------------------- protocols, repr, imports


def test_protocols_and_repr(backend: HFBackend) -> None:
    assert isinstance(backend, NextTokenBackend)
    text = "ab ac ad ae"
    session = backend.start([text, "af ag"])
    assert isinstance(session, HFIncrementalSession)
    assert isinstance(session, IncrementalSession)
    assert not isinstance(object(), NextTokenBackend)
    assert not isinstance(backend, IncrementalSession)

    assert "HFBackend" in repr(backend) and "vocab_size=150" in repr(backend)
    assert "n_prompts" not in repr(session) and "open=True" in repr(session)  # a subset's size is private
    for r in (repr(backend), repr(session), str(session)):
        assert text not in r and "af ag" not in r
        assert "27, 28" not in r  # nor the token ids
    session.close()
    assert "open=False" in repr(session)


def test_core_imports_without_torch() -> None:
    code = (
        "import dp_icl_plugin, dp_icl_plugin.backends, sys; "
        "from dp_icl_plugin.backends import FakeBackend, NextTokenBackend; "
        "assert 'torch' not in sys.modules, 'torch'; assert 'transformers' not in sys.modules, 'transformers'"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_hf_backend_is_reachable_lazily() -> None:
    import dp_icl_plugin.backends as backends

    assert backends.HFBackend is HFBackend
    with pytest.raises(AttributeError):
        backends.NoSuchBackend  # noqa: B018


# ---------------------------------------------------------------------------------------------- threads


@pytest.mark.timeout(120)
def test_concurrent_calls_match_sequential(backend: HFBackend, prompts: list[list[int]]) -> None:
    batches = [prompts, prompts[::-1], ["a b c", "d e", "ab"], prompts[3:9]]
    sequential = [backend.next_token_logprobs(b) for b in batches]
    session_steps = [[5, 6], [7, 8]]
    with backend.start([[1, 2, 3], [4]]) as s:
        for step in session_steps:
            s.append(step)
        session_expected = s.logprobs

    results: dict[tuple[int, int], np.ndarray] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def work(k: int) -> None:
        try:
            barrier.wait()
            for rep in range(3):
                results[k, rep] = backend.next_token_logprobs(batches[k])
                with backend.start([[1, 2, 3], [4]]) as sess:
                    for step in session_steps:
                        sess.append(step)
                    results[k, -rep - 1] = sess.logprobs
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=100)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert len(results) == 4 * 6
    for (k, rep), got in results.items():
        expected = sequential[k] if rep >= 0 else session_expected
        np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------ prefixes with a shared suffix
def test_shared_suffix_equals_full_prompts_and_reuses_prefix_caches(
    backend: HFBackend, prompts: list[list[int]]
) -> None:
    prefixes = [p[:20] for p in prompts]  # lengths 1..20: the caches are left-padded to their buckets
    suffix = [5, 9, 2, 7]
    rows = [p + suffix for p in prefixes] + [[3, 4]]  # the last row does not end with the suffix: computed whole
    backend.prefix_cache.clear()
    fast = backend.next_token_logprobs_shared_suffix(rows, suffix)
    full = backend.next_token_logprobs(rows)
    np.testing.assert_allclose(fast, full, atol=TOL)
    assert len(backend.prefix_cache) == len({tuple(p) for p in prefixes})
    again = backend.next_token_logprobs_shared_suffix([[*r, 3] for r in rows[::-1]], [*suffix, 3])  # cached, new order
    np.testing.assert_allclose(again, backend.next_token_logprobs([[*r, 3] for r in rows[::-1]]), atol=TOL)
    # a prompt past the model's length is refused as next_token_logprobs refuses it
    with pytest.raises(ConfigurationError, match="at most"):
        backend.next_token_logprobs_shared_suffix([prompts[1] + list(range(1, 30))], list(range(1, 30)))


def test_the_prefix_cache_keeps_to_its_token_budget() -> None:
    from dp_icl_plugin.backends.hf_prefix import PrefixKVCache

    cache = PrefixKVCache(10)
    for start in (0, 100, 200):
        cache.put(tuple(range(start, start + 4)), [])
    assert cache.cached_tokens <= 10 and len(cache) == 2 and cache.cached_bytes == 0  # the oldest went out
    cache.put(tuple(range(11)), [])  # larger than the whole budget: not kept
    assert cache.cached_tokens <= 10 and len(cache) == 2


def test_mozo_steps_through_prefix_caches_give_the_full_prompts_distributions(backend: HFBackend) -> None:
    from dp_icl_plugin import BudgetManager, PrivacyBudget, PrivateDataset, PrivateRecord
    from dp_icl_plugin.decoding.decoders import MozoDecoder
    from dp_icl_plugin.templates.answer import ANSWER_PRESETS

    names = symbol_names(VOCAB)
    records = [
        PrivateRecord(" ".join(names[3 + (7 * i + j) % 100] for j in range(1 + i % 5)), names[i % 4 + 110])
        for i in range(30)
    ]
    decoder = MozoDecoder(
        PrivateDataset(records),
        backend=backend,
        budget=BudgetManager(PrivacyBudget(50.0, 1e-3)),
        n_queries=2,
        epsilon=8.0,
        max_tokens=3,
        top_k=20,
        template=ANSWER_PRESETS["ginc"],
    )
    from dp_icl_plugin.backends.shared_rows import rows_logprobs

    query = " ".join(names[20:26])
    zero = decoder._ids(query, None)
    one = [decoder._ids(query, records[i]) for i in (0, 7, 13, 21)]
    suffix = decoder._public_suffix(query)
    assert suffix and all(r[len(r) - len(suffix) :] == suffix for r in [zero, *one])  # the query part
    backend.prefix_cache.clear()
    for generated in ([], [4], [4, 8, 15]):
        fast = rows_logprobs(backend, [zero, *one], generated, suffix=suffix)
        full = backend.next_token_logprobs([r + generated for r in [zero, *one]])
        np.testing.assert_allclose(fast, full, atol=TOL)
    assert len(backend.prefix_cache) == 5  # the zero-shot prompt's and four records' parts, reused each step


def test_mozo_offline_synthesis_through_prefix_caches_equals_full_prompts(backend: HFBackend) -> None:
    from dp_icl_plugin import MozoOfflineSynthesizer, PrivateDataset, PrivateRecord
    from dp_icl_plugin.templates.answer import ANSWER_PRESETS

    names = symbol_names(VOCAB)
    records = [
        PrivateRecord(" ".join(names[3 + (5 * i + j) % 100] for j in range(2 + i % 4)), names[i % 4 + 110])
        for i in range(20)
    ]
    method = MozoOfflineSynthesizer(beta=0.5, max_tokens=4, top_k=20, template=ANSWER_PRESETS["ginc"])
    inputs = [" ".join(names[20:25]), " ".join(names[40:46])]
    backend.prefix_cache.clear()
    cached = method.synthesize_nonprivate(
        PrivateDataset(records), public_inputs=inputs, backend=backend, rng=np.random.default_rng(3), progress=False
    )
    assert len(backend.prefix_cache) > 0  # the records' parts went through the cache
    whole = Without(backend, "next_token_logprobs_shared_suffix")
    full = method.synthesize_nonprivate(
        PrivateDataset(records), public_inputs=inputs, backend=whole, rng=np.random.default_rng(3), progress=False
    )
    assert [d.token_ids for d in cached] == [d.token_ids for d in full]


def test_a_session_started_from_prefix_caches_grows_like_a_fresh_one(backend: HFBackend) -> None:
    from dp_icl_plugin.backends.shared_rows import start_rows

    prefixes = [[5, 9, 11], [5, 17, 4, 22, 8], [5, 30]]
    suffix = [40, 41, 42]
    rows = [p + suffix for p in prefixes]
    backend.prefix_cache.clear()
    with start_rows(backend, rows, suffix=suffix) as cached, backend.start(rows) as fresh:
        assert len(backend.prefix_cache) == 3  # the prefixes went through the cache
        first = fresh.logprobs
        np.testing.assert_allclose(cached.logprobs, first, atol=TOL)
        for token in (7, 13, 2):
            np.testing.assert_allclose(cached.append([token] * 3), fresh.append([token] * 3), atol=TOL)
        assert list(cached.lengths) == list(fresh.lengths)
    with start_rows(backend, rows, suffix=suffix) as again:  # all prefixes cached now: the same distributions
        np.testing.assert_allclose(again.logprobs, first, atol=TOL)


def test_clip_blend_answers_are_the_same_with_and_without_the_prefix_cache(backend: HFBackend) -> None:
    from dp_icl_plugin import BudgetManager, PrivacyBudget, PrivateDataset, PrivateRecord
    from dp_icl_plugin.decoding.decoders import ClipBlendDecoder
    from dp_icl_plugin.templates.answer import ANSWER_PRESETS

    names = symbol_names(VOCAB)
    records = PrivateDataset(
        [
            PrivateRecord(" ".join(names[3 + (7 * i + j) % 100] for j in range(1 + i % 5)), names[i % 4 + 110])
            for i in range(30)
        ]
    )
    answers = []
    backend.prefix_cache.clear()
    for model in (backend, Without(backend, "start_shared_suffix")):
        decoder = ClipBlendDecoder(
            records,
            backend=model,
            budget=BudgetManager(PrivacyBudget(50.0, 1e-3)),
            n_queries=2,
            subset_size=8,
            rng_subset=np.random.default_rng(1),
            temperature=1.0,
            max_tokens=4,
            template=ANSWER_PRESETS["ginc"],
        )
        answers.append(
            [
                decoder.generate(" ".join(names[20 + 5 * q : 26 + 5 * q]), rng=np.random.default_rng(q)).token_ids
                for q in range(2)
            ]
        )
        if model is backend:
            assert len(backend.prefix_cache) >= 2  # the fixed prompts' records' parts went through the cache
    assert answers[0] == answers[1]


def test_a_copied_backend_carries_no_cached_private_prefix(backend: HFBackend) -> None:
    import copy
    import pickle

    backend.prefix_cache.clear()
    backend.next_token_logprobs_shared_suffix([[5, 9, 11, 40, 41], [5, 30, 40, 41]], [40, 41])
    assert len(backend.prefix_cache) == 2
    state = pickle.dumps(backend.prefix_cache)
    assert len(pickle.loads(state)) == 0 and pickle.loads(state).max_tokens == backend.prefix_cache.max_tokens
    assert len(copy.deepcopy(backend.prefix_cache)) == 0
    with pytest.raises(TypeError):  # the backend itself cannot be pickled (it holds a lock)
        pickle.dumps(backend)
    assert len(backend.prefix_cache) == 2


def test_prefix_cache_tokens_zero_computes_every_prompt_whole(model_dir: Path) -> None:
    from dp_icl_plugin.backends.shared_rows import rows_logprobs, start_rows

    plain = HFBackend.from_pretrained(model_dir, prefix_cache_tokens=0)
    rows = [[5, 9, 11, 40, 41], [5, 30, 40, 41]]
    np.testing.assert_allclose(
        rows_logprobs(plain, rows, [7], suffix=[40, 41]), plain.next_token_logprobs([[*r, 7] for r in rows]), atol=TOL
    )
    with start_rows(plain, rows, suffix=[40, 41]) as session:
        session.append([3, 3])
    assert len(plain.prefix_cache) == 0 and plain.prefix_cache.cached_tokens == 0
    with pytest.raises(ConfigurationError, match="at least 0"):
        HFBackend.from_pretrained(model_dir, prefix_cache_tokens=-1)


def test_sliding_window_models_do_not_use_the_prefix_cache() -> None:
    from types import SimpleNamespace

    from dp_icl_plugin.backends.hf_prefix import supports_prefix_cache

    assert supports_prefix_cache(_config())
    assert not supports_prefix_cache(SimpleNamespace(sliding_window=4096))
    assert not supports_prefix_cache(SimpleNamespace(layer_types=["full_attention", "sliding_attention"]))
    assert supports_prefix_cache(SimpleNamespace(sliding_window=None, layer_types=["full_attention"]))


def test_rows_sharing_a_prefix_give_the_full_prompts_distributions(backend: HFBackend) -> None:
    from dp_icl_plugin.backends.shared_rows import prefix_rows_logprobs

    header = [5, 9, 11, 13, 17, 19]
    rows = [[*header, 40, 41], [*header, 23, 24, 25, 40, 41], [*header, 30, 40, 41], [60, 61, 40], [*header, 7]]
    backend.prefix_cache.clear()
    for step in ([], [3], [3, 8]):
        grown = [r + step for r in rows]
        np.testing.assert_allclose(
            prefix_rows_logprobs(backend, grown, header), backend.next_token_logprobs(grown), atol=TOL
        )
    assert backend.prefix_cache.get(tuple(header)) is not None  # the common instruction, computed once


def test_tang_and_pta_synthesis_through_the_shared_prefix_equal_full_prompts(backend: HFBackend) -> None:
    from dp_icl_plugin import PRESETS, PrivateDataset, PrivateRecord, PTASynthesizer, TangSynthesizer

    names = symbol_names(VOCAB)
    records = PrivateDataset(
        [
            PrivateRecord(" ".join(names[3 + (5 * i + j) % 100] for j in range(2 + i % 4)), ("a", "b")[i % 2])
            for i in range(40)
        ],
        public_label_counts="observed",
    )
    from dp_icl_plugin import PromptTemplate
    from dp_icl_plugin.templates.prompting import PromptIds

    ginc = PRESETS["ginc"]
    template = PromptTemplate(
        header=" ".join(names[50:56]) + " / ",
        example=ginc.example,
        query=ginc.query,
        base=ginc.base,
        stop=None,
        stop_at_eos=False,
    )  # a public instruction of 6 tokens
    for method in (
        TangSynthesizer(noise_multiplier=1.0, max_tokens=4, n_prompts=4, top_k=20, template=template),
        PTASynthesizer(noise_multiplier=1.0, max_tokens=4, n_prompts=4, top_k=20, template=template),
    ):
        backend.prefix_cache.clear()
        made = [
            method.synthesize_nonprivate(records, backend=model, rng=np.random.default_rng(5), progress=False)
            for model in (backend, Without(backend, "next_token_logprobs_shared_prefix"))
        ]
        assert [d.token_ids for d in made[0]] == [d.token_ids for d in made[1]]
        # only the public instruction went through the cache, whatever the sampled records share
        instruction = PromptIds(backend, template).instruction("a")
        assert len(backend.prefix_cache) == 1 and backend.prefix_cache.get(tuple(instruction)) is not None


def _tiny_llama() -> object:  # rotary positions: the shared prefix's positions must carry over exactly
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=N_POSITIONS,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config)


@pytest.mark.parametrize("architecture", ["gpt2", "llama"])
def test_a_session_started_after_a_shared_prefix_grows_like_a_fresh_one(model_dir: Path, architecture: str) -> None:
    from dp_icl_plugin.backends.shared_rows import start_prefix_rows

    if architecture == "gpt2":  # several micro-batches, one with no row that starts with the prefix
        small = HFBackend.from_pretrained(model_dir, micro_batch_size=2)
    else:
        small = HFBackend(_tiny_llama(), _tokenizer(), device="cpu", micro_batch_size=2)
    header = [5, 9, 11, 13]
    long = [int(t) for t in np.random.default_rng(3).integers(1, VOCAB, size=N_POSITIONS - 3)]  # + 3 = the limit
    rows = [
        [*header, 40, 41],
        [60, 61, 62, 63, 64, 65, 66],
        [*header, 23, 24, 25, 26, 40],
        [*header, 30],
        [70, 71],
        long,
    ]
    with start_prefix_rows(small, rows, header) as shared, small.start(rows) as fresh:
        assert len(small.prefix_cache) == 1 and small.prefix_cache.get(tuple(header)) is not None
        np.testing.assert_allclose(shared.logprobs, fresh.logprobs, atol=TOL)
        for step in ([7] * 6, [13, 2, 9, 4, 1, 6], [3] * 6):  # the long row reaches the model's last position
            np.testing.assert_allclose(shared.append(step), fresh.append(step), atol=TOL)
        assert list(shared.lengths) == list(fresh.lengths)
    plain = HFBackend.from_pretrained(model_dir, prefix_cache_tokens=0)
    with start_prefix_rows(plain, rows, header) as session:
        session.append([3] * 6)
    assert len(plain.prefix_cache) == 0


def test_the_shared_prefix_is_cached_whether_or_not_the_rows_start_with_it(backend: HFBackend) -> None:
    from dp_icl_plugin.backends.shared_rows import prefix_rows_logprobs, start_prefix_rows

    header = [5, 9, 11, 13]
    for rows in ([[*header, 40, 41], [60, 61]], [[60, 61, 62], [70, 71]]):  # what the cache holds is public
        backend.prefix_cache.clear()
        np.testing.assert_allclose(
            prefix_rows_logprobs(backend, rows, header), backend.next_token_logprobs(rows), atol=TOL
        )
        assert len(backend.prefix_cache) == 1 and backend.prefix_cache.get(tuple(header)) is not None
        backend.prefix_cache.clear()
        with start_prefix_rows(backend, rows, header) as session:
            np.testing.assert_allclose(session.logprobs, backend.next_token_logprobs(rows), atol=TOL)
        assert len(backend.prefix_cache) == 1 and backend.prefix_cache.get(tuple(header)) is not None


def test_clip_blend_synthesis_through_the_shared_prefix_equals_full_prompts(backend: HFBackend) -> None:
    from dp_icl_plugin import (
        BudgetManager,
        ClipBlendSynthesizer,
        PrivacyBudget,
        PrivateDataset,
        PrivateRecord,
        PromptTemplate,
    )
    from dp_icl_plugin.templates.prompting import PromptIds

    names = symbol_names(VOCAB)
    records = PrivateDataset(
        [
            PrivateRecord(" ".join(names[3 + (5 * i + j) % 100] for j in range(2 + i % 4)), ("a", "b")[i % 2])
            for i in range(40)
        ],
        public_label_counts="observed",
    )
    template = PromptTemplate(
        header=" ".join(names[50:56]) + " / ", example="{text} / ", query="", base="/", stop=None, stop_at_eos=False
    )
    instruction = tuple(PromptIds(backend, template).instruction("a"))  # the same for both labels
    assert len(instruction) >= 5
    for public_prompt in (None, " ".join(names[60:64]) + " /"):  # the template's public prompt, then App. F's own
        made = []
        for model in (backend, Without(backend, "start_shared_prefix")):
            backend.prefix_cache.clear()
            method = ClipBlendSynthesizer(
                temperature=1.0,
                max_tokens=4,
                subset_size=8,
                shots_per_label=2,
                template=template,
                public_prompt=public_prompt,
            )
            made.append(
                method.synthesize(
                    records,
                    backend=model,
                    budget=BudgetManager(PrivacyBudget(1e3, 1e-3)),
                    rng=np.random.default_rng(5),
                    progress=False,
                )
            )
            if model is backend:  # only the public instruction went through the cache, whatever the records share
                assert len(backend.prefix_cache) == 1 and backend.prefix_cache.get(instruction) is not None
        assert [d.token_ids for d in made[0]] == [d.token_ids for d in made[1]]


def test_clip_blend_answers_fit_the_model_whatever_the_records_length(backend: HFBackend) -> None:
    from dp_icl_plugin import BudgetManager, PrivacyBudget, PrivateDataset, PrivateRecord
    from dp_icl_plugin.decoding.decoders import ClipBlendDecoder
    from dp_icl_plugin.templates.answer import ANSWER_PRESETS

    names = symbol_names(VOCAB)
    records = PrivateDataset(
        [
            PrivateRecord(" ".join(names[3 + (i + j) % 100] for j in range(30 + 20 * (i % 3))), names[110])
            for i in range(12)
        ]
    )  # some past 64 positions
    budget = BudgetManager(PrivacyBudget(50.0, 1e-3))
    decoder = ClipBlendDecoder(
        records,
        backend=backend,
        budget=budget,
        n_queries=2,
        subset_size=6,
        rng_subset=np.random.default_rng(1),
        temperature=1.0,
        max_tokens=8,
        template=ANSWER_PRESETS["ginc"],
    )
    answer = decoder.generate(" ".join(names[20:26]), rng=np.random.default_rng(0), stop=[])
    assert len(answer.token_ids) == 8  # no failure after the charge when a fixed prompt grows past the model
    with pytest.raises(ConfigurationError, match="does not fit"):  # a limit the model cannot hold: before a charge
        ClipBlendDecoder(
            records,
            backend=backend,
            budget=budget,
            n_queries=1,
            subset_size=6,
            rng_subset=np.random.default_rng(1),
            temperature=1.0,
            max_tokens=N_POSITIONS,
            template=ANSWER_PRESETS["ginc"],
        ).generate("x", rng=np.random.default_rng(0))
