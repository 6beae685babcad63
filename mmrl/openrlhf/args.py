"""mmrl's config as OpenRLHF 0.11.x ``train_ppo_ray`` command-line arguments (pure: no OpenRLHF import).

One mmrl rollout step is one OpenRLHF global step: ``rollout.prompts_per_step`` prompts × ``samples_per_prompt``
responses (``--rollout.batch_size`` × ``--rollout.n_samples_per_prompt``), then ``optim.epochs`` passes of
``optim.minibatches`` optimizer steps each (``--train.max_epochs``, ``--train.batch_size`` = responses / minibatches).

Choices, written down:
* ``--algo.advantage.estimator group_norm`` only keeps OpenRLHF from building a critic; mmrl's experience maker
  replaces OpenRLHF's advantage computation with ``Algorithm.advantages`` (docs/openrlhf.md).
* ``--algo.advantage.is_correction_level token`` only makes OpenRLHF ask vLLM for each sampled token's (processed)
  log-prob; OpenRLHF's correction lives in the loss mmrl replaces, and mmrl's (``algo.rollout_correction``) reads
  those log-probs as ``rollout_log_probs``.
* A reference model is built only when the objective reads ``ref_logprobs`` (GRPO-family ``kl_coef > 0``):
  ``--algo.kl.init_coef kl_coef --algo.kl.use_loss`` keeps its log-probs in the replay buffer, and mmrl's actor trains
  with OpenRLHF's own KL term switched off (``kl_ctl = 0``), since the objective adds its own k3 KL.
* Weights train in bf16 with fp32 master weights in DeepSpeed; ``model.dtype`` and ``model.device`` are local-only.
* ``run.steps`` is met by limiting the prompt set (``--data.max_samples``) and repeating it (``--train.num_episodes``);
  when the split is smaller than ``steps × prompts_per_step`` the run takes the whole episodes that cover them.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shlex
from pathlib import Path
from typing import Any

from mmrl.algos import Algorithm
from mmrl.errors import UserError
from mmrl.models.lora import parse_targets
from mmrl.run.config import TrainConfig
from mmrl.run.loggers import OPENRLHF_WANDB_KEY, openrlhf_flags
from mmrl.run.masking import MASK, MASKED_URL, SECRET_ENV, is_secret, mask_urls
from mmrl.run.schedule import transformers_name

# mmrl options the openrlhf backend cannot honour yet: refused at start rather than silently ignored.
UNSUPPORTED = {
    "moe.z_loss_coef": ("moe.z_loss_coef", lambda c: c.moe.z_loss_coef > 0,
                        "OpenRLHF's actor only adds the model's own aux (load-balancing) loss"),
    "moe.routing_replay": ("moe.routing_replay", lambda c: c.moe.routing_replay,
                           "vLLM does not return the experts it routed to; docs/moe.md says what replay needs"),
    "run.track_kl_to_init": ("run.track_kl_to_init", lambda c: c.run.track_kl_to_init,
                             "it would build a reference model only for a metric"),
}


@dataclasses.dataclass(frozen=True)
class LaunchInputs:
    """What the launcher resolved before building arguments: paths that exist on the cluster and data sizes."""

    model_path: str  # HF directory or hub id
    train_data: str  # JSONL of the training prompts (mmrl.openrlhf.data)
    eval_data: str  # JSONL of the held-out prompts ("" when the task has none)
    reward_func: str  # generated reward_func file ("" for agent tasks)
    agent_func: str  # AgentExecutor file for multi-turn tasks ("" otherwise)
    train_rows: int
    max_images: int = 0  # most images in one prompt (0: a text task)
    max_eval_new_tokens: int = 0  # the longest generation of an evaluation set (vLLM's context must hold it)
    # prompt batches one step may draw: 1 + the objective's resampling rounds (GPG's β_th); the run still stops at
    # run.steps (mmrl's samples generator), this only keeps resampling from running out of prompts before it
    batches_per_step: int = 1


def world_size(cfg: TrainConfig) -> int:
    return cfg.cluster.nodes * cfg.cluster.gpus_per_node


def micro_batch_size(cfg: TrainConfig) -> int:
    """Responses per forward/backward on one GPU: ``optim.micro_batch_size``, or one whole group by default."""
    return cfg.optim.micro_batch_size or cfg.rollout.samples_per_prompt


def update_rows(cfg: TrainConfig) -> int:
    """Samples per optimizer step (``--train.batch_size``): the step's responses over ``optim.minibatches``, or in
    the agent turn layout ``optim.minibatch_turns`` turn-samples when set (verl-agent's mini-batch; a step then makes
    as many optimizer steps as its turns fill)."""
    r, o = cfg.rollout, cfg.optim
    return o.minibatch_turns or r.prompts_per_step * r.samples_per_prompt // o.minibatches


def check_layout(cfg: TrainConfig, algo: Algorithm) -> None:
    """Batch arithmetic OpenRLHF and DeepSpeed need, as one-line errors naming the fields to change."""
    for _, (name, is_set, why) in UNSUPPORTED.items():
        if is_set(cfg):
            raise UserError(f"config: {name} is not supported by the openrlhf backend ({why})")
    r, o = cfg.rollout, cfg.optim
    world, micro = world_size(cfg), micro_batch_size(cfg)
    if r.prompts_per_step % o.minibatches:
        raise UserError(f"config: rollout.prompts_per_step ({r.prompts_per_step}) must be a multiple of "
                         f"optim.minibatches ({o.minibatches}) so that mini-batches hold whole groups")
    if o.minibatch_turns and o.schedule != "constant":  # a warm-up counts optimizer steps from the start: exact
        raise UserError("config: optim.minibatch_turns makes a number of optimizer steps per rollout step that "
                         "varies with the episodes' lengths, so the length of a decaying lr schedule is unknown: use "
                         "optim.schedule constant")
    rows = update_rows(cfg)
    per_rank = rows / world
    if per_rank != int(per_rank) or int(per_rank) % micro:
        which = "optim.minibatch_turns" if o.minibatch_turns else "rollout.prompts_per_step"
        raise UserError(f"config: each optimizer step's {rows} responses must split evenly into "
                         f"{world} GPUs (cluster.nodes × cluster.gpus_per_node) × micro-batches of {micro} "
                         f"(optim.micro_batch_size); change {which} or optim.micro_batch_size")
    batches = r.prompts_per_step * r.samples_per_prompt // micro
    if batches < world:  # OpenRLHF asserts this at launch, naming its own flags
        raise UserError(f"config: a step's {r.prompts_per_step} prompts × {r.samples_per_prompt} samples "
                         f"(rollout.prompts_per_step × rollout.samples_per_prompt) in micro-batches of {micro} "
                         f"(optim.micro_batch_size) make {batches} sample batches, fewer than the {world} GPUs "
                         f"(cluster.nodes × cluster.gpus_per_node) that each need one: raise "
                         f"rollout.prompts_per_step, lower optim.micro_batch_size, or use fewer GPUs")
    if algo.needs_whole_groups and micro % r.samples_per_prompt:
        raise UserError(f"config: {algo.name} needs whole groups in a micro-batch: optim.micro_batch_size ({micro}) "
                         f"must be a multiple of rollout.samples_per_prompt ({r.samples_per_prompt})")
    c = cfg.cluster
    if c.colocate and world != c.vllm_engines * c.vllm_tensor_parallel_size:
        engines = c.vllm_engines * c.vllm_tensor_parallel_size
        raise UserError(f"config: cluster.colocate puts vLLM on the training GPUs, so cluster.vllm_engines × "
                         f"cluster.vllm_tensor_parallel_size ({engines}) must equal cluster.nodes × "
                         f"cluster.gpus_per_node ({world})")


def episodes_and_samples(cfg: TrainConfig, train_rows: int, batches_per_step: int = 1) -> tuple[int, int]:
    """(``--train.num_episodes``, ``--data.max_samples``) giving at least ``run.steps`` full rollout steps of
    ``batches_per_step`` prompt batches each."""
    per_step = cfg.rollout.prompts_per_step
    if train_rows < per_step:
        raise UserError(f"config: the task's training split has {train_rows} prompts, fewer than "
                         f"rollout.prompts_per_step ({per_step})")
    wanted = cfg.run.steps * per_step * batches_per_step
    if train_rows >= wanted:
        return 1, wanted
    usable = train_rows // per_step * per_step  # whole steps only: no short last batch
    return math.ceil(wanted / usable), usable


def optimizer_steps(cfg: TrainConfig) -> int:
    """The run's optimizer steps, the length of its learning-rate schedule (as the local trainer's): ``run.steps`` ×
    ``optim.epochs`` × ``optim.minibatches``. Not OpenRLHF's own count (the prompt set's, ``--data.max_samples`` ×
    ``--train.num_episodes``), which is longer whenever the prompts cover more than ``run.steps`` (whole episodes, or
    GPG's resampling reserve): mmrl's PPO trainer hands this one to the policy actors instead."""
    return cfg.run.steps * cfg.optim.epochs * cfg.optim.minibatches


def warmup_ratio(warmup_steps: int, optimizer_steps: int) -> float:
    """OpenRLHF's ``--actor.lr_warmup_ratio`` for exactly ``warmup_steps``: it warms up ``ceil(steps × ratio)`` steps,
    and ``warmup / steps`` in floating point can land a hair above the integer (0.1 × 100 = 10.000000000000002), so
    the ratio aims at the middle of the step below."""
    if warmup_steps <= 0:
        return 0.0
    return min(1.0, (warmup_steps - 0.5) / max(optimizer_steps, 1))


def build_flags(cfg: TrainConfig, inputs: LaunchInputs, kl_coef: float, out_dir: str,
                entropy_coef: float = 0.0) -> dict[str, Any]:
    """OpenRLHF flags (``{"dotted.name": value}``; True = a bare switch) for this run, before ``cluster.extra``.
    ``entropy_coef`` > 0 (the objective's ``entropy_coef``) turns on OpenRLHF's own entropy bonus in its training
    step, averaged by OpenRLHF's token normalisers (the local trainer averages it as the objective's loss)."""
    r, o, c, run = cfg.rollout, cfg.optim, cfg.cluster, cfg.run
    micro = micro_batch_size(cfg)
    episodes, max_samples = episodes_and_samples(cfg, inputs.train_rows, inputs.batches_per_step)
    flags: dict[str, Any] = {
        "actor.model_name_or_path": inputs.model_path,
        "actor.num_nodes": c.nodes, "actor.num_gpus_per_node": c.gpus_per_node,
        "ref.num_nodes": c.nodes, "ref.num_gpus_per_node": c.gpus_per_node,
        "vllm.num_engines": c.vllm_engines, "vllm.tensor_parallel_size": c.vllm_tensor_parallel_size,
        "vllm.gpu_memory_utilization": c.vllm_gpu_memory_utilization,
        "ds.zero_stage": c.zero_stage, "ds.param_dtype": "bf16",
        # data
        "data.prompt_dataset": inputs.train_data, "data.input_key": "messages", "data.label_key": "label",
        "data.apply_chat_template": True, "data.max_samples": max_samples,
        "data.max_len": r.max_prompt_tokens + max(r.max_new_tokens, inputs.max_eval_new_tokens),
        # rollout
        "rollout.batch_size": r.prompts_per_step, "rollout.n_samples_per_prompt": r.samples_per_prompt,
        "rollout.max_new_tokens": r.max_new_tokens, "rollout.temperature": r.temperature, "rollout.top_p": r.top_p,
        "rollout.micro_batch_size": micro,
        # update
        "train.batch_size": update_rows(cfg), "train.micro_batch_size": micro,
        "train.max_epochs": o.epochs, "train.num_episodes": episodes, "train.seed": run.seed,
        "actor.adam.lr": o.lr, "actor.adam.betas": list(o.betas), "actor.adam.weight_decay": o.weight_decay,
        "actor.max_norm": o.grad_clip, "actor.lr_scheduler": transformers_name(o.schedule),
        "actor.lr_warmup_ratio": warmup_ratio(o.warmup_steps, optimizer_steps(cfg)),
        "actor.min_lr_ratio": o.min_lr_ratio,
        # objective: advantages and loss are mmrl's (the estimator only avoids a critic)
        "algo.advantage.estimator": "group_norm",
        # vLLM returns each sampled token's log-prob (after temperature and top-p/top-k): the sampler-trainer gap is
        # measured every step and mmrl's rollout correction reads it (OpenRLHF's own correction lives in the loss
        # mmrl replaces)
        "algo.advantage.is_correction_level": "token",
        "algo.kl.init_coef": kl_coef,
        # MoE: the load-balancing loss of the model's own router, 0 by default as in the local trainer
        "actor.aux_loss_coef": cfg.moe.aux_loss_coef,
        # outputs
        "ckpt.path": f"{out_dir}/checkpoints", "ckpt.output_dir": f"{out_dir}/model",
        "ckpt.save_steps": run.checkpoint_every or -1, "ckpt.max_num": run.keep_checkpoints,
        # loggers: run.tensorboard / run.wandb as OpenRLHF's --logger.* flags
        **openrlhf_flags(run.tensorboard, run.wandb, out_dir, Path(out_dir).name),
    }
    if kl_coef > 0:
        flags.update({"algo.kl.use_loss": True, "algo.kl.estimator": "k3"})
    if entropy_coef > 0:
        flags["actor.entropy_coef"] = entropy_coef
    if c.colocate:
        flags.update({"train.colocate_all": True, "vllm.enable_sleep": True, "ds.enable_sleep": True})
    elif kl_coef > 0:
        flags["train.colocate_actor_ref"] = True
    if cfg.model.gradient_checkpointing:
        flags["actor.gradient_checkpointing_enable"] = True
    if cfg.model.lora_rank:  # OpenRLHF's own LoRA (peft inside its actor); its reference is a separate base model
        flags.update({"ds.lora.rank": cfg.model.lora_rank, "ds.lora.alpha": cfg.model.lora_alpha,
                      "ds.lora.target_modules": list(parse_targets(cfg.model.lora_targets))})
    if run.resume:
        flags["ckpt.load_enable"] = True
    if inputs.eval_data:
        flags.update({"eval.dataset": inputs.eval_data, "eval.steps": run.eval_every or -1,
                      "eval.n_samples_per_prompt": run.eval_samples, "eval.temperature": run.eval_temperature})
    if inputs.agent_func:
        flags["train.agent_func_path"] = inputs.agent_func
    else:
        flags["reward.remote_url"] = inputs.reward_func
    if inputs.max_images:
        flags.update({"data.image_key": "images", "data.max_images_per_prompt": inputs.max_images})
    return flags


def to_argv(flags: dict[str, Any]) -> list[str]:
    """``{"a.b": 1, "c": True, "d": False, "e": [1, 2]}`` -> ``["--a.b", "1", "--c", "--e", "1", "2"]``."""
    argv: list[str] = []
    for key, value in flags.items():
        if value is False or value is None:
            continue
        argv.append(f"--{key}")
        if value is True:
            continue
        argv.extend(str(v) for v in value) if isinstance(value, (list, tuple)) else argv.append(str(value))
    return argv


def merge_extra(flags: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``cluster.extra`` (raw OpenRLHF flags, leading dashes optional) over the generated flags."""
    merged = dict(flags)
    for key, value in extra.items():
        merged[str(key).lstrip("-")] = value
    return merged


def unmasked_extra(extra: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(``cluster.extra`` without the values a saved ``config.json`` masked, one line per flag left out): a resumed
    run reads its saved config, where a secret is ``***``, never the value."""
    kept, dropped = {}, []
    for key, value in extra.items():
        name = str(key).lstrip("-")
        if is_secret(key) and value == MASK:
            dropped.append(f"cluster.extra: {name} was masked in the saved config.json and is left out; set "
                           f"{SECRET_ENV.get(name.lower(), 'the environment variable its tool reads')} to give it")
        elif MASKED_URL in str(value):
            dropped.append(f"cluster.extra: {name} holds a URL whose password the saved config.json masks, and is "
                           f"left out; give it again in --cluster.extra")
        else:
            kept[key] = value
    return kept, dropped


def secret_warnings(extra: dict[str, Any]) -> list[str]:
    """One line per secret flag of ``cluster.extra``: where the value belongs instead of a flag."""
    lines = []
    for key in extra:
        if is_secret(key):
            name = str(key).lstrip("-")
            env = SECRET_ENV.get(name.lower(), "the environment variable its tool reads")
            lines.append(f"cluster.extra: {name} is a secret; it is masked ({MASK}) in this launch and in config.json, "
                         f"but a flag's value can still be seen by other users of this machine: set it in "
                         f"{env} instead")
    return lines


def hide_wandb_key(args: Any) -> None:
    """In the process that builds OpenRLHF's W&B logger: a W&B key given as ``logger.wandb.key`` moves into this
    process's ``WANDB_API_KEY`` (unless that is set already, which W&B would use first anyway) and the argument becomes
    ``***``. OpenRLHF's logger records every argument as the W&B run's config: the key would be stored with the run,
    on W&B's servers and in its offline files. W&B reads the variable, so OpenRLHF's own login is not needed."""
    key = args.logger.wandb.key
    if not key or key in (OPENRLHF_WANDB_KEY, MASK):
        return
    os.environ.setdefault(SECRET_ENV["logger.wandb.key"], key)
    args.logger.wandb.key = MASK


def mask_argv(argv: list[str]) -> list[str]:
    """The argument list with the value(s) of each secret flag replaced by ``***`` and the password of each URL masked
    (for printing only)."""
    out, hiding = [], False
    for arg in argv:
        if arg.startswith("--"):
            hiding = is_secret(arg)
            out.append(arg)
        else:
            out.append(MASK if hiding else mask_urls(arg))
    return out


def command_line(argv: list[str], indent: str = "    ") -> str:
    """The argument list as shell text, one flag (with its values) per line."""
    lines: list[list[str]] = []
    for arg in argv:
        if arg.startswith("--") or not lines:
            lines.append([arg])
        else:
            lines[-1].append(arg)
    return (" \\\n" + indent).join(" ".join(shlex.quote(a) for a in line) for line in lines)
