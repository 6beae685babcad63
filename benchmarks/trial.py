"""The trial: hostile and broken inputs replayed as a user (or an attacker) would give them, one outcome each.

Each case is a small function that sets up its input under a fresh folder, runs the real command or the real loader,
and says what happened: ``clear error`` (one line, no traceback, nothing touched), ``right result``, ``crash`` (a
traceback or a signal), ``silently wrong``, ``data lost``, ``ran code`` (a file's content was executed) or ``hang``
(still running past the case's bound). To add a
case, write a function ``(work: Path) -> (outcome, detail)`` and decorate it with ``@case("name", "what it tries")``.

    python benchmarks/trial.py [--only name,name] [--skip-runs]

``--skip-runs`` leaves out the cases that train the embedded tiny model (SIGTERM and resume, two runs into one
folder, a damaged checkpoint; ``benchmarks/faults.py`` repeats those with more trials). Prints the table and writes
``runs/bench/trial.json``; ``--publish`` writes ``benchmarks/results/trial.json``, the one docs/results.md renders.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# the repository, not this folder, first on the path: benchmarks/alfworld.py would shadow the alfworld package
sys.path[:] = [str(REPO)] + [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.append(str(Path(__file__).resolve().parent))  # behind the packages: for summary only
from summary import add_out_arguments, result_row, write_summary  # noqa: E402

CLEAR, RIGHT, CRASH, WRONG, LOST, RAN_CODE, HANG = ("clear error", "right result", "crash", "silently wrong",
                                                   "data lost", "ran code", "hang")
SMALL = ["--rollout.prompts_per_step", "4", "--rollout.samples_per_prompt", "4", "--rollout.max_new_tokens", "12",
         "--run.progress", "false", "--run.plot", "false", "--model.threads", "1", "--run.eval_every", "0"]


@dataclass
class Case:
    name: str
    what: str
    run: Callable[[Path], tuple[str, str]]
    trains: bool  # starts training runs of the embedded model (slow; left out by --skip-runs)


CASES: list[Case] = []


def case(name: str, what: str, trains: bool = False):
    def register(fn: Callable[[Path], tuple[str, str]]) -> Callable[[Path], tuple[str, str]]:
        CASES.append(Case(name, what, fn, trains))
        return fn

    return register


# ----------------------------------------------------------------------------------------------------- helpers


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def command(*argv: str, timeout: float = 600) -> tuple[int, str, str]:
    out = subprocess.run([sys.executable, *argv], env=env(), capture_output=True, text=True, timeout=timeout)
    return out.returncode, out.stdout, out.stderr


def refused(code: int, err: str, *, expect: str = "") -> tuple[str, str]:
    """The outcome of a command that must stop with one ``error:`` line (exit 2) mentioning ``expect``."""
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    if "Traceback" in err or code < 0:
        return CRASH, (err.strip().splitlines() or [f"signal {-code}"])[-1][:160]
    if code == 0:
        return WRONG, "accepted"
    if code == 2 and len(errors) == 1 and expect in errors[0]:
        return CLEAR, errors[0]
    return WRONG, f"exit {code}: {(errors or err.strip().splitlines() or [''])[-1][:160]}"


def raises_one_line(fn: Callable[[], object], expect: str) -> tuple[str, str]:
    """The outcome of a loader call that must raise one ValueError line mentioning ``expect``."""
    try:
        fn()
    except ValueError as exc:
        text = str(exc)
        if "\n" not in text and expect in text:
            return CLEAR, text
        return WRONG, f"unclear: {text[:160]}"
    except Exception as exc:  # noqa: BLE001 -- any other exception is the crash this trial counts
        return CRASH, f"{type(exc).__name__}: {exc}"[:160]
    return WRONG, "accepted"


def train(*argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mmrl.train", *SMALL, *argv], env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def steps_logged(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    return [json.loads(x)["step"] for x in path.read_text().splitlines()] if path.exists() else []


def png(path: Path) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (16, 16), "white").save(path)
    return path


# ---------------------------------------------------------------------------------------- configs and answers


BILLION_LAUGHS = "cluster:\n  extra:\n    a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"    {b}: &{b} [{', '.join(['*' + a] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True))


@case("yaml_alias_bomb", "--config with nine levels of nine aliases (387 million values from 400 bytes)")
def yaml_alias_bomb(work: Path) -> tuple[str, str]:
    (work / "bomb.yaml").write_text(BILLION_LAUGHS)
    code, _, err = command("-m", "mmrl.train", "--config", str(work / "bomb.yaml"), "--out", str(work / "out"),
                           timeout=120)
    outcome = refused(code, err, expect="aliases expand")
    return (LOST, "the run folder was created") if (work / "out").exists() and outcome[0] == CLEAR else outcome


@case("yaml_tab", "--config indented with a tab")
def yaml_tab(work: Path) -> tuple[str, str]:
    (work / "tab.yaml").write_text("run:\n\tsteps: 3\n")
    code, _, err = command("-m", "mmrl.train", "--config", str(work / "tab.yaml"), "--out", str(work / "out"))
    return refused(code, err, expect="line 2 column 1")


@case("think_boxed_100kb", "a 100 KB completion built to make the think/boxed format check backtrack")
def think_boxed_100kb(work: Path) -> tuple[str, str]:
    script = ("import time; from mmrl.rewards import get_reward; import mmrl.rewards.geometry\n"
              "text = '<think>' + '</think>\\\\boxed{' * 7000\n"
              "start = time.perf_counter(); [r] = get_reward('think_boxed_format')([text], [{}])\n"
              "print(r.score, round(time.perf_counter() - start, 3))")
    try:
        code, out, err = command("-c", script, timeout=60)
    except subprocess.TimeoutExpired:
        return WRONG, "still checking after 60 s"
    if code != 0:
        return CRASH, err.strip().splitlines()[-1][:160]
    score, seconds = out.split()
    return (RIGHT if score == "0.0" and float(seconds) < 1 else WRONG), f"score {score} in {seconds} s"


@case("gold_1e3", "gold answer 1e3 (math-verify alone reads 3·e): answers 1000 and 3e")
def gold_e_notation(work: Path) -> tuple[str, str]:
    from mmrl.rewards import get_reward

    scores = [r.score for r in get_reward("math_accuracy")(["<answer>1000</answer>", "<answer>3e</answer>"],
                                                            [{"answer": "1e3"}] * 2)]
    return (RIGHT if scores == [1.0, 0.0] else WRONG), f"1000 scores {scores[0]}, 3e scores {scores[1]}"


@case("gold_parquet_float", "a parquet float 0.00001 as the gold answer, answered 0.00001")
def gold_parquet_float(work: Path) -> tuple[str, str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mmrl.tasks import get_task

    pq.write_table(pa.table({"problem": ["p"], "answer": [0.00001]}), work / "d.parquet")
    task = get_task("math", path=str(work / "d.parquet"), eval_fraction=0)
    [result] = task.reward(["<answer>0.00001</answer>"], task.train)
    accuracy = result.components["math_accuracy"]
    return (RIGHT if accuracy == 1.0 else WRONG), f"gold {task.train[0]['answer']!r}, accuracy {accuracy}"


# ------------------------------------------------------------------------------------------------ datasets


def image_rows(work: Path, image: str) -> str:
    png(work / "data" / "a.png")
    path = work / "data" / "t.jsonl"
    path.write_text(json.dumps({"image": "a.png", "label": "x"}) + "\n" + json.dumps({"image": image, "label": "y"})
                    + "\n")
    return str(path)


@case("image_dotdot", "a dataset row naming ../private.png (an image beside the dataset folder)")
def image_dotdot(work: Path) -> tuple[str, str]:
    from mmrl.tasks import get_task

    png(work / "private.png")
    path = image_rows(work, "../private.png")
    return raises_one_line(lambda: get_task("classification", path=path, eval_fraction=0), "leads outside")


@case("image_absolute", "a dataset row naming an absolute path outside its folder")
def image_absolute(work: Path) -> tuple[str, str]:
    from mmrl.tasks import get_task

    path = image_rows(work, str(png(work / "private.png")))
    return raises_one_line(lambda: get_task("classification", path=path, eval_fraction=0), "leads outside")


@case("image_symlink_out", "an image folder whose file is a symlink out of it")
def image_symlink_out(work: Path) -> tuple[str, str]:
    from mmrl.tasks import get_task

    png(work / "data" / "eagle" / "1.png")
    (work / "data" / "eagle" / "2.png").symlink_to(png(work / "private.png"))
    return raises_one_line(lambda: get_task("classification", path=str(work / "data"), eval_fraction=0),
                           "leads outside")


@case("image_missing", "a dataset row naming an image that is not there")
def image_missing(work: Path) -> tuple[str, str]:
    from mmrl.tasks import get_task

    path = image_rows(work, "gone.png")
    return raises_one_line(lambda: get_task("classification", path=path, eval_fraction=0), "does not exist or cannot")


@case("alfworld_grammar_code", "an ALFWorld game whose grammar holds {__import__('os').system(...)}")
def alfworld_grammar_code(work: Path) -> tuple[str, str]:
    from mmrl.envs.alfworld import ensure_games, list_games

    source = next(g for g in list_games(ensure_games(n_per_type=1, n_eval_per_type=1)))
    trial = work / "games" / "json_2.1.1" / "train" / source.path.parent.parent.name / source.path.parent.name
    shutil.copytree(source.path.parent, trial)
    game = json.loads((trial / "game.tw-pddl").read_text())
    mark = work / "MARK"
    game["grammar"] = game["grammar"].replace("{r.name}", f"{{__import__('os').system('touch {mark}') or r.name}}")
    (trial / "game.tw-pddl").write_text(json.dumps(game))
    script = ("import asyncio, sys; from mmrl.envs.alfworld import AlfWorldEnv\n"
              "env = AlfWorldEnv(sys.argv[1]); asyncio.run(env.reset()); asyncio.run(env.close())")
    listed = raises_one_line(lambda: list_games(work / "games"), "refused")
    command("-c", script, str(trial / "game.tw-pddl"), timeout=120)  # the env alone, as a user's script would
    return (RAN_CODE, f"{mark.name} was created") if mark.exists() else listed


@case("prompt_too_long", "a 2,000-character problem on line 6 of a math file, --rollout.max_prompt_tokens 400")
def prompt_too_long(work: Path) -> tuple[str, str]:
    rows = [json.dumps({"problem": f"What is {i} + 1?", "answer": str(i + 1)}) for i in range(20)]
    rows[5] = json.dumps({"problem": "What is 2+3? " * 160, "answer": "5"})
    (work / "m.jsonl").write_text("\n".join(rows) + "\n")
    code, _, err = command("-m", "mmrl.train", "--task", "math", "--task.path", str(work / "m.jsonl"),
                           "--rollout.max_prompt_tokens", "400", "--out", str(work / "out"), *SMALL)
    return refused(code, err, expect="m.jsonl line 6")


# -------------------------------------------------------------------------------------- run folders and files


class RunsCode:
    """Unpickled, this creates ``marker``: what a crafted checkpoint would do with a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def ran_or(marker: Path, outcome: tuple[str, str]) -> tuple[str, str]:
    return (RAN_CODE, f"{marker.name} was created") if marker.exists() else outcome


def crafted_state_pt(work: Path) -> tuple[Path, Path]:
    """(run folder, marker): a run folder as an older mmrl left it, whose pickled ``state.pt`` creates the marker."""
    import hashlib

    import torch

    from mmrl.run.config import TrainConfig

    run, marker = work / "shared-run", work / "MARK"
    folder = run / "checkpoints" / "step_0000001"
    folder.mkdir(parents=True)
    cfg = TrainConfig()
    cfg.run.out_dir = str(run)
    (run / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2, default=str))
    torch.save({"model": RunsCode(marker), "step": 1, "optimizer": {}}, folder / "state.pt")
    (folder / "state.sha256").write_text(hashlib.sha256((folder / "state.pt").read_bytes()).hexdigest() + "\n")
    return run, marker


@case("crafted_state_pt_eval", "python -m mmrl.eval --model DIR on a run folder whose state.pt runs a command")
def crafted_state_pt_eval(work: Path) -> tuple[str, str]:
    run, marker = crafted_state_pt(work)
    code, _, err = command("-m", "mmrl.eval", "--model", str(run), "--max-problems", "1")
    return ran_or(marker, refused(code, err, expect="mmrl.convert_checkpoint"))


@case("crafted_state_pt_resume", "--resume of a run folder whose state.pt runs a command")
def crafted_state_pt_resume(work: Path) -> tuple[str, str]:
    run, marker = crafted_state_pt(work)
    code, _, err = command("-m", "mmrl.train", "--out", str(run), "--resume", "--run.progress", "false")
    return ran_or(marker, refused(code, err, expect="mmrl.convert_checkpoint"))


def user_folder(work: Path) -> dict[Path, bytes]:
    """A user's own folder, with names a run also writes; {file: content} to check afterwards."""
    files = {work / "mine" / "notes.txt": b"my notes\n", work / "mine" / "config.json": b'{"mine": true}\n',
             work / "mine" / "checkpoints" / "best.bin": b"\x00weights", work / "mine" / "events.out.tfevents.1": b"e"}
    for path, content in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return files


def lost(files: dict[Path, bytes]) -> list[str]:
    return [p.name for p, content in files.items() if not p.is_file() or p.read_bytes() != content]


@case("overwrite_user_folder", "--run.overwrite true with --out at a user's folder (notes, config.json, checkpoints/)")
def overwrite_user_folder(work: Path) -> tuple[str, str]:
    files = user_folder(work)
    code, _, err = command("-m", "mmrl.train", "--out", str(work / "mine"), "--run.overwrite", "true", *SMALL)
    gone = lost(files)
    return (LOST, f"lost {gone}") if gone else refused(code, err, expect="not an mmrl run")


@case("overwrite_run_with_user_files", "--run.overwrite true on an earlier run's folder where the user added notes.txt "
      "and checkpoints/best.bin", trains=True)
def overwrite_run_with_user_files(work: Path) -> tuple[str, str]:
    run = work / "run"
    first = train("--out", str(run), "--steps", "1", "--run.checkpoint_every", "1")
    if first.wait(timeout=900) != 0:
        return CRASH, first.communicate()[1].strip().splitlines()[-1][:160]
    files = {run / "notes.txt": b"my notes\n", run / "checkpoints" / "best.bin": b"\x00weights"}
    for path, content in files.items():
        path.write_bytes(content)
    again = train("--out", str(run), "--steps", "1", "--run.checkpoint_every", "1", "--run.overwrite", "true")
    _, err = again.communicate(timeout=900)
    gone = lost(files)
    if gone:
        return LOST, f"lost {gone}"
    if again.returncode != 0:
        return refused(again.returncode, err)
    if steps_logged(run) != [1]:
        return WRONG, f"metrics steps {steps_logged(run)}"
    return RIGHT, "the run started afresh; notes.txt and checkpoints/best.bin kept"


@case("out_other_owner", "--out at an existing folder owned by another user (uid 12345)")
def out_other_owner(work: Path) -> tuple[str, str]:
    (work / "theirs").mkdir(mode=0o755)
    os.chown(work / "theirs", 12345, 12345)
    code, _, err = command("-m", "mmrl.train", "--out", str(work / "theirs"), *SMALL)
    return refused(code, err, expect="belongs to another user")


@case("out_group_writable", "--out at an existing folder its group can write (mode 775)")
def out_group_writable(work: Path) -> tuple[str, str]:
    (work / "shared").mkdir()
    os.chmod(work / "shared", 0o775)
    code, _, err = command("-m", "mmrl.train", "--out", str(work / "shared"), *SMALL)
    return refused(code, err, expect="can be written by its group")


@case("out_under_a_file", "--out whose parent is a file")
def out_under_a_file(work: Path) -> tuple[str, str]:
    (work / "file").write_text("x")
    code, _, err = command("-m", "mmrl.train", "--out", str(work / "file" / "run"), *SMALL)
    return refused(code, err, expect="is a file, not a folder")


@case("out_in_proc", "--out /proc/mmrl-trial (a folder nothing can be created in)")
def out_in_proc(work: Path) -> tuple[str, str]:
    code, _, err = command("-m", "mmrl.train", "--out", "/proc/mmrl-trial", *SMALL)
    return refused(code, err, expect="cannot be created")


@case("cache_is_a_file", "MMRL_CACHE naming a file")
def cache_is_a_file(work: Path) -> tuple[str, str]:
    (work / "cache").write_text("x")
    out = subprocess.run([sys.executable, "-m", "mmrl.train", "--out", str(work / "run"), *SMALL],
                         env={**env(), "MMRL_CACHE": str(work / "cache")}, capture_output=True, text=True, timeout=300)
    return refused(out.returncode, out.stderr, expect="is a file, not a folder")


def claimed_run(work: Path) -> Path:
    """A run folder as a run leaves it when it starts: claimed, with its record and config.json."""
    from mmrl.run.run_dir import claim
    from mmrl.train import parse_config

    cfg = parse_config(["--out", str(work / "run")])
    owner = claim(cfg)
    owner.record_config(cfg, 0)
    owner.lock.release()
    return work / "run"


def eval_out(work: Path, out: Path, expect: str) -> tuple[str, str]:
    code, _, err = command("-m", "mmrl.eval", "--max-problems", "2", "--k", "1", "--out", str(out))
    return refused(code, err, expect=expect)


@case("eval_out_run_config", "mmrl.eval --out at a run's own config.json")
def eval_out_run_config(work: Path) -> tuple[str, str]:
    run = claimed_run(work)
    before = (run / "config.json").read_bytes()
    outcome = eval_out(work, run / "config.json", "is one of the files of the mmrl run")
    return (LOST, "config.json was replaced") if (run / "config.json").read_bytes() != before else outcome


@case("eval_out_directory", "mmrl.eval --out at an existing folder")
def eval_out_directory(work: Path) -> tuple[str, str]:
    (work / "results").mkdir()
    return eval_out(work, work / "results", "is a folder")


@case("eval_out_missing_parent", "mmrl.eval --out in a folder that does not exist")
def eval_out_missing_parent(work: Path) -> tuple[str, str]:
    return eval_out(work, work / "nowhere" / "eval.json", "does not exist")


@case("secret_in_cluster_extra", "cluster.extra {logger.wandb.key: <secret>} on the openrlhf backend: the printed "
      "launch and every file it writes")
def secret_in_cluster_extra(work: Path) -> tuple[str, str]:
    from mmrl.openrlhf.launch import describe, prepare
    from mmrl.train import parse_config

    secret = "sk-trial-0123456789abcdef"
    cfg = parse_config(["--backend", "openrlhf", "--cluster.rehearsal", "true", "--out", str(work / "run"),
                        "--cluster.extra", json.dumps({"logger.wandb.key": secret})])
    resolved, owner = prepare(cfg)  # the claim and the files of a launch, without starting Ray
    owner.lock.release()
    shown = describe(cfg, resolved)
    leaked = [str(p.relative_to(work)) for p in (work / "run").rglob("*") if p.is_file() and secret in
              p.read_text(errors="replace")] + (["the printed launch"] if secret in shown else [])
    masked = json.loads((work / "run" / "config.json").read_text())["cluster"]["extra"]["logger.wandb.key"]
    if leaked:
        return WRONG, f"the secret is in {leaked}"
    return RIGHT, f"config.json holds {masked!r}; the launch shows it masked"


@case("crafted_deepspeed_checkpoint", "--resume on the openrlhf backend (CPU rehearsal) of a run whose DeepSpeed "
      "checkpoint file runs a command", trains=True)
def crafted_deepspeed_checkpoint(work: Path) -> tuple[str, str]:
    import torch

    from mmrl.openrlhf.checkpoint import deepspeed_types

    run, marker = work / "run", work / "MARK"
    rehearsal = ["-m", "mmrl.train", "--backend", "openrlhf", "--cluster.rehearsal", "true", "--out", str(run),
                 "--rollout.prompts_per_step", "2", "--rollout.samples_per_prompt", "4", "--rollout.max_new_tokens",
                 "8", "--run.eval_samples", "1", "--model.threads", "1"]
    code, _, err = command(*rehearsal, "--algo", "gpg", "--task", "arithmetic", "--steps", "1", timeout=900)
    if code != 0:
        return CRASH, f"the first run: exit {code}: {err.strip().splitlines()[-1][:120]}"
    [target] = (run / "checkpoints" / "_actor").glob("global_step1/mp_rank_00_model_states.pt")
    with torch.serialization.safe_globals(deepspeed_types()):
        content = torch.load(target, weights_only=True)
    content["note"] = RunsCode(marker)
    torch.save(content, target)
    code, _, err = command(*rehearsal, "--resume", "--steps", "2", timeout=900)
    return ran_or(marker, refused(code, err, expect="nothing in it was run"))


# ------------------------------------------------------------------------- paths, files and templates (round 2)
# Cases marked held back were written after the fixes and not used while making them: they check that a fix is of
# the class of input, not of the one file that found it.

HELD = "[held back] "


def printed_out_dir(work: Path, yaml_text: str, **extra_env: str) -> tuple[int, str, str]:
    (work / "c.yaml").write_text(yaml_text)
    out = subprocess.run([sys.executable, "-m", "mmrl.train", "--config", str(work / "c.yaml"), "--print-config"],
                         env={**env(), "HOME": str(work / "home"), **extra_env}, capture_output=True, text=True,
                         timeout=300, cwd=work)
    return out.returncode, out.stdout, out.stderr


@case("yaml_out_dir_tilde", "run.out_dir: ~/r in a --config YAML (HOME set to the case folder)")
def yaml_out_dir_tilde(work: Path) -> tuple[str, str]:
    code, out, err = printed_out_dir(work, "run:\n  out_dir: ~/r\n")
    if code != 0:
        return refused(code, err)
    got = json.loads(out)["run"]["out_dir"]
    literal = (work / "~").exists()
    ok = got == str(work / "home" / "r") and not literal
    return (RIGHT if ok else WRONG), f"out_dir {got}" + (", and ./~ was created" if literal else "")


@case("yaml_out_dir_variable", HELD + "run.out_dir: ${MMRL_TRIAL_RUNS}/r in a --config YAML")
def yaml_out_dir_variable(work: Path) -> tuple[str, str]:
    code, out, err = printed_out_dir(work, "run:\n  out_dir: ${MMRL_TRIAL_RUNS}/r\n",
                                     MMRL_TRIAL_RUNS=str(work / "runs"))
    if code != 0:
        return refused(code, err)
    got = json.loads(out)["run"]["out_dir"]
    return (RIGHT if got == str(work / "runs" / "r") else WRONG), f"out_dir {got}"


@case("eval_out_unset_variable", HELD + "mmrl.eval --out '$MMRL_TRIAL_UNSET/e.json' (a variable that is not set)")
def eval_out_unset_variable(work: Path) -> tuple[str, str]:
    code, _, err = command("-m", "mmrl.eval", "--max-problems", "1", "--out", "$MMRL_TRIAL_UNSET/e.json")
    return refused(code, err, expect="$MMRL_TRIAL_UNSET, which is not set")


def math_file(work: Path, lines: list[str], name: str = "m.jsonl") -> Path:
    (work / name).write_text("".join(line + "\n" for line in lines))
    return work / name


def math_task(path: Path, **options):
    from mmrl.tasks import get_task

    return get_task("math", path=str(path), eval_fraction=0, **options)


@case("jsonl_repeated_key", 'a jsonl row {"problem": ..., "answer": "2", "answer": "3"} on line 2')
def jsonl_repeated_key(work: Path) -> tuple[str, str]:
    path = math_file(work, ['{"problem": "1+1", "answer": "2"}', '{"problem": "1+2", "answer": "2", "answer": "3"}'])
    return raises_one_line(lambda: math_task(path), "line 2 has the key 'answer' twice")


@case("json_repeated_key_nested", HELD + "a .json list whose third object writes 'problem' twice, across lines")
def json_repeated_key_nested(work: Path) -> tuple[str, str]:
    (work / "m.json").write_text('[{"problem": "a", "answer": "1"},\n {"problem": "b", "answer": "2"},\n'
                                 ' {"problem": "c",\n  "answer": "3",\n  "problem": "d"}]\n')
    return raises_one_line(lambda: math_task(work / "m.json"), "line 5 has the key 'problem' twice")


@case("jsonl_lone_surrogate", "a jsonl problem holding the escape \\ud800 (half a UTF-16 pair) on line 3")
def jsonl_lone_surrogate(work: Path) -> tuple[str, str]:
    path = math_file(work, ['{"problem": "a", "answer": "1"}'] * 2 + ['{"problem": "x \\ud800", "answer": "1"}'])
    return raises_one_line(lambda: math_task(path), "line 3 field 'problem' holds \\ud800")


@case("json_lone_low_surrogate", HELD + "a .json answer holding \\udc00 (a low surrogate alone), then a run on it")
def json_lone_low_surrogate(work: Path) -> tuple[str, str]:
    (work / "m.json").write_text('[{"problem": "a", "answer": "1"}, {"problem": "b", "answer": "2\\udc00"}]')
    code, _, err = command("-m", "mmrl.train", "--task", "math", "--task.path", str(work / "m.json"), "--out",
                           str(work / "out"), *SMALL)
    return refused(code, err, expect="item 1 (items count from 0) field 'answer' holds \\udc00")


@case("empty_eval_path", "--task.eval_path an empty file (the training file has rows)")
def empty_eval_path(work: Path) -> tuple[str, str]:
    train_file = math_file(work, ['{"problem": "a", "answer": "1"}'])
    (work / "e.jsonl").write_text("")
    return raises_one_line(lambda: math_task(train_file, eval_path=str(work / "e.jsonl")), "e.jsonl has no rows")


@case("blank_eval_path", HELD + "--task.eval_path a file of blank lines, through mmrl.train")
def blank_eval_path(work: Path) -> tuple[str, str]:
    train_file = math_file(work, ['{"problem": "a", "answer": "1"}'] * 8)
    (work / "e.jsonl").write_text("\n\n  \n")
    code, _, err = command("-m", "mmrl.train", "--task", "math", "--task.path", str(train_file), "--task.eval_path",
                           str(work / "e.jsonl"), "--out", str(work / "out"), *SMALL)
    return refused(code, err, expect="e.jsonl has no rows")


def parquet_gold(work: Path, value: float, written: str) -> tuple[str, str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"problem": ["p"], "answer": pa.array([value], pa.float32())}), work / "d.parquet")
    task = math_task(work / "d.parquet")
    [result] = task.reward([f"<answer>{written}</answer>"], task.train)
    gold = str(task.train[0]["answer"])
    ok = gold == written and result.components["math_accuracy"] == 1.0
    return (RIGHT if ok else WRONG), f"gold {gold!r}, accuracy {result.components['math_accuracy']}"


@case("gold_parquet_float32", "a parquet float32 0.1 as the gold answer")
def gold_parquet_float32(work: Path) -> tuple[str, str]:
    return parquet_gold(work, 0.1, "0.1")


@case("gold_parquet_float32_small", HELD + "a parquet float32 0.00001 as the gold answer")
def gold_parquet_float32_small(work: Path) -> tuple[str, str]:
    return parquet_gold(work, 0.00001, "0.00001")


@case("jsonl_over_size_bound", "a 3 MiB jsonl with MMRL_MAX_DATA_MB=2, through mmrl.train")
def jsonl_over_size_bound(work: Path) -> tuple[str, str]:
    path = math_file(work, [json.dumps({"problem": "p" * 1000, "answer": "1"})] * 3100)
    out = subprocess.run([sys.executable, "-m", "mmrl.train", "--task", "math", "--task.path", str(path), "--out",
                          str(work / "out"), *SMALL], env={**env(), "MMRL_MAX_DATA_MB": "2"}, capture_output=True,
                         text=True, timeout=300)
    return refused(out.returncode, out.stderr, expect="more than the 2 MiB a data file may be")


@case("parquet_over_size_bound", HELD + "a 2 MiB parquet with MMRL_MAX_DATA_MB=1")
def parquet_over_size_bound(work: Path) -> tuple[str, str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"problem": [os.urandom(700).hex() for _ in range(1500)], "answer": ["1"] * 1500}),
                   work / "d.parquet", compression="none")
    os.environ["MMRL_MAX_DATA_MB"] = "1"
    try:
        return raises_one_line(lambda: math_task(work / "d.parquet"), "more than the 1 MiB a data file may be")
    finally:
        del os.environ["MMRL_MAX_DATA_MB"]


def model_folder(work: Path) -> Path:
    from mmrl.cache import EMBEDDED_NAME
    from mmrl.models import shipped_model

    folder = work / "model"
    shutil.copytree(shipped_model(EMBEDDED_NAME), folder)
    return folder


def with_template(work: Path, template: str) -> tuple[str, str]:
    folder = model_folder(work)
    (folder / "chat_template.jinja").write_text(template)
    started = time.perf_counter()
    try:
        code, _, err = command("-m", "mmrl.eval", "--model", str(folder), "--max-problems", "1", "--k", "1",
                               timeout=300)
    except subprocess.TimeoutExpired:
        return HANG, "still running after 300 s"
    outcome, detail = refused(code, err, expect="chat_template.jinja: its chat template is refused")
    return outcome, f"{detail.partition('is refused: ')[2] or detail} ({time.perf_counter() - started:.0f} s)"


@case("chat_template_nested_loops", "mmrl.eval --model FOLDER whose chat_template.jinja nests two loops of 99,999")
def chat_template_nested_loops(work: Path) -> tuple[str, str]:
    return with_template(work, "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}")


@case("chat_template_escape", "a chat_template.jinja reaching for ''.__class__.__mro__[1].__subclasses__()")
def chat_template_escape(work: Path) -> tuple[str, str]:
    return with_template(work, "{{ ''.__class__.__mro__[1].__subclasses__() }}")


@case("chat_template_huge_range", "a chat_template.jinja looping over range(10**12)")
def chat_template_huge_range(work: Path) -> tuple[str, str]:
    return with_template(work, "{% for i in range(10**12) %}{{ i }}{% endfor %}")


@case("chat_template_memory", HELD + "a chat_template.jinja building a 10 GB string ('a' * 10**10)")
def chat_template_memory(work: Path) -> tuple[str, str]:
    return with_template(work, "{% set s = 'a' * 10**10 %}{{ s[:3] }}{% for m in messages %}{{ m.content }}"
                               "{% endfor %}")


@case("chat_template_recursion", HELD + "a chat_template.jinja whose macro calls itself without end")
def chat_template_recursion(work: Path) -> tuple[str, str]:
    return with_template(work, "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}")


def model_file_case(spec: Path, expect: str) -> tuple[str, str]:
    code, _, err = command("-m", "mmrl.eval", "--model", str(spec), "--max-problems", "1", "--k", "1", timeout=300)
    return refused(code, err, expect=expect)


@case("gguf_random_bytes", "--model x.gguf holding 64 KiB of random bytes")
def gguf_random_bytes(work: Path) -> tuple[str, str]:
    (work / "x.gguf").write_bytes(os.urandom(1 << 16))
    return model_file_case(work / "x.gguf", "x.gguf is not a GGUF file")


@case("gguf_lying_count", "--model x.gguf whose header claims 2^40 tensors")
def gguf_lying_count(work: Path) -> tuple[str, str]:
    import struct

    (work / "x.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**40, 2) + os.urandom(4096))
    return model_file_case(work / "x.gguf", "x.gguf is damaged")


@case("gguf_truncated", HELD + "--model x.gguf: a whole small GGUF (gguf's own writer) cut 4 KiB short")
def gguf_truncated(work: Path) -> tuple[str, str]:
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(str(work / "x.gguf"), "llama")
    writer.add_tensor("token_embd.weight", np.ones((128, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    data = (work / "x.gguf").read_bytes()
    (work / "x.gguf").write_bytes(data[: len(data) - 4096])
    return model_file_case(work / "x.gguf", "x.gguf is damaged")


def damaged_weights(work: Path, header: bytes) -> tuple[str, str]:
    folder = model_folder(work)
    (folder / "model.safetensors").write_bytes(header)
    return model_file_case(folder, "model.safetensors is damaged")


@case("safetensors_huge_header", "a model folder whose model.safetensors declares a 2^60-byte header")
def safetensors_huge_header(work: Path) -> tuple[str, str]:
    import struct

    return damaged_weights(work, struct.pack("<Q", 2**60) + b"{}")


@case("safetensors_lying_offsets", HELD + "a model folder whose model.safetensors has offsets past its end")
def safetensors_lying_offsets(work: Path) -> tuple[str, str]:
    import struct

    header = json.dumps({"model.embed_tokens.weight": {"dtype": "F32", "shape": [4, 4],
                                                       "data_offsets": [0, 1 << 30]}}).encode()
    return damaged_weights(work, struct.pack("<Q", len(header)) + header + bytes(64))


def rewritten_checkpoint(work: Path, edit: Callable[[dict], None]) -> Path:
    """A run folder (config.json) with one checkpoint whose state ``edit`` changed, re-hashed as a hand would."""
    from mmrl.files import file_sha256
    from mmrl.run.checkpoint import DIGEST, STATE, TENSORS, read_state, save_checkpoint, write_state

    run = claimed_run(work)
    folder = save_checkpoint(run, 3, {"model": {"w": __import__("torch").ones(8)}}, keep=2)
    state = read_state(folder)
    edit(state)
    for name in (STATE, TENSORS, DIGEST):
        (folder / name).unlink()
    write_state(folder, state)
    (folder / DIGEST).write_text("".join(f"{file_sha256(folder / n)}  {n}\n" for n in (STATE, TENSORS)))
    return run


@case("checkpoint_negative_step", "mmrl.eval --model RUN whose only checkpoint says step -5 (re-hashed)")
def checkpoint_negative_step(work: Path) -> tuple[str, str]:
    run = rewritten_checkpoint(work, lambda s: s.update(step=-5))
    code, _, err = command("-m", "mmrl.eval", "--model", str(run), "--max-problems", "1", "--k", "1")
    return refused(code, err, expect="none of its 1 checkpoints can be read")


@case("checkpoint_inf_weight", HELD + "--resume of a run whose checkpoint holds an infinite weight (re-hashed)")
def checkpoint_inf_weight(work: Path) -> tuple[str, str]:
    run = rewritten_checkpoint(work, lambda s: s["model"]["w"].__setitem__(0, float("inf")))
    code, _, err = command("-m", "mmrl.train", "--out", str(run), "--resume", "--run.progress", "false")
    return refused(code, err, expect="none of its 1 checkpoints can be read")


@case("resume_edited_config", "--resume after config.json's optim.lr was edited from 0.001 to 0.5", trains=True)
def resume_edited_config(work: Path) -> tuple[str, str]:
    run = work / "run"
    first = train("--out", str(run), "--steps", "1", "--run.checkpoint_every", "1")
    if first.wait(timeout=900) != 0:
        return CRASH, first.communicate()[1].strip().splitlines()[-1][:160]
    saved = json.loads((run / "config.json").read_text())
    saved["optim"]["lr"] = 0.5
    (run / "config.json").write_text(json.dumps(saved, indent=2))
    again = train("--out", str(run), "--resume", "--steps", "2")
    _, err = again.communicate(timeout=900)
    return refused(again.returncode, err, expect="optim.lr is 0.5")


@case("read_only_mid_run", "a run's folder made read-only (chmod 555) after its first step, the run as a plain user",
      trains=True)
def read_only_mid_run(work: Path) -> tuple[str, str]:
    if os.geteuid() != 0:
        return RIGHT, "skipped: needs root to start the run as another user"
    os.chown(work, 65534, 65534)
    os.chmod(work, 0o755)
    run = work / "run"
    proc = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                             "mmrl.train", *SMALL, "--out", str(run), "--steps", "6", "--run.checkpoint_every", "1"],
                            env={**env(), "HOME": str(work), "MMRL_CACHE": str(work / "cache")},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while proc.poll() is None and not steps_logged(run) and time.time() < deadline:
        time.sleep(0.05)
    os.chmod(run, 0o555)
    _, err = proc.communicate(timeout=600)
    os.chmod(run, 0o755)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    if proc.returncode == 1 and len(errors) == 1 and "Traceback" not in err:  # a RunError: the machine failed it
        return CLEAR, errors[0]
    return refused(proc.returncode, err)


@case("out_newline", "--out under a file, with a newline and a forged 'error:' line in its name")
def out_newline(work: Path) -> tuple[str, str]:
    (work / "file").write_text("x")
    code, _, err = command("-m", "mmrl.train", "--out", f"{work / 'file'}/a\nerror: all is well", *SMALL)
    return refused(code, err, expect="\\nerror: all is well")


@case("out_bidi_override", HELD + "--out under a file, with a right-to-left override (U+202E) in its name")
def out_bidi_override(work: Path) -> tuple[str, str]:
    (work / "file").write_text("x")
    code, _, err = command("-m", "mmrl.train", "--out", f"{work / 'file'}/run\u202egpj.exe", *SMALL)
    if "\u202e" in err:
        return WRONG, "the override reached the terminal"
    return refused(code, err, expect="\\u202egpj.exe")


@case("yaml_200k_keys", "--config with 200,000 keys and no alias")
def yaml_200k_keys(work: Path) -> tuple[str, str]:
    (work / "big.yaml").write_text("task:\n" + "".join(f"  k{i}: {i}\n" for i in range(200_000)))
    code, _, err = command("-m", "mmrl.train", "--config", str(work / "big.yaml"), "--out", str(work / "out"),
                           timeout=300)
    return refused(code, err, expect="holds more than 100000 values")


@case("yaml_wide_list", HELD + "--config with one list of 150,000 items and no alias")
def yaml_wide_list(work: Path) -> tuple[str, str]:
    (work / "big.yaml").write_text("cluster:\n  extra:\n    x: [" + ", ".join("1" for _ in range(150_000)) + "]\n")
    code, _, err = command("-m", "mmrl.train", "--config", str(work / "big.yaml"), "--out", str(work / "out"),
                           timeout=300)
    return refused(code, err, expect="holds more than 100000 values")


def timed_out_reason(work: Path, answer: str, gold: str) -> tuple[str, str]:
    script = ("import sys; from mmrl.rewards import text; text.VERIFY_SECONDS = 1\n"
              "ok, why = text.math_verify_match(sys.argv[1], sys.argv[2]); print(ok, why)")
    try:
        code, out, err = command("-c", script, answer, gold, timeout=120)
    except subprocess.TimeoutExpired:
        return HANG, "still verifying after 120 s"
    if code != 0:
        return CRASH, err.strip().splitlines()[-1][:160]
    said = out.strip()
    if "timed out" in said:
        return RIGHT, said[:160]
    return (WRONG, f"reported as: {said[:120]}") if "wrong" in said else (RIGHT, f"judged in time: {said[:120]}")


@case("math_verify_timeout", "math-verify given 1 s to compare (x+1)^{400} with the gold (x+1)^{401}")
def math_verify_timeout(work: Path) -> tuple[str, str]:
    return timed_out_reason(work, "(x+1)^{400}", "(x+1)^{401}")


@case("math_verify_timeout_expand", HELD + "math-verify given 1 s to compare (a+b+c)^{60} with (a+b+c)^{61}")
def math_verify_timeout_expand(work: Path) -> tuple[str, str]:
    return timed_out_reason(work, "(a+b+c)^{60}", "(a+b+c)^{61}")


def loop_stall(n: int, games_used: int = 0) -> tuple[str, str]:
    script = f"""
import asyncio, time
from mmrl.envs.alfworld import AlfWorldEnv, ensure_games, list_games
games = list_games(ensure_games(n_per_type=1, n_eval_per_type=1))
games = games[:{games_used}] if {games_used} else games
envs = [AlfWorldEnv(games[i % len(games)].path) for i in range({n})]
async def main():
    longest, done = [0.0], [False]
    async def ticker():
        last = time.perf_counter()
        while not done[0]:
            await asyncio.sleep(0.01)
            now = time.perf_counter(); longest[0] = max(longest[0], now - last); last = now
    tick = asyncio.create_task(ticker()); start = time.perf_counter()
    await asyncio.gather(*(e.reset() for e in envs)); total = time.perf_counter() - start
    done[0] = True; await tick; await asyncio.gather(*(e.close() for e in envs))
    print(round(total, 1), round(longest[0], 2))
asyncio.run(main())
"""
    code, out, err = command("-c", script, timeout=900)
    if code != 0:
        return CRASH, err.strip().splitlines()[-1][:160]
    total, longest = map(float, out.split())
    ok = longest < max(0.5 * total, 1.0)
    return (RIGHT if ok else WRONG), f"{n} resets in {total} s; the event loop's longest stall {longest} s"


@case("alfworld_resets_at_once", "30 AlfWorldEnv resets awaited together: does the event loop keep running?")
def alfworld_resets_at_once(work: Path) -> tuple[str, str]:
    return loop_stall(30)


@case("alfworld_resets_one_game", HELD + "12 AlfWorldEnvs of one game reset together")
def alfworld_resets_one_game(work: Path) -> tuple[str, str]:
    return loop_stall(12, games_used=1)


# --------------------------------------------------------------------------- the earlier reliability cases


@case("sigterm_then_resume", "SIGTERM after the first step of a 4-step run, then --resume", trains=True)
def sigterm_then_resume(work: Path) -> tuple[str, str]:
    out = work / "run"
    proc = train("--out", str(out), "--steps", "4")
    deadline = time.time() + 600
    while proc.poll() is None and not steps_logged(out) and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=600)
    if "Traceback" in err:
        return CRASH, err.strip().splitlines()[-1][:160]
    resumed = train("--out", str(out), "--resume")
    _, err = resumed.communicate(timeout=900)
    logged = steps_logged(out)
    if resumed.returncode != 0:
        return CRASH, f"resume exit {resumed.returncode}: {err.strip().splitlines()[-1][:120]}"
    return (RIGHT, "every step logged once") if logged == [1, 2, 3, 4] else (LOST, f"steps logged {logged}")


@case("two_runs_one_folder", "two 2-step runs started together into one --out", trains=True)
def two_runs_one_folder(work: Path) -> tuple[str, str]:
    out = work / "run"
    runs = [train("--out", str(out), "--steps", "2", "--run.seed", str(seed)) for seed in (1, 2)]
    results = sorted(((p.wait(timeout=900), p.communicate()[1]) for p in runs), key=lambda r: r[0])
    if [r[0] for r in results] != [0, 2]:
        return CRASH if any("Traceback" in r[1] for r in results) else WRONG, f"exit codes {[r[0] for r in results]}"
    if steps_logged(out) != [1, 2]:
        return LOST, f"metrics steps {steps_logged(out)}"
    return CLEAR, refused(2, results[1][1], expect="in use")[1]


@case("damaged_checkpoint", "the newest checkpoint's largest file truncated, then mmrl.eval on the run", trains=True)
def damaged_checkpoint(work: Path) -> tuple[str, str]:
    out = work / "run"
    train("--out", str(out), "--steps", "2", "--run.checkpoint_every", "1").communicate(timeout=900)
    newest = sorted((out / "checkpoints").glob("step_*"))[-1]
    largest = max(newest.iterdir(), key=lambda p: p.stat().st_size)
    largest.write_bytes(largest.read_bytes()[: largest.stat().st_size // 3])
    code, stdout, err = command("-m", "mmrl.eval", "--model", str(out), "--k", "1", "--max-problems", "4")
    if code != 0:
        return refused(code, err)
    fell_back = "step_0000001" in stdout + err
    return (RIGHT, "evaluated the intact step 1") if fell_back else (WRONG, "no fallback named")


# ------------------------------------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated case names")
    parser.add_argument("--skip-runs", action="store_true", help="leave out the cases that train the tiny model")
    add_out_arguments(parser, "trial")
    args = parser.parse_args()
    chosen = [c for c in CASES if (not args.only or c.name in args.only.split(","))
              and not (args.skip_runs and c.trains)]
    results, started = [], time.perf_counter()
    for c in chosen:
        work = Path(tempfile.mkdtemp(prefix=f"mmrl-trial-{c.name}-"))
        start = time.perf_counter()
        try:
            outcome, detail = c.run(work)
        except Exception as exc:  # noqa: BLE001 -- a case that raises is a crash of what it tried
            outcome, detail = CRASH, f"{type(exc).__name__}: {exc}"[:200]
        finally:
            shutil.rmtree(work, ignore_errors=True)
        detail = detail.replace(str(work), "<tmp>")[:200]  # the case folder, named before the cut
        results.append({"case": c.name, "what": c.what, "outcome": outcome, "detail": detail,
                        "seconds": round(time.perf_counter() - start, 1)})
        print(f"{c.name:24} {outcome:15} {detail}", flush=True)
    counts = Counter(r["outcome"] for r in results)
    total = round(time.perf_counter() - started, 1)
    print("\n| case | what | outcome |\n|---|---|---|")
    for r in results:
        print(f"| {r['case']} | {r['what']} | {r['outcome']}: {r['detail'].replace('|', '/')} |")
    print(f"\n{len(results)} cases in {total} s: " + ", ".join(f"{n} {k}" for k, n in counts.most_common())
          + f" (load average {os.getloadavg()[0]:.1f})")
    rows = [result_row("trial", f"cases with outcome '{k}'", {"count": n}) for k, n in counts.most_common()]
    write_summary(Path(args.out), "Trial: hostile and broken inputs, and what mmrl did with each", rows, seeds=[],
                  cases=[{**r, "detail": r["detail"].replace("|", "/")} for r in results],
                  notes=f"{len(results)} cases in {total} s. An outcome other than a clear error or the right result "
                        "(a crash, a silently wrong result, data lost, code run, a hang) fails the trial. Cases "
                        "marked [held back] were written after the fixes they check and not used while making them.")
    bad = counts[CRASH] + counts[WRONG] + counts[LOST] + counts[RAN_CODE] + counts[HANG]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
