"""``templates/slurm``: its per-node launch line, run as two nodes on one machine with SLURM's variables set
(one process a node, experts split over the two), trains as one process does."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch

from launch_kit import COMMON, ROOT, launch, weights, write_run

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

NODE = ROOT / "templates" / "slurm" / "node.sh"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_from_slurm_variables_equal_one_process(tmp_path):
    config = write_run(tmp_path, "completion", "max_length: 48\n")
    args = ["--optim=sgd", "--learning_rate=0.5"]
    one = launch("sft", config, tmp_path / "one", 1, *args)
    out = tmp_path / "two"
    overrides = ["--", f"--output_dir={out}", "--per_device_train_batch_size=2", *COMMON, *args, "--expert_parallel_size=2"]
    env = {**os.environ, "METHOD": "sft", "CONFIG": str(config), "HALO": f"{sys.executable} -m halo_cli", "NPROC": "1",
           "HALO_RDZV_ENDPOINT": f"localhost:{_free_port()}", "SLURM_NNODES": "2"}
    nodes = [subprocess.Popen(["bash", str(NODE), *overrides], env={**env, "SLURM_NODEID": str(rank)}, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    for node in nodes:
        output, _ = node.communicate(timeout=600)
        assert node.returncode == 0, output[-3000:]
    reference, trained = weights(one), weights(out)
    assert reference.keys() == trained.keys()
    for key in reference:
        torch.testing.assert_close(trained[key], reference[key], rtol=1e-4, atol=1e-5, msg=lambda m: f"{key}: {m}")


def test_the_batch_script_hands_each_node_slurms_variables():
    """The sbatch file runs node.sh once a node through srun, with the rendezvous on the allocation's first node."""
    script = (ROOT / "templates" / "slurm" / "halo.sbatch").read_text()
    assert 'srun --ntasks-per-node=1' in script and 'node.sh' in script and "scontrol show hostnames" in script
    line = NODE.read_text()
    assert '--nnodes "$SLURM_NNODES" --node-rank "$SLURM_NODEID"' in line and '--rdzv-endpoint "$HALO_RDZV_ENDPOINT"' in line
