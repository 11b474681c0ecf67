"""Each of Halo's methods against its stock trainer on the same model, sequences and settings, in one invocation.

    python3 bench/methods_vs_trl.py --out methods.json                     # every method, stock row then Halo row
    python3 bench/methods_vs_trl.py --rows kto:trl-bf16+nockpt kto:halo-ep1+compile+nockpt

A row is ``METHOD:VARIANT``; the variants are ``sft_vs_trl.py``'s (``sft_variants``; ``+precompute`` for the
methods with a reference, as in ``dpo_vs_trl.py``). The rows run in the order given, each in its own processes,
the whole list once per ``--repeats``. Stock rows, one per method:

  dpo       ``trl.DPOTrainer`` (``dpo_vs_trl.dpo_worker``); its reference a second copy loaded from the policy's folder
  kto       ``trl.KTOTrainer``; its reference likewise
  reward    ``trl.RewardTrainer`` on ``AutoModelForSequenceClassification`` (``num_labels`` 1)
  classify  ``transformers.Trainer`` on ``AutoModelForSequenceClassification`` (``num_labels`` 2), texts tokenised
            with truncation at ``--seq`` and padded by ``DataCollatorWithPadding``, as ``halo launch classify`` does
  distill   ``trl.experimental.gkd.GKDTrainer`` at ``lmbda`` 0 (the fixed rows only, no generation) and ``beta`` 0.5; the
            student the config at seed 0 (as reward's), the teacher the same config at seed 1, saved once and loaded
            with ``from_pretrained`` in bf16 (the Halo row's ``teacher_model_name_or_path``)
  smpo      none: Halo's own loss. Its Halo row is set beside stock DPO's (the nearest stock method: the same
            pairs and DPOTrainer's data path, but no reference)

Halo rows are ``halo launch METHOD`` over a YAML (``sft_halo_row.halo_command``) and report the trainer's own
logged tokens/s, log to log; stock rows time each optimizer step (CUDA-synced callback). ``--steps`` steps, the
first 5 dropped, the median kept; peak memory is ``max_memory_allocated``.

What one step trains on (every sequence exactly ``--seq`` tokens, checked before any row runs; tokens/s counts
the trained sequences, so the methods' figures compare):

  dpo, smpo   one pair (batch 1): a prompt of about ``--prompt`` tokens, chosen and rejected completions cut at
              ``max_length``: 2 x seq tokens
  kto         two rows (batch 2, the least KTO's KL term takes), one desirable and one not, each prompt +
              completion cut at ``max_length``: 2 x seq tokens. Each row also has a KL twin (its prompt with the
              other row's completion, also seq tokens), which the policy (no gradient) and the reference run
              forward; those 2 x seq tokens are not counted
  reward      one pair (batch 1) of texts of exactly seq - 1 tokens, TRL appending EOS: 2 x seq tokens
  classify    two texts (batch 2), cut at ``max_length``: 2 x seq tokens
  distill     one row (batch 1) in GKD's ``messages`` format, a user prompt of about ``--prompt`` tokens and the
              assistant's completion, the chat-templated whole exactly seq tokens (so GKD's collator cuts nothing):
              seq tokens. The loss covers the completion's tokens; the student and the teacher run all seq of them

MFU counts the policy's forward and backward, plus the forwards a step runs without gradients (the reference's;
KTO's KL twins; distill's teacher), over the bf16 matmul rate measured at the start; reward and classify have no LM head.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import string
from argparse import Namespace
from pathlib import Path

import torch

from dpo_vs_trl import check_pairs, dpo_worker, write_pairs
from sft_checks import start_measuring
from sft_report import flops_per_token, print_reports, write
from sft_rows import run_variant
from sft_trl_row import step_timer, write_row
from sft_variants import parse, row_process
from sft_workload import DEFAULT_CONFIG, HERE, TOKENIZER, prepare, saved_model, trainer_fields

ENTRY = HERE / "methods_vs_trl.py"

#: Per method: examples a step (batch), sequences of --seq tokens an example, and the keys of its own config
#: over the shared ``trainer_fields`` (None: a key its config lacks). SMPO's stock peer is DPO's stock row.
METHODS = {
    "dpo": {"batch": 1, "sequences": 2, "fields": {}},
    "smpo": {"batch": 1, "sequences": 2, "fields": {}},
    "kto": {"batch": 2, "sequences": 1, "fields": {}},
    "reward": {"batch": 1, "sequences": 2, "fields": {"router_aux_loss_coef": None}},
    "classify": {"batch": 2, "sequences": 1, "fields": {"router_aux_loss_coef": None, "num_labels": 2}},
    "distill": {"batch": 1, "sequences": 1, "fields": {"lmbda": 0.0, "beta": 0.5}},
}
STOCK_PEER = {"smpo": "dpo"}
#: distill's teacher: the student's config at this seed (the student's is 0), in bf16, in the method's folder.
TEACHER_SEED = 1
TEACHER = "teacher-bfloat16"
DEFAULT_ROWS = [f"{m}:{v}" for m in ("dpo", "kto", "reward", "classify", "distill") for v in ("trl-bf16+nockpt", "halo-ep1+compile+nockpt")]
DEFAULT_ROWS.append("smpo:halo-ep1+compile+nockpt")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", default=DEFAULT_ROWS, metavar="METHOD:VARIANT")
    parser.add_argument("--seq", type=int, default=4096, help="tokens of every sequence")
    parser.add_argument("--prompt", type=int, default=1024, help="about this many of a DPO/SMPO/KTO sequence's are the prompt's")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--timeout", type=int, default=300, help="seconds a row may take")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the model's config.json (random init)")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--losses", action="store_true", help="log every step in every row")
    parser.add_argument("--halo-log-every", type=int, default=5, help="every row's logging_steps (Halo's throughput is log to log)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/halo-methods-bench"))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--method", choices=sorted(METHODS), help=argparse.SUPPRESS)  # the worker's
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)  # the worker's: the orchestrator takes METHODS'
    parser.set_defaults(packing=False, profile=None, memory=False, nproc=1, tree={})
    return parser


def split_row(row: str) -> tuple[str, str]:
    method, _, variant = row.partition(":")
    if method not in METHODS or not variant:
        raise SystemExit(f"row {row!r}: write METHOD:VARIANT, METHOD one of {', '.join(METHODS)}")
    return method, variant


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with every row checked before anything runs."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.worker:
        return args
    if not 0 < args.prompt < args.seq:
        parser.error("--prompt must leave room for a completion in --seq")
    args.plan = [split_row(row) for row in args.rows]
    for method, variant in args.plan:
        spec = parse(variant, method)
        if spec["tf_ep"]:
            parser.error(f"{variant!r}: +tf-ep is an SFT row (sft_vs_trl.py)")
        if method in STOCK_PEER and not spec["halo"]:
            parser.error(f"{method}:{variant}: {method} has no stock trainer; its Halo row is set beside stock {STOCK_PEER[method]}'s")
        row_process(spec, args.tree)
    return args


def method_args(args, method: str) -> Namespace:
    """The arguments a method's rows run with: the shared ones and its batch."""
    return Namespace(**{**vars(args), "batch": METHODS[method]["batch"], "method": method})


def tokens_per_step(method: str, args) -> int:
    return METHODS[method]["sequences"] * args.seq * args.batch


def halo_fields(method: str, workdir: Path) -> dict:
    """A Halo row's own keys in its YAML (``METHODS``' and, for distill, the teacher's folder in ``workdir``)."""
    fields = dict(METHODS[method]["fields"])
    if method == "distill":
        fields["teacher_model_name_or_path"] = str((workdir / TEACHER).resolve())
    return fields


# -- the data ------------------------------------------------------------------------------------


def random_text(draw: random.Random, n: int) -> str:
    return "".join(draw.choice(string.ascii_lowercase + " ") for _ in range(n))


def exact_text(tokenizer, draw: random.Random, n: int) -> str:
    """Random text of exactly ``n`` tokens: ``n`` tokens' worth decoded, then trimmed or extended a character at a time."""
    text = tokenizer.decode(tokenizer(random_text(draw, 2 * n))["input_ids"][:n])
    for _ in range(200):
        count = len(tokenizer(text)["input_ids"])
        if count == n:
            return text
        text = text[:-1] if count > n else text + draw.choice(string.ascii_lowercase)
    raise SystemExit(f"no random text of exactly {n} tokens found")


def chat_tokens(tokenizer, messages: list[dict]) -> int:
    """A conversation's tokens as GKD's collator counts them (the chat template, then no special tokens added)."""
    return len(tokenizer(tokenizer.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"])


def exact_chat(tokenizer, draw: random.Random, prompt: int, n: int) -> list[dict]:
    """A user prompt of ``prompt`` random characters and an assistant completion, the templated whole exactly ``n`` tokens."""
    user = {"role": "user", "content": random_text(draw, prompt)}
    chat = lambda text: [user, {"role": "assistant", "content": text}]  # noqa: E731
    overhead = chat_tokens(tokenizer, chat(""))
    if overhead >= n:
        raise SystemExit(f"a prompt of {prompt} characters is {overhead} tokens in the chat template: no room for a completion in {n}")
    text = exact_text(tokenizer, draw, n - overhead)
    for _ in range(200):
        count = chat_tokens(tokenizer, chat(text))
        if count == n:
            return chat(text)
        text = text[:-1] if count > n else text + draw.choice(string.ascii_lowercase)
    raise SystemExit(f"no conversation of exactly {n} tokens found")


def write_data(method: str, path: Path, rows: int, args, tokenizer) -> None:
    """The rows a method trains on (module docstring): long enough to be cut at exactly ``seq`` tokens, or exact."""
    if method in ("dpo", "smpo"):
        return write_pairs(path, rows, args.prompt, args.seq)
    draw = random.Random(0)
    with open(path, "w") as f:
        for i in range(rows):
            if method == "kto":
                row = {"prompt": random_text(draw, args.prompt), "completion": random_text(draw, args.seq), "label": i % 2 == 0}
            elif method == "reward":  # TRL drops longer pairs rather than cutting them: exact, EOS included
                row = {"chosen": exact_text(tokenizer, draw, args.seq - 1), "rejected": exact_text(tokenizer, draw, args.seq - 1)}
            elif method == "distill":  # GKD's collator keeps a longer row's last max_length tokens (the prompt cut first): exact
                row = {"messages": exact_chat(tokenizer, draw, args.prompt, args.seq)}
            else:
                row = {"text": random_text(draw, 2 * args.seq), "label": i % 2}
            f.write(json.dumps(row) + "\n")


def check_data(method: str, data: Path, tokenizer, seq: int, batch: int) -> dict:
    """Every sequence a step trains on is exactly ``seq`` tokens as the trainer cuts it; returns the shape."""
    if method in ("dpo", "smpo"):
        return check_pairs(data, TOKENIZER, seq)
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    length = lambda text: len(tokenizer(text)["input_ids"])  # noqa: E731
    if method == "kto":
        prompts = [length(r["prompt"]) for r in rows]
        # each row and its KL twin (the completion of the row before it in its batch): both cut at seq
        twins = [rows[i - 1 if i % batch else i + batch - 1]["completion"] for i in range(len(rows) - len(rows) % batch)]
        shortest = min(min(length(r["prompt"] + r["completion"]) for r in rows), min(length(r["prompt"] + t) for r, t in zip(rows, twins)))
        if not max(prompts) < seq <= shortest:
            raise SystemExit(f"kto rows tokenize to prompts of up to {max(prompts)} and sequences of {shortest} tokens: not every one would be {seq}")
        return {"prompt_tokens_min": min(prompts), "prompt_tokens_max": max(prompts), "sequence_tokens": seq, "kl_twins": True}
    if method == "reward":
        lengths = {length(r[k] + tokenizer.eos_token) for r in rows for k in ("chosen", "rejected")}
        if lengths != {seq}:
            raise SystemExit(f"reward pairs tokenize to {sorted(lengths)} tokens with EOS, not {seq}")
        return {"sequence_tokens": seq, "eos_included": True}
    if method == "distill":  # GKD's own collator (Halo's RightPadded wraps the same one): one row, as a step of batch 1 sees it
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        from trl.experimental.utils import DataCollatorForChatML

        collator = DataCollatorForChatML(tokenizer=tokenizer, max_length=seq)
        prompts = []
        for r in rows:
            batch = collator([r])
            completion = int((batch["labels"] != -100).sum())
            if chat_tokens(tokenizer, r["messages"]) != seq or batch["input_ids"].shape[1] != seq or not batch["attention_mask"].all() or not completion:
                raise SystemExit(f"a distill row is {chat_tokens(tokenizer, r['messages'])} tokens in the chat template "
                                 f"({completion} of them completion): not exactly {seq}")
            prompts.append(seq - completion)
        return {"prompt_tokens_min": min(prompts), "prompt_tokens_max": max(prompts), "sequence_tokens": seq, "format": "messages"}
    shortest = min(length(r["text"]) for r in rows)
    if shortest < seq:
        raise SystemExit(f"a classify text is {shortest} tokens, under {seq}: it would not be cut at {seq}")
    return {"sequence_tokens": seq, "labels": sorted({r["label"] for r in rows})}


def prepare_methods(args) -> dict:
    """Per method a folder (model, data) under ``--workdir``; stock DPO/KTO rows' weights saved once, shared."""
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)  # the one every model folder gets (sft_workload.prepare)
    shapes = {}
    for method in dict.fromkeys(m for m, _ in args.plan):
        folder = args.workdir / method
        folder.mkdir(parents=True, exist_ok=True)
        margs = method_args(args, method)
        write_data(method, folder / "rows.jsonl", args.steps * margs.batch * args.nproc + 8, margs, tokenizer)
        prepare(folder, args.config, args.seq, 0, folder / "rows.jsonl")
        shapes[method] = check_data(method, folder / "data.jsonl", tokenizer, args.seq, margs.batch)
    stock = [(m, parse(v, m)) for m, v in args.plan if m in ("dpo", "kto") and not parse(v, m)["halo"]]
    if stock:  # TRL builds the reference from the policy's folder: load the initialisation from disk, saved once
        config = AutoConfig.from_pretrained(args.workdir / stock[0][0] / "model")
        for dtype in {torch.float32 if spec["fp32_weights"] else torch.bfloat16 for _, spec in stock}:
            shared = saved_model(args.workdir, config, dtype)
            for method in {m for m, _ in stock}:
                link = args.workdir / method / shared.name
                if not link.exists():
                    link.symlink_to(shared.resolve())
    if "distill" in shapes:  # both distill rows read the teacher from disk
        saved_teacher(args.workdir / "distill", AutoConfig.from_pretrained(args.workdir / "distill" / "model"))
    return shapes


def saved_teacher(workdir: Path, config) -> Path:
    """distill's teacher: ``config`` at ``TEACHER_SEED``, bf16, saved once to ``workdir / TEACHER`` (as ``saved_model`` saves the student's)."""
    folder = workdir / TEACHER
    if not (folder / "config.json").exists():
        from transformers import AutoModelForCausalLM

        torch.manual_seed(TEACHER_SEED)
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        model.save_pretrained(folder)
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return folder


# -- the stock rows ------------------------------------------------------------------------------


def stock_fields(method: str, spec: dict, args, workdir: Path, variant: str) -> dict:
    """The shared trainer fields with the method's own (``METHODS``), for its stock config class."""
    fields = trainer_fields(spec, args, workdir / "out" / variant)
    fields.pop("disable_tqdm")
    fields["logging_steps"] = 1 if args.losses else args.halo_log_every
    if not torch.cuda.is_available():
        fields["use_cpu"] = True
    for key, value in METHODS[method]["fields"].items():
        fields.pop(key) if value is None else fields.__setitem__(key, value)
    return fields


def stock_worker(variant: str, args, workdir: Path) -> None:
    """A stock row of ``args.method`` (module docstring): train, time each step, write the row."""
    method = args.method
    if method == "dpo":
        return dpo_worker(variant, args, workdir)
    import datasets
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    spec = parse(variant, method)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float32 if spec["fp32_weights"] else torch.bfloat16
    data = datasets.load_dataset("json", data_files=str(workdir / "data.jsonl"), split="train")
    tokenizer = AutoTokenizer.from_pretrained(workdir / "model")
    config = AutoConfig.from_pretrained(workdir / "model")
    fields = stock_fields(method, spec, args, workdir, variant)
    timer = step_timer(variant, args, workdir, 0)
    if method == "kto":
        from trl import KTOConfig, KTOTrainer

        model = AutoModelForCausalLM.from_pretrained(saved_model(workdir, config, dtype), dtype=dtype, attn_implementation="sdpa", device_map=device)
        trainer = KTOTrainer(model=model, args=KTOConfig(**fields), train_dataset=data, processing_class=tokenizer, callbacks=[timer])
    elif method == "distill":  # the student from the config at seed 0 (as reward's); the teacher from its folder, bf16
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        from trl.experimental.gkd import GKDConfig, GKDTrainer

        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
        teacher = AutoModelForCausalLM.from_pretrained(workdir / TEACHER, dtype=torch.bfloat16, attn_implementation="sdpa", device_map=device)
        trainer = GKDTrainer(model=model, teacher_model=teacher, args=GKDConfig(**fields), train_dataset=data, processing_class=tokenizer,
                             callbacks=[timer])
    else:  # reward, classify: the whole model from the config at seed 0, as Halo's random_init draws it
        config.num_labels = fields.pop("num_labels", 1)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        config.pad_token_id = tokenizer.pad_token_id  # the head reads each row's last non-pad token
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForSequenceClassification.from_config(config, dtype=dtype, attn_implementation="sdpa")
        if method == "reward":
            from trl import RewardConfig, RewardTrainer

            trainer = RewardTrainer(model=model, args=RewardConfig(**fields), train_dataset=data, processing_class=tokenizer, callbacks=[timer])
        else:
            from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

            length = fields.pop("max_length")
            data = data.map(lambda rows: tokenizer(rows["text"], truncation=True, max_length=length), batched=True, remove_columns=["text"])
            trainer = Trainer(model=model, args=TrainingArguments(**fields), train_dataset=data, processing_class=tokenizer,
                              data_collator=DataCollatorWithPadding(tokenizer), callbacks=[timer])
    trainer.train()
    write_row(variant, timer, trainer, tokens_per_step(method, args), workdir)


# -- the figures ---------------------------------------------------------------------------------


def flops_per_trained_token(method: str, spec: dict, config: dict, seq: int) -> float:
    """``sft_report.flops_per_token`` (forward and backward, LM head included), for what a method's step runs."""
    train = flops_per_token(config, seq)
    if method in ("reward", "classify"):  # a score head of a few outputs instead of the LM head
        return train - 6 * config["hidden_size"] * config["vocab_size"]
    forward = train / 3
    if method == "dpo":
        return train + (0 if spec["precompute"] else forward)  # the reference on the pair
    if method == "kto":  # the policy on the KL twins (no gradient), the reference on the rows and the twins
        return train + forward + (0 if spec["precompute"] else 2 * forward)
    if method == "distill":  # the teacher (the student's config) on the row
        return train + forward
    return train


def with_method_mfu(row: dict, config: dict, rate: float) -> dict:
    spec = parse(row["variant"], row["method"])
    row["reference_in_step"] = row["method"] in ("dpo", "kto") and not spec["precompute"]
    if row["method"] == "distill":
        row["teacher_in_step"] = True
    if "tokens_per_s" in row:
        row["mfu"] = round(flops_per_trained_token(row["method"], spec, config, row["seq"]) * row["tokens_per_s"] / rate, 4)
    return row


def ratios_to_stock(results: list[dict]) -> dict[int, tuple[float, str]]:
    """Each timed row's tokens/s over the fastest stock row (median over its repeats) of its method (SMPO: of DPO)
    with the same reference mode, and that stock row's name, by the row's index in ``results``."""
    rates: dict[tuple[str, str], list[int]] = {}
    for r in results:
        if "tokens_per_s" in r:
            rates.setdefault((r["method"], r["variant"]), []).append(r["tokens_per_s"])
    stock: dict[tuple[str, bool], tuple[float, str]] = {}
    for (method, variant), seen in rates.items():
        spec = parse(variant, method)
        key = (method, spec["precompute"])
        if not spec["halo"] and statistics.median(seen) > stock.get(key, (0.0, ""))[0]:
            stock[key] = (statistics.median(seen), f"{method}:{variant}")
    ratios = {}
    for i, r in enumerate(results):
        if "tokens_per_s" in r:
            rate, name = stock.get((STOCK_PEER.get(r["method"], r["method"]), parse(r["variant"], r["method"])["precompute"]), (0.0, "none"))
            ratios[i] = (r["tokens_per_s"] / rate if rate else float("nan"), name)
    return ratios


def print_methods_summary(results: list[dict], workdir: Path) -> None:
    ratios = ratios_to_stock(results)
    print(f"\n{'row':42} {'tokens/s/GPU':>12} {'s/step':>7} {'peak GiB':>9} {'MFU':>6} {'x stock':>7}  over")
    for i, r in enumerate(results):
        if i in ratios:
            print(f"{r['method'] + ':' + r['variant']:42} {r['tokens_per_s']:>12} {r['median_step_s']:>7} {r['peak_gib']:>9} "
                  f"{r['mfu']:>6.3f} {ratios[i][0]:>7.2f}  {ratios[i][1]}")
    print("x stock: over the fastest stock row of the method (smpo: of dpo) with the same reference mode")
    print_reports(results, workdir, None)


def main() -> None:
    args = parse_args()
    if args.worker:
        return stock_worker(args.worker, args, args.workdir)
    shapes = prepare_methods(args)
    print(f"workload: {json.dumps(shapes)}", flush=True)
    rate, config, checks = start_measuring(args.config, list(dict.fromkeys(v for _, v in args.plan)), None)
    results = []
    for repeat in range(args.repeats):
        for method, variant in args.plan:
            margs = method_args(args, method)
            row = run_variant(variant, margs, args.workdir / method, entry=ENTRY, method=method, sequences=METHODS[method]["sequences"],
                              fields=halo_fields(method, args.workdir / method), worker_args=("--method", method))
            row = with_method_mfu({"repeat": repeat, "method": method, "nproc": args.nproc, "seq": args.seq, "batch": margs.batch,
                                   "tokens_per_step": tokens_per_step(method, margs), **row}, config, rate)
            print(json.dumps(row), flush=True)
            results.append(row)
            if args.out:  # after every row, so a run cut short keeps what it measured
                write(args.out, rate, {**checks, "workload": shapes}, results)
    print_methods_summary(results, args.workdir)


if __name__ == "__main__":
    main()
