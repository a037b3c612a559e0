"""GGUF checkpoints (`--model FILE.gguf`): a small random model written as llama.cpp's converter writes it (names
through the `gguf` package's own `TensorNameMap`, experts stacked, norms float32), in BF16 and in Q8_0, gives the
tokens and logits of the safetensors checkpoint of the same weights (for Q8_0: of its dequantized weights), on the
torch path; its config comes from the file's metadata; split files load as one; bad files are one clear error."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.core.kernels.test_gguf_blocks import random_blocks
from tests.helpers import assert_hybrid_computes_packed_experts_on_the_cpu, COMMON, FAMILY_SPECS, assert_quantized_gives_its_twins_bits

gguf = pytest.importorskip("gguf")

ARCH = {"qwen3_moe": gguf.MODEL_ARCH.QWEN3MOE, "olmoe": gguf.MODEL_ARCH.OLMOE, "qwen2_moe": gguf.MODEL_ARCH.QWEN2MOE,
        "mixtral": gguf.MODEL_ARCH.LLAMA, "gpt_oss": gguf.MODEL_ARCH.GPT_OSS, "deepseek_v2": gguf.MODEL_ARCH.DEEPSEEK2}
EVERY_LAYER_MOE = {"qwen3_moe": dict(mlp_only_layers=[]), "qwen2_moe": dict(decoder_sparse_step=1)}  # as llama.cpp's
PROMPT = [5, 17, 42, 8, 99, 3, 64]
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")
EXPERT = re.compile(r"^(model\.layers\.\d+\.(?:mlp|block_sparse_moe)\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$")


def hf_checkpoint(family: str, path: Path, vocab_size: int = COMMON["vocab_size"], wide: int = 0, **fields) -> Path:
    """A random tiny model of `family` saved as the hub does; `wide`: hidden and expert widths of that size; `fields`:
    other config fields."""
    import transformers

    cfg_cls, model_cls, kwargs = FAMILY_SPECS[family]
    torch.manual_seed(7)
    widths = {"hidden_size": wide, "moe_intermediate_size": wide, "head_dim": 64} if wide else {}
    config = getattr(transformers, cfg_cls)(**{**COMMON, **kwargs, **EVERY_LAYER_MOE.get(family, {}),
                                               "vocab_size": vocab_size, **widths, **fields})
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():  # far from ties, as tests.helpers.make_hf_model widens them
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.5 if "embed" in name else 0.15)
    model.save_pretrained(path)
    return path


def hf_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def stacked(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert tensors stacked as llama.cpp's converter stacks them: `...experts.gate_proj` [N, I, D]; GPT-OSS's
    interleaved gate_up [N, D, 2I] (and bias) split into gate and up, its down [N, I, D] turned to [N, D, I]."""
    out, experts = {}, {}
    for name, t in tensors.items():
        if name.endswith(("experts.gate_up_proj", "experts.gate_up_proj_bias")):
            rows = t.transpose(1, 2) if t.dim() == 3 else t  # [N, 2I(, D)], gate even, up odd
            stem, tail = name.rsplit(".", 1)
            suffix = ".bias" if tail.endswith("_bias") else ".weight"
            out[f"{stem}.gate_proj{suffix}"], out[f"{stem}.up_proj{suffix}"] = rows[:, 0::2], rows[:, 1::2]
            continue
        if name.endswith(("experts.down_proj", "experts.down_proj_bias")):
            out[name.removesuffix("_bias").removesuffix("down_proj") + ("down_proj.bias" if name.endswith("_bias")
                else "down_proj.weight")] = t if t.dim() == 2 else t.transpose(1, 2)
            continue
        m = EXPERT.match(name)
        if m is None:
            out[name] = t
        else:
            experts.setdefault(f"{m[1]}.{m[3]}.weight", {})[int(m[2])] = t
    for name, by_id in experts.items():
        out[name] = torch.stack([by_id[e] for e in sorted(by_id)])
    return out


def write_gguf(family: str, folder: Path, out: Path, qtype, split: int = 1, tokenizer=None,
               expert_qtype=None, split_kv_b: bool = True) -> list[Path]:
    """The checkpoint in `folder` as GGUF: 2-D and 3-D weights in `qtype`, vectors float32 (split in `split` files);
    `tokenizer` (a byte-level BPE `tokenizers.Tokenizer`) as llama.cpp's "gpt2" model, else placeholder tokens;
    `expert_qtype`: the experts' type where it is not `qtype` (GPT-OSS's MXFP4); `split_kv_b`: DeepSeek-V2's kv_b as
    llama.cpp's converters since 2025 write it (attn_k_b [H, r, nope], attn_v_b [H, v, r]), else one attn_kv_b."""
    cfg = json.loads((folder / "config.json").read_text())
    arch = ARCH[family]
    tensors = stacked(hf_tensors(folder))
    names = gguf.TensorNameMap(arch, cfg["num_hidden_layers"])
    arch_name = gguf.MODEL_ARCH_NAMES[arch]
    writer = gguf.GGUFWriter(out, arch_name, split_max_tensors=-(-len(tensors) // split) if split > 1 else 0)
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_expert_feed_forward_length(cfg.get("moe_intermediate_size", cfg["intermediate_size"]))
    if cfg.get("shared_expert_intermediate_size"):
        writer.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    if arch != gguf.MODEL_ARCH.DEEPSEEK2:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_rope_freq_base(cfg.get("rope_theta") or cfg.get("rope_parameters", {}).get("rope_theta", 10000.0))
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_expert_count(cfg.get("num_experts") or cfg.get("num_local_experts") or cfg["n_routed_experts"])
    if arch == gguf.MODEL_ARCH.DEEPSEEK2:  # the latent attention as llama.cpp's converter describes it
        rank, rope_dim = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
        writer.add_leading_dense_block_count(cfg["first_k_dense_replace"])
        writer.add_kv_lora_rank(rank)
        if cfg.get("q_lora_rank"):
            writer.add_q_lora_rank(cfg["q_lora_rank"])
        writer.add_key_length(rank + rope_dim)
        writer.add_value_length(rank)
        writer.add_key_length_mla(cfg["qk_nope_head_dim"] + rope_dim)
        writer.add_value_length_mla(cfg["v_head_dim"])
        writer.add_rope_dimension_count(rope_dim)
        writer.add_expert_shared_count(cfg["n_shared_experts"])
        writer.add_expert_weights_scale(cfg["routed_scaling_factor"])
        writer.add_expert_weights_norm(bool(cfg.get("norm_topk_prob")))
        rope = cfg["rope_parameters"]
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        writer.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])
    if arch == gguf.MODEL_ARCH.GPT_OSS:
        rope = cfg["rope_parameters"]
        writer.add_sliding_window(cfg["sliding_window"])
        if rope["rope_type"] == "yarn":
            writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            writer.add_rope_scaling_factor(rope["factor"])
            writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        writer.add_swiglu_clamp_exp([cfg["swiglu_limit"]] * cfg["num_hidden_layers"])
    writer.add_expert_used_count(cfg["num_experts_per_tok"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == gguf.GGMLQuantizationType.F32 else
                         gguf.LlamaFileType.MOSTLY_MXFP4_MOE if expert_qtype == gguf.GGMLQuantizationType.MXFP4 else
                         gguf.LlamaFileType.MOSTLY_BF16 if qtype == gguf.GGMLQuantizationType.BF16 else
                         gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_tokenizer_model("gpt2")
    if tokenizer is None:
        writer.add_token_list([f"<t{i}>" for i in range(cfg["vocab_size"])])
        writer.add_token_types([gguf.TokenType.NORMAL] * cfg["vocab_size"])
    else:
        add_tokenizer(writer, tokenizer, cfg["vocab_size"])
    if arch == gguf.MODEL_ARCH.DEEPSEEK2 and split_kv_b:
        for name in [n for n in tensors if n.endswith("kv_b_proj.weight")]:
            kv_b = tensors.pop(name).view(cfg["num_attention_heads"], -1, cfg["kv_lora_rank"])
            k_b, v_b = kv_b.split([cfg["qk_nope_head_dim"], cfg["v_head_dim"]], dim=1)
            tensors[name.replace("kv_b_proj", "k_b_proj")] = k_b.transpose(1, 2).contiguous()
            tensors[name.replace("kv_b_proj", "v_b_proj")] = v_b.contiguous()
    for name, t in tensors.items():
        if arch == gguf.MODEL_ARCH.LLAMA and re.search(r"self_attn\.[qk]_proj\.weight$", name):
            heads = cfg["num_attention_heads"] if ".q_proj" in name else cfg["num_key_value_heads"]
            t = t.reshape(heads, 2, t.shape[0] // heads // 2, t.shape[1]).swapaxes(1, 2).reshape(t.shape)  # llama.cpp's
        base = name.removesuffix(".weight").removesuffix(".bias")
        gname = names.get_name(base) + (name[len(base):] or ".weight")  # (GPT-OSS's sinks: no suffix in HF)
        x = t.float().reshape(-1) if name.endswith("shared_expert_gate.weight") else t.float()  # [D], as converters did
        kind = expert_qtype if expert_qtype is not None and "_exps." in gname else qtype
        if x.dim() == 1 or name.endswith(".bias") or kind == gguf.GGMLQuantizationType.F32:  # vectors, biases: float32
            writer.add_tensor(gname, x.numpy())
        elif kind == gguf.GGMLQuantizationType.BF16:
            writer.add_tensor(gname, x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16), raw_dtype=kind)
        elif kind.name in K_QUANTS:  # the gguf package writes no k-quants: random blocks with finite scales
            rows = int(np.prod(x.shape[:-1]))
            blocks = random_blocks(kind.name, rows, x.shape[-1] // 256, seed=len(gname))
            writer.add_tensor(gname, blocks.reshape(*x.shape[:-1], -1), raw_dtype=kind)
        else:
            writer.add_tensor(gname, gguf.quants.quantize(x.numpy(), kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sorted(out.parent.glob(out.stem + "*.gguf"))


CHAT = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
TEXTS = ["Hello, world!", "It's 2026: DON'T panic.\n\n  indented\tand tabbed 123456", "naïve café 東京 🙂", "x<|im_end|>y",
         "a<tool_call>{\"name\": 1}</tool_call>b", ""]


def trained_tokenizer(vocab_size: int, pre: str = "qwen2"):
    """A byte-level BPE trained on a few sentences, split as `pre` (a GGUF pre-tokenizer name) says, with a control
    token and a user-defined one."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from wisp.models.gguf_tokenizer import PRE_TOKENIZER_SPLITS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS[pre]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    text = ["the quick brown fox jumps over the lazy dog", "it's what they're doing, don't you think?",
            "numbers 12345 and 2026", "a cafe, a naive idea"] * 20
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 2, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(text, trainer)
    tok.add_special_tokens(["<|im_end|>"])
    tok.add_tokens(["<tool_call>"])  # added, not special: kept in decoded text (Qwen3's tool-call tags)
    tok.gguf_pre = pre  # (read by add_tokenizer)
    return tok


def add_tokenizer(writer, tok, vocab_size: int) -> None:
    model = json.loads(tok.to_str())["model"]
    vocab = sorted(tok.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(vocab_size))
    tokens = [t for t, _ in vocab]
    writer.add_tokenizer_pre(getattr(tok, "gguf_pre", "qwen2"))
    writer.add_token_list(tokens)
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in model["merges"]])
    kinds = {"<|im_end|>": gguf.TokenType.CONTROL, "<tool_call>": gguf.TokenType.USER_DEFINED}
    writer.add_token_types([kinds.get(t, gguf.TokenType.NORMAL) for t in tokens])
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_chat_template(CHAT)


def bf16_twin(folder: Path, out: Path, replace) -> Path:
    """`folder`'s checkpoint with each tensor replaced by `replace(name, tensor)` (a GGUF file's dequantized weights),
    computed in bfloat16 as a GGUF file of quantized weights is."""
    from safetensors.torch import save_file

    out.mkdir()
    cfg = json.loads((folder / "config.json").read_text())
    cfg["torch_dtype"] = cfg["dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(cfg))
    tensors = {name: replace(name, t.float()).contiguous() for name, t in hf_tensors(folder).items()}
    save_file(tensors, str(out / "model.safetensors"))
    return out


def through(qtype, x: torch.Tensor) -> torch.Tensor:
    """x [..., in] quantized to `qtype` by the gguf package and back (float32)."""
    return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(x.numpy(), qtype), qtype).copy())


@pytest.mark.slow
@pytest.mark.parametrize("family", list(ARCH))
def test_a_bf16_gguf_gives_the_safetensors_tokens(family, tmp_path):
    from wisp import LLM

    folder = hf_checkpoint(family, tmp_path / "hf")
    file = write_gguf(family, folder, tmp_path / f"{family}.gguf", gguf.GGMLQuantizationType.BF16)[0]
    on_gguf = LLM(str(file))
    assert on_gguf.config.dtype == torch.bfloat16 and on_gguf.config.family == family
    assert_same_run(on_gguf, LLM(str(folder), dtype="bfloat16"))


@pytest.mark.slow
@pytest.mark.parametrize("split_kv_b", [True, False])  # llama.cpp's converters since 2025, and before
def test_deepseek_v2_latent_attention_from_either_kv_b_layout(split_kv_b, tmp_path):
    from wisp import LLM

    folder = hf_checkpoint("deepseek_v2", tmp_path / "hf")
    file = write_gguf("deepseek_v2", folder, tmp_path / "d.gguf", gguf.GGMLQuantizationType.BF16,
                      split_kv_b=split_kv_b)[0]
    on_gguf, on_hf = LLM(str(file)), LLM(str(folder), dtype="bfloat16")
    assert on_gguf.config == on_hf.config  # the MLA shape, yarn's mscale, dense and shared experts, all from metadata
    assert_same_run(on_gguf, on_hf)


@pytest.mark.slow
@pytest.mark.parametrize("family, mode", [("qwen3_moe", "paged"), ("olmoe", "hybrid"), ("qwen3_moe", "zero-copy")])
def test_q8_0_experts_stay_packed_and_give_their_dequantized_twins_tokens(family, mode, tmp_path, caplog):
    folder = hf_checkpoint(family, tmp_path / "hf")
    q8 = gguf.GGMLQuantizationType.Q8_0
    file = write_gguf(family, folder, tmp_path / f"{family}.gguf", q8)[0]
    twin = bf16_twin(folder, tmp_path / "twin", lambda name, t: through(q8, t) if t.dim() >= 2 and not
                     name.endswith("shared_expert_gate.weight") else t)
    q, p = assert_quantized_gives_its_twins_bits(file, twin, mode, 2, "cpu", "torch", "torch", PROMPT)
    assert "dequantized" not in caplog.text  # nothing widened at load
    assert q.config.expert_format == "q8_0" and p.config.expert_format == "plain"
    reader = gguf.GGUFReader(file)  # the planner's bytes are the file's: 34 bytes a block of 32, a scale and 32 codes
    weights = sum(int(t.n_bytes) for t in reader.tensors if t.name.endswith("_exps.weight"))
    assert q.config.expert_bytes * q.config.num_experts * len(q.config.moe_layer_ids) == weights
    assert q.config.expert_bytes * 15 < p.config.expert_bytes * 9  # 8.5 bits a weight against 16


def test_hybrids_native_cpu_kernel_computes_a_gguf_files_q8_0_experts_packed(tmp_path):
    folder = hf_checkpoint("qwen3_moe", tmp_path / "hf")
    q8 = gguf.GGMLQuantizationType.Q8_0
    file = write_gguf("qwen3_moe", folder, tmp_path / "q.gguf", q8)[0]
    twin = bf16_twin(folder, tmp_path / "twin", lambda name, t: through(q8, t) if t.dim() >= 2 else t)
    assert_hybrid_computes_packed_experts_on_the_cpu(file, twin, PROMPT, tolerance=3e-2)  # bf16 logits


def test_q8_0_experts_load_as_random_codes_under_the_dummy_format(tmp_path):
    from wisp import LLM, SamplingParams

    folder = hf_checkpoint("olmoe", tmp_path / "hf")
    file = write_gguf("olmoe", folder, tmp_path / "o.gguf", gguf.GGMLQuantizationType.Q8_0)[0]
    llm = LLM(str(file), mode="resident", load_format="dummy")
    bank, _ = llm.model.experts[0].residency.bank_and_map()  # what the kernels read: the packed codes and scales
    assert bank["gate_up"].dtype == torch.int8 and bank["gate_up_scale"].dtype == torch.float16
    assert len(llm.generate(PROMPT, SamplingParams(max_tokens=3, temperature=0))[0].token_ids) == 3


@pytest.mark.slow
def test_gpt_oss_mxfp4_experts_stay_packed_and_give_their_dequantized_twins_tokens(tmp_path):
    mx = gguf.GGMLQuantizationType.MXFP4
    folder = hf_checkpoint("gpt_oss", tmp_path / "hf")
    file = write_gguf("gpt_oss", folder, tmp_path / "g.gguf", gguf.GGMLQuantizationType.BF16, expert_qtype=mx)[0]
    twin = bf16_twin(folder, tmp_path / "twin", lambda name, t: through(mx, t.transpose(1, 2)).transpose(1, 2) if
                     name.endswith(("experts.gate_up_proj", "experts.down_proj")) else t)  # along the input dim
    q, p = assert_quantized_gives_its_twins_bits(file, twin, "paged", 2, "cpu", "torch", "torch", PROMPT)
    assert q.config.mxfp4_experts and q.config.expert_bytes * 3 < p.config.expert_bytes  # packed: 4.25 bits a weight
    reader = gguf.GGUFReader(file)  # the planner's bytes are the file's: 17 bytes a block of 32, a scale and 16 codes;
    weights = sum(int(t.n_bytes) for t in reader.tensors if t.name.endswith("_exps.weight"))  # biases: bf16 in memory
    biases = sum(int(t.n_elements) for t in reader.tensors if t.name.endswith("_exps.bias")) * 2
    assert q.config.expert_bytes * q.config.num_experts * len(q.config.moe_layer_ids) == weights + biases


def assert_same_run(a, b):
    from wisp import SamplingParams

    assert torch.equal(a.prompt_logits(PROMPT), b.prompt_logits(PROMPT))
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    assert a.generate([PROMPT], params)[0].token_ids == b.generate([PROMPT], params)[0].token_ids


@pytest.mark.slow
def test_split_files_load_as_one(tmp_path):
    from wisp import LLM

    folder = hf_checkpoint("olmoe", tmp_path / "hf")
    parts = write_gguf("olmoe", folder, tmp_path / "olmoe.gguf", gguf.GGMLQuantizationType.BF16, split=3)
    assert len(parts) == 3 and parts[1].name == "olmoe-00002-of-00003.gguf"
    assert_same_run(LLM(str(parts[1])), LLM(str(folder), dtype="bfloat16"))
    parts[2].unlink()
    with pytest.raises(Exception, match="missing: olmoe-00003-of-00003.gguf"):
        LLM(str(parts[0]))


@pytest.mark.parametrize("arch, message", [
    ("phi3", "unsupported GGUF architecture 'phi3'; supported: qwen3moe, olmoe, llama, qwen2moe"),
    ("llama", "the GGUF file's llama model has no experts .llama.expert_count.: wisp serves mixture-of-experts"),
])
def test_an_unsupported_file_is_one_error_naming_what_is(tmp_path, arch, message):
    from wisp import LLM
    from wisp.errors import WispError

    out = tmp_path / f"{arch}.gguf"
    writer = gguf.GGUFWriter(out, arch)
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(WispError, match=message):
        LLM(str(out))


def test_a_tensor_type_wisp_cannot_read_names_the_ones_it_can(tmp_path):
    from wisp.errors import WispError
    from wisp.models.gguf_file import GGUFFile

    out = tmp_path / "ints.gguf"
    writer = gguf.GGUFWriter(out, "olmoe")
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((4, 32), dtype=np.int32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(WispError, match="blk.0.attn_q.weight is I32, which wisp does not read; supported: F32, F16, BF16, Q8_0"):
        GGUFFile(out).tensor("blk.0.attn_q.weight")


@pytest.mark.slow
@pytest.mark.parametrize("pre", ["qwen2", "gpt-4o"])  # Qwen's split; gpt-oss's (o200k)
def test_the_tokenizer_and_chat_template_come_from_the_metadata(tmp_path, monkeypatch, pre):
    from wisp import LLM

    monkeypatch.setenv("WISP_CACHE", str(tmp_path / "cache"))
    original = trained_tokenizer(320, pre)  # byte-level: 256 bytes, some merges, a control and a user-defined token
    folder = hf_checkpoint("qwen3_moe", tmp_path / "hf", vocab_size=320)
    file = write_gguf("qwen3_moe", folder, tmp_path / "q.gguf", gguf.GGMLQuantizationType.BF16, tokenizer=original)[0]
    llm = LLM(str(file))
    for text in TEXTS:
        ids = original.encode(text, add_special_tokens=False).ids
        assert llm.tokenizer.encode(text) == ids, text
        assert llm.tokenizer.decode(ids) == original.decode(ids, skip_special_tokens=True)
    call = original.token_to_id("<tool_call>")
    assert call in llm.tokenizer.encode("a<tool_call>b") and llm.tokenizer.decode([call]) == "<tool_call>"  # kept
    assert llm.tokenizer.decode(llm.tokenizer.encode("x<|im_end|>y")) == "xy"  # a control token is skipped
    eos = original.token_to_id("<|im_end|>")
    assert llm.config.eos_token_ids == (eos,) and llm.engine.chat_template == CHAT
    assert llm.generate("Hello, world!", None)[0].token_ids  # text in, tokens out
    import transformers  # transformers' own conversion of the same file's tokenizer agrees

    theirs = transformers.AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
    for text in TEXTS:
        assert llm.tokenizer.encode(text) == theirs.encode(text, add_special_tokens=False), text


def test_a_split_the_tokenizer_table_does_not_name_gives_no_tokenizer_rather_than_a_guess():
    from wisp.models.gguf_tokenizer import build_tokenizer

    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "ab"], "tokenizer.ggml.merges": ["a b"]}
    assert build_tokenizer({**meta, "tokenizer.ggml.pre": "qwen2"}).encode("ab").ids == [2]
    assert build_tokenizer({**meta, "tokenizer.ggml.pre": "some-new-model"}) is None
    assert build_tokenizer({**meta, "tokenizer.ggml.model": "llama"}) is None


def test_a_named_load_format_reads_only_its_own_kind_of_checkpoint():
    """--load-format auto reads a GGUF file and a safetensors folder alike; safetensors or gguf refuses the other kind
    with one message naming what the path is."""
    from tests.models.make_q4_k_m_fixture import FIXTURE
    from wisp.config import EngineConfig
    from wisp.errors import WispError
    from wisp.models.source import model_source

    for fmt in ("auto", "gguf"):
        assert model_source(EngineConfig(model=str(FIXTURE), load_format=fmt))[0] == FIXTURE
    with pytest.raises(WispError, match="is a GGUF file"):
        model_source(EngineConfig(model=str(FIXTURE), load_format="safetensors"))
    folder = model_source(EngineConfig(model="demo", load_format="safetensors"))[0]
    assert folder.is_dir() and model_source(EngineConfig(model="demo"))[0] == folder
    with pytest.raises(WispError, match="is a checkpoint directory"):
        model_source(EngineConfig(model="demo", load_format="gguf"))
