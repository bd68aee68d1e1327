"""Token-exact synthetic prompts for a server, without a local tokenizer: the text is tokenized by the server itself
(`POST /tokenize`, which llama.cpp, vLLM and SGLang serve beside `/v1`), and each prompt is sent as token ids
through the completions API, so the server reads exactly the number of tokens asked for (what `vllm bench serve
--dataset-name random` and guidellm's synthetic data do with a local tokenizer). A server without `/tokenize` is
a clear error naming the alternatives, never an approximate length."""

from __future__ import annotations

import random
from urllib.parse import urlsplit, urlunsplit

import httpx

from pytest_infergate.endpoint.exchange import EndpointConfig, EndpointError, EndpointRequest

FILLER = ("The river carved a valley over many years while the city grew along its banks. Travellers wrote "
          "letters about the bridges, the markets and the weather, and the letters were kept in a small museum. ")


def tokenize_url(config: EndpointConfig) -> str:
    parts = urlsplit(config.base_url)
    root = parts.path[:-len("/v1")] if parts.path.endswith("/v1") else parts.path
    return urlunsplit((parts.scheme, parts.netloc, root.rstrip("/") + "/tokenize", "", ""))


def server_tokenize(config: EndpointConfig, text: str, model: str | None = None) -> list[int]:
    """The server's token ids of `text` (no special tokens added). Raises EndpointError naming the URL and the fix
    when the server has no tokenize endpoint or answers something else."""
    url = tokenize_url(config)
    # llama.cpp reads `content`; vLLM and SGLang read `prompt` (and `model`); each ignores the other's fields
    body = {"content": text, "prompt": text, "add_special": False, "add_special_tokens": False}
    if model or config.model:
        body["model"] = model or config.model
    try:
        response = httpx.post(url, json=body, headers=config.headers(), timeout=min(config.timeout_s, 30.0))
    except httpx.TransportError as exc:
        raise EndpointError(f"POST {url} failed ({type(exc).__name__}: {exc}): is the server up?") from None
    tokens = None
    if response.status_code == 200:
        try:
            tokens = response.json().get("tokens")
        except (ValueError, AttributeError):
            tokens = None
    if not isinstance(tokens, list) or not all(isinstance(t, (int, dict)) for t in tokens):
        raise EndpointError(f"POST {url} answered HTTP {response.status_code} without a token list: this server has "
                            "no /tokenize endpoint (llama.cpp, vLLM and SGLang have one), so token-exact prompts "
                            "cannot be built for it; give prompts as text, or size them with a local tokenizer "
                            "(--infergate-model naming the served model)")
    return [t["id"] if isinstance(t, dict) else t for t in tokens]  # llama.cpp with_pieces returns objects


def token_exact_requests(config: EndpointConfig, num_requests: int, input_tokens: int | tuple[int, int],
                         output_tokens: int | tuple[int, int], seed: int = 0,
                         model: str | None = None) -> list[EndpointRequest]:
    """`num_requests` completions requests whose prompts are exactly `input_tokens` of the server's tokens (a
    fixed count, or a (low, high) range drawn per request) and whose answers are exactly `output_tokens` long
    (`ignore_eos`, which vLLM, SGLang and llama.cpp honour). Deterministic for a seed."""
    if config.api != "completions":
        raise EndpointError("token-exact prompts are token ids, which only the completions API takes: run with "
                            "--infergate-endpoint-api=completions")
    rng = random.Random(seed)

    def pick(spec: int | tuple[int, int]) -> int:
        value = spec if isinstance(spec, int) else rng.randint(*spec)
        if value < 1:
            raise EndpointError(f"token counts must be at least 1, got {spec!r}")
        return value

    sizes = [(pick(input_tokens), pick(output_tokens)) for _ in range(num_requests)]
    longest = max((n for n, _ in sizes), default=0)
    text = FILLER
    tokens = server_tokenize(config, text, model)
    if not tokens:
        raise EndpointError(f"POST {tokenize_url(config)} returned no tokens for a non-empty text")
    while len(tokens) < 2 * longest:  # room to start each prompt at its own offset
        text += FILLER
        tokens = server_tokenize(config, text, model)
    requests = []
    for index, (n_in, n_out) in enumerate(sizes):
        start = rng.randrange(0, len(tokens) - n_in + 1)  # different prompts: a shared prefix would be cached
        requests.append(EndpointRequest(prompt=tokens[start:start + n_in], max_tokens=n_out,
                                        request_id=f"exact{seed}-{index}", extra_body={"ignore_eos": True}))
    return requests
