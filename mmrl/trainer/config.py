"""One dataclass tree for a run: defaults here, overridden by the task's declared defaults, a YAML file, CLI flags.

Every field is a flag ``--section.field`` (``--rollout.temperature 0.7``; the names are ``--model/--task/--algo``).
``--algo.X`` / ``--task.X`` that are not fields of those sections are the algorithm's hyper-parameters / the task's
options, checked against the chosen algorithm and task at start. A wrong name or value fails at start with one line
naming the field.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path
from typing import Any

import yaml

import mmrl.algos as algos
from mmrl.cache import EMBEDDED_NAME
from mmrl.trainer.schedule import SCHEDULES
from mmrl.trainer.text_sampler import SAMPLERS
from mmrl.values import as_default_type, yaml_scalar


@dataclasses.dataclass
class ModelConfig:
    name: str = EMBEDDED_NAME  # embedded:tiny-qwen2, a local dir, a hub id, or a .gguf file
    dtype: str = "float32"  # compute dtype: float32 | bfloat16 (autocast; weights and AdamW state stay float32)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int = 0  # torch CPU threads; 0 keeps torch's default
    gradient_checkpointing: bool = False
    lora_rank: int = 0  # > 0: train LoRA adapters of this rank (peft) instead of every weight; 0: full fine-tune
    lora_alpha: int = 16  # LoRA scaling numerator (scale = alpha / rank), an integer as OpenRLHF's --ds.lora.alpha
    lora_targets: str = "all-linear"  # module names to adapt, comma-separated (q_proj,v_proj), or all-linear
    min_pixels: int = 3136  # vision: qwen-vl-utils resize floor per image (56 × 56)
    max_pixels: int = 401_408  # vision: resize ceiling per image (512 tokens at patch 14; R1-V / Visual-RFT setting)
    share_image_features: bool = True  # vision: run the vision tower once per prompt, not once per response


@dataclasses.dataclass
class MoEConfig:
    """Router controls for Mixture-of-Experts models (an error on a dense model)."""

    aux_loss_coef: float = 0.0  # load-balancing loss weight; 0 in RL: it fights the policy objective (see docs)
    z_loss_coef: float = 0.0  # ST-MoE router z-loss weight
    freeze_router: bool = False  # no gradient to router weights
    routing_replay: bool = False  # replay the rollout's expert choices in the training forward (R3)


@dataclasses.dataclass
class TaskConfig:
    name: str = "arithmetic"
    options: dict[str, Any] = dataclasses.field(default_factory=dict)  # --task.<option> (see --help)
    reward_model: str = ""  # path of a sequence-classification reward model to add to the task's reward
    reward_model_weight: float = 1.0


@dataclasses.dataclass
class AlgoConfig:
    name: str = "grpo"
    params: dict[str, Any] = dataclasses.field(default_factory=dict)  # --algo.<hyper-parameter> (see --help)


@dataclasses.dataclass
class RolloutConfig:
    prompts_per_step: int = 16
    samples_per_prompt: int = 8  # group size
    max_new_tokens: int = 16
    max_prompt_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    generation_batch_size: int = 128
    # mmrl: mmrl.trainer.text_sampler (one pre-fill per distinct prompt, finished rows leave the batch); hf:
    # transformers' generate. Prompts with images always use generate.
    sampler: str = "mmrl"
    replay_historical: int = 0  # GVPO's off-policy π_s: responses per group replayed from earlier steps
    # Multi-turn tasks: max_new_tokens is per turn; an episode (prompt + turns + feedback) ends, truncated, at this many
    max_episode_tokens: int = 2048
    env_workers: int = 0  # multi-turn: 0 = envs in this process; N = an EnvPool of N worker processes (isolation)
    episode_kv_cache: bool = True  # multi-turn: keep each episode's KV cache across turns (False: re-read each turn)
    env_step_timeout: float = 120.0  # seconds an env step may take in the pool before its worker counts as hung
    # Multi-turn: "episode" = one growing sequence per episode, env tokens masked (OpenRLHF's layout); "turn" = every
    # env step is its own sample, prompted with the task, the last turns and the state (verl-agent's layout)
    agent_layout: str = "episode"


@dataclasses.dataclass
class OptimConfig:
    lr: float = 1e-3  # for the embedded tiny model (2e-3 diverges); billion-parameter models want ~1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0  # optimizer steps of linear warm-up from 0 (mmrl.trainer.schedule)
    schedule: str = "constant"  # after warm-up: constant | linear (decay to 0) | cosine (down to min_lr_ratio × lr)
    min_lr_ratio: float = 0.0  # cosine's floor as a fraction of lr (Open-RS: 0.1)
    grad_clip: float = 1.0
    epochs: int = 1  # update epochs over each rollout batch (K)
    minibatches: int = 1  # optimizer steps per epoch; groups are never split across mini-batches
    micro_batch_size: int = 0  # max responses per forward/backward (gradient accumulation); 0 = whole mini-batch
    # On the CPU, text batches at least 512 tokens wide are scored (re-scoring and update) one unpadded row at a time:
    # the same values, ~2x less CPU on ALFWorld episodes (mmrl.trainer.rollout.ROW_BY_ROW_MIN_WIDTH); False = padded.
    row_by_row: bool = True


@dataclasses.dataclass
class SFTConfig:
    """Supervised warm-start on the task's expert demonstrations before RL (multi-turn tasks; ``--sft-warmup N``)."""

    steps: int = 0  # 0: no warm-up
    lr: float = 1e-3
    batch_size: int = 8  # demonstrations (episodes) per step
    demos: int = 0  # training rows rendered as demonstrations; 0 = all
    demos_per_row: int = 1  # demonstrations per row, each from a differently seeded expert


@dataclasses.dataclass
class RunConfig:
    steps: int = 60
    seed: int = 0
    out_dir: str = ""  # default: runs/<task>-<algo>
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    eval_every: int = 0  # 0: only at the end
    eval_samples: int = 4  # k for pass@k / avg@k
    eval_temperature: float = 1.0
    eval_sample_prompts: int = 4  # held-out problems per evaluation whose completions go to samples.jsonl
    resume: bool = False
    overwrite: bool = False  # start afresh in an out_dir that already holds a run
    progress: bool = True
    plot: bool = True
    track_kl_to_init: bool = False  # keep a frozen copy of the initial policy and log KL(π_old || π_init)
    backend: str = "local"  # local (this process) | openrlhf (Ray + vLLM + DeepSpeed through OpenRLHF 0.11.x)
    tensorboard: bool = False  # also write TensorBoard event files (the metrics.jsonl scalars) into the run dir
    wandb: str = ""  # a Weights & Biases project: also log there (offline unless logged in; see mmrl.trainer.loggers)


@dataclasses.dataclass
class EvalSetConfig:
    """One named evaluation set (an entry of ``evaluation.sets``): which problems, how they are sampled, what is
    reported. The papers' protocols differ set by set (AIME avg@32 beside greedy pass@1), hence one entry each."""

    name: str = ""
    path: str = ""  # "" = the task's own held-out split; else a file / hub id read by the run's task with `options`
    options: dict[str, Any] = dataclasses.field(default_factory=dict)  # task options for this set (columns, template)
    samples: int = 1  # samples per problem
    temperature: float = 0.0  # 0 = greedy (then samples must be 1)
    top_p: float = 1.0
    max_new_tokens: int = 0  # 0: rollout.max_new_tokens
    max_problems: int = 0  # 0: every problem of the set
    metric: str = "pass@1"  # the headline: pass@1, or pass@k / avg@k with k = samples


@dataclasses.dataclass
class EvaluationConfig:
    """Named evaluation sets, each with its own sampling (docs/cluster.md, section 8). Empty: the task's held-out split
    with ``run.eval_samples`` / ``run.eval_temperature``. When: ``run.eval_every`` and the end of the run."""

    sets: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # entries of EvalSetConfig's fields


@dataclasses.dataclass
class ClusterConfig:
    """Resources of the ``openrlhf`` backend (ignored by the local backend); see docs/openrlhf.md."""

    ray_address: str = ""  # "" starts a local Ray; "auto" joins the running cluster; or ray://host:10001
    nodes: int = 1  # nodes for the policy (DeepSpeed) actors
    gpus_per_node: int = 8  # GPUs per node for the policy actors (and the reference model when one is needed)
    vllm_engines: int = 8  # vLLM rollout engines
    vllm_tensor_parallel_size: int = 1
    vllm_gpu_memory_utilization: float = 0.6
    zero_stage: int = 2  # DeepSpeed ZeRO stage 0-3
    colocate: bool = True  # policy, reference and vLLM share the same GPUs (OpenRLHF --train.colocate_all)
    # CPU rehearsal of the whole OpenRLHF pipeline: HF generate behind the vLLM engine interface, DeepSpeed on its CPU
    # accelerator, gloo weight sync (docs/cluster.md); defaults to 1 node x 1 "GPU" x 1 engine
    rehearsal: bool = False
    placement_timeout: float = 300.0  # seconds to wait for Ray to place the actors before naming what is missing
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # raw OpenRLHF flags, {"actor.aux_loss_coef": 0}


@dataclasses.dataclass
class TrainConfig:
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    moe: MoEConfig = dataclasses.field(default_factory=MoEConfig)
    task: TaskConfig = dataclasses.field(default_factory=TaskConfig)
    algo: AlgoConfig = dataclasses.field(default_factory=AlgoConfig)
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    sft: SFTConfig = dataclasses.field(default_factory=SFTConfig)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    evaluation: EvaluationConfig = dataclasses.field(default_factory=EvaluationConfig)
    cluster: ClusterConfig = dataclasses.field(default_factory=ClusterConfig)

    @property
    def out_dir(self) -> Path:
        return Path(self.run.out_dir or f"runs/{self.task.name}-{self.algo.name}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ``--cluster.rehearsal true`` starts from one policy rank and one rollout engine (a laptop); flags still override
REHEARSAL_DEFAULTS = {"cluster.nodes": 1, "cluster.gpus_per_node": 1, "cluster.vllm_engines": 1,
                      "cluster.vllm_tensor_parallel_size": 1}
SECTIONS = {f.name: f.type for f in dataclasses.fields(TrainConfig)}
BACKENDS = ("local", "openrlhf")
OPEN_SECTIONS = {"algo": "params", "task": "options"}  # sections that take extra keys


def _section_fields(section: str) -> dict[str, dataclasses.Field]:
    cls = {"model": ModelConfig, "moe": MoEConfig, "task": TaskConfig, "algo": AlgoConfig, "rollout": RolloutConfig,
           "optim": OptimConfig, "sft": SFTConfig, "run": RunConfig, "evaluation": EvaluationConfig,
           "cluster": ClusterConfig}[section]
    return {f.name: f for f in dataclasses.fields(cls)}


def _coerce(where: str, value: Any, default: Any) -> Any:
    """A YAML/CLI value as the field's type, or ValueError naming the field (mmrl/values.py)."""
    return as_default_type(f"config: {where}", value, default, yaml_scalar)


def _suggest(name: str, options: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def apply_overrides(cfg: TrainConfig, overrides: dict[str, Any], origin: str) -> None:
    """Apply ``{"section.field": value}`` or nested ``{"section": {...}}`` overrides in place."""
    flat: dict[str, Any] = {}
    for key, value in overrides.items():
        if key in SECTIONS and isinstance(value, dict):
            for sub, v in value.items():
                flat[f"{key}.{sub}"] = v
        elif key in ("algo", "task", "model") and not isinstance(value, dict):
            flat[f"{key}.name"] = value
        elif key in SECTIONS:
            raise ValueError(f"config ({origin}): section {key!r} must be a mapping of fields, got {value!r}")
        else:
            flat[key] = value
    for key, value in flat.items():
        section, _, field = key.partition(".")
        if section not in SECTIONS or not field:
            raise ValueError(f"config ({origin}): unknown field {key!r}{_suggest(section, SECTIONS)}")
        fields = _section_fields(section)
        obj = getattr(cfg, section)
        if field in fields and field not in OPEN_SECTIONS.values():
            setattr(obj, field, _coerce(key, value, getattr(obj, field)))
        elif section in OPEN_SECTIONS:
            extra = getattr(obj, OPEN_SECTIONS[section])
            # a task option keeps its text as written: the task converts it by its option's type (tasks/base.py)
            extra[field] = yaml_scalar(value) if isinstance(value, str) and section != "task" else value
        else:
            raise ValueError(f"config ({origin}): unknown field {key!r}{_suggest(field, fields)}")


def resolve_config(layers: list[tuple[dict[str, Any], str]]) -> TrainConfig:
    """The config of a run from ``(overrides, origin)`` layers, lowest precedence first (a resumed run's saved config,
    the ``--config`` YAML, the flags): built-in defaults < the chosen task's declared defaults (``register_task(...,
    config_defaults=...)``: its embedded model, its token budgets) < each layer. ``mmrl.train`` and ``mmrl.eval``
    resolve their command lines with it, so a task gets the same defaults whatever runs it."""
    from mmrl.tasks import TASK_CONFIG_DEFAULTS

    probe = TrainConfig()  # which task, so that its declared defaults go under every layer
    for overrides, origin in layers:
        apply_overrides(probe, overrides, origin)
    cfg = TrainConfig()
    apply_overrides(cfg, TASK_CONFIG_DEFAULTS.get(probe.task.name, {}), f"task {probe.task.name} defaults")
    if probe.cluster.rehearsal:  # a laptop-sized layout unless a layer gives one
        apply_overrides(cfg, REHEARSAL_DEFAULTS, "rehearsal defaults")
    for overrides, origin in layers:
        apply_overrides(cfg, overrides, origin)
    return cfg


def saved_overrides(saved: dict[str, Any]) -> dict[str, Any]:
    """A run directory's ``config.json`` (``TrainConfig.to_dict()``) as overrides for :func:`apply_overrides`."""
    out = {k: dict(v) for k, v in saved.items() if isinstance(v, dict)}
    for section, extra in OPEN_SECTIONS.items():
        if section in out:
            out[section].update(out[section].pop(extra, {}) or {})
    return out


def load_yaml(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"config: no such file {path!r}")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as exc:
        raise ValueError(f"config: {path} is not UTF-8 text (byte {exc.start}: {exc.reason})") from exc
    except yaml.YAMLError as exc:
        raise ValueError(f"config: {path} is not valid YAML: {str(exc).splitlines()[0]}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"config: {path} must hold a mapping of sections, got {type(data).__name__}")
    return data


def eval_set_configs(cfg: TrainConfig) -> list[EvalSetConfig]:
    """``evaluation.sets`` as checked `EvalSetConfig` entries; a bad entry is one line naming it and its field."""
    fields = {f.name: f for f in dataclasses.fields(EvalSetConfig)}
    out: list[EvalSetConfig] = []
    for i, entry in enumerate(cfg.evaluation.sets):
        where = f"evaluation.sets[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"config: {where} must be a mapping of {', '.join(fields)}, got {entry!r}")
        unknown = set(entry) - set(fields)
        if unknown:
            name = sorted(unknown)[0]
            raise ValueError(f"config: {where} has no field {name!r}{_suggest(name, fields)}")
        values = {}
        for key, value in entry.items():
            default = fields[key].default if key != "options" else {}
            if key == "options":
                if not isinstance(value, dict):
                    raise ValueError(f"config: {where}.options must be a mapping of task options, got {value!r}")
                values[key] = dict(value)
            else:
                values[key] = _coerce(f"{where}.{key}", value, default)
        es = EvalSetConfig(**values)
        k = es.samples
        checks = [
            ("name", bool(es.name) and es.name.replace("_", "").replace("-", "").isalnum(),
             "must be a non-empty name of letters, digits, _ and -"),
            ("samples", es.samples >= 1, "must be >= 1"),
            ("temperature", es.temperature >= 0, "must be >= 0 (0 = greedy)"),
            ("samples", es.temperature > 0 or es.samples == 1, "must be 1 when temperature is 0 (greedy)"),
            ("top_p", 0 < es.top_p <= 1, "must be in (0, 1]"),
            ("max_new_tokens", es.max_new_tokens >= 0, "must be >= 0 (0 = rollout.max_new_tokens)"),
            ("max_problems", es.max_problems >= 0, "must be >= 0 (0 = all)"),
            ("metric", es.metric in ("pass@1", f"pass@{k}", f"avg@{k}"),
             f"must be pass@1, pass@{k} or avg@{k} (k = samples)"),
        ]
        for field, ok, why in checks:
            if not ok:
                raise ValueError(f"config: {where}.{field} {why}, got {getattr(es, field)!r}")
        if any(other.name == es.name for other in out):
            raise ValueError(f"config: {where}.name {es.name!r} is used twice")
        out.append(es)
    return out


def validate(cfg: TrainConfig) -> None:
    """Range checks that need no model; the algorithm and task check their own parameters when built."""
    checks = [
        ("rollout.prompts_per_step", cfg.rollout.prompts_per_step >= 1, "must be >= 1"),
        ("rollout.samples_per_prompt", cfg.rollout.samples_per_prompt >= 2,
         "must be >= 2 (group-relative advantages of a group of one are 0)"),
        ("rollout.max_new_tokens", cfg.rollout.max_new_tokens >= 1, "must be >= 1"),
        ("rollout.max_prompt_tokens", cfg.rollout.max_prompt_tokens >= 1, "must be >= 1"),
        ("rollout.temperature", cfg.rollout.temperature > 0, "must be > 0 (greedy groups have no variance)"),
        ("rollout.top_p", 0 < cfg.rollout.top_p <= 1, "must be in (0, 1]"),
        ("rollout.generation_batch_size", cfg.rollout.generation_batch_size >= 1, "must be >= 1"),
        ("rollout.sampler", cfg.rollout.sampler in SAMPLERS, f"must be one of {', '.join(SAMPLERS)}"),
        ("rollout.replay_historical", 0 <= cfg.rollout.replay_historical < cfg.rollout.samples_per_prompt,
         "must be >= 0 and < rollout.samples_per_prompt"),
        # multi-turn tasks also check it against the first prompt and max_new_tokens at start (check_episode_budget)
        ("rollout.max_episode_tokens", cfg.rollout.max_episode_tokens >= 1, "must be >= 1"),
        ("rollout.env_workers", cfg.rollout.env_workers >= 0, "must be >= 0"),
        ("rollout.env_step_timeout", cfg.rollout.env_step_timeout > 0, "must be > 0"),
        ("rollout.agent_layout", cfg.rollout.agent_layout in ("episode", "turn"), "must be episode or turn"),
        ("rollout.agent_layout", cfg.rollout.agent_layout == "episode" or not cfg.rollout.replay_historical,
         "turn cannot replay historical responses (rollout.replay_historical)"),
        ("optim.lr", cfg.optim.lr > 0, "must be > 0"),
        ("optim.weight_decay", cfg.optim.weight_decay >= 0, "must be >= 0"),
        ("optim.betas", all(0 <= b < 1 for b in cfg.optim.betas), "must both be in [0, 1)"),
        ("optim.warmup_steps", cfg.optim.warmup_steps >= 0, "must be >= 0"),
        ("optim.schedule", cfg.optim.schedule in SCHEDULES, f"must be one of {', '.join(SCHEDULES)}"),
        ("optim.min_lr_ratio", 0 <= cfg.optim.min_lr_ratio <= 1, "must be in [0, 1]"),
        ("optim.grad_clip", cfg.optim.grad_clip > 0, "must be > 0"),
        ("optim.epochs", cfg.optim.epochs >= 1, "must be >= 1"),
        ("optim.minibatches", 1 <= cfg.optim.minibatches <= cfg.rollout.prompts_per_step,
         "must be between 1 and rollout.prompts_per_step (groups are not split)"),
        ("optim.micro_batch_size", cfg.optim.micro_batch_size >= 0, "must be >= 0"),
        ("sft.steps", cfg.sft.steps >= 0, "must be >= 0"),
        ("sft.lr", cfg.sft.lr > 0, "must be > 0"),
        ("sft.batch_size", cfg.sft.batch_size >= 1, "must be >= 1"),
        ("sft.demos", cfg.sft.demos >= 0, "must be >= 0"),
        ("sft.demos_per_row", cfg.sft.demos_per_row >= 1, "must be >= 1"),
        ("run.steps", cfg.run.steps >= 1, "must be >= 1"),
        ("run.checkpoint_every", cfg.run.checkpoint_every >= 0, "must be >= 0"),
        ("run.keep_checkpoints", cfg.run.keep_checkpoints >= 1, "must be >= 1"),
        ("run.eval_every", cfg.run.eval_every >= 0, "must be >= 0"),
        ("run.eval_samples", cfg.run.eval_samples >= 1, "must be >= 1"),
        ("run.eval_sample_prompts", cfg.run.eval_sample_prompts >= 0, "must be >= 0"),
        ("model.dtype", cfg.model.dtype in ("float32", "bfloat16"), "must be float32 or bfloat16"),
        ("model.threads", cfg.model.threads >= 0, "must be >= 0"),
        ("model.lora_rank", cfg.model.lora_rank >= 0, "must be >= 0 (0: full fine-tune)"),
        ("model.lora_alpha", cfg.model.lora_alpha >= 1, "must be >= 1"),
        ("model.min_pixels", cfg.model.min_pixels >= 1, "must be >= 1"),
        ("model.max_pixels", cfg.model.max_pixels >= cfg.model.min_pixels, "must be >= model.min_pixels"),
        ("moe.aux_loss_coef", cfg.moe.aux_loss_coef >= 0, "must be >= 0"),
        ("moe.z_loss_coef", cfg.moe.z_loss_coef >= 0, "must be >= 0"),
        ("run.backend", cfg.run.backend in BACKENDS, f"must be one of {', '.join(BACKENDS)}"),
        ("cluster.nodes", cfg.cluster.nodes >= 1, "must be >= 1"),
        ("cluster.gpus_per_node", cfg.cluster.gpus_per_node >= 1, "must be >= 1"),
        ("cluster.vllm_engines", cfg.cluster.vllm_engines >= 1, "must be >= 1 (rollouts are generated by vLLM)"),
        ("cluster.vllm_tensor_parallel_size", cfg.cluster.vllm_tensor_parallel_size >= 1, "must be >= 1"),
        ("cluster.vllm_gpu_memory_utilization", 0 < cfg.cluster.vllm_gpu_memory_utilization <= 1,
         "must be in (0, 1]"),
        ("cluster.placement_timeout", cfg.cluster.placement_timeout > 0, "must be > 0 seconds"),
        ("cluster.zero_stage", cfg.cluster.zero_stage in (0, 1, 2, 3), "must be 0, 1, 2 or 3"),
        ("cluster.extra", isinstance(cfg.cluster.extra, dict), "must be a mapping of OpenRLHF flags to values"),
    ]
    for name, ok, why in checks:
        if not ok:
            section, field = name.split(".")
            raise ValueError(f"config: {name} {why}, got {getattr(getattr(cfg, section), field)!r}")
    eval_set_configs(cfg)
    if cfg.optim.min_lr_ratio and cfg.optim.schedule != "cosine":
        raise ValueError(f"config: optim.min_lr_ratio is the floor of optim.schedule cosine; it has no effect on "
                         f"{cfg.optim.schedule!r}")
    if cfg.model.lora_rank:
        from mmrl.models.lora import parse_targets

        parse_targets(cfg.model.lora_targets)
    if cfg.moe.routing_replay and cfg.model.gradient_checkpointing:
        raise ValueError("config: moe.routing_replay cannot be combined with model.gradient_checkpointing (the "
                         "recomputation in backward would not replay the routing)")
    if cfg.moe.freeze_router and (cfg.moe.aux_loss_coef > 0 or cfg.moe.z_loss_coef > 0):
        raise ValueError("config: moe.freeze_router with a router loss (moe.aux_loss_coef / moe.z_loss_coef) would "
                         "train the rest of the network to balance a frozen router; use one or the other")
    objective = algos.ALGORITHMS.get(cfg.algo.name)  # an unknown name fails when the objective is built
    if cfg.rollout.replay_historical and objective is not None and not objective.replays_history:
        replaying = "/".join(sorted(name for name, cls in algos.ALGORITHMS.items() if cls.replays_history))
        raise ValueError(f"config: rollout.replay_historical needs --algo {replaying} (an objective that is exact on "
                         f"responses of older policies; {cfg.algo.name} is not)")
