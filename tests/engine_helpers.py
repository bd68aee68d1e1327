"""Shared prompts and the `model.generate` reference the engine must reproduce token for token."""

import torch

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a KV cache is in one sentence.",
    "List three prime numbers.",
    "Translate 'good morning' into French.",
    "What is 17 * 23?",
    "Name a famous painter and one of their works.",
    "Why is the sky blue?",
    "Give me a JSON object with keys name and age.",
    "写一句关于春天的诗。",
    "Summarize: The cat sat on the mat all day, watching birds through the window and ignoring its food.",
    "def fibonacci(n):",
    "Hi!",
    "What are the three states of matter? Answer briefly, then give one example of each state, and explain "
    "how water moves between them when it is heated or cooled over a long afternoon in the summer.",
    "Tell me a joke about programmers.",
    "How many legs does a spider have?",
]


def messages(prompt):
    return [{"role": "user", "content": prompt}]


def hf_greedy(loaded, prompts, max_new_tokens):
    """model.generate, batch 1, greedy: the reference output of each prompt."""
    tok = loaded.tokenizer
    outs = []
    for prompt in prompts:
        ids = tok.apply_chat_template(messages(prompt), add_generation_prompt=True, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            out = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                        do_sample=False, pad_token_id=tok.pad_token_id)
        gen = out[0, ids.shape[1]:].tolist()
        eos = loaded.model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos]) | {tok.eos_token_id}
        # generate pads finished rows; cut after the first EOS like the engine does
        for i, t in enumerate(gen):
            if t in eos:
                gen = gen[:i + 1]
                break
        outs.append(gen)
    return outs
