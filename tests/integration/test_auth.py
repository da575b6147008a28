"""API keys: several, stored hashed, each seeing only its own sandboxes, and revocation. Keys are
made with the real `airlock key` CLI against the server's data dir. (Signed URLs expiring is
covered in test_files.py.)"""

import sqlite3
import subprocess
import uuid

import pytest
from e2b import AuthenticationException, Sandbox, SandboxQuery
from e2b.exceptions import NotFoundException

from conftest import AIRLOCK, airlock_key


def test_each_key_sees_only_its_own_sandboxes(server):
    run = uuid.uuid4().hex[:8]
    alice_name, bob_name = f"alice-{run}", f"bob-{run}"
    alice = airlock_key(server, "create", "--name", alice_name)
    bob = airlock_key(server, "create", "--name", bob_name)
    assert alice.startswith("e2b_") and alice != bob

    # Only hashes are stored.
    db = sqlite3.connect(server.data_dir / "airlock.db")
    stored = [row[0] for row in db.execute("SELECT sha256 FROM api_keys")]
    assert alice not in stored and bob not in stored and len(stored) >= 3

    mine = Sandbox.create("base", api_key=alice, metadata={"owner": "alice"})
    try:
        assert Sandbox.get_info(mine.sandbox_id, api_key=alice).sandbox_id == mine.sandbox_id
        with pytest.raises(NotFoundException):
            Sandbox.get_info(mine.sandbox_id, api_key=bob)
        query = SandboxQuery(metadata={"owner": "alice"})
        assert [s.sandbox_id for s in Sandbox.list(query=query, api_key=bob).next_items()] == []
        assert [s.sandbox_id for s in Sandbox.list(query=query, api_key=alice).next_items()] == [mine.sandbox_id]
        assert Sandbox.kill(mine.sandbox_id, api_key=bob) is False
        with pytest.raises(NotFoundException):
            Sandbox.connect(mine.sandbox_id, api_key=bob)
        for path in ["pause", "resume", "snapshots", "fork", "timeout"]:
            status, body = server.api("POST", f"/sandboxes/{mine.sandbox_id}/{path}", {"timeout": 30}, key=bob)
            assert (status, body["code"]) == (404, 404), (path, body)
        # Bob's key does not reach the sandbox, but the sandbox still runs for Alice.
        assert mine.commands.run("echo still mine").stdout == "still mine\n"
    finally:
        assert Sandbox.kill(mine.sandbox_id, api_key=alice) is True

    listed = airlock_key(server, "ls")
    rows = {line.split()[1]: line.split() for line in listed.splitlines()[1:] if len(line.split()) >= 4}
    assert alice_name in rows and bob_name in rows
    bob_id = rows[bob_name][0]
    assert airlock_key(server, "revoke", bob_id) == f"revoked {bob_id}"
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key=bob).next_items()
    rows = {line.split()[1]: line.split() for line in airlock_key(server, "ls").splitlines()[1:] if len(line.split()) >= 4}
    assert rows[bob_name][-1] != "-" and rows[alice_name][-1] == "-", rows
    status, body = server.api("GET", "/v2/sandboxes", key=bob)
    assert status == 401 and "revoked" in body["message"]
    # Revoking twice, or an unknown id, is a clear failure.
    again = subprocess.run(
        [str(AIRLOCK), "--data-dir", str(server.data_dir), "key", "revoke", bob_id],
        capture_output=True, text=True,
    )
    assert again.returncode == 1 and "no live key" in again.stderr
    Sandbox.list(api_key=alice).next_items()

