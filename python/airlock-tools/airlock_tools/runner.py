"""Runs a model's tool calls in one sandbox and answers in the shape its API expects.

Whatever the model sends (an unknown tool, bad arguments, code that fails or runs too long) comes
back as an error result it can read and correct, never as an exception that ends the loop."""

import base64
import json
import re
from dataclasses import dataclass, field

from e2b import CommandExitException, FileType, SandboxException, TimeoutException
from e2b_code_interpreter import Sandbox

from .schemas import TOOL_NAMES, check_arguments, input_schema

# Per stream: a model's context is finite, and a page of output is as useful as a book of it.
MAX_CHARS = 20_000
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass
class ToolResult:
    """What a tool call gave: text for the model, the PNG images it made, and whether it failed."""

    text: str
    images: list[bytes] = field(default_factory=list)  # PNG files
    is_error: bool = False

    def text_with_image_note(self):
        """The text, saying how many images there were: for APIs whose tool results are text."""
        if not self.images:
            return self.text
        return (f"{self.text}\n[{len(self.images)} PNG image(s) produced and saved by the "
                f"application; you cannot see them here]")


def cap(text, limit=MAX_CHARS):
    """`text`, or its start and end with a note of how much of the middle was cut."""
    if len(text) <= limit:
        return text
    head, tail = text[: limit // 2], text[len(text) - limit // 2:]
    return (f"{head}\n[... {len(text) - 2 * (limit // 2):,} of {len(text):,} characters cut here; "
            f"for long output, write it to a file and read the parts you need ...]\n{tail}")


def field_of(obj, key):
    """`obj[key]` for a dict, `obj.key` for an SDK object."""
    return obj[key] if isinstance(obj, dict) else getattr(obj, key)


class Runner:
    """Runs tool calls against one code-interpreter sandbox. `images` keeps every PNG the tools
    produced, in order (OpenAI's tool messages carry text only)."""

    def __init__(self, sandbox, max_chars=MAX_CHARS):
        self.sandbox = sandbox
        self.max_chars = max_chars
        self.images = []
        self.schemas = {name: input_schema(name) for name in TOOL_NAMES}

    @classmethod
    def create(cls, **kwargs):
        """A runner on a new sandbox (`Sandbox.create`'s arguments; kill it with
        `runner.sandbox.kill()`)."""
        return cls(Sandbox.create(**kwargs))

    def call(self, name, args):
        """Runs tool `name` with `args` (a dict, as the model sent it)."""
        if name not in self.schemas:
            return ToolResult(f"there is no tool {name!r}; the tools are {', '.join(TOOL_NAMES)}",
                              is_error=True)
        try:
            args = check_arguments(name, self.schemas[name], args)
        except ValueError as e:
            return ToolResult(str(e), is_error=True)
        try:
            result = getattr(self, f"_{name}")(**args)
        except SandboxException as e:
            text = f"{name} failed: {type(e).__name__}: {e}"
            if isinstance(e, TimeoutException) and "timeout" in args:
                text += f"\n(this call's timeout was {args['timeout']} s)"
            return ToolResult(text, is_error=True)
        self.images.extend(result.images)
        return result

    def openai(self, tool_call):
        """The `role: tool` message that answers an OpenAI chat-completions tool call (an SDK
        object or its dict, whose `function.arguments` is a JSON string)."""
        function = field_of(tool_call, "function")
        try:
            args = json.loads(field_of(function, "arguments") or "{}")
        except json.JSONDecodeError as e:
            result = ToolResult(f"the arguments are not valid JSON ({e}); send a JSON object",
                                is_error=True)
        else:
            result = self.call(field_of(function, "name"), args)
        return {"role": "tool", "tool_call_id": field_of(tool_call, "id"),
                "content": result.text_with_image_note()}

    def anthropic(self, tool_use):
        """The `tool_result` content block that answers an Anthropic `tool_use` block (an SDK
        object or its dict)."""
        result = self.call(field_of(tool_use, "name"), field_of(tool_use, "input"))
        content = [{"type": "text", "text": result.text}]
        content += [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                  "data": base64.b64encode(png).decode()}}
                    for png in result.images]
        return {"type": "tool_result", "tool_use_id": field_of(tool_use, "id"),
                "content": content, "is_error": result.is_error}

    # The tools, called with the arguments check_arguments passed; their defaults are the ones
    # tools.json's descriptions state. Each returns a ToolResult whose text is never empty:
    # Anthropic refuses an empty text block.

    def _run_code(self, code, language="python", timeout=60):
        execution = self.sandbox.run_code(code, language=language, timeout=timeout)
        sections = [("stdout", "".join(execution.logs.stdout)),
                    ("stderr", "".join(execution.logs.stderr))]
        images = []
        for result in execution.results:
            if result.png:  # a figure: its text is only a repr like <Figure size 640x480>
                images.append(base64.b64decode(result.png))
            elif result.text:
                sections.append(("result" if result.is_main_result else "output", result.text))
        error = execution.error
        if error:
            traceback = ANSI_ESCAPE.sub("", error.traceback or "")
            sections.append(("error", f"{error.name}: {error.value}\n{traceback}"))
        return ToolResult(self.sections(sections) or "(no output)", images, is_error=bool(error))

    def _run_command(self, command, cwd=None, timeout=60):
        try:
            done = self.sandbox.commands.run(command, cwd=cwd, timeout=timeout)
        except CommandExitException as e:
            done = e
        text = self.sections([("stdout", done.stdout), ("stderr", done.stderr)])
        return ToolResult(f"exit code {done.exit_code}\n{text}".strip(),
                          is_error=done.exit_code != 0)

    def _read_file(self, path):
        text = self.sandbox.files.read(path)
        return ToolResult(cap(text, self.max_chars) if text else f"({path} is empty)")

    def _write_file(self, path, content):
        info = self.sandbox.files.write(path, content)
        return ToolResult(f"wrote {len(content.encode())} bytes to {info.path}")

    def _list_files(self, path="/home/user", depth=1):
        entries = self.sandbox.files.list(path, depth=depth)
        lines = [f"{e.path}/" if e.type == FileType.DIR else f"{e.path}  ({e.size} bytes)"
                 for e in entries]
        return ToolResult("\n".join(lines) or f"({path} is empty)")

    def sections(self, sections):
        """Non-empty `(label, text)` pairs as labelled, capped blocks."""
        return "\n".join(f"[{label}]\n{cap(text, self.max_chars).rstrip()}"
                         for label, text in sections if text)
