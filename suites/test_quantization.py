"""The precision ladder (guide: "先测 FP16/BF16 基线, 再测 8bit, 最后再评估 4bit"): does each precision load,
really quantize, and save weight memory compared with the reference?"""

import pytest


def test_precision_loads_and_answers(infergate_model, infergate_reference_model, infergate_tokenizer):
    record = infergate_model.record
    if record.precision in ("int8", "nf4"):
        assert record.quantized_modules > 0
        assert record.weight_bytes < infergate_reference_model.record.weight_bytes
    ids = infergate_tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                                  add_generation_prompt=True, return_tensors="pt")["input_ids"]
    out = infergate_model.model.generate(ids.to(infergate_model.model.device), max_new_tokens=16, do_sample=False)
    assert len(out[0]) > len(ids[0])
