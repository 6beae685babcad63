"""ALFWorld success after an SFT warm-start on the explorer's demonstrations, then RL: ``gmpo`` vs ``grpo`` from the
same warm-started model, same seeds, same budget, on the real TextWorld engine with the embedded agent model.

1. Warm start (once per seed): behaviour cloning of :class:`mmrl.envs.alfworld.explorer.Explorer` (a scripted player
   that searches, acting only on what the model sees), ``--demos-per-row`` differently seeded demonstrations per
   training game, rendered through the real env by the trainer's episode driver. ``--sft-steps`` steps in chunks of
   ``--sft-eval-every`` (each chunk is one ``sft_warmup`` call, i.e. what ``--sft-warmup N`` runs, its batches drawn
   with the chunk's offset as seed), with held-out success after each chunk. ``--init-model`` starts it from a saved
   model (a longer warm-up in two runs).
2. RL from that checkpoint for each algorithm (``--rl-steps``), held-out success every ``--eval-every`` steps;
   ``--rl-resume`` continues the runs of an earlier call from their last checkpoints up to ``--rl-steps``.

Held-out success is measured greedily (one episode per game, ``--eval-temperature 0``) and, for the warm start, also
sampled at the RL rollout temperature. Prints tables, writes JSON and a PNG of the curves to ``--out``.

    python benchmarks/alfworld.py [--sft-steps 1500] [--rl-steps 15] [--seeds 0] [--algos gmpo,grpo] [--threads 2]

The warm start of docs/alfworld.md in one command (~1.3 h of SFT on 2 idle cores), then RL from it for 3 seeds:

    python benchmarks/alfworld.py --pre-sft-steps 900 --n-per-type 250 --demos-per-row 2 --sft-steps 900 \
        --sft-eval-every 300 --rl-steps 0
    python benchmarks/alfworld.py --n-per-type 250 --reuse-warm-start --rl-seeds 0,1,2 --rl-steps 12 --eval-every 4

Seeds can also run as separate processes side by side (``--rl-seeds 1 --out <dir>-s1``, each out dir linking the
warm start); ``--merge <dir>-s0,<dir>-s1,<dir>-s2 --out <dir>`` then pools their tables, significance and curves.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

# This script shares its name with the ``alfworld`` package: keep its directory behind the installed packages on the
# import path (it is only needed for ``common``).
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

import torch  # noqa: E402
from common import QUIET, pyplot  # noqa: E402
from summary import add_out_arguments, result_row, write_summary  # noqa: E402

from mmrl.algos import get as get_algorithm  # noqa: E402
from mmrl.envs.alfworld.generate import generate_games  # noqa: E402
from mmrl.envs.alfworld.tasks import TASK_TYPES, official_task_type  # noqa: E402
from mmrl.models import load_model, load_tokenizer  # noqa: E402
from mmrl.samples import SAMPLES_FILE  # noqa: E402
from mmrl.tasks import get_task  # noqa: E402
from mmrl.tasks.alfworld import ALFWORLD_DEFAULTS  # noqa: E402
from mmrl.trainer.config import resolve_config, validate  # noqa: E402
from mmrl.trainer.evaluate import evaluate_episode_groups  # noqa: E402
from mmrl.trainer.local import build_trainer  # noqa: E402
from mmrl.trainer.metrics import read_metrics  # noqa: E402
from mmrl.trainer.schedule import SCHEDULES  # noqa: E402
from mmrl.trainer.sft import render_demonstrations, sft_warmup  # noqa: E402

EVAL_KEYS = ("pass@1", "valid_action_rate", "format_rate", "episode_length")


def held_out(model, tokenizer, task, args, temperature: float) -> dict:
    """Success on the task's held-out games: greedy (1 episode per game) or sampled (``--eval-samples`` each)."""
    return held_out_games(model, tokenizer, task, args, temperature)[0]


def held_out_games(model, tokenizer, task, args, temperature: float) -> tuple[dict, list[int]]:
    """(the metrics of :func:`held_out`, episodes won per held-out game in the task's order)."""
    result, groups = evaluate_episode_groups(model, tokenizer, task, k=args.eval_samples, temperature=temperature,
                                             max_new_tokens=ALFWORLD_DEFAULTS["rollout.max_new_tokens"],
                                             max_episode_tokens=ALFWORLD_DEFAULTS["rollout.max_episode_tokens"],
                                             seed=0, batch_size=64, layout=args.layout)
    model.train()  # evaluation leaves the model in eval mode; the warm-up continues in train mode
    wins = [sum(int(r.episode["won"]) for r in g.responses) for g in groups]
    return {k: v for k, v in result.items() if isinstance(v, float)}, wins


def sign_test(gained: int, lost: int) -> float:
    """Two-sided exact sign test (McNemar's exact test) of ``gained`` games won after RL and not before against
    ``lost`` games won before and not after: the chance of a split at least this uneven if RL changed nothing."""
    n = gained + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(gained, lost) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def run_rl(overrides: dict, out_dir: Path, tasks: dict, args) -> tuple[list[dict], float, dict]:
    """(per-step records, wall seconds, {split: (greedy metrics, wins per game)} of the final policy) of one RL run
    from the warm start; SIGINT/SIGTERM stop the whole benchmark. ``valid_seen`` (the task's own held-out split) is
    the trainer's evaluation after its last step, every game's episode kept in samples.jsonl; the other splits are
    played here."""
    seen = tasks["valid_seen"]
    keep_every_game = {"run.eval_sample_prompts": len(seen.eval)}
    cfg = resolve_config([({**QUIET, **overrides, "run.out_dir": str(out_dir), **keep_every_game}, "benchmark")])
    start = time.perf_counter()
    trainer = build_trainer(cfg)
    trainer.run()
    if trainer.stop_signal is not None:
        raise SystemExit(128 + trainer.stop_signal)
    wall = time.perf_counter() - start
    records = read_metrics(trainer.run_dir / "metrics.jsonl")
    final = {"valid_seen": trainer_final_evaluation(records, trainer.run_dir / SAMPLES_FILE, len(seen.eval))}
    final = {split: final.get(split) or held_out_games(trainer.model, trainer.tokenizer, task, args, 0.0)
             for split, task in tasks.items()}
    return records, wall, final


def trainer_final_evaluation(records: list[dict], samples: Path, n_games: int) -> tuple[dict, list[int]] | None:
    """(the metrics, wins per game) of the trainer's greedy evaluation after its last step, as :func:`held_out_games`
    gives them: one episode per game, in the task's order; None when samples.jsonl does not hold every game of it (a
    run written before the benchmark kept them, resumed at its last step), which is then replayed."""
    last = records[-1]
    metrics = {k.split("/", 1)[1]: v for k, v in last.items() if k.startswith("eval/") and isinstance(v, float)}
    episodes = [json.loads(line) for line in samples.read_text().splitlines() if line.strip()]
    won = {r["problem"]: int(r["episode"]["won"]) for r in episodes if r["step"] == last["step"]}
    if "pass@1" not in metrics or sorted(won) != list(range(n_games)):
        return None
    return metrics, [won[i] for i in range(n_games)]


def per_type(result: dict) -> dict:
    """{task type: success} from an evaluation's ``success/<type>`` entries (the types the held-out games have)."""
    return {key.split("/", 1)[1]: value for key, value in sorted(result.items()) if key.startswith("success/")}


def short(result: dict) -> str:
    return ", ".join(f"{k} {result[k]:.3f}" for k in EVAL_KEYS if k in result)


def warm_start(args, games: Path, seed: int, out: Path) -> tuple[Path, dict]:
    """The warm-started model's directory and the warm-up's record (curve, final evaluations, seconds)."""
    saved = out / "warm_start.json"
    tasks = held_out_tasks(args, games)
    if args.reuse_warm_start and saved.is_file():
        record = json.loads(saved.read_text())
        if "wins" not in record:  # a record written before per-game wins were kept; greedy play is deterministic
            model, tokenizer = load_model(str(out / "model")), load_tokenizer(str(out / "model"))
            record["wins"] = {split: held_out_games(model, tokenizer, task, args, 0.0)[1]
                              for split, task in tasks.items()}
            saved.write_text(json.dumps(record))
        return out / "model", record
    seen = tasks["valid_seen"]
    tokenizer = load_tokenizer(args.init_model)
    torch.manual_seed(seed)
    model = load_model(args.init_model)
    pre_seconds = pre_sft(args, model, tokenizer, seed, out) if args.pre_sft_steps > 0 else 0.0
    start = time.perf_counter()
    demos = render_demonstrations(seen, tokenizer, seen.train, ALFWORLD_DEFAULTS["rollout.max_episode_tokens"],
                                  seed=seed, per_row=args.demos_per_row, layout=args.layout)
    tokens = [len(g.prompt_ids) + len(g.responses[0].token_ids) for g in demos]
    record = {"demonstrations": len(demos), "demo_tokens_mean": sum(tokens) / len(tokens),
              "render_seconds": time.perf_counter() - start, "curve": [], "losses": []}
    print(f"seed {seed}: {len(demos)} demonstrations, {record['demo_tokens_mean']:.0f} tokens on average, rendered "
          f"in {record['render_seconds']:.0f} s", flush=True)
    done, sft_seconds = 0, 0.0
    while done < args.sft_steps:
        n = min(args.sft_eval_every, args.sft_steps - done)
        t0 = time.perf_counter()
        record["losses"] += sft_warmup(model, demos, tokenizer.pad_token_id, n, args.sft_lr, args.sft_batch,
                                       seed=done)
        sft_seconds += time.perf_counter() - t0
        done += n
        greedy = held_out(model, tokenizer, seen, args, 0.0)
        record["curve"].append((done, greedy["pass@1"], greedy["valid_action_rate"]))
        print(f"  sft step {done}: loss {sum(record['losses'][-n:]) / n:.3f}, held-out greedy: {short(greedy)} "
              f"({sft_seconds:.0f} s of SFT)", flush=True)
    record["sft_seconds"] = sft_seconds
    record["pre_sft_seconds"] = pre_seconds
    final = {(split, mode): held_out_games(model, tokenizer, task, args, temperature)
             for split, task in tasks.items() for mode, temperature in (("greedy", 0.0), ("sampled", args.temperature))}
    record["final"] = {f"{split}/{mode}": metrics for (split, mode), (metrics, _) in final.items()}
    record["wins"] = {split: final[(split, "greedy")][1] for split in tasks}
    target = out / "model"
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    saved.write_text(json.dumps(record))
    return target, record


def pre_sft(args, model, tokenizer, seed: int, out: Path) -> float:
    """Part 1 of the warm start: ``--pre-sft-steps`` SFT steps on a smaller set (``--pre-n-per-type`` games per type,
    ``--pre-demos-per-row`` demonstrations each; generated into ``<out>/games-pre``), so that the main warm-up starts
    from a model that already copies commands (docs/alfworld.md). Returns its seconds."""
    games = out.parent / "games-pre"
    if not (games / "COMPLETE").is_file():
        generate_games(games, n_per_type=args.pre_n_per_type, n_eval_per_type=6, seed=0,
                       task_types=selected_types(args), n_receptacles=args.receptacles,
                       n_distractors=args.distractors)
        (games / "COMPLETE").write_text("done\n")
    task = get_task("alfworld", **task_options(args, games))
    demos = render_demonstrations(task, tokenizer, task.train, ALFWORLD_DEFAULTS["rollout.max_episode_tokens"],
                                  seed=seed, per_row=args.pre_demos_per_row, layout=args.layout)
    start, done = time.perf_counter(), 0
    while done < args.pre_sft_steps:
        n = min(args.sft_eval_every, args.pre_sft_steps - done)
        losses = sft_warmup(model, demos, tokenizer.pad_token_id, n, args.sft_lr, args.sft_batch, seed=done)
        done += n
        print(f"  pre-sft step {done}: loss {sum(losses) / n:.3f}", flush=True)
    return time.perf_counter() - start


def summarise_gain(algo: str, rows: list[dict], split: str) -> dict:
    """Mean held-out gain over RL seeds with its standard error, and the exact sign test pooled over every
    (seed, game) pair that changed."""
    start, end = ("held-out greedy, start", "held-out greedy, end") if split == "valid_seen" else \
        ("unseen, start", "unseen, end")
    gains = [r[end] - r[start] for r in rows]
    gained, lost = sum(r[f"{split} gained"] for r in rows), sum(r[f"{split} lost"] for r in rows)
    return {"algorithm": algo, "split": split, "seeds": len(rows), "mean gain": statistics.mean(gains),
            "standard error": statistics.stdev(gains) / math.sqrt(len(gains)) if len(gains) > 1 else float("nan"),
            "games gained": gained, "games lost": lost, "sign test p": sign_test(gained, lost)}


def selected_types(args) -> tuple[str, ...]:
    return tuple(official_task_type(t) for t in args.task_types.split(",") if t) or TASK_TYPES


def held_out_tasks(args, games: Path) -> dict:
    """{split: the alfworld task evaluating on it} for ``valid_seen`` and ``valid_unseen``."""
    options = task_options(args, games)
    return {split: get_task("alfworld", **{**options, "eval_split": split}) for split in ("valid_seen", "valid_unseen")}


def task_options(args, games: Path) -> dict:
    return {"games_root": str(games), "task_types": args.task_types, "max_steps": args.max_steps,
            "max_eval_games": 0}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init-model", default=ALFWORLD_DEFAULTS["model.name"],
                        help="model the warm-up starts from (default: the embedded agent model)")
    parser.add_argument("--sft-steps", type=int, default=1500)
    parser.add_argument("--sft-eval-every", type=int, default=300)
    parser.add_argument("--sft-lr", type=float, default=2e-3)
    parser.add_argument("--sft-batch", type=int, default=8, help="demonstrations per SFT step")
    parser.add_argument("--demos-per-row", type=int, default=4, help="explorer demonstrations per training game")
    parser.add_argument("--pre-sft-steps", type=int, default=0,
                        help="part 1 of the warm start: SFT steps on a smaller set first (the recipe: 900)")
    parser.add_argument("--pre-n-per-type", type=int, default=48, help="training games per type of that set")
    parser.add_argument("--pre-demos-per-row", type=int, default=4, help="demonstrations per game of that set")
    parser.add_argument("--reuse-warm-start", action="store_true",
                        help="reuse the warm-started model of an earlier run in --out (RL phase only)")
    parser.add_argument("--rl-steps", type=int, default=15)
    parser.add_argument("--rl-resume", action="store_true",
                        help="continue each RL run of --out from its last checkpoint up to --rl-steps (a longer run; "
                             "every run must have a checkpoint; 'seconds' then counts this call's part)")
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="RL steps between checkpoints (0: only at the end or on SIGINT/SIGTERM)")
    parser.add_argument("--games-per-step", type=int, default=4, help="groups per RL step")
    parser.add_argument("--group-size", type=int, default=4, help="episodes per game (group) in RL")
    parser.add_argument("--temperature", type=float, default=0.7, help="RL rollout temperature")
    parser.add_argument("--rl-lr", type=float, default=2e-4)
    parser.add_argument("--rl-warmup-steps", type=int, default=0,
                        help="optimizer steps of linear lr warm-up from 0 in RL (Adam's first step moves every weight "
                             "by the full lr); 0 here, unlike the task's default of 10, so that earlier "
                             "benchmark commands reproduce")
    parser.add_argument("--rl-schedule", default="constant", choices=SCHEDULES,
                        help="RL lr after warm-up (optim.schedule); under a constant lr, 50-step runs tend to "
                             "peak early and fall back")
    parser.add_argument("--rl-min-lr-ratio", type=float, default=0.0, help="cosine's floor (optim.min_lr_ratio)")
    parser.add_argument("--epochs", type=int, default=2,
                        help="update epochs per rollout: with 1, GMPO and GRPO take the same gradient (ratio 1)")
    parser.add_argument("--algo-param", action="append", default=[], metavar="KEY=VALUE",
                        help="an objective's hyper-parameter (--algo.KEY of mmrl.train, e.g. clip_low=0.2) for the "
                             "RL runs of EVERY objective in --algos; repeat for more; a key or value one of them does "
                             "not take fails at start, before the warm start")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--rl-seeds", default="",
                        help="RL seeds run from each warm start ('' = the warm start's own seed)")
    parser.add_argument("--algos", default="gmpo,grpo")
    parser.add_argument("--n-per-type", type=int, default=48, help="generated training games per task type")
    parser.add_argument("--n-eval-per-type", type=int, default=12, help="generated held-out games per type and split")
    parser.add_argument("--task-types", default="pick_and_place,look_at_obj_in_light",
                        help="comma-separated subset of the six types ('' = all six)")
    parser.add_argument("--games-root", default="",
                        help="play this game set (e.g. the task's cached generated set) instead of generating one")
    parser.add_argument("--receptacles", type=int, default=5, help="receptacles per generated room")
    parser.add_argument("--distractors", type=int, default=2, help="objects per room besides the task's own")
    parser.add_argument("--max-steps", type=int, default=15, help="env steps per episode")
    parser.add_argument("--layout", default="episode", choices=("episode", "turn"),
                        help="the agent layout (rollout.agent_layout) of the demonstrations, the held-out play and "
                             "the RL runs")
    parser.add_argument("--eval-samples", type=int, default=2, help="episodes per held-out game when sampling")
    parser.add_argument("--threads", type=int, default=2)
    add_out_arguments(parser, "alfworld")
    parser.add_argument("--merge", default="",
                        help="comma-separated --out dirs of earlier runs (e.g. one RL seed each, run side by side): "
                             "pool their results into --out and stop")
    return parser


def rl_base_overrides(args, games: Path) -> dict:
    """The config overrides every RL run of this benchmark shares (the run's model, algorithm and seed go on top)."""
    return {**ALFWORLD_DEFAULTS, "task.name": "alfworld", "model.threads": args.threads,
            **{f"task.{k}": v for k, v in task_options(args, games).items()},
            "run.eval_temperature": 0.0, "rollout.temperature": args.temperature, "rollout.agent_layout": args.layout,
            "optim.lr": args.rl_lr,
            "rollout.prompts_per_step": args.games_per_step, "rollout.samples_per_prompt": args.group_size,
            "optim.epochs": args.epochs, "optim.warmup_steps": args.rl_warmup_steps,
            "optim.schedule": args.rl_schedule, "optim.min_lr_ratio": args.rl_min_lr_ratio, "sft.steps": 0,
            "run.checkpoint_every": args.checkpoint_every, **algo_params(args.algo_param)}


def algo_params(pairs: list[str]) -> dict:
    """``["clip_low=0.2"]`` -> ``{"algo.clip_low": "0.2"}`` (the config parses the value as ``--algo.X`` does)."""
    params = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"--algo-param {pair!r}: expected KEY=VALUE")
        params[f"algo.{key.strip()}"] = value.strip()
    return params


def check_objectives(base: dict, names: list[str]) -> None:
    """Build each objective the RL runs will train with, so that a wrong ``--algo-param`` (or objective name) fails
    now and not after an hour of warm start and earlier runs."""
    for name in names:
        cfg = resolve_config([({**base, "algo.name": name}, "benchmark")])
        validate(cfg)
        get_algorithm(cfg.algo.name, **cfg.algo.params)


def main() -> None:
    args = build_parser().parse_args()
    out = Path(args.out)
    if args.merge:
        merge([Path(d) for d in args.merge.split(",") if d], out)
        return
    torch.set_num_threads(args.threads)
    games = Path(args.games_root) if args.games_root else out / "games"
    base = rl_base_overrides(args, games)
    check_objectives(base, args.algos.split(","))
    if not args.games_root and not (games / "COMPLETE").is_file():  # the benchmark's own set: its types and rooms
        generate_games(games, n_per_type=args.n_per_type, n_eval_per_type=args.n_eval_per_type, seed=0,
                       task_types=selected_types(args), n_receptacles=args.receptacles,
                       n_distractors=args.distractors)
        (games / "COMPLETE").write_text("done\n")
    warm_rows, rl_rows, type_rows, curves = [], [], [], {}
    for seed in map(int, args.seeds.split(",")):
        warm_dir, record = warm_start(args, games, seed, out / f"sft-seed{seed}")
        # steps and seconds of the (last part of the) warm-up that made this model, also when it is reused
        warm_rows.append({"seed": seed, "steps": record["curve"][-1][0] if record["curve"] else 0,
                          "seconds": record["sft_seconds"],
                          **{k: v["pass@1"] for k, v in record["final"].items()},
                          "valid_action (seen, greedy)": record["final"]["valid_seen/greedy"]["valid_action_rate"]})
        type_rows.append({"model": f"warm start, seed {seed}", **per_type(record["final"]["valid_seen/greedy"])})
        curves[("sft", seed)] = [(s, p) for s, p, _ in record["curve"]]
        start_success = record["final"]["valid_seen/greedy"]["pass@1"]
        rl_seeds = [int(s) for s in args.rl_seeds.split(",") if s] or [seed]
        runs = [(a, r) for r in rl_seeds for a in args.algos.split(",")] if args.rl_steps > 0 else []  # 0: warm-up only
        for algo, rl_seed in runs:
            overrides = {**base, "model.name": str(warm_dir), "algo.name": algo, "run.seed": rl_seed,
                         "run.steps": args.rl_steps, "run.eval_every": args.eval_every,
                         **({"run.resume": True, "run.overwrite": False} if args.rl_resume else {})}
            records, wall, final = run_rl(overrides, out / "runs" / f"{algo}-seed{rl_seed}",
                                          held_out_tasks(args, games), args)
            records = [r for r in records if "reward" in r]  # training steps (the step-0 evaluation has none)
            curve = [(0, start_success)] + [(r["step"], r["eval/pass@1"]) for r in records if "eval/pass@1" in r]
            curves[(algo, rl_seed)] = curve
            row = {"algorithm": algo, "warm seed": seed, "seed": rl_seed, "steps": args.rl_steps, "seconds": wall,
                   "held-out greedy, start": start_success, "held-out greedy, end": final["valid_seen"][0]["pass@1"],
                   "best": max(p for _, p in curve),
                   "unseen, start": record["final"]["valid_unseen/greedy"]["pass@1"],
                   "unseen, end": final["valid_unseen"][0]["pass@1"],
                   "train success, first 3 steps": sum(r["success_rate"] for r in records[:3]) / 3,
                   "train success, last 3 steps": sum(r["success_rate"] for r in records[-3:]) / 3,
                   "valid action, last step": records[-1]["valid_action_rate"]}
            for split in ("valid_seen", "valid_unseen"):  # per game: won after RL and not before, and the reverse
                pairs = list(zip(record["wins"][split], final[split][1], strict=True))
                row[f"{split} gained"] = sum(b > 0 and a == 0 for a, b in pairs)
                row[f"{split} lost"] = sum(a > 0 and b == 0 for a, b in pairs)
            rl_rows.append(row)
            type_rows.append({"model": f"{algo}, RL seed {rl_seed}, step {args.rl_steps}",
                              **per_type(final["valid_seen"][0])})
    meta = {"machine": platform.platform(), "threads": args.threads, "args": vars(args)}
    report(out, meta, warm_rows, rl_rows, type_rows, curves)


def merge(dirs: list[Path], out: Path) -> None:
    """Pool the results of runs made as separate processes (e.g. one ``--rl-seeds`` each, side by side) into one
    report in ``out``: their RL rows, per-type rows and curves, the warm start once, and the gain and sign test
    recomputed over all of them. Every run must share the warm start (the same start success per split)."""
    if any(d.resolve() == out.resolve() for d in dirs):
        raise SystemExit(f"--merge: --out {out} is one of the merged runs; its results would be overwritten")
    runs = []
    for d in dirs:
        path = d / "alfworld.json"
        if not path.is_file():
            raise SystemExit(f"--merge: {path} does not exist (run the benchmark with --out {d} first)")
        runs.append(json.loads(path.read_text()))
    starts = {(r["held-out greedy, start"], r["unseen, start"]) for run in runs for r in run["rl"]}
    if len(starts) > 1:
        raise SystemExit(f"--merge: the runs start from different warm starts (start success {sorted(starts)})")
    warm_rows = list({json.dumps(w, sort_keys=True): w for run in runs for w in run["warm_start"]}.values())
    rl_rows = [r for run in runs for r in run["rl"]]
    type_rows = list({row["model"]: row for run in runs for row in run["per_type"]}.values())
    curves = {tuple_key(name): curve for run in runs for name, curve in run["curves"].items()}
    meta = {"machine": platform.platform(), "merged": [str(d) for d in dirs],
            "args": [run["meta"]["args"] for run in runs]}
    report(out, meta, warm_rows, rl_rows, type_rows, curves)


def tuple_key(name: str) -> tuple[str, int]:
    """("gmpo", 1) from the JSON's curve name "gmpo-seed1"."""
    algo, seed = name.rsplit("-seed", 1)
    return algo, int(seed)


def write_alfworld_summary(out: Path, meta: dict, warm_rows: list, rl_rows: list) -> None:
    """``<out>.json`` for docs/results.md: the warm start's held-out greedy success per warm-up seed, and per
    objective the RL gain in held-out greedy success per RL seed (``valid_seen`` and ``valid_unseen``)."""
    rows = []
    if warm_rows:
        for key in ("valid_seen/greedy", "valid_unseen/greedy"):
            if all(key in w for w in warm_rows):
                rows.append(result_row("warm start", f"held-out {key.replace('/', ' ')} success",
                                       {w["seed"]: w[key] for w in warm_rows}))
    for algo in dict.fromkeys(r["algorithm"] for r in rl_rows):
        mine = [r for r in rl_rows if r["algorithm"] == algo]
        steps = mine[0]["steps"]
        rows.append(result_row(algo, f"valid_seen greedy success gain by RL step {steps}",
                               {r["seed"]: r["held-out greedy, end"] - r["held-out greedy, start"] for r in mine}))
        rows.append(result_row(algo, f"valid_unseen greedy success gain by RL step {steps}",
                               {r["seed"]: r["unseen, end"] - r["unseen, start"] for r in mine}))
        rows.append(result_row(algo, "wall seconds per run", {r["seed"]: r["seconds"] for r in mine}, unit="s"))
    seeds = sorted({r["seed"] for r in rl_rows} or {w["seed"] for w in warm_rows})
    merged = meta.get("merged")
    command = None if not merged else (f"python benchmarks/alfworld.py --merge {','.join(merged)} --out {out}"
                                       "  # pools the runs listed under their own commands")
    write_summary(out, "ALFWorld: held-out success of the embedded agent, warm start and RL", rows, seeds=seeds,
                  command=command, notes="Greedy play, one episode per held-out game, on generated games.")


def report(out: Path, meta: dict, warm_rows: list, rl_rows: list, type_rows: list, curves: dict) -> None:
    """Print the tables, and write alfworld.json and alfworld.png of the curves to ``out``."""
    algos = list(dict.fromkeys(r["algorithm"] for r in rl_rows))
    significance = [summarise_gain(algo, [r for r in rl_rows if r["algorithm"] == algo], split)
                    for algo in algos for split in ("valid_seen", "valid_unseen")]
    for title, rows in (("warm start (held-out pass@1)", warm_rows), ("RL from the warm start", rl_rows),
                        ("RL gain over seeds, and the sign test over (seed, game) pairs", significance),
                        ("held-out greedy success per task type (valid_seen)", type_rows)):
        if not rows:
            continue
        print(f"\n{title}")
        columns = list(rows[0])
        print(" | ".join(columns))
        for row in rows:
            print(" | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()))
    out.mkdir(parents=True, exist_ok=True)
    (out / "alfworld.json").write_text(json.dumps({"meta": meta, "warm_start": warm_rows, "rl": rl_rows,
                                                   "significance": significance, "per_type": type_rows,
                                                   "curves": {f"{a}-seed{s}": c for (a, s), c in curves.items()}},
                                                  indent=2))
    write_alfworld_summary(out, meta, warm_rows, rl_rows)
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for (name, seed), curve in curves.items():
        ax = left if name == "sft" else right
        ax.plot([p[0] for p in curve], [p[1] for p in curve], marker="o", label=f"{name} seed {seed}")
    left.set_xlabel("SFT step")
    right.set_xlabel("RL step (0 = the warm-started model)")
    for ax in (left, right):
        ax.set_ylabel("held-out success (greedy)")
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend()
    fig.suptitle("ALFWorld (generated games), embedded agent model")
    fig.tight_layout()
    fig.savefig(out / "alfworld.png", dpi=90)
    print(f"wrote {out / 'alfworld.json'} and {out / 'alfworld.png'}")


if __name__ == "__main__":
    main()
