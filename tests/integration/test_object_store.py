"""Paused images in object storage (`airlock serve --object-store`), through a real S3 server
(s3s-fs, by scripts/s3.sh). Another node is simulated honestly: the paused image is deleted
from this server's disk, as it would be missing on a node that did not pause the sandbox, so
the resume can only come from what the pause uploaded. Parking is off (--paused-memory-mb 0),
so a resume restores the image and does not thaw a kept runtime. The control beside it shows
that without object storage the same deletion makes the resume fail."""

import shutil
import time

import pytest

from test_operator_metrics import scrape, value

# A counter that only a live process advances, in a shell variable; /tmp is the sandbox's
# memory (gVisor's tmpfs), so the file and the variable are both in the paused image's memory.
COUNTER = ("n=0; while true; do n=$((n+1)); echo $n > /tmp/n.new; mv /tmp/n.new /tmp/n;"
           " sleep 0.1; done")

# An object store where nothing listens.
DOWN = ("s3://airlock-test?endpoint=http://127.0.0.1:9&allow_http=true&region=us-east-1"
        "&access_key_id=a&secret_access_key=b")


def paused_with_state(sbx):
    """Pauses `sbx` with a file on its disk and a process counting in memory; returns the count
    just before the pause."""
    sbx.files.write("/home/user/kept", "written before the pause")
    sbx.commands.run(COUNTER, background=True)
    time.sleep(1)
    before = int(sbx.files.read("/tmp/n"))
    assert sbx.pause() is True
    return before


def delete_local_image(server, sbx):
    images = server.data_dir / "gvisor" / "images"
    [image] = [p for p in images.iterdir() if p.name == f"paused-{sbx.sandbox_id}"]
    assert (image / "checkpoint.img").is_file(), list(image.iterdir())
    shutil.rmtree(image)


def objects_of(bucket, sbx):
    """The sandbox's objects in the bucket, as the S3 server keeps them on disk."""
    folder = bucket / "paused" / sbx.sandbox_id
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) \
        if folder.exists() else []


def eventually(check, within=15):
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_a_sandbox_resumes_from_object_storage_when_its_image_is_not_on_disk(
        server, restarted, s3, sandbox_factory):
    url, bucket = s3
    restarted("--object-store", url, "--paused-memory-mb", "0")
    sbx = sandbox_factory()
    before = paused_with_state(sbx)
    uploaded = objects_of(bucket, sbx)
    names = {name.split("/", 1)[1] for name in uploaded}
    assert {"manifest.json", "checkpoint.img", "pages.img"} <= names, uploaded
    assert value(scrape(server), "airlock_paused_image_uploads_total", outcome="ok") >= 1

    delete_local_image(server, sbx)
    sbx.connect()
    assert sbx.files.read("/home/user/kept") == "written before the pause"
    resumed = int(sbx.files.read("/tmp/n"))
    assert resumed >= before, "the counter went on from its memory, not from 0"
    time.sleep(0.5)
    assert int(sbx.files.read("/tmp/n")) > resumed, "and the process lives on"
    assert value(scrape(server), "airlock_paused_image_downloads_total", outcome="ok") >= 1
    # The image is spent by the resume, in object storage as on disk.
    eventually(lambda: objects_of(bucket, sbx) == [])

    # Paused again, it is uploaded again; its kill deletes it.
    paused_with_state(sbx)
    assert any(n.endswith("/manifest.json") for n in objects_of(bucket, sbx))
    sbx.kill()
    eventually(lambda: objects_of(bucket, sbx) == [])


def test_without_object_storage_the_same_deletion_makes_the_resume_fail(
        server, restarted, sandbox_factory):
    restarted("--paused-memory-mb", "0")
    sbx = sandbox_factory()
    paused_with_state(sbx)
    delete_local_image(server, sbx)
    with pytest.raises(Exception) as failed:
        sbx.connect()
    assert "paused image is gone" in str(failed.value), failed.value
    status, body = server.api("POST", f"/sandboxes/{sbx.sandbox_id}/resume", {})
    assert status == 500 and "paused image is gone" in body["message"], body


def test_a_pause_succeeds_when_object_storage_is_down(server, restarted, sandbox_factory):
    # The upload fails, the image stays on this host.
    restarted("--object-store", DOWN, "--paused-memory-mb", "0")
    sbx = sandbox_factory()
    before = paused_with_state(sbx)
    assert value(scrape(server), "airlock_paused_image_uploads_total", outcome="failed") >= 1
    sbx.connect()
    assert sbx.files.read("/home/user/kept") == "written before the pause"
    assert int(sbx.files.read("/tmp/n")) >= before


def test_a_restart_keeps_a_sandbox_whose_image_is_only_in_object_storage(
        server, restarted, s3, sandbox_factory):
    url, bucket = s3
    restarted("--object-store", url, "--paused-memory-mb", "0")
    sbx = sandbox_factory()
    before = paused_with_state(sbx)
    delete_local_image(server, sbx)
    # Back with object storage unreachable: kept as paused, and its resume says to try again.
    restarted("--object-store", DOWN, "--paused-memory-mb", "0")
    status, body = server.api("POST", f"/sandboxes/{sbx.sandbox_id}/resume", {})
    assert status == 503 and "could not be fetched from object storage" in body["message"], body
    assert objects_of(bucket, sbx), "the image is still there"
    # Back with it: the resume downloads it.
    restarted("--object-store", url, "--paused-memory-mb", "0")
    sbx.connect()
    assert sbx.files.read("/home/user/kept") == "written before the pause"
    assert int(sbx.files.read("/tmp/n")) >= before
