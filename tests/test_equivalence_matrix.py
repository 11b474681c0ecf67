"""Every layout a method declares gives the same losses and post-step weights as one process.

One matrix over (method, layout): each split the method declares (``Method.splits``) alone on two ranks (and the layouts
a row adds: LoRA's data parallelism and EP x TP on four ranks), `halo launch`
over gloo in float32 with SGD on rows of uneven lengths (every batch padded), against the method's one-process run on
the same global batch (``launch_kit.MATRIX`` says which metrics each method logs; ``assert_matches_single`` holds them
within 1e-5 and the weights within 1e-4 relative). The one-process run is shared with the method's own tests
(``method_runs``, session-scoped). What is particular to a method (its formula, stock trainer, refusals) stays in its
own file; SFT's layouts (compositions, ring attention, AdamW) are tests/test_launch_layouts.py's.
"""

from __future__ import annotations

import pytest

from launch_kit import LAYOUTS, MATRIX, OPTIMIZERS, TWO_RANKS, assert_matches_single, assert_planned, launched, method_layouts, split_of

CELLS = [(method, name) for method in MATRIX for name in method_layouts(method)]


def test_the_matrix_holds_every_split_each_method_declares():
    """Guard on the matrix itself: a split a method declares has a cell; one it does not declare has none."""
    from halo_core.trainers.method import get_method

    assert {split_of(name) for name in TWO_RANKS} == {"ep", "tp", "cp", "etp"}
    for method in MATRIX:
        alone = {name for m, name in CELLS if m == method and name in TWO_RANKS}
        assert {split_of(name) for name in alone} == set(get_method(launched(method)).splits), method


@pytest.mark.slow
@pytest.mark.parametrize("method, name", CELLS, ids=[f"{method}-{name}" for method, name in CELLS])
def test_layout_logs_the_single_process_losses_and_ends_on_its_weights(method_runs, method, name):
    nproc, layout = LAYOUTS[name]
    spec = MATRIX[method]
    out = method_runs.layout(method, name)
    if spec.planned:  # halo plan counts the head the run holds (a score head): its bytes are the real ones, by rank
        assert_planned(launched(method), method_runs.config(method), out, nproc, [*OPTIMIZERS["sgd"], *spec.args, *layout],
                       common=list(spec.common))
    assert_matches_single(method, out, method_runs.single(method), name)
