"""`halo launch embed`: EP2 against one process (losses within 1e-5, post-SGD weights within 1e-4: the in-batch negatives
are gathered over both ranks, and per-rank negatives would give another loss), one process against stock
`SentenceTransformerTrainer`, the written directory loaded by `SentenceTransformer(path)`, EP2's retrieval metrics (an
evaluation at the last step) against one process's, and the refusals before start."""

from __future__ import annotations

import json
import random
import re
import shutil

import pytest
import torch

from conftest import run_halo
from halo_core.errors import ConfigError
from halo_core.testing.compare import assert_close
from launch_kit import GLOBAL_BATCH, HEAD_COMMON, LENGTHS, OPTIMIZERS, STEPS, TINY, TWO_RANKS, console, launch, logged, noise_in, weights

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

TEXTS = ["What is 3 + 4?", "3 + 4 = 7", "1 2 3 4 5 6 7 8 9 10 11 12", "7"]


def pair_rows(count: int = 64, seed: int = 11) -> list[dict]:
    """(anchor, positive) rows of 1 to 40 numbers: every batch is padded, each text to another length."""
    draw = random.Random(seed)
    rows = []
    for _ in range(count):
        numbers = [str(draw.randrange(100)) for _ in range(draw.choice(LENGTHS))]
        rows.append({"anchor": "Repeat " + " ".join(numbers), "positive": " ".join(reversed(numbers))})
    return rows


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("embed")
    (folder / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pair_rows()))
    (folder / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pair_rows(count=13, seed=4)))
    config = folder / "run.yaml"
    config.write_text(f"model_name_or_path: {TINY}\nrandom_init: true\ndataset:\n  - path: pairs.jsonl\neval_dataset:\n  - path: eval.jsonl\n")
    return config


#: The last step evaluates (``single`` and ``ep2``): their retrieval metrics are compared too, at no extra launch.
EVAL = [f"--eval_steps={STEPS}", "--eval_strategy=steps", "--per_device_eval_batch_size=4"]


@pytest.fixture(scope="module")
def single(run_file):
    return launch("embed", run_file, run_file.parent / "single", 1, *OPTIMIZERS["sgd"], *EVAL, common=HEAD_COMMON)


@pytest.fixture(scope="module")
def ep2(run_file):
    nproc, layout = TWO_RANKS["ep2"]
    return launch("embed", run_file, run_file.parent / "ep2", nproc, *OPTIMIZERS["sgd"], *EVAL, *layout, common=HEAD_COMMON)


class _Recording:
    """Stock MNRL that, on its first call, also records the loss with each half of the batch ranked against its own
    half's candidates only: what two ranks without the gather would average."""

    def __new__(cls, model):
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

        class Recorded(MultipleNegativesRankingLoss):
            per_rank = None

            def forward(self, features, labels):
                if Recorded.per_rank is None:
                    with torch.no_grad():
                        embeddings = [self.model(dict(f))["sentence_embedding"] for f in features]
                        half = embeddings[0].shape[0] // 2
                        parts = [self.compute_loss_from_embeddings([e[s] for e in embeddings], labels)
                                 for s in (slice(0, half), slice(half, None))]
                        Recorded.per_rank = float(sum(parts) / 2)
                return super().forward(features, labels)

        return Recorded(model)


@pytest.fixture(scope="module")
def stock(run_file, tmp_path_factory):
    """Stock sentence-transformers on one process: the model Halo's random_init builds (seeded, then from_config), saved
    and loaded by a stock ``Transformer`` module as the saved directory describes it, stock MNRL, stock trainer."""
    import datasets
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import AutoConfig, AutoModelForCausalLM

    from halo_core.methods.embed_model import MODALITY, OUTPUT

    folder = tmp_path_factory.mktemp("stock")
    torch.manual_seed(5)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY), dtype=torch.float32).save_pretrained(folder / "init")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TINY / name, folder / "init" / name)
    transformer = Transformer(str(folder / "init"), transformer_task="text-generation", modality_config=MODALITY, module_output_name=OUTPUT)
    model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")], device="cpu")
    args = SentenceTransformerTrainingArguments(
        output_dir=str(folder / "out"), per_device_train_batch_size=GLOBAL_BATCH, max_steps=STEPS, lr_scheduler_type="constant",
        warmup_steps=0, logging_steps=1, save_strategy="no", seed=5, max_grad_norm=1.0, bf16=False, report_to="none",
        optim="sgd", learning_rate=0.5, use_cpu=True)
    data = datasets.load_dataset("json", data_files=str(run_file.parent / "pairs.jsonl"), split="train")
    loss = _Recording(model)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=data, loss=loss)
    trainer.train()
    return [e["loss"] for e in trainer.state.log_history if "loss" in e], model, type(loss).per_rank


def test_ep2_gathers_negatives_and_equals_one_process(single, ep2, stock):
    assert len(logged(single, "loss")) == STEPS
    assert logged(ep2, "loss") == pytest.approx(logged(single, "loss"), abs=1e-5, rel=0)
    expected = weights(single)
    for key, tensor in weights(ep2).items():
        assert_close(tensor, expected[key], f"{key} after {STEPS} SGD steps at ep2", rtol=1e-4)
    # Without the gather each rank would rank its 2 anchors against its own 2 candidates: another first loss.
    _, _, per_rank = stock
    assert abs(per_rank - logged(single, "loss")[0]) > 1e-2, (per_rank, logged(single, "loss")[0])
    # FSDP2's view warning on the root unit and sentence-transformers' all_gather deprecation, both shown harmless
    # (``embed._quiet_harmless``): this launch's gradients are the ones compared above
    assert not noise_in(console(ep2).read_text())


def test_ep2_reports_the_retrieval_metrics_of_one_process(single, ep2):
    """``embed`` evaluates with sentence-transformers' ``InformationRetrievalEvaluator`` over the evaluation pairs (each
    anchor's own positive the one relevant document): every rank encodes the whole set, so EP2 gives one process's."""

    def retrieval(out):
        state = json.loads((out / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
        return [{k: v for k, v in e.items() if k.startswith("eval_retrieval_")} for e in state["log_history"] if "eval_loss" in e]

    expected = retrieval(single)
    assert len(expected) == 1 and "eval_retrieval_cosine_accuracy@1" in expected[0] and "eval_retrieval_cosine_ndcg@10" in expected[0]
    assert retrieval(ep2) == [pytest.approx(expected[0], abs=1e-5)]


def test_one_process_equals_stock_trainer(single, stock):
    losses, model, _ = stock
    assert logged(single, "loss") == pytest.approx(losses, abs=1e-5, rel=1e-6)
    saved = weights(single)
    trained = {k.removeprefix("0.model."): v for k, v in model.state_dict().items()}
    assert saved.keys() == trained.keys()
    for key, tensor in trained.items():
        assert_close(saved[key], tensor, f"{key} after {STEPS} SGD steps, Halo against stock", rtol=1e-4)


@pytest.mark.parametrize("which", ["single", "ep2"])
def test_written_directory_loads_as_the_trained_sentence_transformer(request, stock, which):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    folder = request.getfixturevalue(which)
    assert json.loads((folder / "1_Pooling" / "config.json").read_text())["pooling_mode"] == "mean"
    loaded = SentenceTransformer(str(folder), device="cpu")
    _, trained, _ = stock
    ours, theirs = loaded.encode(TEXTS, convert_to_tensor=True), trained.encode(TEXTS, convert_to_tensor=True)
    assert ours.shape == (len(TEXTS), 64)
    assert_close(ours, theirs, f"embeddings of the model written at {which}", rtol=1e-4)
    assert type(AutoModel.from_pretrained(folder)).__name__ == "Qwen3MoeModel"


@pytest.fixture(scope="module")
def dense_model(tmp_path_factory):
    """A tiny dense Llama on the tiny tokenizer: no plugin claims it, so it trains on the plain FSDP2 route."""
    from transformers import AutoConfig

    folder = tmp_path_factory.mktemp("dense") / "llama"
    shutil.copytree(TINY, folder, ignore=shutil.ignore_patterns("config.json"))
    moe = AutoConfig.from_pretrained(TINY)
    AutoConfig.for_model("llama", vocab_size=moe.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, pad_token_id=moe.pad_token_id,
                         eos_token_id=moe.eos_token_id, bos_token_id=None).save_pretrained(folder)
    return folder


def test_dense_model_under_fsdp2_equals_one_process(run_file, dense_model, tmp_path):
    """Two data-parallel ranks (FSDP2, no split) of a dense model: the negatives gathered over the world group are
    the global batch's, so losses and SGD weights are one process's; last-token pooling is what the directory records."""
    args = [*OPTIMIZERS["sgd"], f"--model_name_or_path={dense_model}", "--pooling=lasttoken"]
    one = launch("embed", run_file, tmp_path / "one", 1, *args, common=HEAD_COMMON)
    two = launch("embed", run_file, tmp_path / "two", 2, *args, common=HEAD_COMMON)
    assert logged(two, "loss") == pytest.approx(logged(one, "loss"), abs=1e-5, rel=0)
    expected = weights(one)
    for key, tensor in weights(two).items():
        assert_close(tensor, expected[key], f"{key} after {STEPS} SGD steps, dense model, FSDP2 over 2 ranks", rtol=1e-4)
    assert json.loads((two / "1_Pooling" / "config.json").read_text())["pooling_mode"] == "lasttoken"


def test_lora_at_ep2_equals_one_process_and_loads_as_a_sentence_transformer(run_file, tmp_path):
    """TRL's LoRA keys on the embedding model (attention, router and the fused experts): EP2 equals one process in
    losses and adapter weights, and ``SentenceTransformer(path)`` loads base plus adapter to the same embeddings."""
    from safetensors.torch import load_file
    from sentence_transformers import SentenceTransformer

    # No LoRA dropout (TRL's default is 0.05): its masks are drawn per rank, so no layout could equal one process.
    args = ["--optim=sgd", "--learning_rate=0.05", "--use_peft=true", "--lora_r=4", "--lora_alpha=8", "--lora_dropout=0.0",
            "--lora_target_modules=all-linear"]
    one = launch("embed", run_file, tmp_path / "one", 1, *args, common=HEAD_COMMON)
    two = launch("embed", run_file, tmp_path / "two", 2, *args, *TWO_RANKS["ep2"][1], common=HEAD_COMMON)
    assert logged(two, "loss") == pytest.approx(logged(one, "loss"), abs=1e-5, rel=0)
    expected = load_file(one / "adapter_model.safetensors")
    adapters = load_file(two / "adapter_model.safetensors")
    assert adapters.keys() == expected.keys() and any("experts" in k for k in adapters)
    for key, tensor in adapters.items():
        assert_close(tensor, expected[key], f"{key} after {STEPS} SGD steps, LoRA at ep2", rtol=1e-4)
    ours = SentenceTransformer(str(two), device="cpu").encode(TEXTS, convert_to_tensor=True)
    theirs = SentenceTransformer(str(one), device="cpu").encode(TEXTS, convert_to_tensor=True)
    assert_close(ours, theirs, "embeddings of the LoRA runs' directories", rtol=1e-4)


def _retrieval_accuracy(model, rows: list[dict]) -> float:
    """How often each anchor's nearest positive (cosine) among all the rows' positives is its own."""
    anchors = model.encode([r["anchor"] for r in rows], convert_to_tensor=True, normalize_embeddings=True)
    positives = model.encode([r["positive"] for r in rows], convert_to_tensor=True, normalize_embeddings=True)
    return (anchors @ positives.T).argmax(1).eq(torch.arange(len(rows))).float().mean().item()


def test_the_embedded_default_learns_to_retrieve_held_out_answers(tmp_path):
    """``templates/configs/tiny-embed.yaml`` on two ranks, cut to 30 steps: the loss falls and held-out questions find
    their own answer among 150 far more often than the random-init model's (about 0.02)."""
    import importlib.util

    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import AutoConfig, AutoModelForCausalLM

    from halo_core.methods.embed_model import MODALITY, OUTPUT

    spec = importlib.util.spec_from_file_location("generate", TINY.parent / "generate.py")
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    seen = {r["anchor"] for r in generate.pairs()}
    held_out = [r for r in generate.pairs(seed=99, count=180) if r["anchor"] not in seen][:150]
    out = tmp_path / "run"
    config = TINY.parents[1] / "configs" / "tiny-embed.yaml"
    result = run_halo("launch", "embed", str(config), "--nproc", "2", "--", f"--output_dir={out}", "--max_steps=30",
                      "--logging_steps=10", "--save_steps=30", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    state = json.loads((out / "checkpoint-30" / "trainer_state.json").read_text())
    losses = [e["loss"] for e in state["log_history"] if "loss" in e]
    assert len(losses) == 3 and losses[-1] < losses[0] / 2, losses

    torch.manual_seed(0)  # the config's seed: the model random_init started from
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY)).save_pretrained(tmp_path / "init")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TINY / name, tmp_path / "init" / name)
    transformer = Transformer(str(tmp_path / "init"), transformer_task="text-generation", modality_config=MODALITY, module_output_name=OUTPUT)
    start = SentenceTransformer(modules=[transformer, Pooling(64, pooling_mode="mean")], device="cpu")
    before, after = _retrieval_accuracy(start, held_out), _retrieval_accuracy(SentenceTransformer(str(out), device="cpu"), held_out)
    assert after > 0.5 and after > before + 0.3, (before, after)


def _check(run_file, tmp_path, overrides=(), rows=None, world=1):
    from halo_core.methods.embed import EmbedConfig
    from halo_core.trainers.run_checks import check_run
    from halo_core.trainers.run_config import load_run_config, parse_overrides

    if rows is not None:
        (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        overrides = [*overrides, f"--dataset={tmp_path / 'rows.jsonl'}"]
    check_run(load_run_config("embed", EmbedConfig, run_file, parse_overrides(list(overrides))), world)


@pytest.mark.parametrize(
    "overrides, rows, message",
    [
        ([], [{"query": "a", "positive": "b"}], "row 1 lacks 'anchor' (has 'query', 'positive'); loss MultipleNegativesRankingLoss reads columns (anchor, positive, [negative])"),
        (["--loss=CoSENTLoss"], None, "row 1 lacks 'sentence1', 'sentence2', 'score'"),
        (["--loss=TripletLoss"], None, "row 1 lacks 'negative'"),
        ([], [{"anchor": "a", "positive": "b", "id": 3}], "row 1 has 'id' beside the columns loss MultipleNegativesRankingLoss reads"),
        (["--loss=InfoNCE"], None, "loss: 'InfoNCE' is not a loss method 'embed' trains with; set loss to one of MultipleNegativesRankingLoss"),
        (["--matryoshka_dims=[32, 65]"], None, "matryoshka_dims: [32, 65] has 65, not a dimension in [1, 64] (the model's hidden_size"),
        (["--pooling=cls"], None, "pooling: 'cls' is not mean or lasttoken"),
    ],
)
def test_refusals_before_start(run_file, tmp_path, overrides, rows, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        _check(run_file, tmp_path, overrides, rows)
    assert "\n" not in str(caught.value)


def test_accepted_configurations_pass_the_checks(run_file, tmp_path):
    _check(run_file, tmp_path, ["--matryoshka_dims=[16, 64]", "--expert_parallel_size=2"], world=2)
    _check(run_file, tmp_path, ["--loss=CoSENTLoss"], [{"sentence1": "a", "sentence2": "b", "score": 0.5}])


def test_cli_dry_run_refuses_an_unknown_loss_in_one_line(run_file, tmp_path):
    result = run_halo("launch", "embed", str(run_file), "--nproc", "2", "--dry-run", "--", f"--output_dir={tmp_path / 'out'}", "--loss=InfoNCE")
    assert result.returncode == 2 and "loss: 'InfoNCE'" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()
