"""ServerBackend against a fake OpenAI-compatible server in this process (httpx.MockTransport): fast checks of
the protocol, the row completion, the URL policy, retries and typed errors. The real vLLM is exercised in
tests/test_vllm_server.py.

The fake answers like vLLM 0.32 (``/v1/models``, ``/tokenize``, ``/v1/completions`` with ``logprobs`` keyed
``"token_id:N"``), computing distributions with an HFBackend over a tiny GPT-2, so rows can be compared.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tests_support import tiny_text_gpt2  # noqa: E402

from dp_icl_plugin import BudgetManager, PrivacyBudget  # noqa: E402
from dp_icl_plugin.backends.hf import HFBackend  # noqa: E402
from dp_icl_plugin.backends.server import ServerBackend  # noqa: E402
from dp_icl_plugin.backends.server_http import check_base_url  # noqa: E402
from dp_icl_plugin.backends.server_rows import full_row  # noqa: E402
from dp_icl_plugin.errors import (  # noqa: E402
    ConfigurationError,
    ReleaseFailedError,
    ServerError,
    ServerMismatchError,
    ServerRateLimitError,
    ServerUnavailableError,
)

SECRET = "zq-private-record-9f"
CORPUS = [
    "the patient reports mild pain and a fever",
    "what is the capital of france",
    "naïve café ✓ 12,345",
    "DP-ICL tokenizer check: tokens End.",
] * 20


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> HFBackend:
    folder = tiny_text_gpt2(tmp_path_factory.mktemp("tiny-server-model"), CORPUS, vocab_size=300, n_positions=128)
    return HFBackend.from_pretrained(folder, device="cpu", dtype="float32")


class FakeVLLM:
    """A scripted vLLM: ``fail`` is a list of HTTP statuses (or "timeout"/"down") answered before normal ones."""

    def __init__(self, hf: HFBackend, *, max_logprobs: int = -1, tokenizer_shift: int = 0) -> None:
        self.hf, self.max_logprobs, self.shift = hf, max_logprobs, tokenizer_shift
        self.fail: list[Any] = []
        self.requests: list[dict[str, Any]] = []
        self.in_flight = self.peak = 0
        self.lock = threading.Lock()
        self.delay = 0.0
        self.truncate: int | None = None  # answer only this many entries, whatever was asked (a bad replica)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            failure = self.fail.pop(0) if self.fail else None
        if failure == "timeout":
            raise httpx.ReadTimeout("timed out", request=request)
        if failure == "down":
            raise httpx.ConnectError("refused", request=request)
        if failure is not None:
            return httpx.Response(failure, json={"error": {"message": f"boom {SECRET}"}})
        path = request.url.path
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny", "max_model_len": 128}]})
        body = json.loads(request.content)
        self.requests.append(body)
        if body.get("model") != "tiny":
            return httpx.Response(404, json={"error": {"message": f"The model `{body.get('model')}` does not exist."}})
        if path == "/tokenize":
            ids = self.hf.encode(body["prompt"], add_special_tokens=body.get("add_special_tokens", True))
            return httpx.Response(200, json={"tokens": [t + self.shift for t in ids], "max_model_len": 128})
        if path == "/v1/completions":
            return self._completion(body)
        return httpx.Response(404, json={"detail": "Not Found"})

    def _completion(self, body: dict[str, Any]) -> httpx.Response:
        k = body["logprobs"]
        vocab = self.hf.vocab_size
        limit = vocab if self.max_logprobs == -1 else self.max_logprobs
        if (vocab if k == -1 else k) > limit:
            return httpx.Response(
                400,
                json={
                    "error": {
                        "message": f"Requested sample logprobs of {vocab}, which is greater than max allowed: {limit}"
                    }
                },
            )
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            if self.delay:
                threading.Event().wait(self.delay)
            row = self.hf.next_token_logprobs([body["prompt"]])[0].astype(np.float64)
        finally:
            with self.lock:
                self.in_flight -= 1
        order = np.argsort(-row, kind="stable")[: vocab if k == -1 else k][: self.truncate]
        top = {f"token_id:{int(i)}": max(float(row[i]), -9999.0) for i in order}
        return httpx.Response(200, json={"choices": [{"index": 0, "text": "", "logprobs": {"top_logprobs": [top]}}]})


def _backend(fake: FakeVLLM, **kwargs: Any) -> ServerBackend:
    kwargs.setdefault("backoff", 0.0)
    return ServerBackend("http://127.0.0.1:8000", fake.hf.tokenizer, transport=httpx.MockTransport(fake), **kwargs)


def test_full_vocabulary_rows_equal_the_model_in_process(hf: HFBackend) -> None:
    server = _backend(FakeVLLM(hf))
    prompts = [hf.encode("the patient reports", add_special_tokens=True), "what is the capital of", [5, 9, 11]]
    np.testing.assert_allclose(server.next_token_logprobs(prompts), hf.next_token_logprobs(prompts), atol=1e-5)
    assert server.max_length == 127 and server.vocab_size == hf.vocab_size and server.model_id == "tiny"
    assert "full vocabulary" in repr(server)


def test_a_session_sends_prompts_whole_and_matches_the_model(hf: HFBackend) -> None:
    fake = FakeVLLM(hf)
    server = _backend(fake)
    prompts = [[5, 9, 11], [7, 3]]
    with server.start(prompts) as remote, hf.start(prompts) as local:
        np.testing.assert_allclose(remote.logprobs, local.logprobs, atol=1e-5)
        for token in ([4, 4], [8, 12]):
            np.testing.assert_allclose(remote.append(token), local.append(token), atol=1e-5)
    assert fake.requests[-1]["prompt"] == [7, 3, 4, 12] and fake.requests[-1]["max_tokens"] == 1


def test_top_k_rows_are_completed_into_probability_vectors(hf: HFBackend) -> None:
    server = _backend(FakeVLLM(hf), top_k=5)
    full = hf.next_token_logprobs([[5, 9, 11]])[0]
    row = server.next_token_logprobs([[5, 9, 11]])[0]
    top = np.argsort(-full)[:5]
    np.testing.assert_allclose(row[top], full[top], atol=1e-5)  # the returned tokens keep their values
    others = np.setdiff1d(np.arange(hf.vocab_size), top)
    assert np.allclose(row[others], row[others][0]) and row[others][0] <= full[top].min() + 1e-6
    assert abs(np.exp(row.astype(np.float64)).sum() - 1) < 1e-5


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-30, 0), min_size=1, max_size=12), st.integers(12, 40))
def test_a_completed_row_is_a_distribution_and_no_missing_token_outranks_a_returned_one(
    values: list[float], vocab: int
) -> None:
    probabilities = np.exp(np.array(values))
    values = list(np.log(probabilities / max(1.0, probabilities.sum())))  # a top-k of some distribution
    top = {f"token_id:{i * 3 % vocab}": v for i, v in enumerate(values)}
    row = full_row(top, vocab).astype(np.float64)
    assert np.isfinite(row).all() and abs(np.exp(row).sum() - 1) < 1e-4
    returned = [int(k.split(":")[1]) for k in top]
    missing = np.setdiff1d(np.arange(vocab), returned)
    if len(missing):
        assert row[missing].max() <= row[returned].min() + 1e-6
        assert np.exp(row[missing]).max() < 1  # never probability 1


def test_a_method_reading_more_than_the_top_k_refuses_before_any_charge(hf: HFBackend) -> None:
    from dp_icl_plugin import PrivateDataset, TangSynthesizer
    from dp_icl_plugin.decoding.decoders import MozoDecoder

    server = _backend(FakeVLLM(hf), top_k=20)
    from dp_icl_plugin.backends.base import check_top_k

    check_top_k(20, server)
    with pytest.raises(ConfigurationError, match="top_k >= 100"):
        check_top_k(100, server)
    budget = BudgetManager(PrivacyBudget(10.0, 1e-3))
    data = PrivateDataset.from_pairs(["the patient reports mild pain"] * 50, ["a"] * 50, public_label_counts="observed")
    with pytest.raises(ConfigurationError, match="top 20"):
        TangSynthesizer(noise_multiplier=1.0, max_tokens=2, top_k=100).synthesize(
            data, backend=server, budget=budget, rng=np.random.default_rng(0), progress=False
        )
    with pytest.raises(ConfigurationError, match="top 20"):
        MozoDecoder(data, backend=server, budget=budget, n_queries=1, epsilon=1.0, max_tokens=2, top_k=100)
    assert budget.spent().epsilon == 0


def test_prompts_of_a_call_go_concurrently(hf: HFBackend) -> None:
    fake = FakeVLLM(hf)
    server = _backend(fake, max_concurrency=8)
    fake.delay = 0.2
    server.next_token_logprobs([[5, i + 1] for i in range(16)])
    assert fake.peak >= 4


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.5:8000",
        "http://vllm.internal",
        "ftp://127.0.0.1",
        "127.0.0.1:8000",
        "http://127.0.0.1.evil.example",
        "http://127.0.0.1@evil.example",
        "https://user:pw@vllm.internal",
        "HTTP://10.0.0.1",
    ],
)
def test_plain_http_beyond_loopback_and_other_schemes_are_refused(url: str) -> None:
    with pytest.raises(ConfigurationError):
        check_base_url(url, allow_insecure_http=False)


def test_loopback_https_and_explicit_insecure_are_accepted() -> None:
    assert check_base_url("http://127.0.0.1:8000/v1/", allow_insecure_http=False) == "http://127.0.0.1:8000"
    assert check_base_url("http://localhost:1", allow_insecure_http=False) == "http://localhost:1"
    assert check_base_url("http://[::1]:8000", allow_insecure_http=False) == "http://[::1]:8000"
    assert check_base_url("https://vllm.internal", allow_insecure_http=False) == "https://vllm.internal"
    assert check_base_url("http://10.0.0.5:8000", allow_insecure_http=True) == "http://10.0.0.5:8000"


def test_a_server_without_max_logprobs_is_named(hf: HFBackend) -> None:
    with pytest.raises(ServerMismatchError, match="--max-logprobs -1"):
        _backend(FakeVLLM(hf, max_logprobs=20))
    assert _backend(FakeVLLM(hf, max_logprobs=20), top_k=20).top_k == 20


def test_another_tokenizer_or_model_is_refused(hf: HFBackend) -> None:
    with pytest.raises(ServerMismatchError, match="tokenizer"):
        _backend(FakeVLLM(hf, tokenizer_shift=1))
    with pytest.raises(ServerMismatchError, match="does not serve 'other'"):
        _backend(FakeVLLM(hf), model="other")


def test_retries_are_bounded_and_end_in_typed_errors_without_private_text(hf: HFBackend) -> None:
    fake = FakeVLLM(hf)
    server = _backend(fake, max_retries=2)
    secret_prompt = hf.encode(SECRET, add_special_tokens=True)
    fake.fail = [503, "timeout"]  # two failures, then an answer: retried, one row
    assert server.next_token_logprobs([secret_prompt]).shape == (1, hf.vocab_size)
    for failures, error in (
        ([429] * 3, ServerRateLimitError),
        ([503] * 3, ServerUnavailableError),
        (["down"] * 3, ServerUnavailableError),
        (["timeout"] * 3, ServerUnavailableError),
        ([400], ServerError),
    ):
        fake.fail = list(failures)
        with pytest.raises(error) as caught:
            server.next_token_logprobs([secret_prompt])
        assert SECRET not in str(caught.value) and "zq" not in repr(caught.value)
        assert not fake.fail  # exactly max_retries + 1 attempts (or 1 for a 400)


def test_a_server_that_goes_down_mid_synthesis_keeps_the_charge(hf: HFBackend) -> None:
    from dp_icl_plugin import PrivateDataset, TangSynthesizer

    fake = FakeVLLM(hf)
    server = _backend(fake, max_retries=1)
    data = PrivateDataset.from_pairs(["the patient reports mild pain"] * 60, ["a"] * 60, public_label_counts="observed")
    budget = BudgetManager(PrivacyBudget(50.0, 1e-3))
    method = TangSynthesizer(noise_multiplier=1.0, max_tokens=3, n_prompts=4, top_k=20)
    calls = len(fake.requests)

    def go_down(request: httpx.Request) -> httpx.Response:
        if len(fake.requests) > calls + 6:  # after the charge and a few rows
            raise httpx.ConnectError("refused", request=request)
        return fake(request)

    server._client._client._transport = httpx.MockTransport(go_down)
    with pytest.raises(ReleaseFailedError) as failed:  # after the charge: the one fixed error, no cause
        method.synthesize(data, backend=server, budget=budget, rng=np.random.default_rng(0), progress=False)
    assert failed.value.__cause__ is None and failed.value.__context__ is None
    assert budget.spent().epsilon > 0  # charged before the first private call, never refunded


def test_the_api_key_comes_from_the_environment(hf: HFBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str | None] = []
    fake = FakeVLLM(hf)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return fake(request)

    monkeypatch.setenv("DP_ICL_SERVER_API_KEY", "sk-test-1")
    ServerBackend("http://127.0.0.1:8000", hf.tokenizer, transport=httpx.MockTransport(handler))
    assert seen and set(seen) == {"Bearer sk-test-1"}


def test_a_tokenizer_path_is_loaded_from_local_files(hf: HFBackend, tmp_path: Path) -> None:
    from dp_icl_plugin.backends.server import load_tokenizer

    hf.tokenizer.save_pretrained(tmp_path)
    assert load_tokenizer(tmp_path)("the patient")["input_ids"] == hf.tokenizer("the patient")["input_ids"]
    with pytest.raises(ConfigurationError, match="no tokenizer"):
        load_tokenizer(tmp_path / "missing")


def test_no_proxy_from_the_environment_sees_the_prompts(monkeypatch: pytest.MonkeyPatch) -> None:
    from dp_icl_plugin.backends.server_http import ServerClient

    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(name, "http://proxy.invalid:3128")
    client = ServerClient("http://127.0.0.1:8000")
    assert client._client._transport_for_url(httpx.URL("http://127.0.0.1:8000/v1/models")) is client._client._transport
    client.close()


def test_errors_keep_no_request_or_answer_in_their_chain(hf: HFBackend) -> None:
    fake = FakeVLLM(hf)
    server = _backend(fake, max_retries=0)
    for failure in ("down", 400):
        fake.fail = [failure]
        with pytest.raises(ServerError) as caught:
            server.next_token_logprobs([hf.encode(SECRET, add_special_tokens=True)])
        assert caught.value.__cause__ is None and caught.value.__context__ is None


def test_a_short_answer_in_full_vocabulary_mode_is_an_error_never_filled(hf: HFBackend) -> None:
    fake = FakeVLLM(hf)
    server = _backend(fake)
    fake.truncate = 10  # a replica behind the router without --max-logprobs -1
    with pytest.raises(ServerError, match="10 of"):
        server.next_token_logprobs([[5, 9]])
    with pytest.raises(ServerError, match="twice"):
        full_row({"token_id:5": -1.0, "token_id:05": -1.0}, 10)


@pytest.mark.parametrize("bad", [float("nan"), 0.5, None, "x"])
def test_a_row_that_is_not_log_probabilities_comes_back_as_nan_for_the_caller_to_judge(bad: object) -> None:
    """The server's numbers for one prompt are NaN or positive: a NaN row, not a ServerError, whose raising would
    depend on the prompt (a record's maybe); a public caller refuses it, a method stands in for a record's."""
    row = full_row({"token_id:1": -0.1, "token_id:2": bad}, 10)
    assert row.shape == (10,) and row.dtype == np.float32 and np.isnan(row).all()


def test_server_settings_as_one_config_object(hf: HFBackend) -> None:
    from dp_icl_plugin import ConfigurationTypeError, ServerSettings

    fake = FakeVLLM(hf)
    settings = ServerSettings(api_key="secret-key", timeout=30.0, max_retries=0, backoff=0.0, max_concurrency=4)
    assert "secret-key" not in repr(settings)
    backend = ServerBackend.with_settings(
        "http://127.0.0.1:8000", hf.tokenizer, settings, top_k=None, transport=httpx.MockTransport(fake)
    )
    assert backend.max_concurrency == 4
    prompts = [hf.encode("The cat sat", add_special_tokens=True)]
    np.testing.assert_allclose(backend.next_token_logprobs(prompts), hf.next_token_logprobs(prompts), atol=1e-4)
    with pytest.raises(ConfigurationTypeError):
        ServerSettings(timeout="30")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="max_retries"):
        ServerSettings(max_retries=-1)
    with pytest.raises(ConfigurationTypeError, match="ServerSettings"):
        ServerBackend.with_settings("http://127.0.0.1:8000", hf.tokenizer, {"timeout": 30.0})  # type: ignore[arg-type]


def test_any_value_that_is_not_a_real_number_is_a_nan_row() -> None:
    """An integer too large for a float raised OverflowError (an error depending on the prompt); a numpy float was
    read as NaN (review of issue 30)."""
    assert np.isnan(full_row({"token_id:1": -0.1, "token_id:2": 10**400}, 10)).all()
    row = full_row({"token_id:1": np.float32(-0.1), "token_id:2": -3.0}, 10)
    assert np.isfinite(row).all()
