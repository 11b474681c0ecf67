"""Layouts of the tiny Qwen3-MoE on eight gloo ranks equal one process (the kit's checks, world 8).

The plugin kits run every split and pair of splits at world 4. Here, in one spawn of eight
processes: the expert-parallel sweep of issue 8 (EP1 = FSDP2 alone, EP2, EP4, EP8, data
parallelism filling the rest), every composition of three splits at degree 2 (EP x CP x TP
with Ulysses and with ring attention, EP x ETP x TP, EP x ETP x CP, ETP x CP x TP), and
each split at its widest beside another (TP 4, ring CP 4, ETP 4).
"""

import random

import pytest

from halo_core.parallel.config import ParallelConfig as P
from halo_core.testing.equivalence import run_layouts

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

WORLD8_LAYOUTS = [
    P(), P(ep=2), P(ep=4), P(ep=8),
    P(ep=2, cp=2, tp=2), P(ep=2, cp=2, tp=2, cp_attention="ring"), P(ep=2, etp=2, tp=2), P(ep=2, etp=2, cp=2), P(etp=2, cp=2, tp=2),
    P(ep=2, tp=4), P(cp=4, tp=2, cp_attention="ring"), P(ep=2, etp=4),
]


def test_every_layout_uses_eight_ranks():
    for layout in WORLD8_LAYOUTS:
        dims = layout.resolve(8)
        assert dims.world == 8 and (layout == P() or dims.ep * dims.etp * dims.cp * dims.tp > 1)


def test_world8_layouts_match_one_process():
    run_layouts("qwen3-moe", "qwen3_moe", 8, WORLD8_LAYOUTS, random.SystemRandom().randrange(2**31))
