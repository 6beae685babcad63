"""Docs snippets that spawn processes carry the ``__main__`` guard, the EnvPool example of docs/envs.md runs as a
script, as a reader would copy it, and negative numbers work as flag values."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SPAWNS = ("EnvPool(", "multiprocessing", "ProcessPoolExecutor", "Process(")


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.DOTALL)


def test_every_snippet_that_spawns_processes_has_the_main_guard():
    missing = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for block in python_blocks(doc):
            starts_pool = any(word in block for word in SPAWNS) and ("with " in block or "asyncio.run" in block)
            if starts_pool and 'if __name__ == "__main__":' not in block:
                missing.append(f"{doc.name}: {block.splitlines()[0]}")
    assert not missing, missing


def test_the_envpool_example_runs_as_a_script(tmp_path, alfworld_games):
    [example] = [b for b in python_blocks(REPO / "docs" / "envs.md") if "EnvPool(AlfWorldEnv" in b]
    script = tmp_path / "pool_example.py"
    script.write_text(example)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stdout.strip() == "8 episodes; 8 steps answered"


@pytest.mark.parametrize("flag", ["--optim.lr", "--optim.weight_decay"])
def test_negative_numbers_work_as_flag_values(flag):
    """Case 14: ``--optim.lr -1e-3`` reaches the config (and its range check), not argparse's usage dump."""
    from mmrl.cli import join_negative_values
    from mmrl.train import parse_config

    assert join_negative_values([flag, "-1e-3", "--steps", "-2"]) == [f"{flag}=-1e-3", "--steps=-2"]
    assert getattr(parse_config([flag, "-1e-3"]).optim, flag.split(".")[1]) == -1e-3
    assert parse_config(["--algo.clip_low", "-0.5"]).algo.params == {"clip_low": -0.5}


def test_evaluation_shows_progress_in_responses(capsys, embedded_model_dir):
    """Case 19: a long evaluation shows how far it is (responses done of all), and the bar stays on screen."""
    from mmrl.models import load_model, load_tokenizer
    from mmrl.tasks import get_task
    from mmrl.trainer.evaluate import evaluate

    task = get_task("arithmetic")
    model, tok = load_model("embedded:tiny-qwen2"), load_tokenizer("embedded:tiny-qwen2")
    evaluate(model, tok, task, k=2, max_new_tokens=4, max_problems=6, batch_size=4, progress=True)
    err = capsys.readouterr().err
    assert "eval: 100%" in err and "12/12" in err and "response" in err


def test_eval_on_a_run_directory_takes_its_task_and_warns_about_another(tmp_path, caplog):
    """Case 15: ``mmrl.eval --model <run>`` evaluates the run's own task (the README's example needs no --task), and
    names the mismatch when --task says otherwise."""
    import json
    import logging

    from mmrl.eval import parse_command
    from mmrl.run.config import TrainConfig

    run = tmp_path / "run"
    run.mkdir()
    saved = TrainConfig()
    saved.task.name, saved.task.options = "countdown", {"seed": 3}
    (run / "config.json").write_text(json.dumps(saved.to_dict(), default=str))
    cfg, _ = parse_command(["--model", str(run)])
    assert cfg.task.name == "countdown" and cfg.task.options == {"seed": 3}
    with caplog.at_level(logging.WARNING, logger="mmrl"):
        cfg, _ = parse_command(["--model", str(run), "--task", "arithmetic"])
    assert cfg.task.name == "arithmetic"
    warning = f"model {run} was trained on task 'countdown' (its config.json); evaluating it on 'arithmetic'"
    assert warning in caplog.text


def test_the_readme_eval_example_follows_its_train_command():
    readme = (REPO / "README.md").read_text()
    assert "python -m mmrl.train --algo gpg --task geoqa " in readme  # writes runs/geoqa-gpg (runs/<task>-<algo>)
    assert "python -m mmrl.eval --model runs/geoqa-gpg " in readme


# What may stand before the command itself: VAR=value assignments, nice -n N, nohup, time.
LAUNCHERS = re.compile(r"^(?:(?:[A-Z_][A-Z0-9_]*=\S*|nice(?: -n -?\d+)?|nohup|time)\s+)+")


def documented_commands(prefix: str) -> list[tuple[str, str]]:
    """(file:line, the rest of the line) of every command starting with ``prefix`` in a code block of the README and
    docs, with its continuation lines joined and its comment dropped; placeholders (``<setting>``, ``$VAR``, ``…``),
    resumed runs (they read a run directory) and ``--help`` are left out."""
    found = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = path.read_text()
        # every fenced block in turn (so that a block in another language never shifts the pairing of fences)
        for block in re.finditer(r"```(\w*)\n(.*?)```", text, re.DOTALL):
            if block.group(1) not in ("", "bash", "sh", "shell", "console", "text"):
                continue
            first_line = text[:block.start()].count("\n") + 2
            lines = block.group(2).split("\n")
            i = 0
            while i < len(lines):
                start, command = i, lines[i].strip()
                while command.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    command = command[:-1].rstrip() + " " + lines[i].strip()
                i += 1
                command = LAUNCHERS.sub("", command.split(" #")[0].strip())
                if not command.startswith(prefix + " "):
                    continue
                if any(mark in command for mark in ("<", "$", "…", "...", "--resume", "--help")):
                    continue
                found.append((f"{path.relative_to(REPO)}:{first_line + start}", command[len(prefix):]))
    return found


DOCUMENTED = documented_commands("python -m mmrl.train")


def test_the_docs_show_training_commands():
    assert len(DOCUMENTED) >= 20  # the extraction itself works


@pytest.mark.parametrize("where,argv", DOCUMENTED, ids=[w for w, _ in DOCUMENTED])
def test_every_documented_training_command_parses(where, argv, monkeypatch):
    """A command a reader copies from the docs starts: its flags exist (none is read as an abbreviation of another),
    its objective takes its ``--algo.X``, its task takes its ``--task.X``, and the config passes the start checks."""
    import shlex

    from mmrl import algos
    from mmrl.run.config import validate
    from mmrl.tasks.base import TASKS
    from mmrl.train import parse_command

    monkeypatch.chdir(REPO)  # --config examples/... is relative to the repository
    cfg, _ = parse_command([a for a in shlex.split(argv) if a != "--dry-run"])
    validate(cfg)
    algos.get(cfg.algo.name, **cfg.algo.params)
    assert cfg.task.name in TASKS, where
    import inspect

    accepted = set(inspect.signature(TASKS[cfg.task.name]).parameters)
    assert set(cfg.task.options) <= accepted, f"{where}: {set(cfg.task.options) - accepted}"


def test_a_task_option_that_prefixes_a_flag_is_not_taken_for_it():
    """``--task.reward`` is grounding's reward option, not an abbreviation of ``--task.reward_model``."""
    from mmrl.train import parse_config

    cfg = parse_config(["--task", "grounding", "--task.reward", "giou_plus_one"])
    assert cfg.task.options["reward"] == "giou_plus_one" and cfg.task.reward_model == ""


def test_the_headline_command_is_the_demo_run():
    """``python -m mmrl.train --algo gpg --task geoqa`` trains and evaluates as ``make demo`` (40 steps, held-out
    pass@1 every 20) on the embedded vision model."""
    from mmrl.train import parse_config

    cfg = parse_config(["--algo", "gpg", "--task", "geoqa"])
    assert (cfg.run.steps, cfg.run.eval_every, cfg.model.name) == (40, 20, "embedded:tiny-qwen2.5-vl")


def test_the_readme_reads_the_demos_last_evaluation():
    """Samples are labelled with the number of updates made before them: the demo's last evaluation is STEPS."""
    steps = int(re.search(r"^STEPS \?= (\d+)", (REPO / "Makefile").read_text(), re.MULTILINE).group(1))
    assert f"select(.step == {steps})" in (REPO / "README.md").read_text()


EVAL_COMMANDS = documented_commands("python -m mmrl.eval")


def test_the_docs_show_eval_commands():
    assert len(EVAL_COMMANDS) >= 4


@pytest.mark.parametrize("where,argv", EVAL_COMMANDS, ids=[w for w, _ in EVAL_COMMANDS])
def test_every_documented_eval_command_parses(where, argv, monkeypatch):
    """The same for ``python -m mmrl.eval`` (which takes fewer flags than training: README's "Config")."""
    import inspect
    import shlex

    from mmrl.eval import parse_command
    from mmrl.tasks.base import TASKS

    monkeypatch.chdir(REPO)
    cfg, _ = parse_command(shlex.split(argv))
    assert set(cfg.task.options) <= set(inspect.signature(TASKS[cfg.task.name]).parameters), where

BENCHMARK_COMMANDS = [(where, rest) for where, rest in documented_commands("python")
                      if rest.strip().startswith("benchmarks/")]


class Parsed(Exception):
    """Raised by the patched ``parse_args``: the benchmark's command line parsed, and nothing ran."""


def test_the_docs_show_benchmark_commands():
    assert len(BENCHMARK_COMMANDS) >= 15  # the extraction itself works: every guide quotes its benchmarks


@pytest.mark.parametrize("where,command", BENCHMARK_COMMANDS, ids=[w for w, _ in BENCHMARK_COMMANDS])
def test_every_documented_benchmark_command_parses(where, command, monkeypatch):
    """The benchmark commands the docs quote still parse with their script's own parser (a renamed or dropped flag
    fails here, not in a reader's hour-long run). The script's ``main`` runs only up to its ``parse_args``."""
    import argparse
    import runpy
    import shlex

    script, *argv = shlex.split(command)
    assert (REPO / script).is_file(), f"{where}: no {script}"
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        assert args is None, f"{where}: {script} parsed {args!r} first, not its command line"
        raise Parsed(original(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(sys, "argv", [script, *argv])
    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    with pytest.raises(Parsed):
        runpy.run_path(str(REPO / script), run_name="__main__")


def anchors(path: Path) -> set[str]:
    """The anchors a Markdown file offers: GitHub's heading slugs and explicit ``<a id="...">`` tags."""
    text = path.read_text()
    found = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", text, flags=re.DOTALL), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def test_every_relative_link_in_the_docs_resolves():
    """A link a reader follows from the README, CONTRIBUTING, CHANGELOG or a guide reaches a file of the repository,
    and its ``#anchor`` a heading or an explicit anchor of that file."""
    broken = []
    docs = [REPO / name for name in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md") if (REPO / name).exists()]
    for doc in [*docs, *sorted((REPO / "docs").glob("*.md"))]:
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            file_part, _, anchor = target.partition("#")
            path = (doc.parent / file_part).resolve() if file_part else doc
            if not path.exists():
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such anchor)")
    assert not broken, broken
