"""Templates `from_image`: real images in a real registry on loopback (tests/images.py), pulled
by the server, each layer applied inside a build sandbox, then provisioned with what a sandbox
needs. One image is Debian with pip, the other BusyBox and musl with no glibc or bash."""

import http.server
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from e2b import BuildException, Sandbox, Template

from conftest import AIRLOCK, API_KEY
from harness import build_messages as messages
from images import Registry, assert_musl_hello_runs, debian_layout, musl_layout


@pytest.fixture(scope="module")
def debian_image(registry, server):
    return registry.push(debian_layout(), "latest", "test/debian:1")


@pytest.fixture(scope="module")
def musl_image(registry):
    return registry.push(musl_layout(), "latest", "test/musl:1")


def test_a_debian_image_with_a_pip_step_starts_sandboxes_as_user(names, debian_image):
    name = names()
    logs = []
    definition = lambda: (Template().from_image(debian_image)  # noqa: E731
                          .pip_install(["six"])
                          .run_cmd("echo $IMAGE_FLAVOUR > /home/user/flavour"))
    Template.build(definition(), name, on_build_logs=logs.append)
    text = "\n".join(messages(logs))
    assert f"FROM image {debian_image}" in text, text

    sbx = Sandbox.create(name)
    try:
        run = sbx.commands.run(
            "whoami; pwd; cat /home/user/flavour; python3 -c 'import six; print(six.__name__)'; "
            "grep -c '^user:' /etc/passwd; "
            "test -e /etc/sudoers.d/user && echo whiteout-missed || echo whiteout-applied")
        assert run.stdout.split() == [
            "user", "/home/user", "debian", "six", "1", "whiteout-applied"], run.stdout
        sudoers = sbx.commands.run("cat /etc/sudoers.d/airlock-user", user="root").stdout
        assert sudoers == "user ALL=(ALL:ALL) NOPASSWD: ALL\n", sudoers
        # The host's CA bundle (this image's own login profile points pip at its own copy).
        bundle = sbx.files.read("/etc/airlock/ca-certificates.crt")
        assert bundle == Path("/etc/ssl/certs/ca-certificates.crt").read_text()
    finally:
        sbx.kill()

    # Built again: nothing is downloaded and every layer comes from the cache.
    again = []
    Template.build(definition(), name, on_build_logs=again.append)
    text = messages(again)
    assert not any("downloading" in m for m in text), text
    assert any(m.endswith("cached") and m.startswith("layer ") for m in text), text
    # 3 image layers, provisioning, pip and the RUN.
    assert text.count("CACHED") >= 5, text


def test_a_musl_image_without_glibc_or_bash_runs_commands(names, musl_image):
    name = names()
    Template.build(Template().from_image(musl_image).run_cmd("hello > /home/user/built"), name)
    sbx = Sandbox.create(name)
    try:
        # The SDK runs `/bin/bash -l -c`; there is no bash, so the agent uses sh.
        run = sbx.commands.run("hello; cat /home/user/built; whoami; pwd; ls /lib")
        lines = run.stdout.split()
        assert lines[:6] == ["hello", "from", "musl", "hello", "from", "musl"], run.stdout
        assert lines[6:8] == ["user", "/tmp"], run.stdout
        assert "ld-musl-x86_64.so.1" in lines[8:], run.stdout
        assert sbx.commands.run("test -e /lib/x86_64-linux-gnu || echo no-glibc").stdout.strip() \
            == "no-glibc"
        # The image's env, and TLS clients pointed at the host's CA bundle.
        env = sbx.commands.run("echo $IMAGE_FLAVOUR $PIP_CERT").stdout.split()
        assert env == ["musl", "/etc/airlock/ca-certificates.crt"], env
        # Files move in and out as in any sandbox.
        sbx.files.write("/tmp/in.txt", "data")
        assert sbx.files.read("/tmp/in.txt") == "data"
    finally:
        sbx.kill()


def test_an_image_with_zstd_layers_is_unpacked(names, registry):
    """The same musl image with its layers recompressed with zstd (an OCI manifest with
    `tar+zstd` layers, as skopeo writes it) builds and runs."""
    image = registry.push(musl_layout(), "latest", "test/musl-zstd:1", zstd=True)
    assert registry.layer_types("test/musl-zstd", "1") == [
        "application/vnd.oci.image.layer.v1.tar+zstd"]
    assert_musl_hello_runs(Template().from_image(image), names())


@pytest.mark.server_only
def test_blobs_no_pull_used_lately_are_collected_at_start(names, registry, musl_image,
                                                          restarted):
    """Layer blobs are a download cache: a restart removes the ones no pull has used for a
    week (the zstd image's here, aged by hand), and keeps the ones a pull used since (the musl
    image's), whose next build then downloads nothing."""
    blobs = Path(os.environ["AIRLOCK_TEMPLATES_DIR"]) / "blobs" / "sha256"
    stale = registry.push(musl_layout(), "latest", "test/musl-stale:1", zstd=True)

    def downloads(image):
        logs = []
        Template.build(Template().from_image(image), names(), on_build_logs=logs.append)
        return [m for m in messages(logs) if m.startswith("layer ") and "downloading" in m]

    downloads(stale)
    downloads(musl_image)
    week_ago = time.time() - 8 * 24 * 3600
    for blob in blobs.iterdir():
        os.utime(blob, (week_ago, week_ago))
    assert downloads(musl_image) == [], "cached blobs are used, and so marked used"
    restarted()
    assert downloads(musl_image) == []
    assert downloads(stale), "the blobs no pull used for a week were collected"


def test_an_image_that_does_not_exist_fails_with_the_registrys_words(names, registry):
    name = names()
    with pytest.raises(BuildException) as err:
        Template.build(Template().from_image(f"{registry.address}/test/nothing:1"), name)
    text = str(err.value)
    assert "test/nothing" in text and "manifest unknown" in text.lower(), text
    assert not Template.exists(name)


def test_a_registry_at_a_private_address_needs_the_operator(names, registry):
    """Only the registry the server was started with `--insecure-registry` for is reachable
    on loopback (the test above is the positive control): another loopback port is refused
    before anything is fetched."""
    name = names()
    with pytest.raises(BuildException) as err:
        Template.build(Template().from_image("127.0.0.1:9/test/debian:1"), name)
    text = str(err.value)
    assert "private address" in text and "--insecure-registry 127.0.0.1:9" in text, text


@pytest.mark.server_only
def test_a_registry_cannot_send_the_pull_on_to_a_private_address(names, restarted):
    """A registry the operator allowed redirects its blob downloads to another port on
    loopback (a canary that records what reaches it). The server follows the redirect only
    when the operator named that address too (the positive control: the canary sees the
    request); otherwise the canary sees nothing and the build says what was refused."""
    hits = []

    class Canary(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_error(404)

        def log_message(self, *args):
            pass

    canary = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Canary)
    threading.Thread(target=canary.serve_forever, daemon=True).start()
    canary_address = f"127.0.0.1:{canary.server_port}"
    redirecting = Registry(redirect=f"http://{canary_address}")
    try:
        image = redirecting.push(musl_layout(), "latest", "cdn/musl:1")
        restarted("--insecure-registry", redirecting.address,
                  "--insecure-registry", canary_address)
        with pytest.raises(BuildException):
            Template.build(Template().from_image(image), names())
        assert hits, "the positive control: the redirect reaches the canary when allowed"

        hits.clear()
        restarted("--insecure-registry", redirecting.address)
        name = names()
        with pytest.raises(BuildException) as err:
            Template.build(Template().from_image(image), name)
        text = str(err.value)
        assert hits == [], hits
        assert "refused to connect" in text and canary_address in text, text
        assert not Template.exists(name)
    finally:
        canary.shutdown()
        redirecting.stop()


def test_a_private_registry_is_pulled_from_with_its_credentials_only(names, private_registry):
    """Without credentials, or with wrong ones, the build fails saying which; with
    `from_image(..., username, password)` it pulls."""
    image = private_registry.push(musl_layout(), "latest", "team/musl:1")
    for kwargs, expected in (({}, "wants credentials"),
                             ({"username": "tester", "password": "wrong"},
                              "did not accept the credentials of 'tester'")):
        name = names()
        with pytest.raises(BuildException) as err:
            Template.build(Template().from_image(image, **kwargs), name)
        assert expected in str(err.value), (kwargs, err.value)
        assert not Template.exists(name)
    assert_musl_hello_runs(Template().from_image(image, username="tester", password="secret"),
                           names())


def test_bad_registry_credentials_are_refused_before_the_build(names, registry):
    name = names()
    # The SDK offers AWS keys; this server cannot turn them into a token and says so.
    template = Template().from_aws_registry(f"{registry.address}/test/debian:1",
                                            access_key_id="a", secret_access_key="b",
                                            region="us-east-1")
    with pytest.raises(Exception) as err:
        Template.build(template, name)
    assert "aws ecr get-login-password" in str(err.value), err.value


def test_a_dockerfile_through_the_sdk(names, debian_image, tmp_path):
    """`from_dockerfile`: the SDK parses it into an image and steps; CMD is the start command,
    so its server already answers when the sandbox starts."""
    (tmp_path / "index.html").write_text("served from the image\n")
    dockerfile = (
        f"FROM {debian_image}\n"
        "ARG GREETING=hello\n"
        "ENV MODE=prod\n"
        "WORKDIR /srv\n"
        "COPY index.html /srv/index.html\n"
        "RUN echo \"$GREETING $MODE\" > /srv/built.txt\n"
        'CMD ["python3", "-m", "http.server", "8000"]\n'
    )
    (tmp_path / "Dockerfile").write_text(dockerfile)
    name = names()
    template = Template(file_context_path=str(tmp_path)).from_dockerfile(
        str(tmp_path / "Dockerfile"))
    Template.build(template, name)
    sbx = Sandbox.create(name)
    try:
        run = sbx.commands.run("cat /srv/built.txt; curl -fsS http://127.0.0.1:8000/index.html; "
                               "whoami; echo $MODE")
        assert run.stdout.split("\n")[:4] == [
            "hello prod", "served from the image", "user", "prod"], run.stdout
    finally:
        sbx.kill()


def airlock_cli(server, *args, timeout=900):
    return subprocess.run([str(AIRLOCK), "--url", server.url, "--api-key", API_KEY, *args],
                          capture_output=True, text=True, timeout=timeout)


def test_the_cli_builds_a_dockerfile(server, names, debian_image, tmp_path):
    """`airlock template build -f Dockerfile -n NAME CONTEXT`: Airlock parses the Dockerfile
    itself, uploads COPY's files, prints the build's log as it goes, and the template's
    start command (its CMD) already answers when a sandbox starts."""
    ctx = tmp_path / "ctx"
    (ctx / "site").mkdir(parents=True)
    (ctx / "site" / "index.html").write_text("served by the Dockerfile's CMD\n")
    (ctx / "site" / "link").symlink_to("index.html")
    (ctx / "setup.sh").write_text("echo \"set up in $PWD for $GREETING\" > done.txt\n")
    (tmp_path / "Dockerfile").write_text(
        f"ARG IMAGE={debian_image}\n"
        "FROM $IMAGE\n"
        "ARG GREETING=hello\n"
        "ENV MODE=prod \\\n    SITE=/srv/site\n"
        "WORKDIR /srv\n"
        "COPY site/ $SITE/\n"
        "COPY --chmod=0755 setup.sh /tmp/\n"
        "RUN sh /tmp/setup.sh\n"
        "EXPOSE 8000\n"
        "USER user\n"
        'CMD ["python3", "-m", "http.server", "8000", "--directory", "/srv/site"]\n'
    )
    name = names()
    args = ["template", "build", "-f", str(tmp_path / "Dockerfile"), "-n", name,
            "--ready-cmd", "curl -fs http://127.0.0.1:8000/", str(ctx)]
    built = airlock_cli(server, *args)
    assert built.returncode == 0, built.stdout + built.stderr
    assert "ignored line 10: EXPOSE" in built.stderr, built.stderr
    # Each log line carries the seconds since the command began, then the step.
    assert any(line.strip().startswith(tuple("0123456789")) and "RUN sh /tmp/setup.sh" in line
               for line in built.stdout.splitlines()), built.stdout
    assert "built in" in built.stdout, built.stdout

    sbx = Sandbox.create(name)
    try:
        run = sbx.commands.run("whoami; pwd; echo $MODE $GREETING; cat /srv/done.txt; "
                               "readlink /srv/site/link; curl -fsS http://127.0.0.1:8000/")
        assert run.stdout.splitlines() == [
            "user", "/srv", "prod hello", "set up in /srv for hello", "index.html",
            "served by the Dockerfile's CMD"], run.stdout
    finally:
        sbx.kill()

    again = airlock_cli(server, *args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "the server has these files already" in again.stdout, again.stdout
    assert "CACHED" in again.stdout, again.stdout


def test_a_dockerfile_builds_on_a_built_in_template(server, names, tmp_path):
    """`FROM base` in a Dockerfile the CLI builds is the built-in template (itself built from
    templates/base/Dockerfile), as `from_template("base")` is, not an image of that name."""
    (tmp_path / "Dockerfile").write_text("FROM base\nRUN pip --version > /opt/pip.txt\n")
    name = names()
    built = airlock_cli(server, "template", "build", "-f", str(tmp_path / "Dockerfile"),
                        "-n", name)
    assert built.returncode == 0, built.stdout + built.stderr
    assert "FROM template base" in built.stdout, built.stdout
    sbx = Sandbox.create(name)
    try:
        run = sbx.commands.run("whoami; cat /opt/pip.txt")
        assert run.stdout.splitlines()[0] == "user", run.stdout
        assert run.stdout.splitlines()[1].startswith("pip "), run.stdout
    finally:
        sbx.kill()


def test_the_cli_heeds_dockerignore_and_build_args(server, names, tmp_path):
    """`.dockerignore` keeps files out of what COPY sends (and so out of the template), and
    `--build-arg` sets an ARG (which, as in the SDK, sandboxes also get as a variable); a build
    argument no ARG takes is reported, as Docker does."""
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "main.py").write_text("print('hi')\n")
    (tmp_path / "app" / "debug.log").write_text("not for the template\n")
    (tmp_path / "node_modules" / "left-pad").mkdir(parents=True)
    (tmp_path / "node_modules" / "left-pad" / "index.js").write_text("module.exports = 1\n")
    (tmp_path / ".dockerignore").write_text("# local only\n**/*.log\nnode_modules/\n")
    (tmp_path / "Dockerfile").write_text(
        "FROM base\nARG FLAVOUR=plain\nCOPY . /srv/\nRUN echo $FLAVOUR > /srv/flavour\n")
    name = names()
    built = airlock_cli(server, "template", "build", "-f", str(tmp_path / "Dockerfile"),
                        "-n", name, "--build-arg", "FLAVOUR=spicy", "--build-arg", "UNUSED=1",
                        str(tmp_path))
    assert built.returncode == 0, built.stdout + built.stderr
    assert "ignored --build-arg UNUSED" in built.stderr, built.stderr
    sbx = Sandbox.create(name)
    try:
        files = sbx.commands.run("cd /srv && find . -type f | sort").stdout.split()
        assert "./app/main.py" in files and "./Dockerfile" in files, files
        assert "./app/debug.log" not in files, files
        assert not any(f.startswith("./node_modules") for f in files), files
        assert sbx.commands.run("cat /srv/flavour; echo $FLAVOUR").stdout == "spicy\nspicy\n"
    finally:
        sbx.kill()


@pytest.mark.parametrize("line, expected", [
    ("HEALTHCHECK CMD true", "line 3: HEALTHCHECK is not supported"),
    ("COPY missing.txt /srv/", "COPY missing.txt: missing.txt is not in the build context"),
    ("RUN --mount=type=cache,target=/root/.cache true", "line 3: RUN --mount is not supported"),
])
def test_the_cli_refuses_what_it_cannot_build_before_making_anything(
        server, names, debian_image, tmp_path, line, expected):
    (tmp_path / "Dockerfile").write_text(f"FROM {debian_image}\nRUN true\n{line}\n")
    name = names()
    failed = airlock_cli(server, "template", "build", "-f", str(tmp_path / "Dockerfile"),
                         "-n", name, timeout=60)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert expected in failed.stderr, failed.stderr
    assert not Template.exists(name)
