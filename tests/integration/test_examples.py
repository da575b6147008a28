"""The LLM examples (examples/*_analyst.py) run end to end with --dry-run: a recorded model
response, but a real sandbox that computes the answer and draws the chart."""

import csv
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def highest_average_city():
    """The answer, computed here without pandas or a sandbox."""
    salaries = defaultdict(list)
    with open(EXAMPLES / "data" / "salaries.csv", newline="") as f:
        for row in csv.DictReader(f):
            salaries[row["city"]].append(int(row["salary"]))
    return max(salaries, key=lambda city: sum(salaries[city]) / len(salaries[city]))


@pytest.mark.parametrize("example", ["data_analyst.py", "langchain_analyst.py"])
def test_example_dry_run_answers_and_saves_the_chart(server, tmp_path, example):
    chart = tmp_path / "out" / "chart.png"
    # It inherits the SDK's E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY, which the server
    # fixture has set.
    command = [sys.executable, str(EXAMPLES / example), "--dry-run", "--out", str(chart)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    city = highest_average_city()
    # What the sandbox printed, then what the (recorded) model concluded from it.
    assert f"highest: {city}" in done.stdout, done.stdout
    answer = next(line for line in done.stdout.splitlines() if line.startswith("answer: "))
    assert city in answer
    assert chart.read_bytes()[:8] == PNG_SIGNATURE
