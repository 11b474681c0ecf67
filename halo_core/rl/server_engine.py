"""Server rollout engines (``rollout_engine: vllm`` or ``sglang``): a separately started inference server over HTTP.

Generation goes through the server's OpenAI-compatible ``/v1/completions`` with token-id prompts, one request
per completion with its own seed (a request with ``n`` copies of one seed would repeat itself), spread over
``engine_urls`` round-robin and sent concurrently. Halo imports neither package: the dialects below are the
endpoint names and request extras each server documents. Weights go through ``weight_sync``'s process group;
rank 0 of the trainer is rank 0 of that group and the servers' ranks follow it.

Failures are retried within bounds (``engine_retries``, moving to the next server); a reply that lacks what the
trainer needs is an ``EngineError`` naming the server and the field.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request

import torch
import torch.distributed as dist

from halo_core.errors import HaloError
from halo_core.rl import weight_sync
from halo_core.rl.engines import Rollout, SamplingParams


class EngineError(HaloError):
    """A rollout server that failed, or answered something the trainer cannot use."""


class Dialect:
    """How one kind of server is asked for a completion and handed weights (``halo_core.rl.weight_sync``'s messages)."""

    name = "?"
    pause_path, resume_path = "/pause_generation", "/continue_generation"
    #: Whether the server can take ``weight_sync: sparse`` (indices and values).
    sparse = False

    def completion(self, prompt: list[int], params: SamplingParams, seed: int | None, model: str) -> tuple[str, dict]:
        raise NotImplementedError

    def parse(self, url: str, reply) -> tuple[list[int], list[float], list | None]:
        raise NotImplementedError

    def weights(self, kind: str, body: dict) -> tuple[str, dict]:
        """The request for a weight message: ``init`` (join the group), ``full`` or ``sparse`` (one chunk)."""
        raise NotImplementedError


class VLLM(Dialect):
    """``vllm serve`` with ``--logprobs-mode processed_logprobs`` and Halo's worker extension for weights
    (``--worker-extension-cls halo_core.rl.vllm_worker.HaloWeightReceiver``): vLLM's own weight-transfer group is its
    ``StatelessProcessGroup`` and PyNCCL communicator, which a trainer can join only through vLLM's classes; the
    extension joins Halo's torch group instead and takes sparse deltas too. Reached through ``/collective_rpc``."""

    name, pause_path, resume_path, sparse = "vllm", "/pause?mode=keep", "/resume", True

    def completion(self, prompt, params, seed, model):
        body = {"model": model, "prompt": prompt, "n": 1, "max_tokens": params.max_completion_length, "temperature": params.temperature,
                "top_p": params.top_p, "top_k": params.top_k or -1, "logprobs": 0, "return_token_ids": True}
        if seed is not None:
            body["seed"] = seed
        return "/v1/completions", body

    def parse(self, url, reply):
        try:
            choice = reply["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise EngineError(f"engine server {url}: malformed /v1/completions reply: no choices[0] (got {str(reply)[:200]})") from None
        ids = choice.get("token_ids")
        if not isinstance(ids, list):
            raise EngineError(f"engine server {url}: the reply's choices[0] has no token_ids (a vLLM older than return_token_ids?)")
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
        return _checked(url, ids, logprobs, "choices[0].logprobs.token_logprobs"), choice.get("routed_experts")

    def weights(self, kind, body):
        method = {"init": "halo_init_group", "full": "halo_update_full", "sparse": "halo_update_sparse"}[kind]
        return "/collective_rpc", {"method": method, "kwargs": {"payload": json.dumps(body)}}


class SGLang(Dialect):
    """SGLang's native ``/generate`` (its OpenAI completions return no token ids) and its own weight-update group."""

    name = "sglang"

    def completion(self, prompt, params, seed, model):
        sampling = {"max_new_tokens": params.max_completion_length, "temperature": params.temperature, "top_p": params.top_p,
                    "top_k": params.top_k or -1}
        if seed is not None:
            sampling["sampling_seed"] = seed  # deterministic inference otherwise gives every sample seed 42
        return "/generate", {"input_ids": prompt, "sampling_params": sampling, "return_logprob": True, "logprob_start_len": -1}

    def parse(self, url, reply):
        try:
            ids, meta = reply["output_ids"], reply["meta_info"]
        except (KeyError, TypeError):
            raise EngineError(f"engine server {url}: malformed /generate reply: no output_ids or meta_info (got {str(reply)[:200]})") from None
        pairs = meta.get("output_token_logprobs")
        logprobs = [p[0] for p in pairs] if isinstance(pairs, list) and all(isinstance(p, list) and p for p in pairs) else None
        return _checked(url, ids, logprobs, "meta_info.output_token_logprobs"), None

    def weights(self, kind, body):
        if kind == "sparse":
            raise EngineError("weight_sync: sparse is not supported by SGLang servers (they take whole tensors); use weight_sync: full")
        return {"init": "/init_weights_update_group", "full": "/update_weights_from_distributed"}[kind], body


def _checked(url: str, ids, logprobs, where: str) -> tuple[list[int], list[float]]:
    if not isinstance(logprobs, list) or len(logprobs) != len(ids):
        raise EngineError(f"engine server {url}: the reply's {where} does not give one log-prob per token ({len(ids)} tokens)")
    return list(ids), [float(v) for v in logprobs]


DIALECTS = {"vllm": VLLM(), "sglang": SGLang()}


def post(url: str, path: str, body: dict | None = None, timeout: float = 600.0):
    request = urllib.request.Request(url.rstrip("/") + path, data=json.dumps(body or {}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    return _send(url, path, request, timeout)


def get(url: str, path: str, timeout: float = 30.0):
    return _send(url, path, urllib.request.Request(url.rstrip("/") + path), timeout)


def _send(url: str, path: str, request, timeout: float):
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:300]
        raise EngineError(f"engine server {url}: {path} answered HTTP {exc.code}: {detail}") from None
    except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out, or cut off mid-reply (IncompleteRead)
        raise EngineError(f"engine server {url}: {path} failed: {getattr(exc, 'reason', exc)}") from None
    except json.JSONDecodeError as exc:
        raise EngineError(f"engine server {url}: {path} answered something that is not JSON ({exc})") from None


def _local_address(url: str) -> str:
    """The address of this host that ``url``'s server reaches it at (the route the OS picks towards it)."""
    parsed = urllib.parse.urlparse(url)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((parsed.hostname or "127.0.0.1", parsed.port or 80))
        return probe.getsockname()[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


class ServerEngine:
    """Rollouts from ``urls`` (servers of one dialect serving the same model)."""

    shares_weights = False

    def __init__(self, urls: list[str], dialect: Dialect | str, *, timeout_s: float = 600.0, retries: int = 3, concurrency: int = 64,
                 sync_dtype: torch.dtype | None = None, sparse: bool = False, anchor_every: int = 10, backend: str = "auto",
                 group_port: int = 0, chunk_bytes: int = weight_sync.CHUNK_BYTES, model_name: str | None = None):
        if not urls:
            raise EngineError("engine_urls is empty: a server engine needs the URL of at least one running server")
        dialect = DIALECTS[dialect] if isinstance(dialect, str) else dialect
        if sparse and not dialect.sparse:
            dialect.weights("sparse", {})  # raises, saying why
        self.urls, self.dialect, self.timeout_s, self.retries = list(urls), dialect, timeout_s, retries
        self.sync_dtype, self.sparse, self.anchor_every, self.chunk_bytes = sync_dtype, sparse, anchor_every, chunk_bytes
        self.backend = backend if backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
        self.group_port, self.group_name = group_port, "halo-weights"
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="halo-engine")
        self.ahead = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="halo-prefetch")
        self.sender: weight_sync.WeightSender | None = None
        self.last_sync: weight_sync.SyncReport | None = None
        self.model_name = model_name or self._served_model()

    # -- generation ------------------------------------------------------------------------

    def _served_model(self) -> str:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                models = get(self.urls[0], "/v1/models", timeout=10.0)
                return models["data"][0]["id"]
            except EngineError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
            except (KeyError, IndexError, TypeError):
                raise EngineError(f"engine server {self.urls[0]}: /v1/models lists no model") from None

    def _complete(self, index: int, path: str, body: dict) -> tuple[tuple[list[int], list[float]], list | None]:
        failures = []
        for attempt in range(self.retries + 1):
            url = self.urls[(index + attempt) % len(self.urls)]
            try:
                return self.dialect.parse(url, post(url, path, body, timeout=self.timeout_s))
            except EngineError as exc:
                failures.append(str(exc))
                time.sleep(min(2.0**attempt * 0.1, 5.0))
        raise EngineError(f"rollout failed after {self.retries + 1} attempts: " + "; ".join(failures[-2:]))

    def generate(self, prompts: list[list[int]], params: SamplingParams, seeds: list[int] | None = None) -> Rollout:
        """``params.num_generations`` completions of each prompt; ``seeds``: one per completion (prompt-major)."""
        rows = [p for p in prompts for _ in range(params.num_generations)]
        seeds = seeds if seeds is not None else [None] * len(rows)
        futures = [self.pool.submit(self._complete, i, *self.dialect.completion(p, params, s, self.model_name))
                   for i, (p, s) in enumerate(zip(rows, seeds))]
        done = [f.result() for f in futures]
        routed = [torch.tensor(r) for _, r in done] if done and all(r is not None for _, r in done) else None
        return Rollout(rows, [ids for (ids, _), _ in done], [lp for (_, lp), _ in done], routed_experts=routed)

    def submit(self, prompts, params, seeds=None) -> concurrent.futures.Future:
        """``generate`` in the background (the asynchronous loop's next batch)."""
        return self.ahead.submit(self.generate, prompts, params, seeds)

    # -- weights ---------------------------------------------------------------------------

    def _each(self, path: str, body: dict | None = None, bodies: list[dict] | None = None) -> None:
        futures = [self.pool.submit(post, url, path, bodies[i] if bodies else body, self.timeout_s) for i, url in enumerate(self.urls)]
        for future in futures:
            answer = future.result()
            if isinstance(answer, dict) and answer.get("success") is False:
                raise EngineError(f"engine server: {path} refused: {answer.get('message', answer)}")

    def _join(self) -> weight_sync.WeightSender:
        host = _local_address(self.urls[0])
        port = self.group_port or _free_port()
        size = 1 + len(self.urls)  # one rank per server (a server's own tensor-parallel ranks: its world_size)
        bodies = [{"master_address": host, "master_port": port, "rank_offset": i + 1, "world_size": size, "group_name": self.group_name,
                   "backend": self.backend, "sparse": self.sparse} for i in range(len(self.urls))]
        inits = self.pool.submit(self._each, self.dialect.weights("init", bodies[0])[0], bodies=[self.dialect.weights("init", b)[1] for b in bodies])
        group = weight_sync.join(host, port, 0, size, self.backend, self.group_name, timeout_s=self.timeout_s)
        inits.result()
        device = "cuda" if self.backend == "nccl" else "cpu"
        return weight_sync.WeightSender(group, lambda kind, body: self._each(*self.dialect.weights(kind, body)), self.sync_dtype,
                                        self.sparse, self.anchor_every, self.group_name, device=device)

    def update_weights(self, named) -> None:
        """Every trainer rank calls it (gathering the named tensors is collective); rank 0 sends them."""
        named = iter(named)
        try:
            if dist.is_initialized() and dist.get_rank() != 0:
                return
            if self.sender is None:
                try:
                    self.sender = self._join()
                except (RuntimeError, dist.DistError) as exc:  # a server that never joined the group
                    raise EngineError(f"engine servers {self.urls}: joining the weight-update group failed: {exc}") from None
            self._each(self.dialect.pause_path)
            try:
                self.last_sync = self.sender.sync(named, self.chunk_bytes)
            except (RuntimeError, dist.DistError) as exc:  # the group broke under a broadcast (a server died mid-sync)
                raise EngineError(f"engine servers {self.urls}: a weight sync failed part-way: {exc}") from None
            finally:
                self._each(self.dialect.resume_path)
        finally:
            for _ in named:  # drive the gathers left: a failure part-way must not leave the other ranks waiting in them
                pass

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.ahead.shutdown(wait=False, cancel_futures=True)



def _engine(dialect: str, model, tokenizer, args, **kwargs) -> ServerEngine:
    dtype = args.weight_sync_dtype
    if dtype == "auto":
        dtype = torch.bfloat16 if args.bf16 else next(model.parameters()).dtype
    else:
        dtype = getattr(torch, dtype)
    return ServerEngine(args.engine_urls, dialect, timeout_s=args.engine_timeout_s, retries=args.engine_retries, sync_dtype=dtype,
                        sparse=args.weight_sync == "sparse", anchor_every=args.weight_sync_anchor_every, backend=args.weight_sync_backend)


def vllm_engine(model, tokenizer, args, **kwargs) -> ServerEngine:
    return _engine("vllm", model, tokenizer, args)


def sglang_engine(model, tokenizer, args, **kwargs) -> ServerEngine:
    return _engine("sglang", model, tokenizer, args)
