"""python/airlock-tools: a model's tool calls, recorded in the shapes the OpenAI and Anthropic
APIs send them, run in a real code-interpreter sandbox; and every bad call answered with an
error the model can act on, after which the runner still works."""

import base64
import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

# The package under test: this checkout's, unless it is installed.
if importlib.util.find_spec("airlock_tools") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python" / "airlock-tools"))
from airlock_tools import TOOL_NAMES, Runner, anthropic_tools, openai_tools  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHART = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 5, 6])\nplt.title('A line')\n"


@pytest.fixture
def runner(server):
    runner = Runner.create(template="code-interpreter-v1", metadata={"suite": "function-calling"})
    yield runner
    try:
        runner.sandbox.kill()
    except Exception:
        pass


def openai(runner, name, arguments, call_id="call_1"):
    """The content of the tool message answering an OpenAI tool call; `arguments` go as the API
    sends them, a JSON string (a str here is sent as it is)."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    message = runner.openai({"id": call_id, "type": "function",
                             "function": {"name": name, "arguments": arguments}})
    assert message["role"] == "tool" and message["tool_call_id"] == call_id
    return message["content"]


def anthropic(runner, name, tool_input, use_id="toolu_1"):
    """The tool_result block answering an Anthropic tool_use block."""
    block = runner.anthropic({"type": "tool_use", "id": use_id, "name": name, "input": tool_input})
    assert block["type"] == "tool_result" and block["tool_use_id"] == use_id
    return block


def test_schemas_are_the_function_calling_subset_without_sandbox_ids():
    openai_schemas = {t["function"]["name"]: t["function"] for t in openai_tools()}
    anthropic_schemas = {t["name"]: t for t in anthropic_tools()}
    assert tuple(openai_schemas) == tuple(anthropic_schemas) == TOOL_NAMES
    assert all(t["type"] == "function" for t in openai_tools())
    for name in TOOL_NAMES:
        schema = openai_schemas[name]["parameters"]
        assert schema == anthropic_schemas[name]["input_schema"]
        assert schema["type"] == "object"
        assert "sandbox_id" not in schema["properties"]
        assert set(schema["required"]) <= set(schema["properties"])
        assert openai_schemas[name]["description"] == anthropic_schemas[name]["description"]
    assert openai_schemas["run_code"]["parameters"]["required"] == ["code"]


def test_state_persists_across_run_code_calls_in_both_shapes(runner):
    assert openai(runner, "run_code", {"code": "x = 40"}) == "(no output)"
    block = anthropic(runner, "run_code", {"code": "print('adding')\nx + 2"})
    assert block["content"] == [{"type": "text", "text": "[stdout]\nadding\n[result]\n42"}]
    assert block["is_error"] is False


def test_a_chart_is_an_image_for_anthropic_and_a_mention_for_openai(runner):
    block = anthropic(runner, "run_code", {"code": CHART})
    assert block["is_error"] is False
    images = [c for c in block["content"] if c["type"] == "image"]
    assert len(images) == 1
    assert images[0]["source"]["type"] == "base64"
    assert images[0]["source"]["media_type"] == "image/png"
    assert base64.b64decode(images[0]["source"]["data"])[:8] == PNG_SIGNATURE

    text = openai(runner, "run_code", {"code": CHART})
    assert "1 PNG image(s) produced" in text
    # The application keeps what the model cannot see.
    assert len(runner.images) == 2
    assert all(png[:8] == PNG_SIGNATURE for png in runner.images)


def test_an_error_comes_back_with_its_traceback(runner):
    code = "def f():\n    return 1 / 0\nf()"
    block = anthropic(runner, "run_code", {"code": code})
    assert block["is_error"] is True
    text = block["content"][0]["text"]
    assert "[error]\nZeroDivisionError: division by zero" in text
    assert "f()" in text
    assert "\x1b[" not in text  # the terminal's colours are no use to a model
    assert openai(runner, "run_code", {"code": "1 + 1"}) == "[result]\n2"


def test_a_command_that_fails_reports_its_exit_code_and_output(runner):
    block = anthropic(runner, "run_command", {"command": "echo partial; echo oops >&2; exit 7"})
    assert block["is_error"] is True
    assert block["content"][0]["text"] == "exit code 7\n[stdout]\npartial\n[stderr]\noops"
    assert openai(runner, "run_command", {"command": "pwd", "cwd": "/tmp"}) == \
        "exit code 0\n[stdout]\n/tmp"


def test_a_file_round_trip(runner):
    assert openai(runner, "write_file", {"path": "notes/hello.txt", "content": "héllo\n"}) == \
        "wrote 7 bytes to /home/user/notes/hello.txt"
    assert openai(runner, "read_file", {"path": "/home/user/notes/hello.txt"}) == "héllo\n"
    assert openai(runner, "list_files", {"path": "notes"}) == \
        "/home/user/notes/hello.txt  (7 bytes)"
    assert "/home/user/notes/\n" in openai(runner, "list_files", {}) + "\n"
    # The same sandbox: the code sees the file the tool wrote. (The SDK takes the quotes off
    # a string's repr.)
    assert openai(runner, "run_code", {"code": "open('notes/hello.txt').read()"}) == \
        "[result]\nhéllo\\n"
    block = anthropic(runner, "read_file", {"path": "notes/missing.txt"})
    assert block["is_error"] is True
    assert "missing.txt" in block["content"][0]["text"]


@pytest.mark.parametrize("name,arguments,says", [
    ("run_code", {}, "run_code needs the argument 'code'"),
    ("run_code", {"code": "1", "timeout": "5"},
     "argument 'timeout' of run_code must be a JSON integer"),
    ("run_code", {"code": 1}, "argument 'code' of run_code must be a JSON string"),
    ("run_code", {"code": "1", "timeout": -1}, "argument 'timeout' of run_code must be at least 0"),
    ("run_code", {"code": "1", "sandbox_id": "abc"}, "run_code has no argument 'sandbox_id'"),
    ("delete_everything", {}, "there is no tool 'delete_everything'; the tools are run_code"),
    ("run_code", '{"code": "1 +', "the arguments are not valid JSON"),
    ("run_code", "[1]", "the arguments of run_code must be a JSON object"),
])
def test_a_bad_call_is_an_error_the_model_can_act_on(runner, name, arguments, says):
    assert says in openai(runner, name, arguments)
    if isinstance(arguments, dict):
        block = anthropic(runner, name, arguments)
        assert block["is_error"] is True
        assert says in block["content"][0]["text"]
    assert openai(runner, "run_code", {"code": "1 + 1"}) == "[result]\n2"


def test_code_past_its_timeout_is_stopped_and_the_runner_goes_on(runner):
    runner.call("run_code", {"code": "survivor = 'still here'"})
    started = time.monotonic()
    result = runner.call("run_code", {"code": "import time; time.sleep(30)", "timeout": 2})
    assert time.monotonic() - started < 25
    assert result.is_error
    assert "run_code failed: TimeoutException" in result.text
    assert "this call's timeout was 2 s" in result.text

    result = runner.call("run_command", {"command": "sleep 30", "timeout": 2})
    assert result.is_error
    assert "run_command failed: TimeoutException" in result.text

    # The kernel was interrupted, not restarted: what the model made before is still there.
    assert runner.call("run_code", {"code": "survivor"}).text == "[result]\nstill here"


def test_output_over_the_cap_is_cut_with_a_note(runner):
    text = openai(runner, "run_code", {"code": "print('a' * 25_000 + 'b' * 24_999)"})
    assert text.startswith("[stdout]\naaaa")
    assert text.endswith("bbbb")
    assert "[... 30,000 of 50,000 characters cut here; for long output, write it to a file" in text
    assert len(text) < 20_200


def test_a_killed_sandbox_is_an_error_not_an_exception(runner):
    runner.sandbox.kill()
    for name, args in [("run_code", {"code": "1"}), ("read_file", {"path": "a.txt"})]:
        result = runner.call(name, args)
        assert result.is_error
        assert result.text.startswith(f"{name} failed: "), result.text
