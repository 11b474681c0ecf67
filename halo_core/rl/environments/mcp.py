"""``mcp``: the tools of an MCP server (Model Context Protocol, through the official ``mcp`` SDK) offered to the policy
as TRL tools.

The server is a command started as a subprocess and spoken to over its stdin and stdout (the SDK's stdio transport):
``environment_kwargs: {server: [python, -m, my_pkg.server]}``; without it, Halo's bundled server
(``mcp_server.py``: ``add`` and ``lookup``). At start its tools are listed (``tools/list``) and each becomes a method
of the environment's class, named after the tool, with a signature and a Google-style docstring made from the tool's
description and input schema: what TRL lists in the prompt (through transformers' ``get_json_schema``) and calls
when the model writes a tool call. A call goes to the server (``tools/call``); its text content is the result, and a
result the server flags as an error raises, so TRL hands the model ``{"error": ...}`` and counts a failure.

One server per training process, started on first use and closed when the process ends (its stdin closed, then
its process tree ended, as the SDK does); its stderr goes to a temporary file, quoted when it fails to start.
Every rollout of the process shares it, so its tools should keep no state a rollout must not see from another. ``reset`` does nothing; a reward (``reward_funcs``) grades the answers.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import inspect
import sys
import tempfile
import threading
from typing import Any

from pathlib import Path

# By file, not module: the SDK starts servers with a minimal environment (no PYTHONPATH), and the file needs only the
# SDK; -I keeps the file's folder (which holds this mcp.py) off sys.path.
DEFAULT_SERVER = (sys.executable, "-I", str(Path(__file__).with_name("mcp_server.py")))
START_TIMEOUT_S = 60.0
_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


class MCPError(RuntimeError):
    """The server could not be started or listed, or a call failed outside the tool."""


class Connection:
    """One server subprocess and its MCP client session, held open on an event loop of its own thread: TRL calls
    tools synchronously, and the SDK's streams belong to the loop that opened them."""

    def __init__(self, command: tuple[str, ...], start_timeout_s: float = START_TIMEOUT_S):
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters, stdio_client

        self.command = command
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="halo-mcp", daemon=True)
        self._thread.start()
        # The server's stderr goes to a file: quoted when it fails to start, kept off the run's console otherwise.
        self._errors = tempfile.TemporaryFile(mode="w+")
        self._client = Client(stdio_client(StdioServerParameters(command=command[0], args=list(command[1:])), errlog=self._errors))
        self._closed = False
        try:
            self._run(self._client.__aenter__(), start_timeout_s)
            self.tools = list(self._run(self._client.list_tools(), start_timeout_s).tools)
        except BaseException as exc:
            self.close()
            while isinstance(exc, BaseExceptionGroup) and exc.exceptions:  # the SDK's task groups wrap the cause
                exc = exc.exceptions[0]
            self._errors.seek(0)
            said = self._errors.read().strip().splitlines()[-1:]
            raise MCPError(f"MCP server {' '.join(command)!r} did not start and list its tools "
                           f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no message'}; "
                           f"its stderr's last line: {said[0] if said else 'none'})") from exc

    def _run(self, coroutine, timeout_s: float | None):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)

    def call(self, name: str, arguments: dict[str, Any], timeout_s: float | None = None) -> str:
        result = self._run(self._client.call_tool(name, arguments), timeout_s)
        text = "\n".join(getattr(block, "text", "") or "" for block in result.content)
        if result.is_error:
            raise MCPError(text or f"tool {name!r} failed")
        return text

    def close(self) -> None:
        """Ends the session: the SDK closes the server's stdin, waits, then ends its process tree."""
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._client.__aexit__(None, None, None), 10.0)
        except BaseException:
            pass  # never entered, or already gone
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)


@functools.lru_cache(maxsize=None)
def connection(command: tuple[str, ...]) -> Connection:
    """The process's connection to ``command``, started once and closed at exit."""
    opened = Connection(command)
    atexit.register(opened.close)
    return opened


def _annotation(schema: dict) -> Any:
    kind = schema.get("type")
    if isinstance(kind, list):  # ["string", "null"]: the first that is not null
        kind = next((k for k in kind if k != "null"), "string")
    return _TYPES.get(kind, str)


def _tool_method(connection_of, tool) -> Any:
    """A method named ``tool.name`` whose signature and docstring say what the server's input schema says."""
    schema = tool.input_schema or {}
    properties = schema.get("properties", {})
    required = set(schema.get("required", ()))
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations = {}
    lines = [(tool.description or f"The MCP tool {tool.name}.").strip(), "", "Args:"] if properties else [(tool.description or f"The MCP tool {tool.name}.").strip()]
    for name in sorted(properties, key=lambda n: n not in required):  # required first, as Python needs
        spec = properties[name]
        annotation = _annotation(spec)
        optional = name not in required
        annotations[name] = annotation | None if optional else annotation
        parameters.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotations[name],
                                            default=None if optional else inspect.Parameter.empty))
        description = " ".join(str(spec.get("description") or spec.get("title") or name).split())
        if "enum" in spec:
            import json

            description += f" (choices: {json.dumps(spec['enum'])})"
        lines.append(f"    {name}: {description}")
    annotations["return"] = str

    def call(self, **arguments):
        return connection_of(self).call(tool.name, {k: v for k, v in arguments.items() if v is not None}, self.call_timeout_s)

    call.__name__ = call.__qualname__ = tool.name
    call.__doc__ = "\n".join(lines)
    call.__annotations__ = annotations
    call.__signature__ = inspect.Signature(parameters, return_annotation=str)
    return call


class MCPEnvironment:
    """The base of every server's environment class; ``environment(server)`` adds the server's tools as methods."""

    server: tuple[str, ...] = DEFAULT_SERVER
    call_timeout_s: float | None = None  # tool_timeout_s cuts every call off too (timeout.py)

    def reset(self, **row) -> None:
        return None


@functools.lru_cache(maxsize=None)
def environment(server: tuple[str, ...] = DEFAULT_SERVER) -> type:
    """The environment class of ``server``: its tools listed now, one method each."""
    opened = connection(server)
    names = [tool.name for tool in opened.tools]
    clash = [n for n in names if not n.isidentifier() or n.startswith("_") or n in ("reset", "get_reward") or hasattr(MCPEnvironment, n)]
    if clash:
        raise MCPError(f"MCP server {' '.join(server)!r} offers tools named {clash}, which cannot be methods of an environment "
                       f"(a Python identifier, not reset or get_reward, not starting with _)")
    methods = {tool.name: _tool_method(lambda self: connection(self.server), tool) for tool in opened.tools}
    return type("MCPEnvironment", (MCPEnvironment,), {"server": server, "__module__": __name__, "__qualname__": "MCPEnvironment", **methods})


def mcp(server: list[str] | str | None = None) -> MCPEnvironment:
    """TRL's environment factory (TRL calls it with no arguments; Halo binds ``environment_kwargs``): one instance of
    ``server``'s environment class. ``server`` is the command, a list or a string split like a shell's."""
    if server is None:
        command = DEFAULT_SERVER
    else:
        import shlex

        command = tuple(shlex.split(server) if isinstance(server, str) else (str(part) for part in server))
        if not command:
            raise MCPError("environment_kwargs: server is empty; give the MCP server's command, e.g. [python, -m, my_pkg.server]")
    return environment(command)()
