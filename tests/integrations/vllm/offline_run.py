"""One offline vLLM run in a process of its own, for the tests that compare against vLLM in other processes
(the OpenAI server, TP = 2):

    python -m tests.integrations.vllm.offline_run CHECKPOINT ENGINE_ARGS_JSON PROMPTS_JSON OUT_JSON

builds `vllm.LLM(CHECKPOINT, **ENGINE_ARGS)` (bf16, eager, no tokenizer), generates 8 greedy tokens for each
prompt (lists of token ids, one batch) and writes {"outputs": per prompt [tokens, per step {token: logprob} of
the top 5], "counters": per worker {paged layer: wisp's counters}} to OUT_JSON. The environment chooses the plug-ins
(`VLLM_PLUGINS=""` loads none) and the CPU binding; `apply_model` needs `VLLM_ALLOW_INSECURE_SERIALIZATION=1`
once workers are processes.
"""

from __future__ import annotations

import json
import sys


def main(checkpoint: str, engine_args: str, prompts: str, out: str) -> None:
    import vllm
    from vllm.inputs import TokensPrompt

    from wisp.integrations.vllm import layer_counters

    llm = vllm.LLM(checkpoint, skip_tokenizer_init=True, enforce_eager=True, dtype="bfloat16", max_model_len=128,
                   max_num_seqs=4, seed=0, **json.loads(engine_args))
    params = vllm.SamplingParams(max_tokens=8, temperature=0.0, logprobs=5, detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in json.loads(prompts)], params, use_tqdm=False)
    outputs = [[list(o.outputs[0].token_ids),
                [{t: lp.logprob for t, lp in step.items()} for step in o.outputs[0].logprobs]] for o in outs]
    with open(out, "w") as f:
        json.dump({"outputs": outputs, "counters": llm.apply_model(layer_counters)}, f)


if __name__ == "__main__":  # the guard matters: vLLM's workers are spawned and import this module again
    main(*sys.argv[1:])
