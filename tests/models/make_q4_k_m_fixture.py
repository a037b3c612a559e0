"""Makes `tests/models/data/qwen3_moe_q4_k_m.gguf`: a tiny random Qwen3-MoE (2 layers, 4 experts, hidden and expert
widths 256, so every weight row is whole 256-value k-quant blocks; a trained byte-level BPE vocabulary) written as llama.cpp's converter writes it in BF16
(`tests.models.test_gguf.write_gguf`), then quantized by llama.cpp's own `llama-quantize` to Q4_K_M, the mix users
download (Q4_K for most weights, Q6_K for some, F32 vectors). The gguf package writes no k-quants, so the file is kept
in the repo (about 1 MB) with this command beside it:

    BACKEND=cpu TARGET=llama-quantize bash benchmarks/recipes/llama_cpp/build.sh   # from .llama_cpp/src (fetch.sh)
    python -m tests.models.make_q4_k_m_fixture .llama_cpp/build-cpu/bin/llama-quantize
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

FIXTURE = Path(__file__).parent / "data" / "qwen3_moe_q4_k_m.gguf"
SHAPE = dict(wide=256, num_hidden_layers=2, num_experts=4, vocab_size=320)  # `hf_checkpoint`'s: the test rebuilds it
TOKENIZER_VOCAB = 320  # a trained byte-level BPE (`trained_tokenizer`): llama.cpp needs its merges to load the file


def main(quantize: str, out: Path = FIXTURE) -> None:
    import gguf

    from tests.models.test_gguf import hf_checkpoint, trained_tokenizer, write_gguf

    with tempfile.TemporaryDirectory() as tmp:
        folder = hf_checkpoint("qwen3_moe", Path(tmp) / "hf", **SHAPE)
        bf16 = write_gguf("qwen3_moe", folder, Path(tmp) / "bf16.gguf", gguf.GGMLQuantizationType.BF16,
                          tokenizer=trained_tokenizer(TOKENIZER_VOCAB))[0]
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([quantize, str(bf16), str(out), "Q4_K_M"], check=True)
    print(out, out.stat().st_size, "bytes")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.models.make_q4_k_m_fixture PATH/TO/llama-quantize")
    main(sys.argv[1])
