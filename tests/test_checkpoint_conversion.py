"""Every bundled family reads the checkpoint transformers writes for it, at ep=2, as transformers' own
``from_pretrained`` reads it, and writes it back as transformers writes it: ``save_pretrained`` writes the original layout back (Mixtral's ``block_sparse_moe``
with one tensor per expert, Inkling 2's ``model.llm.``, GraniteMoE's ``router.layer``), and the sliced loader renames
and converts the keys with transformers' conversion mapping. Persistent buffers (DeepSeek's routing correction
bias) are read too: drawn at random here, so a loader that kept the zeros it was built with fails."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from halo_core.registry import discover
from halo_core.testing.spawn import spawn
from halo_core.tiny import tiny_family_model

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)


def _types():
    return [(r.name, t) for r in discover(strict=False).records if r.ok and "ep" in r.family.splits for t in r.family.model_types]


def _reference(family, model_type):
    model = tiny_family_model(discover(strict=False).by_name(family).family, model_type, seed=3)
    persistent = set(model.state_dict())
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name in persistent and buffer.is_floating_point():
                buffer.copy_(torch.randn(buffer.shape, generator=generator))
    return model


def _load_every_type(rank, world, folder):
    from safetensors.torch import load_file

    from halo_core import ParallelConfig, from_pretrained, full_state_dict
    from halo_core.testing.compare import assert_close
    from halo_core.trainers.parts.checkpoint import save_model

    failures = []
    for family, model_type in _types():
        where = Path(folder, model_type)
        reference = _reference(family, model_type)
        if rank == 0:
            reference.save_pretrained(where)
        dist.barrier()
        try:
            model = from_pretrained(where, ParallelConfig(ep=2))
            state = full_state_dict(model)
            save_model(model, Path(folder, f"{model_type}-saved"))
        except Exception as exc:  # every rank fails alike: name the type and go on, so one run lists them all
            failures.append(f"{model_type}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        if rank == 0:
            written, saved = (load_file(Path(f, "model.safetensors")) for f in (where, Path(folder, f"{model_type}-saved")))
            if written.keys() != saved.keys() or any(not torch.equal(written[k], saved[k]) for k in written):
                failures.append(f"{model_type}: Halo's save differs from transformers' ({sorted(written.keys() ^ saved.keys())[:4]})")
            expected = reference.state_dict()
            if state.keys() != expected.keys():
                failures.append(f"{model_type}: keys differ: {sorted(state.keys() ^ expected.keys())[:4]}")
                continue
            for name, tensor in expected.items():
                try:
                    assert_close(state[name], tensor, f"{model_type}: {name}")
                except AssertionError as exc:
                    failures.append(str(exc))
                    break
    assert not failures, "\n".join(failures)


def test_every_bundled_type_reads_the_checkpoint_transformers_writes_at_ep2(tmp_path):
    assert len(_types()) > 30
    spawn(_load_every_type, 2, str(tmp_path))


@pytest.mark.parametrize("model_type", ["deepseek_v3"])
def test_the_reference_has_a_persistent_buffer_the_builder_leaves_zero(model_type):
    """What makes the buffer check above able to fail: the built model's correction bias is zeros, the saved one not."""
    from halo_core.tiny import tiny_model

    built = dict(tiny_model(model_type).named_buffers())["model.layers.1.mlp.gate.e_score_correction_bias"]
    drawn = _reference("deepseek-v3", model_type).state_dict()["model.layers.1.mlp.gate.e_score_correction_bias"]
    assert not built.any() and drawn.any()


def test_a_converter_that_makes_several_weights_names_each_as_transformers_does():
    """One stored ``qkv`` chunked into q, k and v (transformers' ``Chunk``): each target gets its part, and on a
    rank holding some experts of a per-expert operation only those rows are read."""
    from torch import nn
    from transformers.core_model_loading import Chunk, Concatenate, MergeModulelist, WeightConverter

    from halo_core.parallel.conversion import Source, read

    model = nn.Module()
    model.config = None  # what the operations are handed; these read none of it
    qkv = torch.arange(24.0).view(6, 4)
    chunk = Source(WeightConverter("attn.qkv", ["attn.q", "attn.k", "attn.v"], operations=[Chunk(dim=0)]),
                   keys={"attn.qkv": ["layer.attn.qkv"]}, targets=("layer.attn.q", "layer.attn.k", "layer.attn.v"))
    blocks, sliced = read(chunk, lambda key, rows: qkv, model, None, {t: (2, 4) for t in chunk.targets})
    assert not sliced and [torch.equal(blocks[t], part) for t, part in zip(chunk.targets, qkv.chunk(3))] == [True] * 3

    experts = {f"mlp.experts.{e}.{p}.weight": torch.full((2, 3), float(10 * e + (p == "up_proj"))) for e in range(4) for p in ("gate_proj", "up_proj")}
    merge = Source(WeightConverter(["mlp.experts.*.gate_proj.weight", "mlp.experts.*.up_proj.weight"], "mlp.experts.gate_up_proj",
                                   operations=[MergeModulelist(dim=0), Concatenate(dim=1)]),
                   keys={p: [f"mlp.experts.{e}.{p.split('.')[-2]}.weight" for e in range(4)]
                         for p in ("mlp.experts.*.gate_proj.weight", "mlp.experts.*.up_proj.weight")},
                   targets=("mlp.experts.gate_up_proj",))
    opened = []
    blocks, sliced = read(merge, lambda key, rows: opened.append(key) or experts[key], model, (2, 4), {merge.targets[0]: (4, 4, 3)})
    assert sliced and blocks[merge.targets[0]].shape == (2, 4, 3) and blocks[merge.targets[0]][0, 0, 0] == 20
    assert sorted(opened) == sorted(k for k in experts if ".2." in k or ".3." in k)  # experts 2 and 3 alone
