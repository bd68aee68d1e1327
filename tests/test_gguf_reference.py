"""Issue #55 point 6a: a GGUF model's float "reference" is its own file's dequantization, and its verdicts say so:
the quantization read from the file (its header's file type, else its matrices' tensor type), kept with the model
source, and named in the comparison's record, its notes and the terminal's quality line."""

import json
from types import SimpleNamespace

import gguf
import numpy as np

from pytest_infergate.models import gguf_files
from pytest_infergate.models.gguf_files import ensure_converted_gguf, gguf_quantization
from pytest_infergate.models.sources import SMOLLM2_QUANTIZATION, ModelSource
from pytest_infergate.quality.metrics import QualityResult
from pytest_infergate.quality.scoring import reference_source
from pytest_infergate.results.records import QualityRecord
from pytest_infergate.results.summary import QualityGroup, quality_line
from pytest_infergate.status import Status


def write_gguf(path, file_type: int | None = None, quantized: bool = False):
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    if file_type is not None:
        writer.add_file_type(file_type)
    if quantized:  # one Q8_0 matrix: 32 values a block, stored as 34 bytes (an fp16 scale and 32 int8)
        blocks = np.zeros((4, 34), dtype=np.uint8)
        writer.add_tensor("blk.0.attn_q.weight", blocks, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("token_embd.weight", np.ones((4, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_files_quantization_is_read_from_its_header_else_its_tensors(tmp_path):
    assert gguf_quantization(write_gguf(tmp_path / "k.gguf", gguf.LlamaFileType.MOSTLY_Q4_K_M)) == "Q4_K_M"
    assert gguf_quantization(write_gguf(tmp_path / "q41.gguf", gguf.LlamaFileType.MOSTLY_Q4_1)) == "Q4_1"
    assert gguf_quantization(write_gguf(tmp_path / "f16.gguf", gguf.LlamaFileType.MOSTLY_F16)) == ""  # float: as is
    assert gguf_quantization(write_gguf(tmp_path / "untyped.gguf", quantized=True)) == "Q8_0"
    assert gguf_quantization(write_gguf(tmp_path / "plain.gguf")) == ""
    assert SMOLLM2_QUANTIZATION == "Q4_1"  # the embedded model: its fp32 is the wheel's Q4_1 file, dequantized


def test_the_conversion_records_the_quantization_and_older_entries_read_it_from_the_file(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "model.gguf", gguf.LlamaFileType.MOSTLY_Q4_K_M)

    def convert_as_before(gguf_path, out_dir):  # an entry built before the quantization was recorded
        (out_dir / "config.json").write_text("{}")
        return {"source": str(gguf_path)}

    monkeypatch.setattr(gguf_files, "convert_gguf", convert_as_before)
    entry, quantization = ensure_converted_gguf(path, tmp_path / "cache")
    assert quantization == "Q4_K_M" and "quantization" not in json.loads((entry / "infergate-meta.json").read_text())
    monkeypatch.setattr(gguf_files, "convert_gguf",
                        lambda gguf_path, out_dir: {**convert_as_before(gguf_path, out_dir), "quantization": "Q5_0"})
    other = write_gguf(tmp_path / "other.gguf", gguf.LlamaFileType.MOSTLY_Q5_0)
    assert ensure_converted_gguf(other, tmp_path / "cache")[1] == "Q5_0"  # as recorded at conversion


def test_the_quality_verdict_names_a_dequantized_reference():
    gguf_model = SimpleNamespace(source=ModelSource("m.gguf", "/cache/x", "gguf", "m", "Q4_K_M"),
                                 record=SimpleNamespace(precision="fp32"))
    plain = SimpleNamespace(source=ModelSource("org/m", "/hub/x", "hub", "m"), record=SimpleNamespace(precision="fp32"))
    assert reference_source(gguf_model) == "fp32 dequantized from Q4_K_M" and reference_source(plain) == ""

    result = QualityResult("int8", "fp32", [], {"samples": 48, "top1": 0.94, "mean_kl": 0.02}, {}, 1.0,
                           reference_source="fp32 dequantized from Q4_K_M")
    assert QualityResult.from_dict(json.loads(json.dumps(result.to_dict()))).reference == "fp32 dequantized from Q4_K_M"
    before = {name: value for name, value in result.to_dict().items() if name != "reference_source"}
    assert QualityResult.from_dict(before).reference == "fp32"  # a results file from before: the precision alone
    record = QualityRecord("t::q[int8]", Status.PASS, result)
    line = quality_line(QualityGroup("int8", "fp32", [record])).text
    assert "quality PASS      int8 vs fp32 dequantized from Q4_K_M (48 samples" in line
