"""Airlock's sandbox tools for a model's function calling in your own loop: their definitions
for the OpenAI and Anthropic APIs, and a Runner that carries out the calls in a sandbox."""

from .runner import Runner, ToolResult
from .schemas import TOOL_NAMES, anthropic_tools, openai_tools

__all__ = ["TOOL_NAMES", "Runner", "ToolResult", "anthropic_tools", "openai_tools"]
