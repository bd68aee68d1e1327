"""Client overhead per streamed token: what measuring through pytest-infergate's endpoint client costs.

    python benchmarks/endpoint_client.py

A local server in another process streams tokens as fast as it can (so the client, not the server, is the
limit); the client's own CPU time per token is its overhead - the most it can add to a measured TTFT or ITL.
Compared in the same run with the floor: raw httpx reading the same stream line by line and decoding each JSON
chunk, with no SSE parsing, timing or bookkeeping. Then the same figure against llama.cpp's real server
(`llama-server`) serving the embedded model, when it is built. Target: under 1 ms per token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import httpx  # noqa: E402

from pytest_infergate.endpoint import EndpointConfig, EndpointRequest, LoadPattern, run_load  # noqa: E402

SERVER = """
import sys, time
sys.path.insert(0, {tests!r})
from openai_servers import FaultyServer
with FaultyServer("ok", max_tokens={tokens}) as server:
    print(server.url, flush=True)
    time.sleep(3600)
"""


def start_fast_server(tokens: int) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, "-c", SERVER.format(tests=str(ROOT / "tests"), tokens=tokens)],
                               stdout=subprocess.PIPE, text=True)
    return process, process.stdout.readline().strip()


def requests(count: int, tokens: int) -> list[EndpointRequest]:
    return [EndpointRequest(messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=tokens,
                            request_id=f"r{i}") for i in range(count)]


def measure_client(url: str, count: int, tokens: int, concurrency: int) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, streamed chunks) of the infergate client for one load run."""
    cpu, wall = time.process_time(), time.perf_counter()
    run = run_load(EndpointConfig(url, timeout_s=600), requests(count, tokens), LoadPattern(concurrency=concurrency),
                   scrape=False)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert not run.errors, run.errors
    return cpu, wall, sum(len(r.token_times) for r in run.results)


def measure_raw(url: str, count: int, tokens: int, concurrency: int) -> tuple[float, float, int]:
    """The floor: raw httpx streaming, one json.loads per data line, nothing else."""

    async def main() -> int:
        gate = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            async def once(request: EndpointRequest) -> int:
                chunks = 0
                async with client.stream("POST", "/chat/completions", json=request.body("m", True)) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: ") and line != "data: [DONE]":
                            json.loads(line[6:])
                            chunks += 1
                return chunks

            async def one(request: EndpointRequest) -> int:
                async with gate:
                    try:
                        return await once(request)
                    except httpx.RemoteProtocolError:  # a pooled keep-alive connection the server closed, as the
                        return await once(request)     # client's own _exchange_once_more_if_stale takes it

            return sum(await asyncio.gather(*(one(r) for r in requests(count, tokens))))

    cpu, wall = time.process_time(), time.perf_counter()
    chunks = asyncio.run(main())
    return time.process_time() - cpu, time.perf_counter() - wall, chunks


def report(name: str, cpu: float, wall: float, chunks: int) -> float:
    per_token = cpu / chunks * 1e6
    print(f"{name:42s} {chunks:7d} chunks  CPU {per_token:7.1f} us/token  wall {wall / chunks * 1e6:7.1f} us/token")
    return per_token


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--server-tokens", type=int, default=256,
                        help="tokens per request of the llama.cpp server's figure (4 requests, one at a time)")
    args = parser.parse_args()

    process, url = start_fast_server(args.tokens)
    try:
        measure_client(url, 4, 16, 4)  # warm-up: imports, connection pool
        ours = report("infergate client, fast local server", *measure_client(url, args.requests, args.tokens,
                                                                           args.concurrency))
        floor = report("raw httpx + json.loads, fast local server", *measure_raw(url, args.requests, args.tokens,
                                                                                args.concurrency))
    finally:
        process.terminate()
    print(f"overhead over the raw floor: {ours - floor:.1f} us/token (x{ours / floor:.2f}); "
          f"target < 1000 us/token: {'met' if ours < 1000 else 'MISSED'}")

    try:
        from openai_servers import LlamaServer, llama_server_binary

        from pytest_infergate.models.sources import ensure_smollm2_gguf
        from pytest_infergate.options import default_cache_dir
    except ImportError:
        return
    if llama_server_binary() is None:
        print("llama-server not built (bash setup.sh test): real-server figure skipped")
        return
    with LlamaServer(ensure_smollm2_gguf(default_cache_dir()), n_parallel=1) as server:
        measure_client(server.url, 1, 8, 1)
        setup_cpu, _, _ = measure_client(server.url, 1, 1, 1)  # one run's fixed cost: client, TLS context, lookup
        cpu, wall, chunks = measure_client(server.url, 4, args.server_tokens, 1)
        ours = report("infergate client, llama.cpp server (embedded)", cpu, wall, chunks)
        print(f"  fixed per run: {setup_cpu * 1e3:.0f} ms CPU; client CPU is {cpu / wall:.1%} of the wall time the "
              "server took to stream these tokens (each token arrives alone: one event-loop wake-up each)")
        floor = report("raw httpx + json.loads, llama.cpp server", *measure_raw(server.url, 4, args.server_tokens, 1))
        print(f"overhead over the raw floor: {ours - floor:.1f} us/token (x{ours / floor:.2f}); "
              f"target < 1000 us/token: {'met' if ours < 1000 else 'MISSED'}")


if __name__ == "__main__":
    main()
