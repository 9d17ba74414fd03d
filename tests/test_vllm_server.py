"""ServerBackend against a real vLLM (CPU build) serving SmolLM2-135M-Instruct on loopback (tests/vllm_server.py).

Tolerance: full-vocabulary rows from vLLM and from HFBackend on the same float32 weights agree within 1e-3
(measured: 5e-5 at most over the vocabulary; vLLM's CPU attention kernels round differently). The last test
kills the server, so it stays last in this module, and no other module uses the server.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("httpx")

from tests_support import SHARED
from vllm_server import MODEL_NAME, VLLMServer, vllm_server_fixture  # noqa: F401

from dp_icl_plugin import BudgetManager, PrivacyBudget, PrivateDataset
from dp_icl_plugin.backends.hf import HFBackend
from dp_icl_plugin.backends.server import ServerBackend
from dp_icl_plugin.errors import ReleaseFailedError, ServerUnavailableError

TOL = 1e-3
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(vllm_server: VLLMServer) -> Iterator[ServerBackend]:
    backend = ServerBackend.from_url(vllm_server.url, vllm_server.folder, max_retries=1, backoff=0.2)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def local(vllm_server: VLLMServer) -> HFBackend:
    return HFBackend.from_pretrained(vllm_server.folder, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def questions() -> PrivateDataset:
    path = SHARED / "data" / "trec" / "train.txt"
    if not path.exists():
        pytest.skip("../shared/data/trec is not available")
    lines = path.read_text(encoding="latin-1").splitlines()[:300]
    return PrivateDataset.from_pairs(
        [ln.split(" ", 1)[1] for ln in lines], [ln.split(":", 1)[0] for ln in lines], public_label_counts="observed"
    )


def test_the_server_gives_the_models_distributions(server: ServerBackend, local: HFBackend) -> None:
    prompts = [
        local.encode("The capital of France is", add_special_tokens=True),
        local.apply_chat_template([{"role": "user", "content": "Name a fruit."}]),
        "Question: who wrote",
    ]
    remote, here = server.next_token_logprobs(prompts), local.next_token_logprobs(prompts)
    assert remote.shape == here.shape == (3, local.vocab_size)
    np.testing.assert_allclose(remote, here, atol=TOL)
    assert (remote.argmax(1) == here.argmax(1)).all()
    assert server.max_length == 2047 and server.model_id == MODEL_NAME


def test_many_concurrent_requests(server: ServerBackend, local: HFBackend) -> None:
    prompts = [local.encode(f"Item {i}: the answer is", add_special_tokens=True) for i in range(24)]
    expected = local.next_token_logprobs(prompts)
    results: dict[int, np.ndarray] = {}

    def ask(part: int) -> None:  # four callers at once, each a call of six concurrent requests
        results[part] = server.next_token_logprobs(prompts[part * 6 : part * 6 + 6])

    threads = [threading.Thread(target=ask, args=(p,)) for p in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    np.testing.assert_allclose(np.concatenate([results[p] for p in range(4)]), expected, atol=TOL)


def test_pta_synthesis_through_the_server(server: ServerBackend, questions: PrivateDataset) -> None:
    from dp_icl_plugin import PRESETS, PTASynthesizer

    budget = BudgetManager(PrivacyBudget(8.0, 1e-3))
    method = PTASynthesizer(epsilon=4.0, delta=1e-3, max_tokens=6, n_prompts=4, template=PRESETS["trec"])
    demos = method.synthesize(
        questions, labels=["HUM"], backend=server, budget=budget, rng=np.random.default_rng(0), progress=False
    )
    assert len(demos) == 1 and demos[0].label == "HUM" and 0 < len(demos[0].token_ids) <= 6
    assert 0 < budget.spent().epsilon <= 4.0 * 1.01


def test_dps_mozo_decoding_through_the_server(server: ServerBackend, questions: PrivateDataset) -> None:
    from dp_icl_plugin.decoding.decoders import MozoDecoder

    budget = BudgetManager(PrivacyBudget(4.0, 1e-4))
    decoder = MozoDecoder(questions, backend=server, budget=budget, n_queries=1, epsilon=2.0, max_tokens=5)
    answer = decoder.generate([{"role": "user", "content": "Who wrote Hamlet?"}], rng=np.random.default_rng(1))
    assert 0 < len(answer.token_ids) <= 5 and isinstance(answer.text, str)
    assert 0 < budget.spent().epsilon <= 4.0


def test_the_langchain_chat_model_through_the_server(vllm_server: VLLMServer, questions: PrivateDataset) -> None:
    pytest.importorskip("langchain_core")
    from langchain_dp_icl import ChatDPICL

    budget = BudgetManager(PrivacyBudget(4.0, 1e-4))
    chat = ChatDPICL.from_model_id(
        vllm_server.url,
        questions,
        budget=budget,
        rng=np.random.default_rng(2),
        tokenizer=vllm_server.folder,
        n_queries=1,
        epsilon=2.0,
        max_tokens=4,
    )
    message = chat.invoke("What is the capital of France?")
    assert isinstance(message.content, str) and message.usage_metadata["output_tokens"] <= 4
    assert 0 < budget.spent().epsilon <= 4.0


def test_rows_are_isolated_on_the_real_server(server: ServerBackend) -> None:
    """The harness against vLLM's CPU build: 32 requests in flight (the server batches them as it likes) and
    its own prefix cache (repeated prompts) give every row the same bits."""
    from dp_icl_plugin.backends.isolation import check_row_isolation

    report = check_row_isolation(server, long_length=40)
    assert report.isolated, str(report)


def test_a_server_killed_mid_answer_ends_in_a_typed_error_with_the_charge_kept(
    vllm_server: VLLMServer, server: ServerBackend, questions: PrivateDataset, monkeypatch: pytest.MonkeyPatch
) -> None:  # last: the server is gone afterwards
    from dp_icl_plugin.decoding.decoders import MozoDecoder

    budget = BudgetManager(PrivacyBudget(4.0, 1e-4))
    decoder = MozoDecoder(questions, backend=server, budget=budget, n_queries=1, epsilon=2.0, max_tokens=8)
    rows = server._row
    calls = 0

    def row_then_kill(ids: list[int]) -> np.ndarray:
        nonlocal calls
        calls += 1
        if calls == 8:  # during the second token: the server dies (SIGKILL), requests in flight fail
            vllm_server.kill()
        return rows(ids)

    monkeypatch.setattr(server, "_row", row_then_kill)
    with pytest.raises(ReleaseFailedError) as caught:  # after the charge: the one fixed error, no cause
        decoder.generate("Who wrote Hamlet?", rng=np.random.default_rng(3))
    assert caught.value.__cause__ is None and caught.value.__context__ is None
    assert str(caught.value) == ReleaseFailedError.MESSAGE
    assert budget.spent().epsilon > 0  # charged before the first token, kept
    with pytest.raises(ServerUnavailableError, match=r"cannot be reached|timed out|HTTP 5"):
        server.next_token_logprobs([[1, 2, 3]])  # a direct (public) call still says what failed
