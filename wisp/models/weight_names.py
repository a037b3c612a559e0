"""Checkpoint tensor names (as the hub publishes them): one `WeightNames` per naming style.

A `WeightNames` maps our parameter roles to Hugging Face tensor names; each family in
`wisp.models.families` names the style its checkpoints use. Experts are read either one
tensor per expert (`...experts.3.gate_proj.weight`, Mixtral's `w1/w3/w2`) or, where a checkpoint stores
them fused (`...experts.gate_up_proj` [N, 2I, D], `...experts.down_proj` [N, D, I]), as stacks.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WeightNames:
    moe_prefix: str  # module holding router + experts inside a layer
    expert_gate: str
    expert_up: str
    expert_down: str
    router_name: str = "gate"  # the router's module inside moe_prefix
    shared_name: str = "shared_expert"  # the shared expert's module inside mlp (DeepSeek: shared_experts)
    fused_layout: str = "stacked"  # fused experts as [N, 2I, D] / [N, D, I]; "gpt_oss": [N, D, 2I] with gate
    #                                and up interleaved (column 2j gate j, 2j+1 up j) and [N, I, D], plus biases

    @staticmethod
    def layer(i: int) -> str:
        return f"model.layers.{i}"

    def attn(self, i: int, proj: str) -> str:
        return f"{self.layer(i)}.self_attn.{proj}"

    def router(self, i: int) -> str:
        return f"{self.layer(i)}.{self.moe_prefix}.{self.router_name}.weight"

    def expert(self, i: int, e: int, which: str) -> str:
        part = {"gate": self.expert_gate, "up": self.expert_up, "down": self.expert_down}[which]
        return f"{self.layer(i)}.{self.moe_prefix}.experts.{e}.{part}.weight"

    def fused_experts(self, i: int, which: str) -> str:
        return f"{self.layer(i)}.{self.moe_prefix}.experts.{which}_proj"

    def dense_mlp(self, i: int, which: str) -> str:
        return f"{self.layer(i)}.mlp.{which}_proj.weight"

    def shared_expert(self, i: int, which: str) -> str:
        return f"{self.layer(i)}.mlp.{self.shared_name}.{which}_proj.weight"

    def shared_expert_gate(self, i: int) -> str:
        return f"{self.layer(i)}.mlp.shared_expert_gate.weight"


HF_STYLE = WeightNames("mlp", "gate_proj", "up_proj", "down_proj")  # Qwen2/3-MoE, OLMoE
MIXTRAL_STYLE = WeightNames("block_sparse_moe", "w1", "w3", "w2")
DEEPSEEK_STYLE = WeightNames("mlp", "gate_proj", "up_proj", "down_proj", shared_name="shared_experts")
GPT_OSS_STYLE = WeightNames("mlp", "gate_proj", "up_proj", "down_proj", router_name="router", fused_layout="gpt_oss")
