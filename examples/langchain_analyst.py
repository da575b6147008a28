"""The data analyst of data_analyst.py through LangChain: the sandbox's tools as LangChain tools,
bound to a chat model, their results as ToolMessages.

  OPENAI_BASE_URL        the model's API (ChatOpenAI's default: OpenAI's; Ollama's is
                         http://localhost:11434/v1, with any OPENAI_API_KEY)
  OPENAI_API_KEY         its key
  AIRLOCK_EXAMPLE_MODEL  the model (default gpt-4o-mini)
  E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY   the Airlock server, as for the e2b SDK

Needs `pip install langchain-core`, and langchain-openai for a real model; --dry-run replays
recorded/langchain_analyst.json instead of asking one."""

import importlib.util
import json
import os
import sys
from pathlib import Path

# Without `pip install -e python/airlock-tools`, this checkout's copy.
if importlib.util.find_spec("airlock_tools") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "airlock-tools"))
import airlock_tools.langchain  # noqa: E402
from airlock_tools import Runner  # noqa: E402

import salaries_task as task  # noqa: E402

try:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
except ImportError:
    sys.exit("this example needs LangChain's core: pip install langchain-core")


def real_model():
    try:
        from langchain_openai import ChatOpenAI
    except ImportError:
        sys.exit("a real model needs langchain-openai: pip install langchain-openai "
                 "(or pass --dry-run)")
    return ChatOpenAI(model=os.environ.get("AIRLOCK_EXAMPLE_MODEL", "gpt-4o-mini"))


def recorded_model():
    """A chat model that answers with the recorded AIMessages in turn."""
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.utils.function_calling import convert_to_openai_tool

    class Replay(GenericFakeChatModel):
        def bind_tools(self, tools, **kwargs):
            # What ChatOpenAI would send: each tool converted to OpenAI's shape.
            names = [convert_to_openai_tool(t)["function"]["name"] for t in tools]
            print(f"tools bound: {', '.join(names)}")
            return self

    recorded = json.loads((task.HERE / "recorded" / "langchain_analyst.json").read_text())
    return Replay(messages=iter(AIMessage(**m) for m in recorded))


def solve(model, runner):
    """The tool-calling loop: runs the model's tool calls through LangChain until it answers."""
    tools = {t.name: t for t in airlock_tools.langchain.tools(runner)}
    model = model.bind_tools(list(tools.values()))
    messages = [SystemMessage(task.SYSTEM), HumanMessage(task.QUESTION)]
    for _ in range(task.MAX_TURNS):
        reply = model.invoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            return reply.content
        for call in reply.tool_calls:
            task.show_call(call["name"], call["args"])
            tool = tools.get(call["name"])
            result = tool.invoke(call) if tool else ToolMessage(
                f"there is no tool {call['name']!r}; the tools are {', '.join(tools)}",
                tool_call_id=call["id"], status="error")
            task.show_result(result.content)
            messages.append(result)
    sys.exit(f"no answer after {task.MAX_TURNS} model turns")


def main():
    args = task.parse_args(__doc__)
    model = recorded_model() if args.dry_run else real_model()
    sandbox = task.start_sandbox()
    try:
        print(f"\nanswer: {solve(model, Runner(sandbox))}")
        task.save_chart(sandbox, args.out)
    finally:
        sandbox.kill()


if __name__ == "__main__":
    main()
