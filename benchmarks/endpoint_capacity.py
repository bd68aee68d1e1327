"""Capacity of llama.cpp's server serving the embedded model on this machine, under a stated SLO.

    python benchmarks/endpoint_capacity.py [--search rate|concurrency] [--ttft-ms 2000] [--tpot-ms 200]

Starts `llama-server` (built by `bash setup.sh test`; 4 slots, /metrics on) on the embedded SmolLM2-135M GGUF and
runs the capacity search the `infergate_endpoint.capacity(...)` fixture runs: a doubling sweep over the bounds,
then bisection, each point long enough for `--point-s` seconds of arrivals, stopped once it can no longer pass,
the whole search within `--budget-s`. Prints every point (load, SLO attainment with its 95% CI, goodput, TTFT /
TPOT p50 and p99, the server's own running / waiting peaks) and the capacity.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from openai_servers import LlamaServer  # noqa: E402

from pytest_infergate.endpoint import EndpointConfig, Slo  # noqa: E402
from pytest_infergate.endpoint.capacity import search_capacity  # noqa: E402
from pytest_infergate.endpoint.capacity_records import CapacitySpec  # noqa: E402
from pytest_infergate.models import resolve_model  # noqa: E402
from pytest_infergate.models.load import load_tokenizer  # noqa: E402
from pytest_infergate.models.sources import ensure_smollm2_gguf  # noqa: E402
from pytest_infergate.options import default_cache_dir  # noqa: E402
from pytest_infergate.workloads import chat_workload  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--search", choices=("rate", "concurrency"), default="rate")
    parser.add_argument("--low", type=float, default=0.25)
    parser.add_argument("--high", type=float, default=16)
    parser.add_argument("--ttft-ms", type=float, default=2000)
    parser.add_argument("--tpot-ms", type=float, default=200)
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--point-s", type=float, default=20)
    parser.add_argument("--min-requests", type=int, default=16)
    parser.add_argument("--budget-s", type=float, default=300)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None, help="llama-server threads (default: half the cores)")
    args = parser.parse_args()

    cache = default_cache_dir()
    tokenizer = load_tokenizer(resolve_model("smollm2-135m", cache))
    workload = chat_workload(tokenizer, 32, prompt_tokens=(20, 200), max_new_tokens=(16, 48), seed=7)
    spec = CapacitySpec(Slo(ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms), args.target, args.search,
                        (args.low, args.high), args.budget_s, args.point_s, args.min_requests)
    print(f"SLO: TTFT <= {args.ttft_ms:g} ms and TPOT <= {args.tpot_ms:g} ms for {args.target:.0%} of requests; "
          f"chat prompts of 20-200 tokens, 16-48 new tokens; llama-server with {args.slots} slots, "
          f"{args.threads or 'default'} threads")
    with LlamaServer(ensure_smollm2_gguf(cache), n_parallel=args.slots, threads=args.threads) as server:
        result = search_capacity(EndpointConfig(server.url, timeout_s=120), workload, spec)
    unit = "req/s" if args.search == "rate" else "in flight"
    print(f"{'load':>8} {'sent':>5} {'SLO met':>8} {'95% CI':>13} {'goodput':>8} {'TTFT p50/p99 ms':>17} "
          f"{'TPOT p50/p99 ms':>16} {'server run/wait':>15}  verdict")
    for p in result.points:
        verdict = {True: "pass", False: "FAIL", None: "cut"}[p.passed] + (f" ({p.stopped})" if p.stopped else "")
        lat = p.latency_ms
        print(f"{p.load:8.3g} {p.requests:5d} {p.attainment:8.1%} {p.ci[0]:6.1%}-{p.ci[1]:6.1%} "
              f"{p.goodput_rps:8.2f} {lat.get('ttft_ms_p50', 0):8.0f}/{lat.get('ttft_ms_p99', 0):<8.0f} "
              f"{lat.get('tpot_ms_p50', 0):7.0f}/{lat.get('tpot_ms_p99', 0):<8.0f} "
              f"{p.server.get('running_requests', 0):7.0f}/{p.server.get('waiting_requests', 0):<7.0f}  {verdict}")
    print(result.describe().replace("in flight", unit))


if __name__ == "__main__":
    main()
