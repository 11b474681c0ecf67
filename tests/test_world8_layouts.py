"""Every layout of the tiny Qwen3-MoE on eight gloo ranks equals one process (the kit's checks, world 8).

The plugin kits run worlds 2 and 4; here every valid combination of ep, etp, cp and tp
whose product of degrees needs eight ranks or fewer (data parallelism filling the rest)
runs in one spawn of eight processes, including EP x CP x TP and EP x ETP x TP, and ring
attention wherever CP meets TP.
"""

import itertools
import random

from halo_core.errors import LayoutError
from halo_core.parallel.config import ParallelConfig
from halo_core.testing.equivalence import run_layouts
from halo_core.tiny import tiny_config

WORLD = 8


def world8_layouts() -> list[ParallelConfig]:
    config = tiny_config("qwen3_moe")
    layouts = []
    for ep, etp, cp, tp in itertools.product((1, 2, 4, 8), repeat=4):
        layout = ParallelConfig(ep=ep, etp=etp, cp=cp, tp=tp)
        try:
            layout.resolve(WORLD)
        except LayoutError:
            continue
        heads_fit = config.num_attention_heads % (cp * tp) == 0
        # grouped_mm needs rows of 16 bytes: four float32 columns of the tiny intermediate size (16) per ETP rank
        slice_fits = config.moe_intermediate_size % etp == 0 and config.moe_intermediate_size // etp >= 4
        if heads_fit and config.num_experts % ep == 0 and slice_fits and ep * etp * cp * tp > 1:
            layouts.append(layout)
        if cp > 1 and tp > 1 and config.num_attention_heads % tp == 0:  # ring keeps the heads: TP alone splits them
            layouts.append(ParallelConfig(ep=ep, etp=etp, cp=cp, tp=tp, cp_attention="ring"))
    return layouts


def test_the_layout_list_covers_the_compositions():
    degrees = {(c.ep, c.etp, c.cp, c.tp, c.cp_attention) for c in world8_layouts()}
    expected = {(8, 1, 1, 1), (2, 1, 2, 2), (2, 2, 1, 2), (2, 2, 2, 1), (1, 1, 1, 4), (1, 4, 1, 2), (4, 2, 1, 1)}
    assert {(*d, "ulysses") for d in expected} | {(2, 1, 2, 2, "ring"), (1, 1, 4, 2, "ring")} <= degrees


def test_every_world8_layout_matches_one_process():
    run_layouts("qwen3-moe", "qwen3_moe", WORLD, world8_layouts(), random.SystemRandom().randrange(2**31))
