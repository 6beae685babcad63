"""``python -m mmrl.train --backend openrlhf``: resolve the run, print it (``--dry-run``) or start it on Ray.

Resolution happens on the driver and fails at start with one line: the mmrl config is validated, the objective built,
the batch layout checked against the GPUs, the task's splits exported as OpenRLHF prompt files, and the OpenRLHF
arguments parsed by OpenRLHF's own parser. Only then does :func:`mmrl.openrlhf.driver.run` start Ray.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import mmrl.algos as algos
from mmrl.openrlhf.args import (
    LaunchInputs,
    build_flags,
    check_layout,
    command_line,
    merge_extra,
    optimizer_steps,
    to_argv,
)
from mmrl.openrlhf.cli import check_supported, parse_openrlhf_args
from mmrl.openrlhf.data import count_images, export_rows
from mmrl.openrlhf.evaluation import set_spec
from mmrl.openrlhf.rehearsal import FLAGS as REHEARSAL_FLAGS
from mmrl.openrlhf.rehearsal import gpu_note as rehearsal_gpu_note
from mmrl.openrlhf.reward import reward_file_text
from mmrl.trainer.build import build_algorithm, build_task
from mmrl.trainer.config import TrainConfig, validate
from mmrl.trainer.eval_sets import build_eval_sets
from mmrl.trainer.loggers import wandb_mode

log = logging.getLogger("mmrl.openrlhf")

AGENT_MODULES = {"alfworld": "mmrl.envs.adapters.openrlhf_agent"}  # multi-turn tasks: their AgentExecutor file


@dataclasses.dataclass
class Launch:
    """A resolved run: the OpenRLHF argument list and namespace, and what mmrl's actors need beside it."""

    argv: list[str]
    args: Any  # OpenRLHF's hierarchical namespace, with ``args.mmrl`` added
    notes: list[str]  # warnings OpenRLHF printed while checking the arguments
    files: dict[str, str]  # generated files (written unless dry run)


def algorithm_spec(cfg: TrainConfig, algo: algos.Algorithm) -> dict[str, Any]:
    """What every Ray actor needs to rebuild mmrl's objective ``algo`` (built on the driver by
    `mmrl.trainer.build.build_algorithm`, as the local trainer builds it): its name and every resolved hyper-parameter,
    so that ``algos.get(spec["algo"], **spec["params"])`` is the same objective, constant normaliser included."""
    return {"algo": algo.name, "params": dataclasses.asdict(algo), "samples_per_prompt": cfg.rollout.samples_per_prompt,
            "uses_reference": algo.uses_reference(), "kl_coef": algo.reference_kl_coef(),
            "entropy_coef": algo.entropy_coef,
            "freeze_router": cfg.moe.freeze_router}


def run_spec(cfg: TrainConfig, out: Path) -> dict[str, Any]:
    """What the actors need of the run beside the objective: where ``metrics.jsonl`` goes and whether it continues an
    earlier run's lines, the step budget (rollout steps, and optimizer steps: the lr schedule's length), and the env
    pool size of multi-turn rollouts (``rollout.env_workers``)."""
    return {"metrics_path": str(out / "metrics.jsonl"), "resume": cfg.run.resume, "steps": cfg.run.steps,
            "optimizer_steps": optimizer_steps(cfg), "env_workers": cfg.rollout.env_workers}


def check_devices(cfg: TrainConfig) -> str | None:
    """Before anything is written: a real run on a local Ray needs GPUs (one line, at once, rather than actors
    pending forever); a rehearsal on a machine with GPUs returns a one-line note and runs as asked."""
    import torch

    if cfg.cluster.rehearsal:
        return rehearsal_gpu_note()
    if not cfg.cluster.ray_address and not torch.cuda.is_available():
        raise ValueError("cluster: this machine has no GPU; rehearse the job on the CPU with --cluster.rehearsal "
                         "true, or run it on GPUs (or join a GPU cluster with --cluster.ray_address)")
    return None


def model_path(spec: str) -> str:
    from mmrl.models.loading import resolve

    where, gguf = resolve(spec, check_hub=False)  # a hub id is loaded on the cluster
    if gguf:
        raise ValueError(f"model: the openrlhf backend needs a Hugging Face model directory or hub id; {spec!r} is "
                         f"GGUF, which OpenRLHF's DeepSpeed actors and vLLM do not load")
    return str(Path(where).resolve()) if Path(where).exists() else where


def agent_file(task_name: str) -> str:
    module = AGENT_MODULES.get(task_name)
    if module is None:
        return ""
    found = importlib.util.find_spec(module)
    if found is None or found.origin is None:
        raise ValueError(f"task {task_name!r} on the openrlhf backend needs its agent executor {module} (issue 4)")
    return found.origin


def episode_rows(task, rows: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """Rows of a multi-turn task as the agent file reads them (``mmrl.envs.adapters.openrlhf_agent.parse_label``): the
    label carries the game, a reset seed fixed per game (a group's episodes start identically, as in the local
    trainer) and the env settings. The env writes the first prompt, so the chat is only the placeholder OpenRLHF's
    prompt dataset needs."""
    out = []
    for i, row in enumerate(rows):
        env = dict(task.env_kwargs(row))
        game = env.pop("game_path")
        out.append({"messages": [{"role": "user", "content": f"{task.name} game {game}"}], "game_path": game,
                    "seed": seed * 1_000_003 + i, "env": env, "chat": "chatml"})
    return out


def vision_annotator(model: str):
    """``annotate(row)`` for rows with images: the vision layer's reward context (``coord_frame``, ``resized_hw``,
    ``original_hw``) computed on the driver with the model's processor, as OpenRLHF's VLM path will resize the images
    (its processor's own pixel budget). ``None`` (with a warning) when this mmrl has no ``mmrl.vision.reward_context``:
    box rewards then read predictions as original pixels."""
    try:
        from mmrl.vision import reward_context  # type: ignore[attr-defined]
    except ImportError:
        log.warning("task rows hold images but mmrl.vision.reward_context is missing: box rewards will read predicted "
                    "boxes as original-image pixels")
        return None
    return lambda row: reward_context(row, model)


def resolve_launch(cfg: TrainConfig, write: bool) -> Launch:
    """Everything up to starting Ray. ``write=False`` (dry run) writes no file."""
    validate(cfg)
    task = build_task(cfg)
    algo = build_algorithm(cfg, task.multi_turn)  # a bad name or hyper-parameter fails here, on the driver
    if cfg.rollout.agent_layout != "episode":
        raise ValueError("config: rollout.agent_layout turn runs on the local backend; the openrlhf backend trains "
                         "agent episodes in the episode layout")
    spec = algorithm_spec(cfg, algo)
    check_layout(cfg, algo)
    out = cfg.out_dir.resolve()
    if (out / "checkpoints").exists() and not cfg.run.resume and not cfg.run.overwrite:
        raise ValueError(f"config: run.out_dir {out} already holds a run; pass --resume to continue it, "
                         f"--run.overwrite true to start afresh, or another --run.out_dir")
    files_dir = out / "openrlhf"
    eval_sets = build_eval_sets(cfg, task)
    files = {"train": str(files_dir / "train.jsonl"), "eval": str(files_dir / "eval.jsonl") if task.eval else "",
             "reward_func": str(files_dir / "reward_func.py")}
    for s in eval_sets:  # each set from its own file (the first also makes OpenRLHF schedule evaluations)
        files[f"eval_{s.name}"] = str(files_dir / f"eval_{s.name}.jsonl")
    if eval_sets:
        files["eval"] = files[f"eval_{eval_sets[0].name}"]
    agent = cfg.cluster.extra.get("train.agent_func_path") or agent_file(task.name)
    if agent:
        files["reward_func"] = ""
    path = model_path(cfg.model.name)
    train_rows, eval_rows = task.train, task.eval
    if task.multi_turn:
        train_rows, eval_rows = (episode_rows(task, task.train, cfg.run.seed),
                                 episode_rows(task, task.eval, cfg.run.seed + 1))
    set_rows = {s.name: (episode_rows(s.task, s.task.eval, cfg.run.seed + 1) if s.task.multi_turn else s.task.eval)
                for s in eval_sets}
    if eval_sets:
        eval_rows = []  # the sets replace the task's held-out split
    most = max((count_images(r) for r in [*train_rows, *eval_rows, *(x for v in set_rows.values() for x in v)]),
               default=0)
    inputs = LaunchInputs(model_path=path, train_data=files["train"], eval_data=files["eval"],
                          reward_func=files["reward_func"], agent_func=agent, train_rows=len(task.train),
                          max_images=most, batches_per_step=1 + algo.resampling().max_rounds,
                          max_eval_new_tokens=max((s.max_new_tokens(cfg) for s in eval_sets), default=0))
    flags = build_flags(cfg, inputs, spec["kl_coef"] if spec["uses_reference"] else 0.0, str(out),
                        entropy_coef=spec["entropy_coef"])
    if cfg.cluster.rehearsal:
        flags = merge_extra(flags, REHEARSAL_FLAGS)
    flags = merge_extra(flags, cfg.cluster.extra)
    argv = to_argv(flags)
    args, notes = parse_openrlhf_args(argv)
    check_supported(args)
    if write:  # only once everything is checked: a refused launch leaves nothing behind
        annotate = vision_annotator(path) if most else None
        export_rows(train_rows, Path(files["train"]), "train", task.name, annotate)
        if eval_rows:
            export_rows(eval_rows, Path(files["eval"]), "eval", task.name, annotate)
        for name, rows in set_rows.items():
            export_rows(rows, Path(files[f"eval_{name}"]), "eval", name, annotate)
        if files["reward_func"]:
            Path(files["reward_func"]).write_text(reward_file_text({
                "task": task.name, "options": cfg.task.options, "reward_model": cfg.task.reward_model,
                "reward_model_weight": cfg.task.reward_model_weight, "tokenizer": path}))
    spec["eval_sets"] = [set_spec(s, files[f"eval_{s.name}"], s.max_new_tokens(cfg)) for s in eval_sets]
    args.mmrl = {**spec, **run_spec(cfg, out)}
    return Launch(argv, args, notes, files)


def describe(cfg: TrainConfig, launch: Launch) -> str:
    spec = launch.args.mmrl
    lines = [
        "OpenRLHF 0.11.x launch (mmrl backend: Ray actor groups, vLLM engines and DeepSpeed are OpenRLHF's; the policy "
        "actor, PPO trainer, experience maker and loss are mmrl.openrlhf's subclasses)",
        f"objective: {spec['algo']} {json.dumps(spec['params'])}",
        f"task: {cfg.task.name} {json.dumps(cfg.task.options)}",
        f"ray: {cfg.cluster.ray_address or 'local (ray.init())'}",
        *(["mode: CPU rehearsal (HF rollout actors behind the vLLM interface, gloo weight sync, sdpa; "
           "docs/cluster.md)"] if cfg.cluster.rehearsal else []),
        "arguments (parsed and checked by OpenRLHF's train_ppo_ray parser):",
        "    " + command_line(launch.argv),
        "files: " + ", ".join(f"{k}={v}" for k, v in launch.files.items() if v),
    ]
    for s in spec.get("eval_sets", []):
        sampling = "greedy" if s["temperature"] == 0 else f"temperature {s['temperature']}, top_p {s['top_p']}"
        lines.append(f"evaluation set {s['name']}: {s['samples']} per problem, {sampling}, "
                     f"{s['max_new_tokens']} new tokens, {s['metric']}")
    lines += [f"openrlhf: {note}" for note in launch.notes]
    return "\n".join(lines)


def launch(cfg: TrainConfig, dry_run: bool = False) -> int:
    if not dry_run:
        note = check_devices(cfg)
        if note:
            print(note)
    resolved = resolve_launch(cfg, write=not dry_run)
    print(describe(cfg, resolved))
    if dry_run:
        return 0
    out = cfg.out_dir.resolve()
    if cfg.run.overwrite and not cfg.run.resume and (out / "checkpoints").exists():
        shutil.rmtree(out / "checkpoints")  # a fresh run must not resume or prune into the old one's checkpoints
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2, default=str))
    if cfg.run.wandb:  # OpenRLHF's W&B logger reads these in its Ray actors (see mmrl.trainer.loggers.openrlhf_flags)
        os.environ["WANDB_MODE"] = wandb_mode()
        os.environ.setdefault("WANDB_DIR", str(out))
    if cfg.cluster.rehearsal:  # the driver imports OpenRLHF's launcher, which imports vLLM and flash-attn names
        from mmrl.openrlhf.rehearsal import install_stand_ins

        install_stand_ins()
    from mmrl.openrlhf.driver import run

    run(resolved.args, cfg.cluster.ray_address, cfg.cluster.rehearsal, cfg.cluster.placement_timeout)
    print(f"run directory: {out} (model/, checkpoints/" + (", tensorboard/" if cfg.run.tensorboard else "") + ")")
    return 0
