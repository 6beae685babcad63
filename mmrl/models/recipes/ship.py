"""``python -m mmrl.models.recipes.ship NAME --from DIR [--eval "ARGS"]``: add a built model to the package's
shipped weights.

Copies the model's files (weights, config, tokenizer or processor files; not its ``build.json``) from DIR into
``mmrl/models/weights/<version>/`` and records the model in ``weights/manifest.json`` (`mmrl.models.shipped`): the
sha256 of every file, the recipe version, the command that built it (``--command``; a recipe's own build command by
default), the build's versions and kernels (DIR's ``build.json``; without one, this process's), and its skill:

* ``--eval "ARGS"`` runs ``python -m mmrl.eval --model NAME ARGS`` on the shipped copy and records its result and
  command (given alone, without ``--from``, it measures an already shipped model again);
* ``--warm-start FILE`` records the held-out greedy evaluations of a warm start's record (``warm_start.json`` of
  benchmarks/alfworld.py), measured by the run that built the model (its command: ``--skill-command``, by default
  the build's ``--command``).

The ALFWorld warm-started agent, for example, is added with::

    python -m mmrl.models.recipes.ship embedded:tiny-qwen2-agent-sft --from OUT/sft-seed0/model \
        --warm-start OUT/sft-seed0/warm_start.json --command "python benchmarks/alfworld.py ... --out OUT"

A model already shipped under that name or folder is replaced only with ``--replace``. ``--expect SUMMARY.json``
keeps a benchmark summary's per-seed figures with the model, for ``python -m mmrl.expect RUN_DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from mmrl.cache import EMBEDDED_VERSIONS, RECIPE_VERSIONS
from mmrl.cli import OneLineParser, run_cli
from mmrl.errors import RunError, UserError
from mmrl.files import atomic_write_text
from mmrl.models.shipped import BUILD_RECORD, MANIFEST_NAME, WEIGHTS_DIR, file_sha256, read_manifest

MAX_FILE_BYTES = 5 * 2**20  # the package stays small: every shipped file under 5 MiB
MANIFEST_FORMAT = 1


def write_manifest(manifest: dict, weights_dir: Path) -> None:
    """Written beside and renamed over the old one: a reader sees the old manifest or the new, never half."""
    weights_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(weights_dir / MANIFEST_NAME,
                      json.dumps({"format": MANIFEST_FORMAT, **manifest}, indent=1, sort_keys=True) + "\n")


def build_record(source: Path) -> dict:
    """How the model in ``source`` was built: its ``build.json`` (less its name), or this process's versions."""
    path = source / BUILD_RECORD
    if path.is_file():
        record = json.loads(path.read_text())
        record.pop("name", None)
        return record
    import torch
    import transformers

    return {"machine": platform.machine(), "kernels": torch.backends.cpu.get_cpu_capability(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "recorded": f"by mmrl.models.recipes.ship: {source} has no {BUILD_RECORD}"}


def model_files(source: Path) -> list[Path]:
    """The files to ship from ``source``: every plain file but the build record, each under ``MAX_FILE_BYTES``."""
    if not (source / "config.json").is_file():
        raise UserError(f"--from: {source} has no config.json (not a saved model folder)")
    files = []
    for path in sorted(source.iterdir()):
        if path.name == BUILD_RECORD or path.name.startswith("."):
            continue
        if path.is_symlink() or not path.is_file():
            raise UserError(f"--from: {path} is not a plain file (a shipped model is a flat folder of files)")
        if path.stat().st_size >= MAX_FILE_BYTES:
            raise UserError(f"--from: {path} is {path.stat().st_size / 2**20:.1f} MiB; shipped files stay under "
                             f"{MAX_FILE_BYTES // 2**20} MiB")
        files.append(path)
    return files


def ship_files(name: str, source: Path, version: str, command: str, replace: bool = False,
               weights_dir: Path = WEIGHTS_DIR) -> dict:
    """Copy ``source``'s model files into ``weights_dir/version`` and record them in the manifest; the entry."""
    if not name.startswith("embedded:"):
        raise UserError(f"model: a shipped model's name starts with 'embedded:', got {name!r}")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", version):
        raise UserError(f"--version: {version!r} is not a folder name (letters, digits, '.', '_' and '-', starting "
                         f"with a letter or digit)")
    manifest = read_manifest(weights_dir)
    models = manifest["models"]
    target = weights_dir / version
    others = [n for n, e in models.items() if e["dir"] == version and n != name]
    if others:
        raise UserError(f"--version: {version} is the folder of {others[0]}; give {name} its own")
    if (name in models or target.exists()) and not replace:
        raise UserError(f"model: {name} is already shipped ({target}); pass --replace to replace it")
    if os.path.lexists(target) and models.get(name, {}).get("dir") != version:  # --replace removes only its own
        raise UserError(f"--version: {target} exists and the manifest names it no model's folder; move it away or "
                         f"give another --version")
    files = model_files(source)
    weights_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=weights_dir, prefix=f".shipping-{version}-"))
    try:
        for path in files:
            shutil.copyfile(path, tmp / path.name)
            (tmp / path.name).chmod(0o644)
        tmp.chmod(0o755)
        if target.exists():
            shutil.rmtree(target)  # --replace: the package's own earlier copy
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    entry = {"dir": version, "recipe": RECIPE_VERSIONS.get(name), "command": command,
             "build": build_record(source), "files": {p.name: file_sha256(target / p.name) for p in files},
             "bytes": sum((target / p.name).stat().st_size for p in files), "skill": None}
    if name in models and models[name]["dir"] != version:
        shutil.rmtree(weights_dir / models[name]["dir"], ignore_errors=True)  # --replace into a new folder
    models[name] = entry
    write_manifest(manifest, weights_dir)
    return entry


def record_skill(name: str, skill: dict, weights_dir: Path = WEIGHTS_DIR) -> None:
    manifest = read_manifest(weights_dir)
    if name not in manifest["models"]:
        raise UserError(f"model: {name} is not shipped; add it with --from DIR first")
    manifest["models"][name]["skill"] = skill
    write_manifest(manifest, weights_dir)


def record_expectation(name: str, summary_path: Path, weights_dir: Path = WEIGHTS_DIR) -> None:
    """Keep the tagged rows of a benchmark summary (benchmarks/results/<name>.json) with the shipped model, so that
    `mmrl.expect` can set a user's run beside the published figure without the repository's benchmarks folder."""
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"--expect: cannot read {summary_path}: {exc}") from None
    rows = [row for row in summary.get("rows", []) if row.get("tags")] if isinstance(summary, dict) else []
    if not rows:
        raise UserError(f"--expect: {summary_path} has no tagged rows (task, algo, key, steps) to compare with")
    manifest = read_manifest(weights_dir)
    if name not in manifest["models"]:
        raise UserError(f"model: {name} is not shipped; add it with --from DIR first")
    stem = summary_path.stem
    manifest["models"][name].setdefault("expected", {})[stem] = {
        "title": summary["title"], "command": summary["command"], "results": f"docs/results.md#{stem}", "rows": rows}
    write_manifest(manifest, weights_dir)


def measure(name: str, eval_args: str) -> dict:
    """``python -m mmrl.eval --model NAME ARGS`` on the shipped copy, in a child process; its command and result."""
    args = shlex.split(eval_args)
    if "--model" in args or "--out" in args:
        raise UserError("--eval: leave out --model and --out (the shipped model and the result are set here)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "eval.json"
        env = dict(os.environ)
        source_root = str(WEIGHTS_DIR.parents[2])  # the folder holding the mmrl package
        env["PYTHONPATH"] = os.pathsep.join(p for p in (source_root, env.get("PYTHONPATH", "")) if p)
        done = subprocess.run([sys.executable, "-m", "mmrl.eval", "--model", name, *args, "--out", str(out)], env=env,
                              stdin=subprocess.DEVNULL, check=False)
        if done.returncode != 0:
            raise RunError(f"--eval: python -m mmrl.eval exited with {done.returncode} (its error is printed above)")
        result = json.loads(out.read_text())
    return {"command": shlex.join(["python", "-m", "mmrl.eval", "--model", name, *args]), "eval_args": args,
            "result": result}


def warm_start_skill(record_path: Path, command: str) -> dict:
    """The held-out greedy evaluations of a warm start's record (benchmarks/alfworld.py's ``warm_start.json``)."""
    try:
        record = json.loads(record_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"--warm-start: cannot read {record_path}: {exc}") from None
    final = record.get("final") if isinstance(record, dict) else None
    greedy = {split: metrics for split, metrics in (final or {}).items() if split.endswith("/greedy")}
    if not greedy:
        raise UserError(f"--warm-start: {record_path} has no 'final' entry of a greedy held-out evaluation")
    return {"command": command, "result": greedy, "source": record_path.name}


def _main(argv: list[str] | None) -> None:
    parser = OneLineParser(prog="python -m mmrl.models.recipes.ship", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", help="embedded:<name>, as users will spell it")
    parser.add_argument("--from", dest="source", default="", help="the folder of the built model")
    parser.add_argument("--version", default="", help="its folder in the package (default: the name's version in "
                                                      "mmrl.cache)")
    parser.add_argument("--command", default="", help="the command that built it (default: the recipe's build "
                                                      "command)")
    parser.add_argument("--eval", dest="eval_args", default="", metavar="ARGS",
                        help='measure it: python -m mmrl.eval arguments, e.g. "--task arithmetic --k 8"')
    parser.add_argument("--warm-start", default="", metavar="FILE",
                        help="record the held-out greedy evaluations of this warm_start.json as its skill")
    parser.add_argument("--skill-command", default="",
                        help="the command that measured --warm-start's figures (default: the build's --command)")
    parser.add_argument("--expect", default="", metavar="SUMMARY",
                        help="keep a benchmark summary's per-seed figures of this model (benchmarks/results/X.json) "
                             "for python -m mmrl.expect")
    parser.add_argument("--replace", action="store_true", help="replace the shipped copy of this name")
    parser.add_argument("--weights", default=str(WEIGHTS_DIR), help="the weights folder to ship into (default: this "
                                                                    "mmrl's)")
    args = parser.parse_args(argv)
    weights = Path(args.weights)
    if not (args.source or args.eval_args or args.warm_start or args.expect):
        raise UserError("nothing to do: give --from DIR (and --eval or --warm-start for its skill), or --expect")
    if args.warm_start and args.eval_args:
        raise UserError("--warm-start and --eval both give the skill: choose one")
    if args.eval_args and weights.resolve() != WEIGHTS_DIR:
        raise UserError("--eval measures the copy in this mmrl's own weights folder; leave out --weights")
    command = args.command or read_manifest(weights)["models"].get(args.name, {}).get("command", "")
    if args.source:
        version = args.version or EMBEDDED_VERSIONS.get(args.name, "")
        if not version:
            raise UserError(f"--version: {args.name} has no version in mmrl.cache; name its folder")
        command = args.command or (f"python -m mmrl.models.recipes.build {args.name} --out DIR"
                                   if args.name in RECIPE_VERSIONS else "")
        if not command:
            raise UserError(f"--command: {args.name} has no recipe here; give the command that built it")
    skill = None
    if args.warm_start:  # read before anything is copied: a bad record leaves the package as it was
        if not (args.skill_command or command):
            raise UserError("--warm-start: give --skill-command (the command whose run wrote the record)")
        skill = warm_start_skill(Path(args.warm_start), args.skill_command or command)
    if args.source:
        entry = ship_files(args.name, Path(args.source), version, command, args.replace, weights)
        print(f"shipped {args.name} into {weights / version} ({len(entry['files'])} files, "
              f"{entry['bytes'] / 2**20:.2f} MiB)")
    if args.eval_args:
        skill = measure(args.name, args.eval_args)
    if skill is not None:
        record_skill(args.name, skill, weights)
        print(f"recorded the skill of {args.name}: {skill['command']}")
    if args.expect:
        record_expectation(args.name, Path(args.expect), weights)
        print(f"recorded {args.expect}'s figures as what a run of {args.name} should show")


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
