"""llama.cpp and wisp on the same tiny GGUF file: prompt logits and greedy tokens (a hand-run check for issue 44; it
needs `pip install llama-cpp-python`, whose build takes minutes, so CI does not run it).

    python benchmarks/probes/llama_cpp_greedy_parity.py [--families qwen3_moe,olmoe,qwen2_moe,mixtral,gpt_oss]
    python benchmarks/probes/llama_cpp_greedy_parity.py --file tests/models/data/qwen3_moe_q4_k_m.gguf

For each family a random tiny model (tests/models/test_gguf.py's, weights widened far from ties, with a trained
byte-level BPE vocabulary) is written as
llama.cpp's converter writes it, in float32, so both sides compute in float32; wisp reads it with `--model
FILE.gguf` on the CPU (torch path). Prints, per family, the largest prompt-logit difference and whether 16 greedy
tokens agree, and writes them as JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

PROMPT = [5, 17, 42, 8, 99, 3, 64, 12]
# where the tiny test models leave what llama.cpp supports, the real models' values: llama.cpp's OLMoE norms k over
# the whole embedding (OLMoE-1B-7B has as many kv heads as heads); its gpt-oss hardcodes the SwiGLU limit 7.0 (the
# tests' 1.5 is ignored) and floors / ceils yarn's correction range, where the reference and transformers do not
# (`truncate: false`): with yarn the two differ by design, so gpt-oss runs here without it; llama.cpp takes a
# DeepSeek-V2 of other than 27 layers for the full model, whose queries have a LoRA rank (V2-Lite's do not)
REAL_SHAPES = {"olmoe": {"num_key_value_heads": 4}, "deepseek_v2": {"q_lora_rank": 16},
               "gpt_oss": {"swiglu_limit": 7.0, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}}


def compare(family: str, root: Path) -> dict:
    import gguf

    from tests.helpers import FAMILY_SPECS
    from tests.models.test_gguf import hf_checkpoint, trained_tokenizer, write_gguf

    cfg_cls, model_cls, kwargs = FAMILY_SPECS[family]
    FAMILY_SPECS[family] = (cfg_cls, model_cls, {**kwargs, **REAL_SHAPES.get(family, {})})
    folder = hf_checkpoint(family, root / family / "hf", vocab_size=320)  # a byte-level BPE: llama.cpp needs merges
    file = write_gguf(family, folder, root / family / f"{family}.gguf", gguf.GGMLQuantizationType.F32,
                      tokenizer=trained_tokenizer(320))[0]
    return {"family": family, **compare_file(file)}


def compare_file(file: Path, theirs_file: Path | None = None, dtype=None) -> dict:
    """wisp (CPU, torch path, in `dtype`: None is the file's) on `file` and llama.cpp on `theirs_file` (default the same
    file): prompt logits and 16 greedy tokens."""
    from llama_cpp import Llama

    from wisp import LLM, SamplingParams

    ours = LLM(str(file), device="cpu", dtype=dtype)
    our_logits = ours.prompt_logits(PROMPT).float().numpy()  # [T, V]
    our_tokens = ours.generate([PROMPT], SamplingParams(max_tokens=16, ignore_eos=True))[0].token_ids
    theirs = Llama(model_path=str(theirs_file or file), n_ctx=64, logits_all=True, verbose=False, n_threads=2)
    theirs.eval(PROMPT)
    their_logits = np.array(theirs.scores[: len(PROMPT)])
    their_tokens, context = [], list(PROMPT)
    for _ in range(16):
        theirs.reset()
        theirs.eval(context)
        token = int(np.argmax(theirs.scores[len(context) - 1]))
        their_tokens.append(token)
        context.append(token)
    diff = float(np.abs(our_logits - their_logits).max())
    scale = float(np.abs(their_logits).max())
    return {"max_logit_diff": diff, "max_logit": scale, "tokens_agree": our_tokens == their_tokens,
            "wisp_tokens": our_tokens, "llama_cpp_tokens": their_tokens}


def dequantized_copy(src: Path, dst: Path) -> Path:
    """`src` with every tensor dequantized (the gguf package's floats) and stored as F32, the metadata as it is: what
    llama.cpp computes on it has no quantized activations, so it isolates the weights from llama.cpp's arithmetic."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    writer = gguf.GGUFWriter(dst, arch)
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        kind = f.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            sub = f.types[1]
            value = [str(bytes(f.parts[i]), "utf-8") if sub == gguf.GGUFValueType.STRING else f.parts[i].tolist()[0]
                     for i in f.data]
            writer.add_key_value(name, value, kind, sub_type=sub)
        elif kind == gguf.GGUFValueType.STRING:
            writer.add_key_value(name, str(bytes(f.parts[-1]), "utf-8"), kind)
        else:
            value = int(gguf.LlamaFileType.ALL_F32) if name == "general.file_type" else f.parts[-1].tolist()[0]
            writer.add_key_value(name, value, kind)
    for t in reader.tensors:
        writer.add_tensor(t.name, gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="qwen3_moe,olmoe,qwen2_moe,mixtral,gpt_oss",
                    help="deepseek_v2 too: llama-cpp-python 0.3.36's llama.cpp aborts (a ggml assert) on the tiny file")
    ap.add_argument("--file", default=None, help="an existing GGUF file instead (e.g. tests/models/data/"
                    "qwen3_moe_q4_k_m.gguf, llama-quantize's Q4_K_M: llama.cpp multiplies 8-bit activations there)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.file:  # the file, then (llama.cpp's side) its F32-dequantized copy, against wisp on the file in float32
            for theirs in (Path(args.file), dequantized_copy(Path(args.file), Path(tmp) / "dequantized.gguf")):
                r = {"file": args.file, "llama_cpp_on": "the file" if theirs == Path(args.file) else
                     "its tensors dequantized to F32", **compare_file(Path(args.file), theirs, dtype="float32")}
                print(json.dumps({k: v for k, v in r.items() if not k.endswith("_tokens")}), flush=True)
                records.append(r)
        for family in [] if args.file else args.families.split(","):
            try:
                r = compare(family, Path(tmp))
            except Exception as exc:  # noqa: BLE001 (a family llama.cpp refuses is reported, not fatal)
                r = {"family": family, "error": f"{exc.__class__.__name__}: {exc}"}
            records.append(r)
            print(json.dumps({k: v for k, v in r.items() if not k.endswith("_tokens")}), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
