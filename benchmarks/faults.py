"""Faults injected into real runs of ``python -m mmrl.train``, and what happened (docs/reliability.md).

Categories: SIGTERM once and twice, SIGKILL during checkpoint writes, a full disk (a 2 MB tmpfs, when this process
may mount one), concurrent runs into one ``--out``, damaged checkpoints then ``--resume`` / ``mmrl.eval``, and env
worker deaths during an ALFWorld run. Each trial is a fresh run of the embedded tiny model; outcomes are counted.

    python benchmarks/faults.py [--trials 3] [--only sigterm,disk_full,...]

Prints a table and writes a summary, per category how many runs ended each way, to ``runs/bench/faults.json``;
``--publish`` writes it as ``benchmarks/results/faults.json``, the one docs/results.md renders.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from summary import add_out_arguments, write_summary

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--rollout.prompts_per_step", "4", "--rollout.samples_per_prompt", "4", "--rollout.max_new_tokens", "12",
         "--run.progress", "false", "--run.plot", "false", "--model.threads", "1"]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def train(*argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mmrl.train", *SMALL, *argv], env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 900) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def last_error(err: str) -> str:
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    return lines[-1] if lines else ""


def wait_for_steps(out: Path, n: int, proc: subprocess.Popen, timeout: float = 600) -> bool:
    deadline = time.time() + timeout
    metrics = out / "metrics.jsonl"
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= n:
            return True
        time.sleep(0.02)
    return False


def steps_logged(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    return [json.loads(x)["step"] for x in path.read_text().splitlines()] if path.exists() else []


def sigterm(work: Path, trials: int, twice: bool) -> Counter:
    """SIGTERM after the first logged step (or two, 50 ms apart, after the second), then --resume to the end. Two
    signals stop without finishing the step, so that run checkpoints every step (it resumes from the last one)."""
    seen: Counter = Counter()
    for t in range(trials):
        out = work / f"sigterm{int(twice)}-{t}"
        proc = train("--out", str(out), "--steps", "6", "--run.checkpoint_every", "1" if twice else "0")
        wait_for_steps(out, 2 if twice else 1, proc)
        proc.send_signal(signal.SIGTERM)
        if twice:
            time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
        code, err = finish(proc)
        seen[f"exit {code}"] += 1
        seen["traceback" if "Traceback" in err else "no traceback"] += 1
        code, err = finish(train("--out", str(out), "--resume"))
        logged = steps_logged(out)
        seen["resumed to the end, every step once" if code == 0 and logged == list(range(1, 7)) else
             f"resume: exit {code} steps {logged}"] += 1
    return seen


def sigkill_during_writes(work: Path, trials: int) -> Counter:
    """kill -9 at a random moment of a loop of 12 MB checkpoint writes; then a run claims the directory."""
    seen: Counter = Counter()
    writer = ("import sys, torch; from pathlib import Path; from mmrl.trainer.checkpoint import save_checkpoint\n"
              "state = {'model': {'w': torch.randn(3_000_000)}}\n"
              "for step in range(1, 10_000): save_checkpoint(Path(sys.argv[1]), step, state, keep=2)\n")
    from mmrl.trainer.checkpoint import load_latest
    from mmrl.trainer.config import TrainConfig
    from mmrl.trainer.run_dir import claim

    for t in range(trials):
        run = work / f"sigkill-{t}"
        proc = subprocess.Popen([sys.executable, "-c", writer, str(run)], env=env())
        while not list((run / "checkpoints").glob("step_*")):
            time.sleep(0.01)
        time.sleep(random.Random(t).uniform(0.05, 1.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        partial = list((run / "checkpoints").glob(".tmp-*"))
        seen["killed mid-write (a .tmp-* folder left)" if partial else "killed between writes"] += 1
        (run / "config.json").write_text(json.dumps(TrainConfig().to_dict(), default=str))
        cfg = TrainConfig()
        cfg.run.out_dir, cfg.run.resume, cfg.run.steps = str(run), True, 10_000  # the writer's last step
        claim(cfg).lock.release()
        seen["no .tmp-* after the next start" if not list((run / "checkpoints").glob(".tmp-*")) else
             ".tmp-* remained"] += 1
        path, state, skipped = load_latest(run)
        seen["newest complete checkpoint loads" if not skipped else "fell back"] += 1
    return seen


def disk_full(work: Path) -> Counter:
    """A real run whose --out is a 2 MB tmpfs: the first checkpoint (~6 MB) cannot fit."""
    seen: Counter = Counter()
    mount = Path(tempfile.mkdtemp(prefix="mmrl-tmpfs-"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                             capture_output=True).returncode == 0
    if not mounted:
        seen["tmpfs could not be mounted here (not measured)"] += 1
        return seen
    try:
        code, err = finish(train("--out", str(mount / "run"), "--steps", "2", "--run.checkpoint_every", "1"))
        seen[f"exit {code}"] += 1
        seen["traceback" if "Traceback" in err else "no traceback"] += 1
        seen[last_error(err).replace(str(mount), "<tmpfs>")[:160]] += 1
        left = list((mount / "run" / "checkpoints").glob(".tmp-*"))
        seen["partial folder removed" if not left else "partial folder left"] += 1
        seen[f"{shutil.disk_usage(mount).free / 2**20:.1f} MiB free after the failure"] += 1
    finally:
        subprocess.run(["umount", str(mount)], check=False)
        mount.rmdir()
    return seen


def concurrent(work: Path, trials: int) -> Counter:
    """Two runs started together into one --out (seeds 1 and 2)."""
    seen: Counter = Counter()
    for t in range(trials):
        out = work / f"concurrent-{t}"
        a = train("--out", str(out), "--steps", "3", "--run.seed", "1")
        b = train("--out", str(out), "--steps", "3", "--run.seed", "2")
        results = sorted([finish(a), finish(b)], key=lambda r: r[0])
        seen[f"exit codes {[r[0] for r in results]}"] += 1
        seen["loser: " + last_error(results[1][1])[:60].replace(str(out), "<out>")] += 1
        seen["metrics hold one run's steps" if steps_logged(out) == [1, 2, 3] else
             f"metrics steps {steps_logged(out)}"] += 1
    return seen


def corrupt_checkpoints(work: Path, trials: int) -> Counter:
    """Truncate / bit-flip / empty the newest checkpoint of a finished run; then --resume and mmrl.eval."""
    seen: Counter = Counter()
    kinds = ["truncate", "bitflip", "empty"]
    for t in range(trials):
        out = work / f"corrupt-{t}"
        finish(train("--out", str(out), "--steps", "2", "--run.checkpoint_every", "1"))
        newest = out / "checkpoints" / "step_0000002" / "tensors.safetensors"
        data = bytearray(newest.read_bytes())
        kind = kinds[t % len(kinds)]
        if kind == "truncate":
            data = data[: len(data) // 3]
        elif kind == "bitflip":
            data[random.Random(t).randrange(len(data))] ^= 0x04
        else:
            data = bytearray()
        newest.write_bytes(bytes(data))
        ev = subprocess.run([sys.executable, "-m", "mmrl.eval", "--model", str(out), "--k", "1", "--max-problems",
                             "4"], env=env(), capture_output=True, text=True, timeout=900)
        seen[f"eval after {kind}: exit {ev.returncode}, "
             f"{'fell back to step 1' if 'step_0000001' in ev.stdout else 'no fallback'}"] += 1
        code, err = finish(train("--out", str(out), "--resume", "--steps", "3"))
        seen[f"resume after {kind}: exit {code}, "
             f"{'resumed from step 1' if 'step_0000001' in err else 'not from step 1'}"] += 1
    return seen


def worker_deaths(work: Path, kills: int) -> Counter:
    """An ALFWorld run with a 2-worker EnvPool; a worker is killed with SIGKILL every few seconds."""
    seen: Counter = Counter()
    out = work / "workers"
    proc = subprocess.Popen([sys.executable, "-m", "mmrl.train", "--task", "alfworld", "--algo", "gmpo", "--out",
                             str(out), "--steps", "4", "--rollout.env_workers", "2", "--rollout.prompts_per_step",
                             "2", "--rollout.samples_per_prompt", "2", "--run.progress", "false", "--run.plot",
                             "false", "--run.eval_samples", "1", "--model.threads", "1"],
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = 0
    while proc.poll() is None and killed < kills:
        time.sleep(4)
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        workers = [int(c) for c in children if "spawn_main" in Path(f"/proc/{c}/cmdline").read_text(errors="replace")]
        if workers:
            os.kill(random.choice(workers), signal.SIGKILL)
            killed += 1
    code, err = finish(proc, timeout=1800)
    seen[f"{killed} workers killed"] += 1
    seen[f"run exit {code}"] += 1
    seen[f"steps logged {steps_logged(out)}"] += 1
    failed = sum(int(json.loads(x).get("env_failures", 0) or 0) for x in (out / "metrics.jsonl").read_text()
                 .splitlines()) if (out / "metrics.jsonl").exists() else 0
    seen[f"{failed} episodes counted as failed"] += 1
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--kill-trials", type=int, default=10, help="SIGKILLs during checkpoint writes")
    parser.add_argument("--only", default="", help="comma-separated categories")
    add_out_arguments(parser, "faults")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mmrl-faults-"))
    categories = {
        "sigterm": lambda: sigterm(work, args.trials, twice=False),
        "sigterm_twice": lambda: sigterm(work, args.trials, twice=True),
        "sigkill_during_writes": lambda: sigkill_during_writes(work, args.kill_trials),
        "disk_full": lambda: disk_full(work),
        "concurrent_runs": lambda: concurrent(work, args.trials),
        "corrupt_checkpoints": lambda: corrupt_checkpoints(work, args.trials),
        "worker_deaths": lambda: worker_deaths(work, args.trials),
    }
    chosen = [c for c in args.only.split(",") if c] or list(categories)
    results = {}
    for name in chosen:
        start = time.perf_counter()
        outcome = categories[name]()
        results[name] = {"outcomes": dict(outcome), "seconds": round(time.perf_counter() - start, 1)}
        print(f"{name} ({results[name]['seconds']} s):", flush=True)
        for what, count in outcome.items():
            print(f"  {count} x {what}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"\nload average {load:.1f}")
    # outcomes are counted, not measured: a table of them, as the trial's cases
    cases = [{"case": name, "what": what, "outcome": f"{count} ×"}
             for name, result in results.items() for what, count in result["outcomes"].items()]
    write_summary(Path(args.out), "Faults injected into real runs, and how each run ended", [], seeds=[], cases=cases,
                  notes=f"{args.trials} trials per category ({args.kill_trials} SIGKILLs during checkpoint writes); "
                        f"load average {load:.1f} at the end.")


if __name__ == "__main__":
    main()
