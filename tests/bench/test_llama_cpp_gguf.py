"""`wisp bench llama-cpp gguf` (wisp.bench.llama_cpp.random_gguf): the random GGUF llama.cpp is benchmarked on
has llama.cpp's names, the preset's shapes and metadata, and Q8_0 blocks bit-equal to the gguf package's
(ggml's) quantizer."""

from __future__ import annotations

import json
import shutil

import gguf
import numpy as np
import pytest

from tests.cli_runner import run_wisp
from wisp.bench.llama_cpp import random_gguf as gguf_random
from wisp.errors import WispError
from wisp.models.config_parsers import model_config
from wisp.models.presets import preset


@pytest.mark.parametrize("family, kind", [("olmoe-1b-7b", "bf16"), ("qwen3-30b-a3b", "q8_0"), ("gpt-oss-20b", "bf16")])
def test_the_gguf_has_llama_cpps_tensors_in_the_presets_shapes(tmp_path, family, kind):
    raw = dict(preset(family), num_hidden_layers=2, num_experts=4, hidden_size=64, intermediate_size=64,
               moe_intermediate_size=32, vocab_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    if "layer_types" in raw:  # GPT-OSS: windowed and full layers alternate
        raw["layer_types"] = raw["layer_types"][:2]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    cfg = model_config(raw)
    proc = run_wisp(["llama-cpp", "gguf", "--model", tmp_path / "config.json", "--out", tmp_path / "m.gguf",
                     "--type", kind], tmp_path / "cache", timeout=300, command="bench")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip()
    assert out == str(tmp_path / "m.gguf")
    reader = gguf.GGUFReader(out)
    arch = gguf_random.ARCHES[cfg.family]
    assert bytes(reader.fields["general.architecture"].parts[-1]).decode() == gguf.MODEL_ARCH_NAMES[arch]
    known = {gguf.TENSOR_NAMES[t].format(bid=i) + part for t in gguf.MODEL_TENSORS[arch] for i in range(2)
             for part in (".weight", ".bias")}
    tensors = {t.name: t for t in reader.tensors}
    assert set(tensors) <= known  # every name is one llama.cpp's loader looks for
    assert set(tensors) == {name for name, _ in gguf_random.tensor_shapes(cfg)}
    gate = tensors["blk.1.ffn_gate_exps.weight"]
    assert [int(n) for n in gate.shape] == [64, cfg.moe_intermediate_size, 4]  # innermost first: [D, I, N]
    expected_type = {"bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}[kind]
    if cfg.mxfp4_experts:  # GPT-OSS: experts in MXFP4 whatever --type says, the rest as it says
        assert tensors["blk.0.attn_q.weight"].tensor_type == expected_type
        assert tensors["blk.1.attn_sinks.weight"].tensor_type == gguf.GGMLQuantizationType.F32
        assert tensors["blk.1.ffn_down_exps.bias"].tensor_type == gguf.GGMLQuantizationType.F32
        expected_type = gguf.GGMLQuantizationType.MXFP4
    assert gate.tensor_type == expected_type and tensors["output_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    field = reader.fields[f"{gguf.MODEL_ARCH_NAMES[arch]}.expert_used_count"]
    assert int(field.parts[-1][0]) == cfg.top_k
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == cfg.vocab_size
    weights = gguf.quants.dequantize(gate.data, gate.tensor_type)
    if cfg.mxfp4_experts:  # random e2m1 codes at scales 2^-7 .. 2^-4: every value is code x scale, up to 6 x 2^-4
        assert np.abs(weights).max() <= 6 * 2**-4 and len(np.unique(weights)) > 8
    else:  # a standard deviation of 0.02, as written (bf16 normal; Q8_0 uniform codes in -127..127 under one scale)
        assert 0.015 < float(np.std(weights)) < 0.025
        if kind == "q8_0":
            codes = gate.data.reshape(-1, 34)[:, 2:].view(np.int8)
            assert codes.min() == -127 and codes.max() == 127 and abs(float(codes.mean())) < 1


def test_a_family_llama_cpp_has_no_layout_for_is_one_line(tmp_path):
    proc = run_wisp(["llama-cpp", "gguf", "--model", "mixtral-8x7b", "--out", tmp_path / "m.gguf"], tmp_path,
                    timeout=120, command="bench")
    assert proc.returncode == 2 and "no GGUF layout for mixtral" in proc.stderr and "Traceback" not in proc.stderr


def test_a_file_its_folder_cannot_hold_is_refused_before_it_is_written(tmp_path, monkeypatch):
    """gpt-oss-120b's file (about 65 GB: 36 layers of 128 MXFP4 experts) against a folder with 34 GB free, as the GPU
    machine's disk had: one clear error, and no file begun."""
    cfg = model_config(preset("gpt-oss-120b"))
    sizes = [int(np.prod(gguf.quant_shape_to_byte_shape(shape, gguf_random.tensor_type(cfg, name, shape, "bf16"))))
             for name, shape in gguf_random.tensor_shapes(cfg)]
    assert 60e9 < sum(sizes) < 70e9
    monkeypatch.setattr(gguf_random.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(252e9, 218e9, 34e9))
    with pytest.raises(WispError, match=r"the GGUF needs 6\d\.\d GB and .* has 34\.0 GB free"):
        gguf_random.write_gguf("gpt-oss-120b", tmp_path / "g.gguf")
    assert not (tmp_path / "g.gguf").exists()


def _small_gpt_oss(tmp_path):
    """A 2-layer gpt-oss config.json (4 experts of 64 x 32): MXFP4 experts, the rest as --type says."""
    raw = dict(preset("gpt-oss-20b"), num_hidden_layers=2, num_local_experts=4, hidden_size=64, intermediate_size=32,
               vocab_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    raw["layer_types"] = raw["layer_types"][:2]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return tmp_path / "config.json"


@pytest.fixture
def small_pools(monkeypatch):
    """Pools of 64 rows, so a test's tensors wrap around them; the process's pools drawn afresh before and after."""
    for qtype in list(gguf_random.POOL_ROWS):
        monkeypatch.setitem(gguf_random.POOL_ROWS, qtype, 1 << 6)
    gguf_random._pool.cache_clear()
    yield
    gguf_random._pool.cache_clear()


@pytest.mark.parametrize("qtype, shape", [(gguf.GGMLQuantizationType.Q8_0, (3, 40, 64)),
                                          (gguf.GGMLQuantizationType.MXFP4, (3, 40, 64)),
                                          (gguf.GGMLQuantizationType.BF16, (40, 64))], ids=["q8_0", "mxfp4", "bf16"])
def test_tensors_tile_one_pool_from_their_seeds_offset(small_pools, qtype, shape):
    """A seed gives the same bytes (in a fresh process too: the pool is redrawn from its fixed seed), another seed
    other bytes; row k of a tensor is the pool's row offset + k, wrapping around the pool."""
    a = gguf_random._random("blk.0.ffn_up_exps.weight", shape, qtype, 7)
    gguf_random._pool.cache_clear()
    assert a.tobytes() == gguf_random._random("blk.0.ffn_up_exps.weight", shape, qtype, 7).tobytes()
    assert a.tobytes() != gguf_random._random("blk.0.ffn_up_exps.weight", shape, qtype, 8).tobytes()
    pool = gguf_random._pool(qtype)
    rows = a.reshape(-1, *pool.shape[1:])
    assert len(rows) > len(pool)  # the tensor wraps around the pool
    offset = 7 * gguf_random.OFFSET_STEP % len(pool)
    np.testing.assert_array_equal(rows, pool[(offset + np.arange(len(rows))) % len(pool)])
    out = np.zeros(a.nbytes + 5, np.uint8)  # the writer's reused buffer gives the same bytes
    assert gguf_random._random("blk.0.ffn_up_exps.weight", shape, qtype, 7, out).tobytes() == a.tobytes()


def test_a_written_files_blocks_keep_their_value_ranges_and_its_seed_fixes_its_bytes(tmp_path):
    """gpt-oss at --type q8_0: Q8_0 blocks of the one scale and codes in -127..127, MXFP4 blocks of scale bytes 120..123
    and any code byte; the same seed writes the same file, another seed other tensors."""
    config = _small_gpt_oss(tmp_path)
    first = gguf_random.write_gguf(str(config), tmp_path / "a.gguf", "q8_0", seed=3)
    assert first.read_bytes() == gguf_random.write_gguf(str(config), tmp_path / "b.gguf", "q8_0", seed=3).read_bytes()
    tensors = {t.name: t for t in gguf.GGUFReader(first).tensors}
    other = {t.name: t for t in gguf.GGUFReader(gguf_random.write_gguf(str(config), tmp_path / "c.gguf", "q8_0",
                                                                     seed=4)).tensors}
    q8 = [t for t in tensors.values() if t.tensor_type == gguf.GGMLQuantizationType.Q8_0]
    fp4 = [t for t in tensors.values() if t.tensor_type == gguf.GGMLQuantizationType.MXFP4]
    assert len(fp4) == 6 and {t.name for t in q8} >= {"blk.1.attn_q.weight", "token_embd.weight"}
    for t in tensors.values():  # vectors and biases are constants (ones, zeros); the rest move with the seed
        assert np.array_equal(t.data, other[t.name].data) == (len(t.shape) == 1 or t.name.endswith(".bias")), t.name
    blocks = np.concatenate([t.data.reshape(-1, 34) for t in q8])
    assert (blocks[:, :2].copy().view(np.float16) == np.float16(gguf_random.Q8_0_STD_SCALE)).all()
    codes = blocks[:, 2:].view(np.int8)
    assert codes.min() == -127 and codes.max() == 127
    blocks = np.concatenate([t.data.reshape(-1, 17) for t in fp4])
    assert set(np.unique(blocks[:, 0])) == {120, 121, 122, 123} and len(np.unique(blocks[:, 1:])) == 256
    weights = np.concatenate([gguf.quants.dequantize(t.data, t.tensor_type).ravel() for t in fp4])
    assert np.abs(weights).max() <= 6 * 2**-4 and len(np.unique(weights)) > 8
