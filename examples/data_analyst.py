"""A model answers a question about a CSV by running pandas in an Airlock sandbox, through plain
OpenAI-style function calling (urllib only, so any OpenAI-compatible server will do).

  OPENAI_BASE_URL        the model's API (default https://api.openai.com/v1; Ollama's is
                         http://localhost:11434/v1)
  OPENAI_API_KEY         its key (a local server may need none)
  AIRLOCK_EXAMPLE_MODEL  the model (default gpt-4o-mini)
  E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY   the Airlock server, as for the e2b SDK

--dry-run replays recorded/data_analyst.json instead of asking a model."""

import importlib.util
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

# Without `pip install -e python/airlock-tools`, this checkout's copy.
if importlib.util.find_spec("airlock_tools") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "airlock-tools"))
from airlock_tools import Runner, openai_tools  # noqa: E402

import salaries_task as task  # noqa: E402

DEFAULT_BASE_URL = "https://api.openai.com/v1"


def model_endpoint():
    """`chat(messages) -> assistant message` against the chat-completions API."""
    base = os.environ.get("OPENAI_BASE_URL", DEFAULT_BASE_URL).rstrip("/")
    key = os.environ.get("OPENAI_API_KEY")
    model = os.environ.get("AIRLOCK_EXAMPLE_MODEL", "gpt-4o-mini")
    if not key and base == DEFAULT_BASE_URL:
        sys.exit("set OPENAI_API_KEY, or OPENAI_BASE_URL for another server (Ollama: "
                 "http://localhost:11434/v1), or pass --dry-run")
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"

    def chat(messages):
        body = json.dumps({"model": model, "messages": messages, "tools": openai_tools()})
        request = urllib.request.Request(f"{base}/chat/completions", body.encode(), headers)
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                return json.load(response)["choices"][0]["message"]
        except urllib.error.HTTPError as e:
            sys.exit(f"{base}/chat/completions answered {e.code}: "
                     f"{e.read().decode(errors='replace')[:2000]}")

    return chat


def recorded_model():
    """`chat(messages) -> assistant message` that replays what a model once answered."""
    replies = iter(json.loads((task.HERE / "recorded" / "data_analyst.json").read_text()))
    return lambda messages: next(replies)


def solve(chat, runner):
    """The function-calling loop: runs the model's tool calls until it answers."""
    messages = [{"role": "system", "content": task.SYSTEM},
                {"role": "user", "content": task.QUESTION}]
    for _ in range(task.MAX_TURNS):
        reply = chat(messages)
        messages.append(reply)
        if not reply.get("tool_calls"):
            return reply["content"]
        for call in reply["tool_calls"]:
            task.show_call(call["function"]["name"], call["function"]["arguments"])
            answer = runner.openai(call)
            task.show_result(answer["content"])
            messages.append(answer)
    sys.exit(f"no answer after {task.MAX_TURNS} model turns")


def main():
    args = task.parse_args(__doc__)
    chat = recorded_model() if args.dry_run else model_endpoint()
    sandbox = task.start_sandbox()
    try:
        print(f"\nanswer: {solve(chat, Runner(sandbox))}")
        task.save_chart(sandbox, args.out)
    finally:
        sandbox.kill()


if __name__ == "__main__":
    main()
