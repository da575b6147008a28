"""The task both analyst examples give a model (a CSV of salaries in a sandbox, a question about
it, a chart to bring back) and what else they share: their flags and how they show a tool call."""

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CSV = HERE / "data" / "salaries.csv"  # made-up data: 200 people in 6 cities
CSV_IN_SANDBOX = "/home/user/salaries.csv"
CHART_IN_SANDBOX = "/home/user/chart.png"
SYSTEM = ("You are a data analyst with a sandbox: a Jupyter kernel with pandas and matplotlib "
          "whose state persists between run_code calls. Compute answers with the tools; never "
          "guess a number.")
QUESTION = (f"{CSV_IN_SANDBOX} has the columns name, city and salary. Which city has the "
            f"highest average salary? Save a bar chart of average salary by city as "
            f"{CHART_IN_SANDBOX}.")
MAX_TURNS = 10  # a model that keeps calling tools is stopped here


def parse_args(description):
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true",
                        help="replay a recorded model response (no model, no API key); the "
                             "tool calls still run in a real sandbox")
    parser.add_argument("--out", type=Path, default=Path("airlock-output/chart.png"),
                        help="where to save the chart (default: %(default)s)")
    return parser.parse_args()


def start_sandbox():
    """A code-interpreter sandbox (on the server E2B_API_URL names) with the CSV in it."""
    from e2b_code_interpreter import Sandbox

    sandbox = Sandbox.create()
    sandbox.files.write(CSV_IN_SANDBOX, CSV.read_bytes())
    print(f"sandbox {sandbox.sandbox_id}: uploaded {CSV.name} to {CSV_IN_SANDBOX}")
    return sandbox


def save_chart(sandbox, out):
    from e2b import FileNotFoundException

    try:
        png = sandbox.files.read(CHART_IN_SANDBOX, format="bytes")
    except FileNotFoundException:
        sys.exit(f"the model did not save {CHART_IN_SANDBOX}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(png)
    print(f"chart saved to {out}")


def show_call(name, args):
    """Prints a tool call; code and other multi-line arguments as they are, not JSON-escaped."""
    print(f"\n>>> {name}")
    if isinstance(args, str):  # OpenAI's arguments are a JSON string, which a model can botch
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            print(args)
            return
    for key, value in (args.items() if isinstance(args, dict) else [("arguments", args)]):
        print(f"{key}:\n{value}" if "\n" in str(value) else f"{key}: {value}")


def show_result(text):
    print(f"<<<\n{text}")
