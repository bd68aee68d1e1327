"""Servers the endpoint tests talk to: llama.cpp's real server (`llama-server`, built by `bash setup.sh test`)
serving the embedded model's GGUF, and a small stdlib HTTP server that misbehaves on purpose (500s, stalls,
malformed SSE, a fixed number of slots) - the failures a real server cannot be asked to produce."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FaultyHandler(BaseHTTPRequestHandler):
    """Behaviour chosen by the server's `mode`: ok, error500, flaky (every second request a 500), stall (sleeps
    before answering), malformed (a non-JSON data line mid-stream), no_done (stream cut before finish_reason),
    killed (the connection reset after two chunks, as when the server process dies), busy (429 with Retry-After),
    unavailable (503 with Retry-After), finished_no_done (finish_reason and usage, then the stream ends without
    [DONE]), duplicate_chunk (one chunk sent twice, usage honest), usage_lie (usage says one token), no_usage,
    after_finish (a text chunk after the finish_reason chunk)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path.rstrip("/") == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": "faulty", "object": "model"}]}).encode())
        else:
            self._send(404, b'{"error": "not found"}')

    def do_POST(self):
        self.server.arrivals.append(time.perf_counter())  # the request line and headers are in: it has left
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length) or b"{}")
        self.server.bodies.append(body)
        mode = self.server.mode
        if self.server.api_key and self.headers.get("Authorization") != f"Bearer {self.server.api_key}":
            return self._send(401, b'{"error": {"message": "invalid API key"}}')
        self.server.requests += 1
        if mode == "error500" or (mode == "flaky" and self.server.requests % 2 == 0):
            return self._send(500, b'{"error": {"message": "injected failure"}}')
        if mode == "base_model" and self.path.endswith("/chat/completions"):  # vLLM's answer, for a base model
            return self._send(400, b'{"error": {"message": "As of transformers v4.44, default chat template is no '
                                   b'longer allowed, so you must provide a chat template if the tokenizer does not '
                                   b'define one."}}')
        if mode in ("busy", "unavailable"):
            self.send_response(429 if mode == "busy" else 503)
            self.send_header("Retry-After", "2")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        with self.server.slots:  # a server with N slots serves N requests at once; the others wait their turn
            self._answer(body, mode)

    def _answer(self, body: dict, mode: str) -> None:
        if mode == "stall":
            time.sleep(self.server.stall_s)
        tokens = [f"tok{i} " for i in range(min(body.get("max_tokens", 8), self.server.max_tokens))]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for index, token in enumerate(tokens):
            if mode == "malformed" and index == 2:
                self.wfile.write(b"data: {this is not json\n\n")
                break
            if mode == "killed" and index == 2:
                self.wfile.flush()
                # SO_LINGER 0: close() sends a reset, not an orderly end, as when the server process is killed
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
                self.close_connection = True
                return
            chunk = {"choices": [{"index": 0, "delta": {"content": token}, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode() * (2 if mode == "duplicate_chunk" and index == 1
                                                                           else 1))
            self.wfile.flush()
            if self.server.token_delay_s:
                time.sleep(self.server.token_delay_s)
        if mode in ("ok", "base_model", "flaky", "finished_no_done", "duplicate_chunk", "usage_lie", "no_usage",
                    "after_finish"):
            completion = 1 if mode == "usage_lie" else len(tokens)
            last = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
            if mode != "no_usage":
                last["usage"] = {"prompt_tokens": 5, "completion_tokens": completion, "total_tokens": 5 + completion}
            self.wfile.write(f"data: {json.dumps(last)}\n\n".encode())
            if mode == "after_finish":
                late = {"choices": [{"index": 0, "delta": {"content": "late "}, "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(late)}\n\n".encode())
            if mode != "finished_no_done":
                self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # a client that hangs up mid-stream is expected here
        pass


class FaultyServer:
    def __init__(self, mode: str = "ok", token_delay_s: float = 0.0, stall_s: float = 5.0, max_tokens: int = 1000,
                 api_key: str | None = None, slots: int = 1000):
        self.httpd = _QuietServer(("127.0.0.1", 0), FaultyHandler)
        self.httpd.slots = threading.Semaphore(slots)
        self.httpd.mode, self.httpd.token_delay_s, self.httpd.stall_s = mode, token_delay_s, stall_s
        self.httpd.max_tokens, self.httpd.requests, self.httpd.api_key = max_tokens, 0, api_key
        self.httpd.arrivals, self.httpd.bodies = [], []  # when each POST arrived (perf_counter) and its JSON
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FaultyServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def llama_server_binary() -> Path | None:
    """llama.cpp's native server: $INFERGATE_LLAMA_SERVER, else the one `bash setup.sh test` built into the
    virtual environment's bin, else one on PATH."""
    given = os.environ.get("INFERGATE_LLAMA_SERVER")
    if given:
        return Path(given)
    beside = Path(sys.executable).parent / "llama-server"
    if beside.is_file():
        return beside
    found = shutil.which("llama-server")
    return Path(found) if found else None


def built_llama_server() -> Path | None:
    """llama_server_binary() where it is a built file, else None."""
    binary = llama_server_binary()
    return binary if binary is not None and binary.is_file() else None


def require_llama_server() -> Path:
    """The built llama-server; the test is skipped without one, and fails under CI (where `.ci/run` builds it)."""
    binary = built_llama_server()
    if binary is None:
        message = "llama.cpp's llama-server is not built: run `bash setup.sh test` (or set INFERGATE_LLAMA_SERVER)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return binary


class LlamaServer:
    """llama.cpp's `llama-server` on 127.0.0.1 at a free port serving `gguf`, with Prometheus /metrics and
    `n_parallel` slots (continuous batching); each slot has a context of `n_ctx` tokens. Waits until /v1/models
    answers; `kill()` ends it at once (SIGKILL), as a crash would."""

    def __init__(self, gguf: Path, model_alias: str = "smollm2-135m", n_ctx: int = 2048, n_parallel: int = 4,
                 threads: int | None = None, log_path: Path | None = None, binary: Path | None = None,
                 extra: tuple[str, ...] = ()):
        self.port = free_port()
        self.n_ctx = n_ctx
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.model_alias = model_alias
        binary = binary or llama_server_binary()
        if binary is None:
            raise RuntimeError("llama-server not found: run `bash setup.sh test` or set INFERGATE_LLAMA_SERVER")
        threads = threads or max(1, (os.cpu_count() or 2) // 2)
        self.cmd = [str(binary), "--model", str(gguf), "--alias", model_alias, "--host", "127.0.0.1",
                    "--port", str(self.port), "--ctx-size", str(n_ctx * n_parallel), "--parallel", str(n_parallel),
                    "--no-kv-unified", "--threads", str(threads), "--metrics", "--no-webui", *extra]
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> LlamaServer:
        import httpx

        log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.process.returncode}: {' '.join(self.cmd)}"
                                   + (f" (log: {self.log_path})" if self.log_path else ""))
            try:
                if httpx.get(self.url + "/models", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        self.__exit__()
        raise RuntimeError(f"llama-server did not answer on {self.url} within 120 s")

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __exit__(self, *exc) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def requantize(binary_dir: Path, source: Path, target: Path, kind: str = "Q4_0") -> Path:
    """A second quantization of the embedded model with llama.cpp's own llama-quantize (built beside the server):
    the candidate of the two-server tests."""
    quantize = binary_dir / "llama-quantize"
    if not target.exists():
        partial = target.with_suffix(".partial")
        subprocess.run([str(quantize), "--allow-requantize", str(source), str(partial), kind], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        partial.rename(target)
    return target
