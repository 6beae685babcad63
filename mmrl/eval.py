"""``python -m mmrl.eval --task arithmetic --model runs/arithmetic-gpg [--k 8] [--out eval.json]``.

pass@1, pass@k and avg@k on the task's held-out split with the same reward as training; prints a table and writes
JSON. Multi-turn tasks (``--task alfworld``) play k episodes per held-out game and report success (pass@1 = success
rate) overall and per task type, valid-action rate, format rate and episode length. ``--model`` takes the same specs
as training (embedded default, a local/hub checkpoint, a GGUF file) or a run directory / checkpoint of ours; a run
directory is evaluated on the task and in the agent layout (``rollout.agent_layout``) it was trained in.

The config is training's: the same layering (defaults < the task's declared defaults < ``--config`` YAML < flags) and
the same flag names (``--model``, ``--task``, ``--task.X``, ``--rollout.X``, ``--model.X``, ``--run.X``), so a task is
evaluated with the budgets it trains with. ``--k``, ``--temperature`` and ``--seed`` are shortcuts for
``--run.eval_samples``, ``--run.eval_temperature`` and ``--run.seed``.

A config with ``evaluation.sets`` (the paper recipes of examples/cluster/) evaluates every set as training does, each
with its own problems and sampling, and reports each set's metrics and ``average``, the mean of the sets' headline
metrics; ``--max-problems`` then caps every set.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

from mmrl.cli import OneLineParser, add_dataclass_flags, catalogue, join_negative_values, run_cli, split_open_flags
from mmrl.errors import RunError, UserError, printable
from mmrl.files import atomic_write_text
from mmrl.paths import expand_path
from mmrl.run.config import TrainConfig, load_yaml, resolve_config, validate
from mmrl.run.run_dir import is_mmrl_config, run_owning, trained_task

log = logging.getLogger("mmrl")

# The config fields evaluation reads (everything else in a --config YAML is accepted and has no effect here).
EVAL_FIELDS = {"model": {"device", "threads", "min_pixels", "max_pixels", "trust_remote_code"},
               "rollout": {"max_new_tokens", "max_prompt_tokens", "max_episode_tokens", "generation_batch_size",
                           "sampler", "agent_layout"},
               "run": {"seed", "eval_samples", "eval_temperature"}, "evaluation": {"sets"}}


def model_from_run(spec: str) -> tuple[str, Path | None, dict | None]:
    """(model spec to load, checkpoint path, its state): a run dir evaluates its newest intact checkpoint."""
    from mmrl.run.checkpoint import latest_checkpoint, load_latest

    path = Path(spec)
    if is_mmrl_config(path / "config.json"):  # a model folder's config.json (transformers') is not a run's
        if latest_checkpoint(path) is None:
            raise UserError(f"model: run directory {spec!r} has no checkpoint yet")
        ckpt, state, _ = load_latest(path)  # an unreadable newer one is skipped with a warning
        base = json.loads((path / "config.json").read_text())["model"]["name"]
        return base, ckpt, state
    return spec, None, None


def parse_command(argv: list[str] | None) -> tuple[TrainConfig, argparse.Namespace]:
    """(resolved config, the eval-only arguments ``max_problems`` and ``out``) from the command line."""
    defaults = TrainConfig()
    parser = OneLineParser(prog="python -m mmrl.eval", description=__doc__, epilog=catalogue(algorithms=False),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML file of a training run (sections model/task/rollout/run are read)")
    parser.add_argument("--task", dest="task.name", default=argparse.SUPPRESS, help="task (default: arithmetic)")
    parser.add_argument("--model", dest="model.name", default=argparse.SUPPRESS,
                        help=f"model spec, or a run directory of mmrl.train (default: the task's declared model, else "
                             f"{defaults.model.name})")
    parser.add_argument("--k", dest="run.eval_samples", default=argparse.SUPPRESS,
                        help="samples per problem; shortcut for --run.eval_samples "
                             f"(default: {defaults.run.eval_samples})")
    parser.add_argument("--temperature", dest="run.eval_temperature", default=argparse.SUPPRESS,
                        help="0 for greedy (then k = 1); shortcut for --run.eval_temperature "
                             f"(default: {defaults.run.eval_temperature})")
    parser.add_argument("--seed", dest="run.seed", default=argparse.SUPPRESS,
                        help=f"shortcut for --run.seed (default: {defaults.run.seed})")
    parser.add_argument("--max-problems", type=int, default=0, help="0: the whole held-out split")
    parser.add_argument("--out", default="", help="write the results as JSON to this new file (~ and $VAR are "
                        "expanded)")
    parser.add_argument("--overwrite-out", action="store_true", help="let --out replace an existing file")
    parser.add_argument("--save-samples", default="", metavar="FILE",
                        help="write every completion with its reward, parts and reason as JSON lines (mmrl.samples)")
    parser.add_argument("--overwrite-samples", action="store_true", help="let --save-samples replace an existing file")
    for section, fields in EVAL_FIELDS.items():
        add_dataclass_flags(parser, section, getattr(defaults, section), only=fields)
    args, extra = parser.parse_known_args(join_negative_values(sys.argv[1:] if argv is None else argv))
    for flag, name in (("--out", "out"), ("--save-samples", "save_samples"), ("--model", "model.name")):
        if getattr(args, name, None):  # the rule of every path (mmrl/paths.py), for the flags of this command too
            setattr(args, name, expand_path(flag, getattr(args, name)))
    layers = [(load_yaml(args.config), args.config)] if args.config else []
    given = vars(args)
    trained = trained_task(given.get("model.name", ""))
    if trained is not None:  # a run directory: evaluate the task it was trained on unless --task says otherwise
        name, options, layout = trained
        if "task.name" not in given:  # and in the agent layout it trained in: a policy plays the prompts it learnt
            layers.insert(0, ({"task": {"name": name, **options}, "rollout": {"agent_layout": layout}},
                              f"{given['model.name']}/config.json"))
        elif given["task.name"] != name:
            log.warning("model %s was trained on task %r (its config.json); evaluating it on %r",
                        given["model.name"], name, given["task.name"])
    flags = {k: v for k, v in vars(args).items() if "." in k}
    flags.update(split_open_flags(extra, {"task"}))
    layers.append((flags, "command line"))
    cfg = resolve_config(layers)
    validate(cfg)
    return cfg, args


def _main(argv: list[str] | None) -> None:
    import torch

    from mmrl.models import load_model, load_tokenizer
    from mmrl.models.lora import load_policy_weights
    from mmrl.run.build import build_task, load_vision, pick_device
    from mmrl.run.eval_sets import build_eval_sets
    from mmrl.samples import group_records, write_samples
    from mmrl.trainer.evaluate import evaluate_episode_groups, evaluate_groups

    cfg, args = parse_command(argv)
    if args.out:  # at start: a bad path must not cost a whole evaluation
        check_output_file("--out", args.out, args.overwrite_out, "--overwrite-out")
    if args.save_samples:
        check_output_file("--save-samples", args.save_samples, args.overwrite_samples, "--overwrite-samples")
    if args.out and args.save_samples and Path(args.out).resolve() == Path(args.save_samples).resolve():
        raise UserError(f"--out and --save-samples both name {args.out!r}; the results would replace the samples: "
                         f"give each its own file")
    given = cfg.model.name
    cfg.model.name, ckpt, state = model_from_run(given)  # before the task: a real base model gets its instruct chat
    task = build_task(cfg)
    if cfg.model.threads:
        torch.set_num_threads(cfg.model.threads)
    vision = load_vision(cfg.model, task, cfg.rollout.max_prompt_tokens)  # None for a text task
    tokenizer = load_tokenizer(cfg.model.name, cfg.model.trust_remote_code)
    model = load_model(cfg.model.name, device=pick_device(cfg.model.device),
                       trust_remote_code=cfg.model.trust_remote_code)
    if ckpt is not None:  # every weight, or a LoRA run's adapters added to the base
        model = load_policy_weights(model, state, ckpt)
    model.eval()
    r, run = cfg.rollout, cfg.run
    saved: list = []  # every scored group, for --save-samples

    def run_on(on_task, k: int, temperature: float, top_p: float, max_new_tokens: int,
               repetition_penalty: float = 1.0) -> dict:
        if on_task.multi_turn:
            metrics, groups = evaluate_episode_groups(
                model, tokenizer, on_task, k=k, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                max_episode_tokens=r.max_episode_tokens, seed=run.seed, max_problems=args.max_problems,
                batch_size=r.generation_batch_size, progress=True, layout=r.agent_layout)
        else:
            metrics, groups = evaluate_groups(
                model, tokenizer, on_task, k=k, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                max_prompt_tokens=r.max_prompt_tokens, seed=run.seed, max_problems=args.max_problems,
                batch_size=r.generation_batch_size, progress=True, vision=vision, sampler=r.sampler,
                repetition_penalty=repetition_penalty)
        saved.extend(groups)
        return metrics

    shown = given if ckpt is not None else cfg.model.name
    result: dict = {"task": cfg.task.name, "model": shown, "checkpoint": str(ckpt) if ckpt else None}
    sets = build_eval_sets(cfg, task)
    if sets:  # each set with its own sampling, as training evaluates it
        for s in sets:
            c = s.config
            result[s.name] = run_on(s.task, c.samples, c.temperature, c.top_p, s.max_new_tokens(cfg),
                                    c.repetition_penalty)
        result["average"] = sum(result[s.name][s.config.metric] for s in sets) / len(sets)
    else:
        result.update(run_on(task, run.eval_samples, run.eval_temperature, 1.0, r.max_new_tokens))
    rows = [(f"{name}/{k}", v) for name, part in result.items() if isinstance(part, dict) for k, v in part.items()]
    rows = [(k, v) for k, v in result.items() if not isinstance(v, dict)] + rows
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        shown = f"{value:.4f}" if isinstance(value, float) else printable(str(value))
        print(f"{key:<{width}}  {shown}")
    # the results are printed first and each file is tried whatever became of the other: no failed write loses them
    failed = None
    if args.out:
        try:
            write_results(args.out, result, overwrite=args.overwrite_out)
        except RunError as exc:
            failed = exc
    if args.save_samples:
        write_samples(args.save_samples, group_records(saved), overwrite=args.overwrite_samples)
    if failed is not None:
        raise failed


def check_output_file(flag: str, path: str, overwrite: bool, overwrite_flag: str) -> None:
    """``path`` can take a new output file: its folder exists and can be written, it is not a folder, not one of a
    run's own files (config.json, metrics.jsonl, ... of an mmrl run), and not an existing file unless
    ``overwrite``. ValueError with one line."""
    target = Path(path)
    folder = target.parent
    if not folder.is_dir():
        raise UserError(f"{flag}: {str(target)!r}: the folder {str(folder)!r} "
                         + ("is not a folder" if folder.exists() else "does not exist"))
    if target.is_dir():
        raise UserError(f"{flag}: {str(target)!r} is a folder; give a file name, e.g. {str(target / 'eval.json')!r}")
    run = run_owning(target)
    if run is not None:
        raise UserError(f"{flag}: {str(target)!r} is one of the files of the mmrl run in {str(run)!r}; write the "
                         f"results to another file")
    if target.exists() and not overwrite:
        raise UserError(f"{flag}: {str(target)!r} already exists; pass {overwrite_flag} to replace it")
    try:  # a folder one cannot write into (read-only, /proc) is found now, not after the evaluation
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".mmrl-eval-"):
            pass
    except OSError as exc:
        raise UserError(f"{flag}: cannot write into {str(folder)!r} "
                         f"({os.strerror(exc.errno) if exc.errno else exc})") from None


def write_results(path: str, result: dict, overwrite: bool = False) -> None:
    """The results as JSON, written atomically: a failed write leaves no half file and keeps a file it replaces. A
    file that appeared at ``path`` during the evaluation is replaced only with ``overwrite`` (--overwrite-out)."""
    target = Path(path)
    try:
        atomic_write_text(target, json.dumps(result, indent=2), replace=overwrite)
    except FileExistsError:
        raise RunError(f"--out: {str(target)!r} appeared during the evaluation and was kept; the results are printed "
                       f"above (pass --overwrite-out to replace the file)") from None
    except OSError as exc:
        raise RunError(f"--out: cannot write {str(target)!r} ({os.strerror(exc.errno) if exc.errno else exc}); the "
                       f"results are printed above") from None


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
