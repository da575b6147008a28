"""What the server reads from a sandbox's agent is capped (issue 31): the MCP server at `/mcp`
runs inside `airlock serve`, so a sandbox whose directory listing is hundreds of MiB must get
a tool error naming the cap, not the server's memory. The positive control: a listing of a
normal directory in the same session."""

import pytest

from test_mcp import session, text_of

pytestmark = pytest.mark.newest_sdk

# A directory whose listing (the agent's JSON answer) is about 60 MB: 15,000 files with
# 250-character names, 14 directories of 250 characters deep.
MAKE_HUGE_LISTING = """
import os
deep = "/home/user/" + "/".join(c * 250 for c in "abcdefghijklmn")
os.makedirs(deep)
os.chdir(deep)
for i in range(15000):
    open(f"{i:06d}" + "x" * 244, "w").close()
print(len(deep))
"""


def test_a_huge_listing_is_refused_at_its_cap_not_buffered(server):
    deep = "/home/user/" + "/".join(c * 250 for c in "abcdefghijklmn")
    seen = {}

    async def steps(client):
        made = await client.call_tool("run_code", {"code": MAKE_HUGE_LISTING, "timeout": 300})
        assert not made.is_error, text_of(made)
        # The positive control first: a listing under the cap comes back whole.
        seen["small"] = await client.call_tool("list_files", {"path": "/home/user"})
        server.reset_peak_memory()  # the peak from here on
        seen["before"] = server.peak_memory_mib()
        seen["huge"] = await client.call_tool("list_files", {"path": deep})

    try:
        session(server, "http-session", steps)
    except Exception as e:  # what the client makes of an answer it cannot take
        seen.setdefault("huge", e)
    grew = server.peak_memory_mib() - seen["before"]
    small, huge = seen["small"], seen["huge"]
    assert not small.is_error and "aaaa" in text_of(small), text_of(small)[:500]
    assert grew < 64, f"the server's memory rose by {grew} MiB ({huge!r:.300})"
    assert not isinstance(huge, Exception), huge
    assert huge.is_error and "4 MiB" in text_of(huge), text_of(huge)[:500]
