"""The tools' definitions for function calling, and the check of a model's arguments against them.

The definitions live in tools.json, which `airlock mcp --print-tools` writes (a Rust unit test
fails when it is stale), so the MCP server and this package describe each tool in the same words."""

import copy
import json
from importlib import resources

# The function-calling subset: the application owns the one sandbox the runner drives and moves
# files in and out itself, so the sandbox and transfer tools are the MCP server's alone.
TOOL_NAMES = ("run_code", "run_command", "read_file", "write_file", "list_files")

ALL_TOOLS = json.loads(resources.files(__package__).joinpath("tools.json").read_text())

JSON_TYPES = {"string": str, "integer": int, "boolean": bool}


def definition(name):
    """Tool `name`'s entry in tools.json."""
    for tool in ALL_TOOLS:
        if tool["name"] == name:
            return tool
    raise ValueError(f"no tool named {name!r}; the tools are "
                     f"{', '.join(t['name'] for t in ALL_TOOLS)}")


def input_schema(name):
    """The JSON Schema of tool `name`'s arguments, less `sandbox_id` (a runner has one sandbox)."""
    schema = copy.deepcopy(definition(name)["inputSchema"])
    schema["properties"].pop("sandbox_id", None)
    schema["required"] = [k for k in schema.get("required", []) if k != "sandbox_id"]
    return schema


def openai_tools(names=TOOL_NAMES):
    """The `tools` of an OpenAI chat-completions request (also Ollama's and other compatible
    servers')."""
    return [{"type": "function",
             "function": {"name": n, "description": definition(n)["description"],
                          "parameters": input_schema(n)}}
            for n in names]


def anthropic_tools(names=TOOL_NAMES):
    """The `tools` of an Anthropic messages request."""
    return [{"name": n, "description": definition(n)["description"],
             "input_schema": input_schema(n)}
            for n in names]


def check_arguments(name, schema, args):
    """`args` as the tool takes them, or a ValueError saying, in words a model can act on, what is
    wrong: a missing or unknown argument, one of the wrong type, or a number below its minimum."""
    props = schema["properties"]
    if not isinstance(args, dict):
        raise ValueError(f"the arguments of {name} must be a JSON object, "
                         f"got {type(args).__name__}")
    # Some models send null for an optional argument they mean to leave out.
    args = {k: v for k, v in args.items() if v is not None}
    unknown = sorted(set(args) - set(props))
    if unknown:
        raise ValueError(f"{name} has no argument {', '.join(map(repr, unknown))}; "
                         f"its arguments are {', '.join(props)}")
    missing = [k for k in schema.get("required", []) if k not in args]
    if missing:
        raise ValueError(f"{name} needs the argument {', '.join(map(repr, missing))}")
    for key, value in args.items():
        expected = props[key].get("type")
        # JSON's true is no integer, though Python's bool is an int.
        wrong_bool = isinstance(value, bool) and expected != "boolean"
        if expected in JSON_TYPES and (wrong_bool or not isinstance(value, JSON_TYPES[expected])):
            raise ValueError(f"argument {key!r} of {name} must be a JSON {expected}, "
                             f"got {json.dumps(value)[:100]}")
        if "minimum" in props[key] and value < props[key]["minimum"]:
            raise ValueError(f"argument {key!r} of {name} must be at least "
                             f"{props[key]['minimum']}, got {value}")
    return args
