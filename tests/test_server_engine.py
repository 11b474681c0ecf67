"""Server rollout engines against the test engine server (``halo_core.testing.engine_server``, a Hugging Face model
in its own process): weight syncs leave the server bit-identical to the trainer, the sparse sync sends exactly the
changed elements, completions parse in both dialects, and faults are reported (malformed replies, raw log-probs,
a server that dies mid-run: the run stops with a checkpoint and resumes)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from halo_core.rl.engines import SamplingParams
from halo_core.rl.server_engine import EngineError, ServerEngine, get, post
from launch_kit import TINY, saved_tiny_model, weights, write_run

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

TESTS = Path(__file__).resolve().parent


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return saved_tiny_model(tmp_path_factory.mktemp("served"))


class Servers:
    """Test servers started on free ports, stopped at the end of the test."""

    def __init__(self, model_dir):
        self.model_dir, self.procs = model_dir, []

    def start(self, *args: str) -> str:
        port = _port()
        self.procs.append(subprocess.Popen([sys.executable, "-m", "halo_core.testing.engine_server", "--model", str(self.model_dir),
                                            "--port", str(port), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                get(url, "/health", timeout=1.0)
                return url
            except EngineError:
                time.sleep(0.1)
        raise RuntimeError(f"test server {url} did not start")

    def stop(self):
        for proc in self.procs:
            proc.kill()
            proc.wait()


class Shared(Servers):
    """Plain test servers the module's tests share by name, each started on first use (a start costs seconds of the
    suite). A test that syncs weights into one begins with a full sync, as every run does at start-up; ``pristine``
    is never synced into, so it serves ``model_dir``'s weights."""

    def __init__(self, model_dir):
        super().__init__(model_dir)
        self.urls = {}

    def plain(self, name: str) -> str:
        if name not in self.urls:
            self.urls[name] = self.start()
        return self.urls[name]


@pytest.fixture
def servers(model_dir):
    """Servers with fault flags, for one test."""
    started = Servers(model_dir)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def shared(model_dir):
    started = Shared(model_dir)
    yield started
    started.stop()


def _served(url: str, path: Path) -> dict[str, torch.Tensor]:
    post(url, "/halo/save", {"path": str(path)})
    return load_file(str(path))


def _bits_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k].view(torch.int32), b[k].view(torch.int32)) for k in a)


def _changed(before: dict, after: dict, dtype) -> int:
    return sum(int((before[k].to(dtype).view(torch.int16 if dtype == torch.bfloat16 else torch.int32)
                    != after[k].to(dtype).view(torch.int16 if dtype == torch.bfloat16 else torch.int32)).sum()) for k in after)


@pytest.mark.parametrize("wire", [torch.float32, torch.bfloat16])
def test_full_then_sparse_sync_is_bit_identical_and_sends_only_changes(shared, tmp_path, wire):
    url = shared.plain("sync")
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY))
    engine = ServerEngine([url], "vllm", sync_dtype=wire, sparse=True, anchor_every=3, backend="gloo")
    try:
        engine.update_weights(model.state_dict().items())
        assert engine.last_sync.kind == "full" and engine.last_sync.elements == sum(t.numel() for t in model.state_dict().values())
        expected = lambda: {k: v.to(wire).to(torch.float32) for k, v in model.state_dict().items()}  # noqa: E731
        assert _bits_equal(_served(url, tmp_path / "a.safetensors"), expected())
        for round in range(2):
            before = {k: v.clone() for k, v in model.state_dict().items()}
            with torch.no_grad():  # a few elements of a few tensors move (one to -0.0: a bitwise change only)
                model.model.layers[0].mlp.experts.gate_up_proj.view(-1)[round :: 997] += 0.25
                model.model.layers[1].self_attn.q_proj.weight.view(-1)[:13] *= -1.5
                model.model.embed_tokens.weight.view(-1)[7] = -0.0 if round == 0 else 0.0
            engine.update_weights(model.state_dict().items())
            changed = _changed(before, model.state_dict(), wire)
            assert engine.last_sync.kind == "sparse" and engine.last_sync.elements == changed > 0
            assert engine.last_sync.bytes == changed * (4 + wire.itemsize)
            assert _bits_equal(_served(url, tmp_path / f"s{round}.safetensors"), expected())
        engine.update_weights(model.state_dict().items())  # the third sync since the anchor: full again
        assert engine.last_sync.kind == "full"
    finally:
        engine.close()


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
def test_completions_are_the_servers_seeded_samples(shared, model_dir, dialect):
    """Each completion is the server's own seeded draw (one request per completion: equal prompts differ by seed),
    with the temperature-processed log-prob of every token, as the trainer would compute it."""
    url = shared.plain("pristine")
    engine = ServerEngine([url], dialect, backend="gloo")
    params = SamplingParams(num_generations=2, max_completion_length=6, temperature=0.7)
    try:
        rollout = engine.generate([[1, 5, 9, 2]], params, seeds=[3, 4])
        again = engine.generate([[1, 5, 9, 2]], params, seeds=[3, 4])
    finally:
        engine.close()
    assert rollout.completion_ids == again.completion_ids and rollout.completion_ids[0] != rollout.completion_ids[1]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for seed, ids, logprobs in zip([3, 4], rollout.completion_ids, rollout.logprobs):
        torch.manual_seed(seed)
        out = model.generate(input_ids=torch.tensor([[1, 5, 9, 2]]), attention_mask=torch.ones(1, 4, dtype=torch.long), do_sample=True,
                             temperature=0.7, top_k=0, max_new_tokens=6, pad_token_id=0)
        assert out[0, 4:].tolist()[: len(ids)] == ids
        logits = model(torch.tensor([[1, 5, 9, 2] + ids])).logits[0, 3:-1] / 0.7
        assert torch.allclose(torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0], torch.tensor(logprobs), atol=1e-5)


def test_malformed_reply_is_named_after_bounded_retries(servers):
    url = servers.start("--malformed-after", "0")
    engine = ServerEngine([url], "vllm", retries=1, backend="gloo")
    try:
        with pytest.raises(EngineError, match=r"failed after 2 attempts: .*malformed /v1/completions reply: no choices\[0\]"):
            engine.generate([[1, 2]], SamplingParams(1, 4))
    finally:
        engine.close()


def test_a_reply_cut_off_midway_is_an_engine_error():
    """A server that dies while writing a reply leaves the client an ``IncompleteRead``, not a connection error; it is
    an ``EngineError`` all the same, so the run retries, then stops with its checkpoint."""
    class CutOff(BaseHTTPRequestHandler):
        def do_POST(self):
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b'{"choices": ')

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), CutOff)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(EngineError, match=r"/v1/completions failed: IncompleteRead"):
            post(f"http://127.0.0.1:{server.server_address[1]}", "/v1/completions", {}, timeout=5.0)
    finally:
        server.shutdown()
        server.server_close()


def test_sglang_refuses_sparse_sync():
    with pytest.raises(EngineError, match="sparse is not supported by SGLang"):
        ServerEngine(["http://127.0.0.1:9"], "sglang", sparse=True, backend="gloo", model_name="m")


# -- through `halo launch grpo` -------------------------------------------------------------------

def _run(tmp_path, urls, *extra_yaml: str) -> Path:
    return write_run(tmp_path, "prompts", "reward_funcs: [grpo_rewards.even_tokens]\nrollout_engine: vllm\n"
                     f"engine_urls: [{', '.join(urls)}]\n" + "".join(line + "\n" for line in extra_yaml))


def _launch(config: Path, out: Path, nproc: int, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "halo_cli", "launch", "grpo", str(config), "--nproc", str(nproc), "--", f"--output_dir={out}",
               "--per_device_train_batch_size=4", "--logging_steps=1", "--bf16=false", "--report_to=none", "--num_generations=2",
               "--max_completion_length=8", "--temperature=0.7", "--optim=sgd", "--learning_rate=0.5", "--seed=5",
               "--lr_scheduler_type=constant", *args]
    result = subprocess.run(command, capture_output=True, text=True, cwd=config.parent, timeout=600,
                            env={**__import__("os").environ, "PYTHONPATH": str(TESTS)})
    if check:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _history(out: Path, step: int) -> list[dict]:
    return json.loads((out / f"checkpoint-{step}" / "trainer_state.json").read_text())["log_history"]


def test_expert_parallel_training_leaves_the_servers_on_the_trained_weights(shared, tmp_path):
    """Two EP ranks, two servers, sparse syncs, the next batch generated ahead: after the run every server holds the
    saved checkpoint's weights, bit for bit (the experts gathered from both ranks' shards); the start-up sync was
    full, later ones sparse; the ranks used their prefetched rollouts together."""
    urls = [shared.plain("a"), shared.plain("b")]
    out = tmp_path / "out"
    _launch(_run(tmp_path, urls, "weight_sync: sparse", "weight_sync_anchor_every: 100", "max_staleness: 1"), out, 2, "--expert_parallel_size=2",
            "--max_steps=3", "--save_steps=3")
    saved = weights(out)  # the checkpoint as from_pretrained reads it back (fused experts, as the server holds them)
    for index, url in enumerate(urls):
        assert _bits_equal(_served(url, tmp_path / f"served{index}.safetensors"), saved)
    history = [entry for entry in _history(out, 3) if "loss" in entry]
    assert "sync/full_bytes" in history[0] and all("sync/sparse_bytes" in entry for entry in history[1:]), history
    assert [entry.get("async/staleness") for entry in history] == [None, 1.0, 1.0]
    sparse, full = history[1]["sync/sparse_bytes"], history[0]["sync/full_bytes"]
    assert 0 < sparse < 2 * full  # SGD moves nearly every element here: sparse is honest about it (indices cost 4 bytes each)


def test_raw_logprobs_at_temperature_are_refused_at_start(servers, tmp_path):
    url = servers.start("--logprobs", "raw")
    result = _launch(_run(tmp_path, [url]), tmp_path / "out", 1, "--max_steps=1", check=False)
    assert result.returncode != 0
    assert "the server's log-probs at temperature 0.7 are the raw ones" in result.stdout + result.stderr
    assert "--logprobs-mode processed_logprobs" in result.stdout + result.stderr


def test_a_server_that_dies_stops_the_run_with_a_checkpoint_that_resumes(servers, shared, tmp_path):
    """The server dies after a few requests; the run stops, saying so, with its last completed step saved; with a
    server back it resumes from there and finishes."""
    dying = servers.start("--die-after", "12")  # the probe, then a step's 8 rows: dies during the second step
    config = _run(tmp_path, [dying], "engine_retries: 1")
    out = tmp_path / "out"
    result = _launch(config, out, 1, "--max_steps=4", "--save_steps=100", check=False)
    text = result.stdout + result.stderr
    assert result.returncode != 0 and "the run stopped with its last completed step saved in" in text, text[-3000:]
    saved = sorted(out.glob("checkpoint-*"))
    assert saved, text[-2000:]
    step = int(saved[-1].name.split("-")[1])
    assert 1 <= step < 4
    config = _run(tmp_path, [shared.plain("a")], "engine_retries: 1")
    _launch(config, out, 1, "--max_steps=4", "--save_steps=4", "--resume_from_checkpoint=true")
    assert [entry["step"] for entry in _history(out, 4) if "loss" in entry] == [1, 2, 3, 4]  # the first run's steps, then the rest


def test_the_asynchronous_loop_with_two_servers_raises_the_reward(shared, tmp_path):
    """max_staleness: 1 over two servers: every batch after the first was generated while the one before it trained
    (one optimizer step old), and a learnable reward (the share of even token ids) still rises."""
    urls = [shared.plain("a"), shared.plain("b")]
    out = tmp_path / "out"
    _launch(_run(tmp_path, urls, "max_staleness: 1"), out, 1, "--max_steps=20", "--save_steps=20", "--logging_steps=5",
            "--per_device_train_batch_size=16", "--num_generations=8", "--optim=adamw_torch", "--learning_rate=1e-2")
    history = [entry for entry in _history(out, 20) if "loss" in entry]
    assert [entry.get("async/staleness") for entry in history] == [1.0] * 4  # every window used prefetched rollouts
    rewards = [entry["reward"] for entry in history]
    assert rewards == sorted(rewards) and rewards[-1] > rewards[0] + 0.1, rewards


def _check(tmp_path, *overrides, extra=""):
    from halo_core.methods.grpo import HaloGRPOConfig
    from halo_core.trainers.run_checks import check_run
    from halo_core.trainers.run_config import load_run_config, parse_overrides

    config = write_run(tmp_path, "prompts", "reward_funcs: [exact_answer]\n" + extra)
    check_run(load_run_config("grpo", HaloGRPOConfig, config, parse_overrides(list(overrides))), 1)


@pytest.mark.parametrize("overrides, extra, says", [
    (["--rollout_engine=vllm"], "", "rollout_engine: vllm needs engine_urls"),
    ([], "engine_urls: [http://h:1]\n", "engine_urls is set but rollout_engine is hf"),
    (["--rollout_engine=vllm"], "engine_urls: [h:1]\n", "engine_urls entry 'h:1' is not an http(s) URL"),
    (["--rollout_engine=sglang", "--weight_sync=sparse"], "engine_urls: [http://h:1]\n", "weight_sync: sparse is not supported by SGLang"),
    (["--rollout_engine=vllm", "--weight_sync=delta"], "engine_urls: [http://h:1]\n", "weight_sync: 'delta' is not one of full, sparse"),
    (["--rollout_engine=vllm", "--max_staleness=-1"], "engine_urls: [http://h:1]\n", "max_staleness: -1 must be at least 0"),
    (["--max_staleness=1"], "", "max_staleness: 1 needs a server engine"),
    (["--rollout_engine=vllm", "--weight_sync_dtype=int8"], "engine_urls: [http://h:1]\n", "weight_sync_dtype: 'int8' is not one of auto"),
    (["--rollout_engine=vllm", "--weight_sync_anchor_every=0"], "engine_urls: [http://h:1]\n", "weight_sync_anchor_every: 0 must be at least 1"),
    (["--rollout_engine=vllm", "--engine_timeout_s=0"], "engine_urls: [http://h:1]\n", "engine_timeout_s: 0 must be positive"),
    (["--use_vllm=true"], "", "vllm_mode: colocate is not supported"),
    (["--rollout_engine=vllm", "--use_peft=true"], "engine_urls: [http://h:1]\n", "use_peft: true with rollout_engine: vllm is not supported"),
])
def test_bad_engine_keys_are_refused_before_start(tmp_path, overrides, extra, says):
    with pytest.raises(__import__("halo_core.errors", fromlist=["ConfigError"]).ConfigError) as caught:
        _check(tmp_path, *overrides, extra=extra)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_a_trl_server_mode_config_runs_on_the_vllm_engine():
    from halo_core.methods.grpo import HaloGRPOConfig

    args = HaloGRPOConfig(output_dir="unused", bf16=False, use_cpu=True, reward_funcs=["exact_answer"], use_vllm=True, vllm_mode="server",
                          vllm_server_host="10.0.0.2", vllm_server_port=8001)
    assert (args.rollout_engine, args.engine_urls, args.use_vllm) == ("vllm", ["http://10.0.0.2:8001"], False)
