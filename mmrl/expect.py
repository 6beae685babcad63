"""``python -m mmrl.expect RUN_DIR``: a finished run's held-out figures beside what the published runs measured.

The shipped manifest (`mmrl.models.shipped`) records, per embedded model, the per-seed summaries of the benchmark runs
behind docs/results.md (``python -m mmrl.models.recipes.ship NAME --expect SUMMARY.json``). For a run of that model with
the same task, task options, objective and step count, this prints the run's start and rise of each held-out metric next
to the published mean and range over seeds, so that a user of ``make demo`` can tell at once whether their machine
reproduced the figure. A run with no published counterpart gets one line saying so.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from mmrl.cli import run_cli
from mmrl.errors import UserError
from mmrl.models.shipped import WEIGHTS_DIR, read_manifest


def held_out(run_dir: Path) -> dict[str, tuple[float, float]]:
    """{metric: (first, last)} of the run's held-out evaluations (``eval/...`` entries of metrics.jsonl)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise UserError(f"{run_dir} has no metrics.jsonl: is it a finished run's --out?")
    evals = [record for record in map(json.loads, path.read_text().splitlines())
             if any(key.startswith("eval/") for key in record)]
    keys = {key for record in evals for key in record if key.startswith("eval/")}
    return {key: (evals[0][key], evals[-1][key]) for key in sorted(keys)
            if key in evals[0] and key in evals[-1] and len(evals) > 1}


def matching_rows(config: dict[str, Any], weights_dir: Path = WEIGHTS_DIR) -> list[tuple[dict, dict]]:
    """(summary, row) pairs of the run's model whose tags match the run's task, options, objective and steps."""
    entry = read_manifest(weights_dir)["models"].get(config["model"]["name"], {})
    found = []
    for summary in entry.get("expected", {}).values():
        for row in summary["rows"]:
            tags = row.get("tags", {})
            options = config["task"].get("options", {})
            if (tags.get("task") == config["task"]["name"] and tags.get("algo") == config["algo"]["name"]
                    and tags.get("steps") == config["run"]["steps"]
                    and all(str(options.get(k, v)) == str(v) for k, v in tags.get("options", {}).items())):
                found.append((summary, row))
    return found


def report(run_dir: Path, weights_dir: Path = WEIGHTS_DIR) -> list[str]:
    try:
        config = json.loads((run_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{run_dir}: cannot read the run's config.json ({exc})") from None
    rows = matching_rows(config, weights_dir)
    if not rows:
        return [f"no published figure for {config['model']['name']} × {config['task']['name']} × "
                f"{config['algo']['name']} × {config['run']['steps']} steps; see docs/results.md"]
    got = held_out(run_dir)
    lines = []
    for summary, row in rows:
        key, kind = row["tags"]["key"], row["tags"].get("kind")
        if key not in got:
            continue
        first, last = got[key]
        mine = first if kind == "start" else last - first
        fmt = "+.3f" if kind == "rise" else ".3f"  # a rise carries its sign; a level does not need one
        lines.append(f"{row['metric']}: this run {mine:{fmt}}; published mean {row['mean']:{fmt}}, range "
                     f"{row['min']:{fmt}} … {row['max']:{fmt}} over {row['n']} seeds ({summary['results']})")
    return lines or ["the run has no held-out evaluation at its first and last step to compare"]


def _main(argv: list[str] | None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        raise UserError("usage: python -m mmrl.expect RUN_DIR")
    print("\n".join(report(Path(args[0]))))


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
