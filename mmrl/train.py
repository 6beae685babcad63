"""``python -m mmrl.train --algo gpg --task arithmetic [--model ...] [--config file.yaml] [--section.field value]``.

Precedence: defaults < the task's declared defaults (``--task alfworld`` picks its own embedded model and turn
budgets, a task with images the embedded vision model) < ``--config`` YAML < flags. Every field and its default is in
``--help``.
``--backend openrlhf`` runs the same algorithm and task on Ray + vLLM + DeepSpeed through OpenRLHF (resources in the
``cluster`` section); ``--dry-run`` prints that launch and exits.
"""

from __future__ import annotations

import argparse
import json
import sys

from mmrl.cli import OneLineParser, add_dataclass_flags, catalogue, join_negative_values, run_cli, split_open_flags
from mmrl.errors import UserError, printable
from mmrl.paths import expand_path
from mmrl.run.config import (
    OPEN_SECTIONS,
    SECTIONS,
    TrainConfig,
    apply_overrides,
    load_yaml,
    resolve_config,
    validate,
)
from mmrl.run.masking import masked_config
from mmrl.run.metrics import read_metrics
from mmrl.run.run_dir import saved_layer


def parse_config(argv: list[str] | None) -> TrainConfig:
    return parse_command(argv)[0]


def parse_command(argv: list[str] | None) -> tuple[TrainConfig, bool]:
    """(resolved config, --dry-run) from the command line."""
    defaults = TrainConfig()
    parser = OneLineParser(prog="python -m mmrl.train", description=__doc__, epilog=catalogue(),
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help=f"YAML file with sections {'/'.join(SECTIONS)}")
    parser.add_argument("--algo", dest="algo.name", default=argparse.SUPPRESS, help="objective (default: grpo)")
    parser.add_argument("--task", dest="task.name", default=argparse.SUPPRESS, help="task (default: arithmetic)")
    parser.add_argument("--model", dest="model.name", default=argparse.SUPPRESS,
                        help=f"model spec (default: {defaults.model.name})")
    parser.add_argument("--steps", dest="run.steps", default=argparse.SUPPRESS, help="shortcut for --run.steps")
    parser.add_argument("--out", dest="run.out_dir", default=argparse.SUPPRESS, help="shortcut for --run.out_dir")
    parser.add_argument("--sft-warmup", dest="sft.steps", default=argparse.SUPPRESS, metavar="STEPS",
                        help="supervised warm-start steps on expert demonstrations before RL (multi-turn tasks)")
    parser.add_argument("--resume", dest="run.resume", action="store_const", const=True, default=argparse.SUPPRESS,
                        help="continue the run in --out from its last checkpoint")
    parser.add_argument("--backend", dest="run.backend", default=argparse.SUPPRESS,
                        help="shortcut for --run.backend: local (default) | openrlhf")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config, checked as a run "
                        "checks it before reading data, and exit")
    parser.add_argument("--dry-run", action="store_true",
                        help="openrlhf backend: print the resolved OpenRLHF launch and exit without starting Ray")
    own_flags = {"model": {"name"}, "task": {"name", "options"}, "algo": {"name", "params"}}  # --model, --task.X, ...
    for section in SECTIONS:
        add_dataclass_flags(parser, section, getattr(defaults, section), own_flags.get(section, set()))
    args, extra = parser.parse_known_args(join_negative_values(sys.argv[1:] if argv is None else argv))
    layers = []  # (overrides, origin), lowest precedence first
    resume_dir = expand_path("run.out_dir", getattr(args, "run.out_dir", None))
    saved = saved_layer(resume_dir) if getattr(args, "run.resume", False) and resume_dir else None
    if saved is not None:  # resuming continues the run as configured; flags may change only what is safe to change
        layers.append(saved)
    file_layer = (load_yaml(args.config), args.config) if args.config else None
    if file_layer is not None:
        layers.append(file_layer)
    flags = {k: v for k, v in vars(args).items() if "." in k}
    flags.update(split_open_flags(extra, set(OPEN_SECTIONS)))
    layers.append((flags, "command line"))
    cfg = resolve_config(layers)
    if file_layer is not None:
        check_file_task_options(cfg.task.name, cfg.task.options, *file_layer)
    if args.print_config:
        check_printed(cfg)
        print(json.dumps(masked_config(cfg.to_dict()), indent=2, default=str))
        sys.exit(0)
    if args.dry_run and cfg.run.backend != "openrlhf":
        raise UserError("--dry-run prints an OpenRLHF launch; it needs --backend openrlhf")
    return cfg, args.dry_run


def check_file_task_options(name: str, options: dict, overrides: dict, origin: str) -> None:
    """The task options a ``--config`` file sets and a flag does not replace (``options``: the resolved ones),
    checked (names and types) as they are written there: the task checks them again when it is built, when the
    message could no longer say which file set a bad one."""
    from mmrl.tasks.base import TASKS, checked_options

    layer = TrainConfig()
    apply_overrides(layer, overrides, origin)
    kept = {key: value for key, value in layer.task.options.items() if key in options and options[key] == value}
    if kept and name in TASKS:  # an unknown task is named by the run's own check
        try:
            checked_options(name, kept)
        except UserError as exc:
            raise UserError(f"config ({origin}): {exc}") from None


def check_printed(cfg: TrainConfig) -> None:
    """The checks of a run's start that need no model, data or output folder: the fields, the objective and its
    hyper-parameters, the task's name and its options' names and types. A printed config is one a run would not
    refuse for these; the data is not read (a hub dataset may need the network, a bundled set minutes to draw), so
    an option value the task checks while building it is checked when a run starts."""
    import mmrl.algos as algos  # the objectives and tasks load only when a config is printed
    from mmrl.tasks.base import checked_options

    validate(cfg)
    algos.get(cfg.algo.name, **cfg.algo.params)
    checked_options(cfg.task.name, cfg.task.options)


def _main(argv: list[str] | None) -> int:
    cfg, dry_run = parse_command(argv)
    if cfg.run.backend == "openrlhf":
        from mmrl.openrlhf.launch import launch

        return launch(cfg, dry_run=dry_run)
    from mmrl.trainer.local import train  # the local backend, loaded only when it runs

    last, trainer = train(cfg)
    shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in last.items()
             if k in ("step", "reward", "accuracy") or k.startswith("eval/")}
    print(json.dumps(shown))
    evals = [r for r in read_metrics(cfg.out_dir / "metrics.jsonl") if "eval/pass@1" in r]
    if len(evals) > 1:  # the held-out curve in one line: what the run learned
        print("held-out pass@1 by step: " + ", ".join(f"{r['step']}: {r['eval/pass@1']:.3f}" for r in evals))
    written = [name for name in ("metrics.jsonl", "samples.jsonl", "curves.png", "checkpoints/")
               if (cfg.out_dir / name).exists()]
    print(f"run directory: {printable(str(cfg.out_dir))} ({', '.join(written)})")
    return 128 + trainer.stop_signal if trainer.stop_signal is not None else 0  # the shell's convention


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
