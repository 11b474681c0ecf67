"""A rollout server for tests: a Hugging Face model in its own process behind the endpoints Halo's server engines use.

``python -m halo_core.testing.engine_server --model DIR --port P`` serves, on 127.0.0.1:

- ``GET /health``, ``GET /v1/models``;
- ``POST /v1/completions`` (OpenAI-compatible, as vLLM serves it): ``prompt`` as token ids (one list, or a list of
  lists), ``n``, ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``, ``logprobs``,
  ``return_token_ids``; each choice carries ``token_ids`` and ``logprobs.token_logprobs`` (temperature-processed,
  or raw with ``--logprobs raw``, the fault the start-up probe must catch);
- ``POST /pause_generation``, ``/continue_generation``, ``/init_weights_update_group``,
  ``/update_weights_from_distributed`` (SGLang's weight protocol, ``halo_core.rl.weight_sync``, over gloo), and ``/generate``
  (SGLang's); ``/pause``, ``/resume`` and ``/collective_rpc`` into ``HaloWeightReceiver`` (vLLM with Halo's worker extension);
- ``POST /halo/save`` (``{"path": ...}``): the served weights as safetensors, what the tests compare;
- ``POST /v1/chat/completions`` (OpenAI-compatible): ``messages`` through the model's chat template, ``max_tokens``,
  ``temperature`` (0: greedy), ``seed``; the reply's ``choices[0].message.content``. The ``llm_judge`` reward serves a
  local judge model through it (``halo_core.rl.judge``).

``--port 0`` takes a free port; the first line printed names it.

Faults on request: ``--die-after N`` exits after N completion requests, ``--malformed-after N`` then answers
with a reply missing its ``choices``.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from halo_core.rl.vllm_worker import HaloWeightReceiver


class _State:
    def __init__(self, model, logprobs: str, die_after: int | None, malformed_after: int | None, tokenizer=None):
        self.model, self.logprobs_mode, self.tokenizer = model, logprobs, tokenizer
        self.die_after, self.malformed_after = die_after, malformed_after
        self.lock = threading.Lock()  # one generation or weight update at a time
        self.running = threading.Event()
        self.running.set()
        self.groups: dict[str, object] = {}
        self.requests = 0
        self.params = model.state_dict(keep_vars=True)  # every Hugging Face name, tied ones onto the same tensor
        self.worker = _Worker(self)


class _Worker(HaloWeightReceiver):
    """The vLLM worker the extension is mixed into, reduced to what it uses: ``model_runner.model.load_weights``."""

    def __init__(self, state: "_State"):
        self.rank, self.model_runner = 0, self
        self.model, self._state = self, state

    def load_weights(self, weights):
        for name, tensor in weights:
            self._state.params[name].data.copy_(tensor)


def _generate(state: _State, prompt: list[int], body: dict, seed: int | None) -> dict:
    model = state.model
    temperature = float(body.get("temperature", 1.0))
    ids = torch.tensor([prompt])
    kwargs = dict(max_new_tokens=int(body.get("max_tokens", 16)), output_scores=True, output_logits=True, return_dict_in_generate=True,
                  pad_token_id=model.generation_config.pad_token_id if model.generation_config.pad_token_id is not None else 0)
    if temperature > 0:
        kwargs.update(do_sample=True, temperature=temperature, top_p=float(body.get("top_p", 1.0)), top_k=int(body.get("top_k", -1)) if int(body.get("top_k", -1)) > 0 else 0)
    else:
        kwargs.update(do_sample=False)
    if seed is not None:
        torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
    tokens = out.sequences[0, ids.shape[1]:].tolist()
    scores = out.logits if state.logprobs_mode == "raw" else out.scores
    logprobs = [torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(scores, tokens)]
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    end = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
    return {"token_ids": tokens[:end], "logprobs": {"token_logprobs": logprobs[:end]},
            "finish_reason": "stop" if end < len(tokens) or (tokens and tokens[-1] in eos) else "length"}


def _handler(state: _State):
    from halo_core.rl import weight_sync

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _reply(self, code: int, payload) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                return self._reply(200, {"status": "ok"})
            if self.path == "/v1/models":
                return self._reply(200, {"data": [{"id": "halo-test", "object": "model"}]})
            self._reply(404, {"error": f"no route {self.path}"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            try:
                route = getattr(self, "_" + self.path.split("?")[0].strip("/").replace("/", "_"), None)
                if route is None:
                    return self._reply(404, {"error": f"no route {self.path}"})
                self._reply(200, route(body))
            except Exception as exc:  # the client reports it, naming the server
                self._reply(500, {"error": f"{type(exc).__name__}: {exc}"})

        def _v1_completions(self, body):
            state.running.wait()
            with state.lock:
                state.requests += 1
                if state.die_after is not None and state.requests > state.die_after:
                    os._exit(3)
                if state.malformed_after is not None and state.requests > state.malformed_after:
                    return {"id": "broken"}
                prompts = body["prompt"]
                prompts = prompts if prompts and isinstance(prompts[0], list) else [prompts]
                seed = body.get("seed")
                choices = []
                for p, prompt in enumerate(prompts):
                    for j in range(int(body.get("n", 1))):
                        choice = _generate(state, prompt, body, None if seed is None else seed + j)
                        choice["index"] = p * int(body.get("n", 1)) + j
                        choice["prompt_token_ids"] = prompt
                        choices.append(choice)
            return {"id": "cmpl", "object": "text_completion", "model": "halo-test", "choices": choices}

        def _v1_chat_completions(self, body):
            if state.tokenizer is None:
                raise ValueError("the served folder has no tokenizer, so chat messages cannot be rendered")
            prompt = state.tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=True, return_dict=False)
            with state.lock:
                choice = _generate(state, list(prompt), body, body.get("seed"))
            text = state.tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
            return {"id": "chatcmpl", "object": "chat.completion", "model": body.get("model", "halo-test"),
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": choice["finish_reason"]}],
                    "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(choice["token_ids"])}}

        def _pause_generation(self, body):
            state.running.clear()
            with state.lock:  # in-flight generation finishes first
                return {"success": True}

        def _continue_generation(self, body):
            state.running.set()
            return {"success": True}

        def _init_weights_update_group(self, body):
            state.groups[body["group_name"]] = weight_sync.join(body["master_address"], int(body["master_port"]), int(body["rank_offset"]),
                                                                int(body["world_size"]), body.get("backend", "gloo"), body["group_name"])
            return {"success": True}

        def _update_weights_from_distributed(self, body):
            group = state.groups[body["group_name"]]
            with state.lock, torch.no_grad():
                for name, tensor in weight_sync.receive_full(group, body):
                    state.params[name].copy_(tensor)
            return {"success": True}

        # vLLM: pause/resume, and the weight messages through /collective_rpc to Halo's worker extension.
        def _pause(self, body):
            return self._pause_generation(body)

        def _resume(self, body):
            return self._continue_generation(body)

        def _collective_rpc(self, body):
            with state.lock, torch.no_grad():
                return [getattr(state.worker, body["method"])(**body.get("kwargs", {}))]

        # SGLang: /generate with input_ids and sampling_params.
        def _generate(self, body):
            sampling = body.get("sampling_params", {})
            reply = self._v1_completions({"prompt": body["input_ids"], "n": 1, "max_tokens": sampling.get("max_new_tokens", 16),
                                          "temperature": sampling.get("temperature", 1.0), "top_p": sampling.get("top_p", 1.0),
                                          "top_k": sampling.get("top_k", -1), "seed": sampling.get("sampling_seed")})
            if "choices" not in reply:
                return reply
            choice = reply["choices"][0]
            return {"output_ids": choice["token_ids"], "meta_info": {
                "output_token_logprobs": [[lp, t, None] for lp, t in zip(choice["logprobs"]["token_logprobs"], choice["token_ids"])],
                "finish_reason": {"type": choice["finish_reason"]}}}

        def _halo_save(self, body):
            from safetensors.torch import save_file

            with state.lock:
                save_file({k: v.detach().clone().contiguous() for k, v in state.model.state_dict().items()}, body["path"])
            return {"success": True, "requests": state.requests}

    return Handler


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--logprobs", choices=("processed", "raw"), default="processed")
    parser.add_argument("--die-after", type=int)
    parser.add_argument("--malformed-after", type=int)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    from transformers import AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
    except (OSError, ValueError):  # weights only: the token-id endpoints still work
        tokenizer = None
    state = _State(model, args.logprobs, args.die_after, args.malformed_after, tokenizer)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), _handler(state))
    print(f"serving on 127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
