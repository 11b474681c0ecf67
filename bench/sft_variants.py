"""What a variant name of ``sft_vs_trl.py`` asks for, and the environment and folder its processes run in.

Parsing refuses a typo or a combination that means nothing before any row runs, so a lease is
not spent on rows that end in an error after the first ones ran. Only the standard library:
tests load this file alone.
"""

from __future__ import annotations

import os
from pathlib import Path


#: Options only the rows of a method with a frozen reference take (``dpo_vs_trl.py``, ``methods_vs_trl.py``).
DPO_OPTIONS = {"precompute"}
#: The methods that keep a frozen reference policy, so take ``DPO_OPTIONS``.
REFERENCE_METHODS = {"dpo", "kto"}


def parse(variant: str, method: str = "sft") -> dict:
    """A variant's settings; ``method`` is the row's (``sft``, ``dpo``, ``kto``, ...), which decides the options it takes."""
    base, *options = variant.split("+")
    environment = dict(o[len("env."):].split("=", 1) for o in options if o.startswith("env.") and "=" in o)
    trees = [o[len("tree."):] for o in options if o.startswith("tree.")]
    options = [o for o in options if not (o.startswith("env.") and "=" in o) and not o.startswith("tree.")]
    budgets = [o for o in options if o.startswith("ab") and o[2:].isdigit()]
    units = [o for o in options if o.startswith("unit") and o[4:].isdigit()]
    options = [o for o in options if o not in budgets + units]
    known = {"liger", "liger-moe", "nockpt", "fsdp", "compile", "tf-ep", "kahan", "replicated", "overlap", "cudnn"} | (DPO_OPTIONS if method in REFERENCE_METHODS else set())
    if budgets and "compile" not in options:
        raise SystemExit(f"{variant!r}: +abNN (activation memory budget) needs +compile")
    if set(options) - known or "" in trees or len(trees) > 1 or not (base in ("trl-fp32-autocast", "trl-bf16") or (base.startswith("halo-ep") and base[7:].isdigit())):
        raise SystemExit(f"unknown variant {variant!r}: see --help")
    if ({"liger-moe", "compile", "kahan", "replicated", "overlap", "cudnn"} & set(options) or units or trees) and not base.startswith("halo"):
        raise SystemExit(f"{variant!r}: +liger-moe, +compile, +kahan, +replicated, +overlap, +cudnn, +unitN and +tree.NAME are Halo options")
    if "overlap" in options and "replicated" not in options:
        raise SystemExit(f"{variant!r}: +overlap (overlap_optimizer_step) needs +replicated (shard_parameters: false)")
    if units and "replicated" in options:
        raise SystemExit(f"{variant!r}: +unitN groups FSDP units, which +replicated has none of")
    if "tf-ep" in options and (base.startswith("halo") or "fsdp" in options):
        raise SystemExit(f"{variant!r}: +tf-ep is a stock-TRL option (it brings its own FSDP2)")
    return {
        "halo": base.startswith("halo"), "ep": int(base[7:]) if base.startswith("halo") else 1,
        "fp32_weights": base == "trl-fp32-autocast", "liger": "liger" in options or "liger-moe" in options,
        "liger_moe": "liger-moe" in options, "checkpointing": "nockpt" not in options, "fsdp": "fsdp" in options,
        "compile": "compile" in options, "tf_ep": "tf-ep" in options, "kahan": "kahan" in options, "activation_budget": int(budgets[0][2:]) / 100 if budgets else None,
        "unit_layers": int(units[0][4:]) if units else None, "replicated": "replicated" in options,
        "overlap": "overlap" in options, "cudnn": "cudnn" in options,
        "environment": environment, "tree": trees[0] if trees else None, "precompute": "precompute" in options,
    }


def row_process(spec: dict, trees: dict[str, Path]) -> tuple[dict, Path | None]:
    """The environment and working directory of a row's processes. A ``+tree.NAME`` row starts in that
    checkout with it first on the path: ``python -m`` puts the working directory ahead of everything,
    so the checkout's halo_core is imported, not the installed one."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **spec["environment"]}
    if spec["tree"] is None:
        return env, None
    if spec["tree"] not in trees:
        raise SystemExit(f"+tree.{spec['tree']}: no checkout of that name; add --tree {spec['tree']}=DIR")
    tree = trees[spec["tree"]].resolve()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH", "")) if p)
    return env, tree
