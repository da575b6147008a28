"""The code interpreter through the pinned e2b-code-interpreter SDK, with real Jupyter kernels
inside a `code-interpreter-v1` sandbox."""

import base64
import time

import pytest
from e2b import TimeoutException

CI_TEMPLATE = "code-interpreter-v1"


@pytest.fixture
def ci(server):
    from e2b_code_interpreter import Sandbox

    sbx = Sandbox.create(CI_TEMPLATE, metadata={"suite": "code-interpreter"})
    yield sbx
    try:
        sbx.kill()
    except Exception:
        pass


def test_state_persists_across_calls(ci):
    ci.run_code("x = 40")
    execution = ci.run_code("x + 2")
    assert execution.text == "42"
    assert execution.error is None
    assert ci.run_code("x").execution_count > 1


def test_stdout_stderr_and_callbacks(ci):
    out, err = [], []
    execution = ci.run_code(
        "import sys\nprint('hello')\nprint('oops', file=sys.stderr)",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert execution.logs.stdout == ["hello\n"]
    assert execution.logs.stderr == ["oops\n"]
    assert [m.line for m in out] == ["hello\n"]
    assert [m.line for m in err] == ["oops\n"]
    assert out[0].timestamp


def test_error_with_traceback(ci):
    execution = ci.run_code("def f():\n    return 1 / 0\nf()")
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError"
    assert execution.error.value == "division by zero"
    assert "f()" in execution.error.traceback
    # The context is still usable.
    assert ci.run_code("1 + 1").text == "2"


def test_matplotlib_plot_comes_back_as_png_with_chart_data(ci):
    execution = ci.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [4, 5, 6], label='rising')\n"
        "plt.title('A line')\n"
        "plt.xlabel('x')\n"
    )
    assert execution.error is None
    pngs = [r for r in execution.results if r.png]
    assert len(pngs) == 1
    assert base64.b64decode(pngs[0].png)[:8] == b"\x89PNG\r\n\x1a\n"
    chart = pngs[0].chart
    assert chart is not None
    assert chart.type.value == "line"
    assert chart.title == "A line"
    assert chart.elements[0].label == "rising"


@pytest.mark.parametrize("labels, style", [
    ("tick_labels", ""), ("tick_labels", ", patch_artist=True"), ("tick_labels", ", vert=False"),
    # The name E2B's matplotlib (3.9) still takes, as users' code written for it passes it.
    ("labels", ""),
])
def test_box_plot_comes_back_with_quartiles_and_outliers(ci, labels, style):
    # Boxes drawn as lines (matplotlib's default), as patches, and lying down.
    execution = ci.run_code(
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots()\n"
        f"ax.boxplot([[1, 2, 3, 4, 5, 30], [10, 12, 14, 16, 18]], {labels}=['a', 'b']"
        f"{style})\n"
        "ax.set_title('Spread')\n"
        "plt.show()\n"
    )
    assert execution.error is None, execution.error
    [result] = [r for r in execution.results if r.png]
    chart = result.chart
    assert chart.type.value == "box_and_whisker" and chart.title == "Spread"
    a, b = chart.elements
    # numpy's quartiles of [1, 2, 3, 4, 5, 30]: 2.25, 3.5, 4.75; 30 lies beyond the whisker.
    assert (a.label, a.first_quartile, a.median, a.third_quartile) == ("a", 2.25, 3.5, 4.75)
    assert (a.min, a.max, a.outliers) == (1, 5, [30])
    assert (b.label, b.min, b.median, b.max, b.outliers) == ("b", 10, 14, 18, [])


def test_a_saved_or_shown_pil_image_is_a_png_result(ci):
    execution = ci.run_code(
        "from PIL import Image\n"
        "img = Image.new('RGB', (40, 20), 'red')\n"
        "img.save('/home/user/red.png')\n"
        "img.show()\n"
    )
    assert execution.error is None, execution.error
    pngs = [base64.b64decode(r.png) for r in execution.results if r.png]
    assert len(pngs) == 2 and all(p[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs), execution
    # The file is written as asked.
    assert ci.files.read("/home/user/red.png", format="bytes")[:8] == b"\x89PNG\r\n\x1a\n"
    # Saving to a buffer is not a result.
    quiet = ci.run_code("import io\nimg.save(io.BytesIO(), 'PNG')")
    assert quiet.results == [], quiet


def test_dataframe_comes_back_as_html_and_data(ci):
    execution = ci.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
    assert execution.error is None
    main = execution.results[0]
    assert main.is_main_result
    assert "<table" in main.html
    assert main.data is not None


def test_timeout_interrupts_and_the_context_survives(ci):
    ci.run_code("survivor = 'still here'")
    started = time.monotonic()
    with pytest.raises(TimeoutException):
        ci.run_code("import time\nwhile True: time.sleep(0.1)", timeout=3)
    assert time.monotonic() - started < 30
    assert ci.run_code("survivor").text == "still here"


def test_contexts_are_isolated_and_can_restart(ci):
    a = ci.create_code_context()
    b = ci.create_code_context(cwd="/tmp")
    ci.run_code("secret = 1", context=a)
    assert ci.run_code("secret", context=b).error.name == "NameError"
    assert ci.run_code("import os; os.getcwd()", context=b).text == "/tmp"
    ids = [c.id for c in ci.list_code_contexts()]
    assert a.id in ids and b.id in ids
    languages = {c.language for c in ci.list_code_contexts()}
    assert {"python", "javascript"} <= languages
    ci.restart_code_context(a)
    assert ci.run_code("secret", context=a).error.name == "NameError"
    ci.remove_code_context(b)
    assert b.id not in [c.id for c in ci.list_code_contexts()]


def test_kernels_run_as_root_and_commands_as_user(ci):
    # E2B's code interpreter runs kernels as root: a context may work in /root (its upstream
    # test_cwd), while commands keep the sandbox's user.
    root = ci.create_code_context(cwd="/root")
    assert ci.run_code("import os; (os.getuid(), os.getcwd())", context=root).text == "(0, '/root')"
    assert ci.run_code("import os; os.getuid()").text == "0", "the default context too"
    assert ci.commands.run("whoami").stdout == "user\n"
    # A context may name its user (E2B's `user` field, sent as the SDK's own request is).
    headers = {"E2b-Sandbox-Id": ci.sandbox_id, "E2b-Sandbox-Port": "49999",
               "E2B-Traffic-Access-Token": ci.traffic_access_token}
    made = ci._client.post(f"{ci._jupyter_url}/contexts", json={"user": "user"}, headers=headers)
    assert made.status_code == 200, made.text
    from e2b_code_interpreter.models import Context

    mine = Context.from_json(made.json())
    assert ci.run_code("import os; (os.getuid(), os.getcwd())", context=mine).text == "(1000, '/home/user')"
    unknown = ci._client.post(f"{ci._jupyter_url}/contexts", json={"user": "nobody-here"},
                              headers=headers)
    assert unknown.status_code == 400 and "nobody-here" in unknown.text


def test_pause_and_resume_keep_the_kernels_state(ci):
    from e2b_code_interpreter import Sandbox

    ci.run_code("import math\nx = 41\nkept = [math.pi]")
    js = ci.create_code_context(language="javascript")
    ci.run_code("const answer = 6 * 7", context=js)
    counted = ci.run_code("x").execution_count
    # The control: the state reads back before the pause, by the same calls as after it.
    reads = [("x + 1", None, "42"), ("round(kept[0], 5)", None, "3.14159"),
             ("answer + 1", js, "43")]
    assert [ci.run_code(code, context=ctx).text for code, ctx, _ in reads] == [t for *_, t in reads]
    assert ci.pause() is True
    again = Sandbox.connect(ci.sandbox_id)
    got = [again.run_code(code, context=ctx) for code, ctx, _ in reads]
    assert [(e.error, e.text) for e in got] == [(None, t) for *_, t in reads], "the kernels kept it"
    assert again.run_code("x").execution_count > counted, "the same kernel counts on"


def test_javascript_and_bash(ci):
    js = ci.run_code("const n: number = 20 + 22; console.log(n)", language="js")
    assert js.error is None, js.error
    assert js.logs.stdout == ["42\n"]
    bash = ci.run_code("echo from-bash; echo $((6 * 7))", language="bash")
    assert bash.error is None
    assert "".join(bash.logs.stdout) == "from-bash\n42\n"


def test_env_vars_per_run_and_per_sandbox(server):
    from e2b_code_interpreter import Sandbox

    sbx = Sandbox.create(CI_TEMPLATE, envs={"GLOBAL_VAR": "g"})
    try:
        code = "import os; (os.environ.get('GLOBAL_VAR'), os.environ.get('RUN_VAR'))"
        assert sbx.run_code(code, envs={"RUN_VAR": "r"}).text == "('g', 'r')"
        assert sbx.run_code(code).text == "('g', None)"
    finally:
        sbx.kill()


def test_r_keeps_state_and_sees_env_vars_and_its_cwd(server):
    from e2b_code_interpreter import Sandbox

    sbx = Sandbox.create(CI_TEMPLATE, envs={"GLOBAL_VAR": "g"})
    try:
        assert sbx.run_code("x <- 41", language="r").error is None
        # The value of a cell's last expression is its main result, as on E2B, so `.text` is
        # it; a value that more output follows was not the last expression.
        summed = sbx.run_code("x + 1\nsum(c(1, 2, 3))", language="r")
        assert [(r.text, r.is_main_result) for r in summed.results] == [
            ("[1] 42", False), ("[1] 6", True)] and summed.text == "[1] 6", summed
        followed = sbx.run_code("x\ncat('to stdout\\n')", language="r")
        assert [(r.text, r.is_main_result) for r in followed.results] == [("[1] 41", False)]
        assert followed.text is None and followed.logs.stdout == ["to stdout\n"], followed
        plot = sbx.run_code("plot(1:10)", language="r").results
        assert len(plot) == 1 and base64.b64decode(plot[0].png).startswith(b"\x89PNG"), plot
        assert not plot[0].is_main_result, "a plot is shown, not the cell's value"
        failed = sbx.run_code("stop('no such thing')", language="r")
        assert failed.error is not None and "no such thing" in failed.error.value, failed.error

        code = "cat(Sys.getenv('GLOBAL_VAR'), Sys.getenv('RUN_VAR', unset = 'none'), sep = '|')"
        value = 'it\'s "quoted"\n\\ here'

        def seen(**kwargs):
            run = sbx.run_code(code, language="r", **kwargs)
            assert run.error is None, run.error
            return "".join(run.logs.stdout)

        assert seen(envs={"RUN_VAR": value}) == "g|" + value
        assert seen() == "g|none", "a run's variables last for that run only"

        ctx = sbx.create_code_context(language="r", cwd="/tmp")
        assert [r.text for r in sbx.run_code("getwd()", context=ctx).results] == ['[1] "/tmp"']
        assert [r.text for r in sbx.run_code("exists('x')", context=ctx).results] == ["[1] FALSE"]
    finally:
        sbx.kill()


def test_files_api_and_code_share_the_filesystem(ci):
    ci.files.write("data.csv", "name,score\nann,3\nbob,5\n")
    execution = ci.run_code(
        "import pandas as pd\n"
        "df = pd.read_csv('data.csv')\n"
        "int(df['score'].sum())"
    )
    assert execution.text == "8"
    ci.run_code("df.to_csv('out.csv', index=False)")
    assert ci.files.read("out.csv") == "name,score\nann,3\nbob,5\n"


def test_unknown_language_and_context_are_clear_errors(ci):
    from e2b import InvalidArgumentException, NotFoundException, SandboxException

    with pytest.raises((InvalidArgumentException, SandboxException)) as exc:
        ci.run_code("1", language="cobol")
    assert "cobol" in str(exc.value)
    from e2b_code_interpreter.models import Context

    with pytest.raises(NotFoundException):
        ci.run_code("1", context=Context(context_id="nope", language="python", cwd="/"))


def test_output_flood_is_bounded(ci):
    execution = ci.run_code("for _ in range(200_000): print('x' * 1000)", timeout=120)
    total = sum(len(s) for s in execution.logs.stdout)
    assert total < 64 * 1024 * 1024
    assert any("truncated" in s for s in execution.logs.stderr)
    assert ci.run_code("1 + 1").text == "2"


def test_kernel_crash_is_reported_and_the_next_run_gets_a_fresh_kernel(ci):
    ci.run_code("before = 1")
    crashed = ci.run_code("import os; os._exit(1)")
    assert crashed.error is not None
    after = ci.run_code("1 + 1")
    assert after.text == "2"
    assert ci.run_code("before").error.name == "NameError"


def test_airlock_run_prints_results_and_saves_images(server, tmp_path):
    import subprocess

    from conftest import AIRLOCK, API_KEY

    script = tmp_path / "plot.py"
    script.write_text(
        "print('computing')\n"
        "import matplotlib.pyplot as plt\n"
        "plt.bar(['a', 'b'], [3, 5])\n"
        "6 * 7\n"
    )
    base = [str(AIRLOCK), "--url", server.url, "--api-key", API_KEY, "run", "--out-dir", str(tmp_path)]
    done = subprocess.run(base + [str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "computing" in done.stdout
    assert "42" in done.stdout
    saved = tmp_path / "result-1.png"
    assert f"saved to {saved}" in done.stdout
    assert saved.read_bytes()[:4] == b"\x89PNG"

    failing = subprocess.run(base + ["-"], input="1/0\n", capture_output=True, text=True, timeout=300)
    assert failing.returncode == 1
    assert "ZeroDivisionError" in failing.stderr

    bash = subprocess.run(base + ["--lang", "bash", "-"], input="echo hi-from-bash\n", capture_output=True, text=True, timeout=300)
    assert bash.returncode == 0 and "hi-from-bash" in bash.stdout


def test_killing_the_sandbox_mid_run_ends_the_stream(ci):
    import threading

    from e2b import Sandbox as BaseSandbox

    # The kernel must be up, so the kill lands while the run streams (not while it waits).
    ci.run_code("1")
    threading.Timer(3.0, lambda: BaseSandbox.kill(ci.sandbox_id)).start()
    started = time.monotonic()
    with pytest.raises(TimeoutException) as exc:
        ci.run_code("import time\ntime.sleep(120)")
    assert "killed" in str(exc.value)
    assert time.monotonic() - started < 60


def test_sandboxes_restored_from_one_golden_image_are_each_unique(server):
    """Fresh code-interpreter sandboxes are restored from one checkpoint of a warmed-up kernel;
    each must still draw its own random numbers and carry its own identity."""
    from e2b_code_interpreter import Sandbox

    code = (
        "import random, socket, numpy\n"
        "print(random.random(), numpy.random.rand(), socket.gethostname())"
    )
    boxes = [Sandbox.create() for _ in range(2)]
    try:
        runs = [b.run_code(code) for b in boxes]
        outs = [r.logs.stdout[0].split() for r in runs]
        assert outs[0][0] != outs[1][0], "Python's random module was not reseeded"
        assert outs[0][1] != outs[1][1], "numpy's global generator was not reseeded"
        assert [o[2] for o in outs] == [b.sandbox_id for b in boxes]
        # The warm-up run in the golden image does not show: the first cell is In [1].
        assert [r.execution_count for r in runs] == [1, 1]
        # pandas is already imported in the restored kernel.
        assert boxes[0].run_code("import sys; 'pandas' in sys.modules").text == "True"
    finally:
        for b in boxes:
            b.kill()
