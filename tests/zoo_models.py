"""Tiny random models of many families (seeded, built in memory, no download): the model zoo the engine must be
exact on, or refuse clearly. Their vocabulary (259) is that of tiny-random-llama's byte-level tokenizer (ids 0..2:
<|endoftext|>, <|im_start|>, <|im_end|>), which the tests share."""

from __future__ import annotations

import torch

WINDOW = 16  # sliding windows shorter than the zoo's prompts (5..60 tokens)
SOFTCAP = 50.0

# hidden 64, 4 heads of 16, 2 KV heads, 2 layers: small enough that the whole zoo builds in a second or two
_COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
_SLIDING_THEN_FULL = ["sliding_attention", "full_attention"]

# name -> (model_type, config overrides, what the engine does with it: "exact" or "refused")
FAMILIES: dict[str, tuple[str, dict, str]] = {
    "llama": ("llama", {}, "exact"),
    "qwen2": ("qwen2", {}, "exact"),
    "qwen2-sliding": ("qwen2", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=0), "exact"),
    "qwen3": ("qwen3", {}, "exact"),
    "mistral": ("mistral", dict(sliding_window=None), "exact"),
    "mistral-sliding": ("mistral", dict(sliding_window=WINDOW), "exact"),
    "gemma": ("gemma", {}, "exact"),
    "gemma2": ("gemma2", dict(sliding_window=WINDOW, attn_logit_softcapping=SOFTCAP, final_logit_softcapping=30.0,
                              layer_types=_SLIDING_THEN_FULL), "exact"),
    "gemma3": ("gemma3_text", dict(sliding_window=WINDOW, layer_types=_SLIDING_THEN_FULL, query_pre_attn_scalar=24),
               "exact"),
    "phi3": ("phi3", dict(head_dim=None, num_key_value_heads=4, sliding_window=None), "exact"),
    "olmo2": ("olmo2", {}, "exact"),
    "granite": ("granite", dict(attention_multiplier=0.2, embedding_multiplier=2.0, logits_scaling=4.0,
                                residual_multiplier=0.5), "exact"),
    "gpt-neox": ("gpt_neox", dict(head_dim=None, num_key_value_heads=None, use_parallel_residual=True,
                                  rotary_pct=0.5), "exact"),
    "cohere": ("cohere", dict(head_dim=None, logit_scale=0.5), "exact"),
    "cohere2": ("cohere2", dict(head_dim=None, logit_scale=0.5, sliding_window=WINDOW,
                                layer_types=_SLIDING_THEN_FULL), "exact"),
    "smollm3": ("smollm3", dict(head_dim=None, use_sliding_window=True, sliding_window=WINDOW,
                                layer_types=_SLIDING_THEN_FULL, no_rope_layers=[1, 0]), "exact"),
    # chunked attention on layer 0 (a query sees only its own chunk of 16), full attention on the NoPE layer 1
    "llama4": ("llama4_text", dict(attention_chunk_size=WINDOW, no_rope_layers=[1, 0], intermediate_size_mlp=128,
                                   num_local_experts=2, num_experts_per_tok=1, interleave_moe_layer_step=2),
               "exact"),
    "gpt-oss": ("gpt_oss", dict(sliding_window=WINDOW, layer_types=_SLIDING_THEN_FULL, num_local_experts=4,
                                num_experts_per_tok=2), "exact"),
    # GPT-2 and OPT ignore a config's num_key_value_heads (here 2, while they run 4 KV heads) and head_dim:
    # the engine sizes its cache from what the attention hands over, not from the config
    "gpt2": ("gpt2", dict(intermediate_size=None), "exact"),
    "opt": ("opt", dict(ffn_dim=128, word_embed_proj_dim=64, intermediate_size=None), "exact"),
    # not through AttentionInterface (bloom, falcon), no attention at all (mamba), attention layers between
    # state-space blocks whose state the KV cache does not hold (jamba)
    "bloom": ("bloom", dict(n_layer=2, n_head=4), "refused"),
    "falcon": ("falcon", dict(head_dim=None), "refused"),
    "mamba": ("mamba", dict(state_size=8), "refused"),
    "jamba": ("jamba", dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
                            num_experts=2, mamba_d_state=8, mamba_dt_rank=8, use_mamba_kernels=False), "refused"),
}
EAGER = {"gemma2", "gpt_oss"}  # families whose own attention is eager (softcapping, sinks)


def build_config(name: str, **changes):
    """The family's tiny config; `changes` override its settings (e.g. a longer window)."""
    from transformers import AutoConfig

    model_type, overrides, _ = FAMILIES[name]
    kwargs = dict(_COMMON, vocab_size=259, bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                  initializer_range=0.4)  # large weights keep greedy logits apart, so exactness is not float luck
    kwargs.update(overrides)
    kwargs.update(changes)
    kwargs = {k: v for k, v in kwargs.items() if v is not None or k == "sliding_window"}
    return AutoConfig.for_model(model_type, **kwargs)


def build_model(name: str, seed: int = 0, **changes):
    """The family's tiny model in fp32 eval mode, weights from `seed`; torch's global RNG is left as it was."""
    from transformers import AutoModelForCausalLM

    config = build_config(name, **changes)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        own = {"attn_implementation": "eager"} if config.model_type in EAGER else {}
        model = AutoModelForCausalLM.from_config(config, **own)
    finally:
        torch.random.set_rng_state(state)
    model = model.to(torch.float32).eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 2
    return model


def prompts(count: int = 6, seed: int = 1, lengths=(5, 60), shared: int = 20) -> list[list[int]]:
    """Random prompts of token ids (no specials), lengths spread over `lengths`; those longer than `shared` + 4
    start with the same `shared` tokens (a prefix for prefix caching to find)."""
    generator = torch.Generator().manual_seed(seed)
    low, high = lengths
    prefix = torch.randint(3, 259, (shared,), generator=generator).tolist()
    out = []
    for n in torch.linspace(low, high, count).round().int().tolist():
        ids = torch.randint(3, 259, (n,), generator=generator).tolist()
        out.append(prefix + ids[shared:] if n >= shared + 4 else ids)
    return out


@torch.inference_mode()
def hf_greedy_ids(model, prompt_ids: list[list[int]], max_new_tokens: int, eos: int = 2) -> list[list[int]]:
    """model.generate, batch 1, greedy, cut after the first EOS: the reference the engine must reproduce."""
    outs = []
    for ids in prompt_ids:
        x = torch.tensor([ids])
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=0)
        gen = out[0, len(ids):].tolist()
        if eos in gen:
            gen = gen[:gen.index(eos) + 1]
        outs.append(gen)
    return outs


def cached_zoo(prompt_ids: list[list[int]], max_new_tokens: int):
    """name -> (the family's model, its greedy model.generate outputs for `prompt_ids`), each built once."""
    built = {}

    def get(name):
        if name not in built:
            model = build_model(name)
            built[name] = model, hf_greedy_ids(model, prompt_ids, max_new_tokens)
        return built[name]

    return get
