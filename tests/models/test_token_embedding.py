"""The token embedding table's placement (`--embedding`): rows read in place from a pinned host table are the
table's rows, bit for bit (the Triton kernel, compiled on a GPU, interpreted on the CPU); the table leaves the
device only beside a GPU and untied; the model's outputs do not depend on where it lives."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from tests.helpers import COMMON, FAMILY_SPECS
from wisp import LLM
from wisp.errors import WispError
from wisp.models.config_parsers import model_config
from wisp.models.host_rows import gather_host_rows
from wisp.models.presets import preset
from wisp.models.token_embedding import TokenEmbedding, embedding_on_host
from wisp.plan.sizes import non_expert_params

GPU = torch.cuda.is_available()
DEV = torch.device("cuda" if GPU else "cpu")
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rows_read_from_a_host_table_are_its_rows_bit_for_bit(dtype):
    table = torch.randn(50, 1100, generator=torch.Generator().manual_seed(3)).to(dtype)  # 1100: two blocks, masked
    table = table.pin_memory() if GPU else table
    tokens = torch.tensor([7, 0, 49, 7, 3], device=DEV)
    rows = gather_host_rows(table, tokens)
    assert rows.device.type == DEV.type and torch.equal(rows.cpu(), table[tokens.cpu()])
    outside = gather_host_rows(table, torch.tensor([-1, 50], device=DEV))  # never read: zeros
    assert torch.equal(outside.cpu(), torch.zeros((2, 1100), dtype=dtype))
    assert gather_host_rows(table, tokens[:0]).shape == (0, 1100)


def test_the_table_leaves_the_device_only_beside_a_gpu_and_when_it_is_not_the_lm_head():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert embedding_on_host("auto", cuda, tied=False) and embedding_on_host("host", cuda, tied=False)
    assert not embedding_on_host("device", cuda, tied=False) and not embedding_on_host("auto", cuda, tied=True)
    assert not embedding_on_host("auto", cpu, tied=False) and not embedding_on_host("host", cpu, tied=False)
    cfg = model_config(preset("olmoe-1b-7b"))  # the planner's device bytes leave a host table out
    assert non_expert_params(cfg) - non_expert_params(cfg, embedding_on_host=True) == cfg.vocab_size * cfg.hidden_size
    tied = dataclasses.replace(cfg, tie_word_embeddings=True)
    assert non_expert_params(tied) == non_expert_params(tied, embedding_on_host=True)


def test_a_host_table_must_be_pinned():  # no GPU needed: a CPU tensor beside a "cuda" device is a host table
    with pytest.raises(ValueError, match="pinned"):
        TokenEmbedding(torch.zeros((4, 16)), torch.device("cuda"))


def test_outputs_do_not_depend_on_where_the_table_lives(hf_checkpoints, device, moe_backend, attention_backend):
    """On a GPU (`--wisp-device cuda`) host against device; on the CPU both stay on the device, as asserted."""
    path = str(hf_checkpoints["olmoe"])
    opts = dict(device=device, mode="paged", expert_cap=4, moe_backend=moe_backend, attention_backend=attention_backend)
    host, on_device = LLM(path, embedding="auto", **opts), LLM(path, embedding="device", **opts)
    assert host.stats()["embedding"] == ("host" if device.startswith("cuda") else "device")
    assert on_device.stats()["embedding"] == "device"
    assert torch.equal(host.prompt_logits(PROMPT), on_device.prompt_logits(PROMPT))


def test_a_tied_table_asked_for_in_host_memory_is_one_clear_error(tmp_path, device):
    config_cls, model_cls, kwargs = FAMILY_SPECS["olmoe"]
    config = getattr(transformers, config_cls)(**{**COMMON, **kwargs, "tie_word_embeddings": True})
    getattr(transformers, model_cls)(config).save_pretrained(tmp_path)
    with pytest.raises(WispError, match="also its LM head"):
        LLM(str(tmp_path), device=device, embedding="host")
    assert LLM(str(tmp_path), device=device).stats()["embedding"] == "device"  # auto keeps it where the head is


def test_a_table_that_cannot_be_pinned_stays_on_the_device_unless_host_was_asked_for(monkeypatch):
    from wisp.config import EngineConfig
    from wisp.models import loader
    from wisp.models.demo import DEMO_CONFIG
    from wisp.models.random_checkpoint import RandomWeights

    cfg = model_config(DEMO_CONFIG)
    reader = RandomWeights(cfg)

    def no_pinning(*args, **kwargs):
        raise RuntimeError("cudaHostAlloc failed: out of memory")

    def never(*args, **kwargs):
        raise AssertionError("no pinned allocation was to be tried")

    on_device = lambda key: torch.empty((cfg.vocab_size, cfg.hidden_size), device="meta")  # noqa: E731 (a GPU's stand-in)
    cuda = torch.device("cuda")
    monkeypatch.setattr(loader, "_allocate", never)  # pageable masters (pin_memory off): the table stays too
    assert not loader._embedding(reader, cfg, EngineConfig(model="x", pin_memory=False), cuda, on_device, False).on_host
    with pytest.raises(WispError, match="needs pinned host memory"):
        loader._embedding(reader, cfg, EngineConfig(model="x", pin_memory=False, embedding="host"), cuda, on_device, False)
    monkeypatch.setattr(loader, "_allocate", no_pinning)
    table = loader._embedding(reader, cfg, EngineConfig(model="x"), cuda, on_device, tied=False)
    assert not table.on_host and table.table.device.type == "meta"
    with pytest.raises(WispError, match=f"could not pin {cfg.vocab_size * cfg.hidden_size * 4} bytes"):
        loader._embedding(reader, cfg, EngineConfig(model="x", embedding="host"), cuda, on_device, tied=False)
