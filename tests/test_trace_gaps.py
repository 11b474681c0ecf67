"""bench/trace_gaps.py on a hand-made timeline: the window split into compute, exposed communication
and idle time, and each idle gap charged to the host phase that ended it."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "trace_gaps.py"


def _load():
    spec = importlib.util.spec_from_file_location("trace_gaps", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _event(cat, name, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": 1, "args": args}


def test_a_step_is_split_and_its_gaps_charged_to_the_host_phase_that_ended_them():
    events = [
        _event("user_annotation", "ProfilerStep#1", 0, 1000),
        _event("cpu_op", "## Call CompiledFxGraph abc ##", 0, 20),
        _event("cuda_runtime", "cudaLaunchKernel", 5, 5, correlation=1),
        _event("kernel", "triton_poi_fused_mul_0", 0, 300, correlation=1),
        _event("kernel", "ncclDevKernel_SendRecv(args)", 200, 300, correlation=2),  # 200 us of it after compute ends
        _event("cuda_runtime", "cudaStreamSynchronize", 510, 40),  # the host read something back during the gap
        _event("cpu_op", "FSDP::pre_forward", 580, 20),
        _event("cuda_runtime", "cudaLaunchKernel", 590, 5, correlation=3),
        _event("kernel", "nvjet_gemm", 600, 200, correlation=3),
    ]
    report = _load().summarise(events, profiled_steps=2).splitlines()
    assert report[0] == "window 1.0 ms per step (1 steps): compute 0.5, communication not under compute 0.2, idle 0.3", report
    assert report[1].split() == "all-to-all (SendRecv) 0.3 ms per step, 0.2 not under compute, 1 kernels".split(), report
    gaps = report[report.index("idle gaps (>= 5 us) by what the host was in when the GPU got work again:") + 1 :]
    assert gaps[0].split() == "0.20 ms per step in 1.0 gaps after the window's last kernel".split(), gaps
    assert gaps[1].split() == "0.10 ms per step in 1.0 gaps after a read-back: FSDP::pre_forward".split(), gaps
    assert gaps[2] == "host synchronisations: 1 per step, 0.0 ms per step waiting", gaps
