"""The runner's tools as LangChain tools (needs `langchain-core`, which this package does not
install for the users who do not need it)."""

from .schemas import TOOL_NAMES, definition, input_schema


def tools(runner):
    """`StructuredTool`s that run in `runner`'s sandbox. A failed call becomes a ToolMessage with
    `status="error"`; the images a call made are its message's `artifact` (PNG bytes)."""
    from langchain_core.tools import StructuredTool, ToolException

    def make(name):
        def run(**args):
            result = runner.call(name, args)
            if result.is_error:
                raise ToolException(result.text)
            return result.text_with_image_note(), result.images

        return StructuredTool(name=name, description=definition(name)["description"],
                              args_schema=input_schema(name), func=run,
                              response_format="content_and_artifact", handle_tool_error=True)

    return [make(name) for name in TOOL_NAMES]
