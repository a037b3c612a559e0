"""LLM.generate on the demo model: EOS, max tokens, text, seeds, prompt forms."""

from __future__ import annotations

from dataclasses import replace

from wisp import SamplingParams


def test_max_tokens_and_text(demo):
    out = demo.generate(["Hello"], SamplingParams(max_tokens=7, ignore_eos=True))[0]
    assert len(out.token_ids) == 7 and out.finish_reason == "length"
    assert out.text == demo.tokenizer.decode(out.token_ids)
    assert out.prompt_token_ids == demo.tokenizer.encode("Hello")
    assert out.arrival_time <= out.first_token_time <= out.finish_time


def test_stops_at_eos(demo):
    first = demo.generate(["Hello"], SamplingParams(max_tokens=3, ignore_eos=True))[0].token_ids
    engine = demo.engine
    saved = engine.model_config
    engine.model_config = replace(saved, eos_token_ids=(first[1],))
    try:
        out = demo.generate(["Hello"], SamplingParams(max_tokens=10))[0]
        assert out.token_ids == first[:2] and out.finish_reason == "stop"
        assert len(demo.generate(["Hello"], SamplingParams(max_tokens=10, ignore_eos=True))[0].token_ids) == 10
    finally:
        engine.model_config = saved
    out = demo.generate(["Hello"], SamplingParams(max_tokens=10, stop_token_ids=(first[2],)))[0]
    assert out.token_ids == first[:3] and out.finish_reason == "stop"


def test_text_and_token_id_prompts_agree(demo):
    ids = demo.tokenizer.encode("abc")
    a = demo.generate("abc", SamplingParams(max_tokens=5, ignore_eos=True))[0]
    b = demo.generate([ids], SamplingParams(max_tokens=5, ignore_eos=True))[0]
    assert a.token_ids == b.token_ids


def test_seeded_sampling_is_reproducible_and_per_request(demo):
    p = SamplingParams(max_tokens=8, temperature=1.0, seed=3, ignore_eos=True)
    one = demo.generate(["x"], p)[0].token_ids
    both = demo.generate(["x", "yy"], [p, replace(p, seed=4)])
    assert both[0].token_ids == one
    assert demo.generate(["yy"], replace(p, seed=4))[0].token_ids == both[1].token_ids
    assert both[1].token_ids != both[0].token_ids


def test_stats_totals_equal_sum_of_layers(demo):
    demo.reset_stats()
    demo.generate(["Hello there"], SamplingParams(max_tokens=4, ignore_eos=True))
    s = demo.stats()
    layers = s["per_layer"].values()
    assert s["expert_hits"] == sum(c["hits"] for c in layers)
    assert s["bytes_h2d"] == sum(c["bytes_h2d"] for c in layers) == s["expert_loads"] * demo.config.expert_bytes
    assert s["tokens_prefilled"] == len(demo.tokenizer.encode("Hello there")) and s["tokens_decoded"] == 3


def test_special_tokens_are_left_out_of_the_text_unless_asked(demo):
    im_end = demo.tokenizer.encode("<|im_end|>")
    assert len(im_end) == 1  # a special token of the demo's vocabulary
    forced = SamplingParams(max_tokens=3, ignore_eos=True, logit_bias=((im_end[0], 100.0),))
    skipped, kept = demo.generate(["Hi", "Hi"], [forced, replace(forced, skip_special_tokens=False)])
    assert skipped.token_ids == kept.token_ids == im_end * 3
    assert skipped.text == "" and kept.text == "<|im_end|>" * 3
