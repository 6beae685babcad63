"""ALFWorld env throughput: EnvPool vs one process per env (verl-agent's layout) vs the engine in-process.

Every layout plays the same 32 episodes (generated games, all six task types) with the same commands: each env starts
its game and takes ``--steps`` steps, choosing among the admissible commands with its own seeded RNG, so every layout
does identical engine work. Only steps are timed (resets and process start-up are not). Throughput is reported per
core (steps/s divided by the cores the layout can use), the way the goal is stated:

- ``in-process engine``: the textworld engine alone (``Engine.step``), one process, one core: the floor;
- ``in-process env``: the same through ``AlfWorldEnv.step`` (prompt building and action parsing added);
- ``in-process env, 4 threads``: the same envs split over 4 threads, each with its own event loop (how OpenRLHF's
  adapter runs them by default); engine calls hold the engine's process-wide lock, which costs nothing here because
  the engine is pure Python under the GIL;
- ``pool``: ``EnvPool`` with one worker per core, all envs stepped concurrently each round (requests batched: one
  message per worker per round);
- ``process per env``: ``EnvPool`` with one worker per env, i.e. one process per env as verl-agent's Ray actors (Ray's
  own per-call overhead is not included, so this flatters that layout);
- ``... uncached``: the engine as textworld ships it, without :mod:`mmrl.envs.alfworld.template_cache`.

Two measures: wall-clock steps/s (and per core: divided by the cores the layout can use), and steps per CPU-second
(CPU time of the driver and of every worker process, from /proc): the per-core throughput of an otherwise idle
machine, and the one that stays meaningful when other jobs share the cores. Ratios are computed on the latter.

    python benchmarks/envs.py [--envs 32] [--steps 20] [--skip-uncached]

Goals: pool ≥ 3× the process-per-env layout, pool per-core within 1.3× of the in-process engine.
Prints a table and writes its summary ``runs/bench/envs.json`` (rows and ratios in ``runs/bench/envs/raw.json``);
``--publish`` writes them into ``benchmarks/results/`` instead, the summary docs/results.md renders.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import sys
import threading
import time
from pathlib import Path

# benchmarks/alfworld.py would shadow the alfworld package (this script's directory comes first on the import path,
# and spawned pool workers inherit it): keep the directory behind the installed packages, only for ``summary``
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

from summary import add_out_arguments, result_row, write_summary  # noqa: E402

from mmrl.envs.actions import format_action  # noqa: E402
from mmrl.envs.alfworld import AlfWorldEnv, ensure_games, list_games  # noqa: E402
from mmrl.envs.alfworld.engine import Engine  # noqa: E402
from mmrl.envs.pool import EnvPool  # noqa: E402


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cpu_seconds(pids: list[int]) -> float:
    """CPU time (user + system) used so far by this process (all threads) and by the processes ``pids``."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = time.process_time()
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14 and 15 of proc(5))
    return total


class Clock:
    """Wall and CPU time of a timed region (CPU summed over this process and the given worker processes)."""

    def __init__(self, pids: list[int] | None = None) -> None:
        self.pids = pids or []

    def __enter__(self) -> Clock:
        self.wall, self.cpu = time.perf_counter(), cpu_seconds(self.pids)
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = cpu_seconds(self.pids) - self.cpu


def pick(rng: random.Random, admissible: list[str]) -> str:
    return rng.choice([a for a in admissible if a != "help"])


def in_process_engine(games: list[str], steps: int, cache: bool) -> tuple[int, Clock]:
    engines = [Engine(path, template_cache=cache) for path in games]
    states = [engine.reset() for engine in engines]
    rngs = [random.Random(i) for i in range(len(games))]
    with Clock() as clock:
        for _ in range(steps):
            states = [engine.step(pick(rng, state.admissible)) for engine, rng, state in zip(engines, rngs, states,
                                                                                              strict=True)]
    for engine in engines:
        engine.close()
    return steps * len(games), clock


async def _play(envs, steps: int, pids: list[int]) -> tuple[int, Clock]:
    firsts = await asyncio.gather(*(env.reset(seed=0) for env in envs))
    admissible = [info["admissible_actions"] for _, info in firsts]
    rngs = [random.Random(i) for i in range(len(envs))]
    clock = Clock(pids).__enter__()
    for _ in range(steps):
        results = await asyncio.gather(*(env.step(format_action(pick(rng, adm)))
                                         for env, rng, adm in zip(envs, rngs, admissible, strict=True)))
        admissible = [r.info["admissible_actions"] for r in results]
        for i, result in enumerate(results):  # a random walk that wins starts over (same in every layout)
            if result.done:
                admissible[i] = (await envs[i].reset(seed=0))[1]["admissible_actions"]
    clock.__exit__()
    await asyncio.gather(*(env.close() for env in envs))
    return steps * len(envs), clock


def env_kwargs(steps: int, cache: bool) -> dict:
    return {"max_steps": steps + 1, "template_cache": cache}


def in_process_env(games: list[str], steps: int) -> tuple[int, Clock]:
    return asyncio.run(_play([AlfWorldEnv(path, **env_kwargs(steps, True)) for path in games], steps, []))


def in_process_threads(games: list[str], steps: int, threads: int) -> tuple[int, Clock]:
    """The envs split over ``threads`` threads, each playing its share on its own loop; one clock around all."""
    shares = [games[i::threads] for i in range(threads)]
    envs = [[AlfWorldEnv(path, **env_kwargs(steps, True)) for path in share] for share in shares]
    started, go = threading.Barrier(threads + 1), threading.Event()
    counted = [0] * threads

    def run(i: int) -> None:
        async def play():
            firsts = await asyncio.gather(*(env.reset(seed=0) for env in envs[i]))
            admissible = [info["admissible_actions"] for _, info in firsts]
            rngs = [random.Random(j) for j in range(len(envs[i]))]
            started.wait()
            go.wait()
            for _ in range(steps):
                for j, (env, rng) in enumerate(zip(envs[i], rngs, strict=True)):
                    result = await env.step(format_action(pick(rng, admissible[j])))
                    admissible[j] = result.info["admissible_actions"]
                    if result.done:
                        admissible[j] = (await env.reset(seed=0))[1]["admissible_actions"]
                    counted[i] += 1
            await asyncio.gather(*(env.close() for env in envs[i]))

        asyncio.run(play())

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    started.wait()
    clock = Clock().__enter__()
    go.set()
    for worker in workers:
        worker.join()
    clock.__exit__()
    return sum(counted), clock


def pooled(games: list[str], steps: int, workers: int, cache: bool) -> tuple[int, Clock]:
    with EnvPool(AlfWorldEnv, num_workers=workers, step_timeout=600) as pool:
        envs = [pool.env(game_path=path, **env_kwargs(steps, cache)) for path in games]
        return asyncio.run(_play(envs, steps, pool.worker_pids()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20, help="steps per env (after one untimed reset)")
    parser.add_argument("--skip-uncached", action="store_true", help="skip the two slow uncached layouts")
    add_out_arguments(parser, "envs")
    args = parser.parse_args()

    # before the runs: the process-per-env layouts' own 32 workers would count in it afterwards
    load = os.getloadavg()[0]
    cores = usable_cores()
    catalogue = [str(g.path) for g in list_games(ensure_games(), "train")]
    games = [catalogue[i % len(catalogue)] for i in range(args.envs)]
    layouts = [
        ("in-process engine", 1, 1, lambda: in_process_engine(games, args.steps, cache=True)),
        ("in-process env", 1, 1, lambda: in_process_env(games, args.steps)),
        ("in-process env, 4 threads", 1, 1, lambda: in_process_threads(games, args.steps, 4)),
        ("pool", cores, cores, lambda: pooled(games, args.steps, cores, cache=True)),
        ("process per env", args.envs, cores, lambda: pooled(games, args.steps, args.envs, cache=True)),
    ]
    if not args.skip_uncached:
        layouts += [
            ("in-process engine, uncached", 1, 1, lambda: in_process_engine(games, args.steps, cache=False)),
            ("process per env, uncached", args.envs, cores, lambda: pooled(games, args.steps, args.envs,
                                                                         cache=False)),
        ]
    rows = []
    for name, processes, used_cores, run in layouts:
        steps, clock = run()
        rows.append({"layout": name, "processes": processes, "cores": used_cores, "steps": steps,
                     "wall_s": clock.wall, "cpu_s": clock.cpu, "steps_per_s": steps / clock.wall,
                     "steps_per_s_per_core": steps / clock.wall / used_cores, "steps_per_cpu_s": steps / clock.cpu})
        print(f"  {name}: {steps} steps in {clock.wall:.2f} s wall, {clock.cpu:.2f} s CPU", flush=True)

    by = {r["layout"]: r["steps_per_cpu_s"] for r in rows}
    ratios = {
        "pool_vs_process_per_env": by["pool"] / by["process per env"],
        "engine_floor_vs_pool_per_core": by["in-process engine"] / by["pool"],
        "threads_vs_one_thread": by["in-process env, 4 threads"] / by["in-process env"],
        "template_cache_speedup": by["in-process engine"] / by.get("in-process engine, uncached", float("nan")),
        "pool_vs_process_per_env_uncached": by["pool"] / by.get("process per env, uncached", float("nan")),
    }
    print(f"\n{args.envs} envs x {args.steps} steps, {cores} usable cores, load average {load:.1f} before the runs\n")
    print("| layout | processes | steps/s (wall) | steps/s per core (wall) | steps per CPU-second | CPU ms per step |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['layout']} | {r['processes']} | {r['steps_per_s']:.1f} | {r['steps_per_s_per_core']:.1f} | "
              f"{r['steps_per_cpu_s']:.1f} | {1000 / r['steps_per_cpu_s']:.2f} |")
    print()
    for key, value in ratios.items():
        print(f"{key}: {value:.2f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "raw.json").write_text(json.dumps({"envs": args.envs, "steps": args.steps, "cores": cores,
                                              "load_average_1min_before": load, "machine": platform.platform(),
                                              "rows": rows, "ratios": ratios}, indent=1))
    summary_rows = [result_row(r["layout"], "steps per CPU-second", {0: r["steps_per_cpu_s"]}) for r in rows]
    summary_rows += [result_row(r["layout"], "steps/s per core (wall)", {0: r["steps_per_s_per_core"]}) for r in rows]
    summary_rows += [result_row("ratio", key, {0: value}, unit="×") for key, value in ratios.items()
                     if math.isfinite(value)]
    write_summary(out, "ALFWorld env throughput: EnvPool, one process per env, the engine in-process", summary_rows,
                  seeds=[0], notes=f"{args.envs} envs x {args.steps} steps on {cores} usable cores, load average "
                                   f"{load:.1f} before the runs; ratios are of steps per CPU-second, one run.")


if __name__ == "__main__":
    main()
