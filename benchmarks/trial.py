"""The trial: hostile and broken inputs replayed as a user (or an attacker) would give them, one outcome each.

Each case is a small function that sets up its input under a fresh folder, runs the real command or the real loader,
and says what happened: ``clear error`` (one line, no traceback, nothing touched), ``right result``, ``crash`` (a
traceback or a signal), ``silently wrong``, ``data lost`` or ``ran code`` (a file's content was executed). To add a
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

CLEAR, RIGHT, CRASH, WRONG, LOST, RAN_CODE = ("clear error", "right result", "crash", "silently wrong", "data lost",
                                             "ran code")
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

    from mmrl.trainer.config import TrainConfig

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
    from mmrl.train import parse_config
    from mmrl.trainer.run_dir import claim

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
                        "(a crash, a silently wrong result, data lost, code run) fails the trial.")
    bad = counts[CRASH] + counts[WRONG] + counts[LOST] + counts[RAN_CODE]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
