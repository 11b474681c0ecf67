"""The ``mcp`` environment: an MCP server's tools (the bundled one: ``add``, ``lookup``), listed over stdio through the
SDK, become methods whose schema TRL lists in the prompt; a tool call the policy writes reaches the server through TRL's
own loop and its result is spliced in; a bad server or argument is refused before start; the embedded default runs
through ``halo launch grpo`` and leaves no server behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_halo
from halo_core.errors import ConfigError
from halo_core.rl.environments import check_tools, load_environment
from halo_core.rl.environments.mcp import MCPError, connection, mcp
from launch_kit import noise_in

CONFIGS = Path(__file__).resolve().parents[1] / "templates" / "configs"


def test_the_servers_tools_become_methods_with_the_servers_schema():
    from transformers.utils import get_json_schema

    environment = load_environment("mcp")()
    listed = {tool.name: tool for tool in connection(environment.server).tools}
    assert set(listed) == {"add", "lookup"}
    for name, tool in listed.items():
        schema = get_json_schema(getattr(environment, name))["function"]
        assert schema["description"] == tool.description
        assert schema["parameters"]["required"] == tool.input_schema["required"]
        assert {k: (v["type"], v["description"]) for k, v in schema["parameters"]["properties"].items()} == \
               {k: (v["type"], v["description"]) for k, v in tool.input_schema["properties"].items()}
    assert environment.reset(prompt="x") is None
    assert environment.add(a=40, b=2) == "42" and environment.lookup(key="capital of France") == "Paris"
    with pytest.raises(MCPError, match="no entry for 'Mars'"):  # the tool's own error, for TRL's {"error": ...}
        environment.lookup(key="Mars")
    assert type(load_environment("mcp")()) is type(environment)  # one class per server: TRL matches rewards by type


def test_optional_arguments_and_choices_keep_their_meaning():
    """A schema argument that is not required defaults to None and is left out of the call; an enum stays one."""
    from types import SimpleNamespace

    from transformers.utils import get_json_schema

    from halo_core.rl.environments.mcp import _tool_method

    calls = []
    tool = SimpleNamespace(name="search", description="Search the notes.", input_schema={
        "type": "object", "required": ["query"], "properties": {
            "query": {"type": "string", "description": "Words to find."},
            "limit": {"type": ["integer", "null"], "title": "Limit"},
            "order": {"type": "string", "enum": ["new", "old"], "description": "Which first."}}})
    server = SimpleNamespace(call=lambda name, arguments, timeout: calls.append((name, arguments)) or "found")
    method = _tool_method(lambda self: server, tool)
    holder = type("Holder", (), {"search": method, "call_timeout_s": None})()
    schema = get_json_schema(holder.search)["function"]["parameters"]
    assert schema["required"] == ["query"] and schema["properties"]["limit"]["type"] == "integer"
    assert schema["properties"]["order"] == {"type": "string", "enum": ["new", "old"], "description": "Which first.", "nullable": True}
    assert holder.search(query="tea") == "found" and calls == [("search", {"query": "tea"})]


def test_a_tool_call_reaches_the_server_through_trls_loop(tmp_path, monkeypatch):
    from test_environments import _rows, assert_spans, tool_call, train_one_step

    def script(tokenizer, row, turn, prompt):
        if turn == 0:
            return tool_call(tokenizer, "qwen3", "add", {"a": 1000 * (row + 1), "b": 7})
        return "Done.<|im_end|>"

    rows = [{"prompt": [{"role": "user", "content": f"What is {a} + 7?"}]} for a in (1, 2)]
    tokenizer, engine, seen, trainer = train_one_step(tmp_path, monkeypatch, "qwen3", script, rows, environment="mcp",
                                                      reward_funcs=["brevity"])
    said = sorted(tokenizer.decode(assert_spans(row, engine.emitted)[1]) for row in _rows(seen))
    assert [s for s in said if "1007" in s] and [s for s in said if "4007" in s], said  # each row's own sum, from the server
    assert '"name": "add"' in tokenizer.decode(engine.emitted[0][0])  # the tool list in the prompt
    assert trainer.state.log_history[0]["tools/call_frequency"] == 1.0 and trainer.state.log_history[0]["tools/failure_frequency"] == 0.0


@pytest.mark.parametrize("kwargs, says", [
    ({"server": [sys.executable, "-c", "import nope"]}, "did not start and list its tools (MCPError: Connection closed; its stderr's "
                                                        "last line: ModuleNotFoundError: No module named 'nope')"),
    ({"server": []}, "environment_kwargs: server is empty"),
    ({"sever": ["x"]}, "environment_kwargs: {'sever': ['x']} do not fit environment 'mcp'"),
])
def test_a_bad_server_is_refused_before_start(kwargs, says):
    import halo_core.methods.grpo as grpo

    args = grpo.HaloGRPOConfig(output_dir="unused", use_cpu=True, report_to="none", environment="mcp", environment_kwargs=kwargs)
    with pytest.raises(ConfigError) as caught:
        check_tools(args)
    assert says in str(caught.value) and "\n" not in str(caught.value), caught.value


def test_the_cli_refuses_a_server_that_does_not_start_in_one_line(tmp_path):
    from launch_kit import write_run

    config = write_run(tmp_path, "prompts", f"reward_funcs: [brevity]\nenvironment: mcp\nenvironment_kwargs: {{server: [{sys.executable}, -c, 'import nope']}}\n")
    done = subprocess.run([sys.executable, "-m", "halo_cli", "launch", "grpo", str(config), "--dry-run"], capture_output=True, text=True,
                          cwd=tmp_path)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "environment: 'mcp' could not be made" in lines[0], done.stderr
    assert "No module named 'nope'" in lines[0]


def test_environment_kwargs_need_an_environment():
    import halo_core.methods.grpo as grpo

    args = grpo.HaloGRPOConfig(output_dir="unused", use_cpu=True, report_to="none", reward_funcs=["brevity"], environment_kwargs={"server": ["x"]})
    with pytest.raises(ConfigError, match="environment_kwargs: .* is set but no environment is"):
        check_tools(args)


def _running(marker: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            line = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in line and proc.name != str(os.getpid()):
            found.append(line)
    return found


def test_a_connection_starts_its_server_and_closing_it_ends_the_server():
    """What the launch test below relies on: the marker shows the server while it runs, and closing ends it."""
    from halo_core.rl.environments.mcp import DEFAULT_SERVER, Connection

    marker = f"halo-mcp-close-{os.getpid()}"
    opened = Connection((*DEFAULT_SERVER, marker))
    assert [tool.name for tool in opened.tools] == ["add", "lookup"] and _running(marker)
    opened.close()
    assert not _running(marker)


def test_the_mcp_default_runs_through_halo_launch(tmp_path):
    """Two steps of the embedded default, its server started with a marker argument (ignored by the server) so that
    the test can see that the run left none behind."""
    out, marker = tmp_path / "run", f"halo-mcp-test-{os.getpid()}"
    server = ["-I", str(Path(__import__("halo_core").__file__).parent / "rl" / "environments" / "mcp_server.py"), marker]
    result = run_halo("launch", "grpo", str(CONFIGS / "tiny-mcp-grpo.yaml"), "--nproc", "1", "--", f"--output_dir={out}",
                      "--max_steps=2", "--logging_steps=1", "--save_steps=2",
                      f"--environment_kwargs={json.dumps({'server': [sys.executable, *server]})}", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not noise_in(result.stdout + result.stderr) and "UserWarning" not in result.stderr, result.stderr[-2000:]
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    steps = [e for e in state["log_history"] if "loss" in e]
    assert len(steps) == 2 and all("tools/call_frequency" in e for e in steps)  # TRL had tools: the server's, listed
    assert not _running(marker)
