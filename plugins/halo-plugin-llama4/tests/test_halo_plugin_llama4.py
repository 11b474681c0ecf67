from halo_core.testing import check_family


def test_halo_plugin_llama4_passes_the_conformance_kit():
    check_family('llama4')


def test_trls_fused_head_runs_llama4s_backbone_once_halo_names_it():
    """TRL's SFT/DPO loss runs ``model.base_model``, which transformers' ``Llama4ForCausalLM`` resolves to itself."""
    import torch
    from trl.trainer.utils import add_fused_lm_head

    from halo_core.tiny import tiny_model
    from halo_core.trainers.runtime import name_the_backbone

    model = tiny_model("llama4_text")
    assert model.base_model is model
    name_the_backbone(model)
    assert model.base_model is model.model
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    expected = torch.log_softmax(model(input_ids=ids).logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    add_fused_lm_head(model, outputs=("log_probs",))
    fused = model(input_ids=ids, labels=ids, fused_lm_head=True).log_probs
    torch.testing.assert_close(fused, expected, rtol=1e-5, atol=1e-5)
