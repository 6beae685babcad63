"""examples/cluster/prepare_<dataset>.py on stand-in files in the official downloads' layouts (a hub snapshot folder,
AMAP-ML/GPG's prompts file with Geo170K's images, ALFWorld's json_2.1.1 tree): each script's output is read by the
recipe's own task loader, and each refusal is one line (exit code 2) naming the file, the row and the field, with
nothing the user owns replaced.

Most runs call the script's entry point in this process through `mmrl.cli.run_cli`, the call its ``__main__`` makes
(a subprocess per run would import mmrl and the task loaders again each time); `command` runs a script as the
command a user types, for the exit code and the one printed line.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import recipe_data

from mmrl.cli import run_cli
from mmrl.run.build import build_task
from mmrl.run.eval_sets import build_eval_sets
from mmrl.train import parse_config

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "examples" / "cluster"


def command(script: str, *args: str) -> subprocess.CompletedProcess:
    """``python examples/cluster/prepare_<script>.py ARGS``, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(CLUSTER / f"prepare_{script}.py"), *args], capture_output=True,
                          text=True, env=env, timeout=300)


@functools.cache
def module_of(script: str):
    sys.path.insert(0, str(CLUSTER))  # where the scripts find prepare_common, as when run as commands
    try:
        spec = importlib.util.spec_from_file_location(f"prepare_{script}", CLUSTER / f"prepare_{script}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(CLUSTER))
    return module


def prepare(script: str, *args: str) -> subprocess.CompletedProcess:
    """The script's run in this process: its entry point through `mmrl.cli.run_cli`, as its ``__main__`` calls it."""
    module = module_of(script)
    main = module.main if hasattr(module, "main") else functools.partial(
        sys.modules["prepare_common"].prepare_table, module.DATASET)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_cli(main, list(args))
    return subprocess.CompletedProcess(script, code, out.getvalue(), err.getvalue())


def default_output(script: str) -> str:
    """The path a prepare script writes when given no ``--out``."""
    module = module_of(script)
    return module.DATASET.out if hasattr(module, "DATASET") else module.OUT


def refused(done: subprocess.CompletedProcess, *words: str) -> str:
    """The one line a refusal prints (exit code 2, no traceback), checked to name each of ``words``."""
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def snapshot(folder: Path, rows: list[dict], layout: str) -> Path:
    """``rows`` as a hub snapshot folder holds them: ``data/<split>-00000-of-00001.parquet`` or ``<split>.jsonl``."""
    import pandas as pd

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / layout
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        pd.DataFrame(rows).to_parquet(path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def jsonl_rows(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


BENCHMARKS = recipe_data.math_eval_sets  # columns as each hub copy has them

TEXT_SETS = [  # script, snapshot file, recipe, evaluation set name ("" = the training set, task.path)
    ("math_train", "data/train-00000-of-00001.parquet", "gvpo_math_qwen2.5-math-7b", ""),
    ("open_rs", "data/train-00000-of-00001.parquet", "cw_grpo_openrs_r1-distill-qwen-1.5b", ""),
    ("math500", "test.jsonl", "cw_grpo_openrs_r1-distill-qwen-1.5b", "math500"),
    ("aime24", "data/train-00000-of-00001.parquet", "gvpo_math_qwen2.5-math-7b", "aime24"),
    ("amc23", "data/train-00000-of-00001.parquet", "cw_grpo_openrs_r1-distill-qwen-1.5b", "amc23"),
    ("amc", "data/train-00000-of-00001.parquet", "gvpo_math_qwen2.5-math-7b", "amc"),
    ("minerva", "data/train-00000-of-00001.parquet", "gvpo_math_qwen2.5-math-7b", "minerva"),
    ("olympiadbench", "data/train-00000-of-00001.parquet", "cw_grpo_openrs_r1-distill-qwen-1.5b", "olympiadbench"),
]


def text_rows(script: str, tmp_path: Path) -> list[dict]:
    import pandas as pd

    if script in ("math_train", "open_rs"):
        make = recipe_data.math_lighteval_train if script == "math_train" else recipe_data.open_rs_train
        return pd.read_parquet(make(tmp_path / "rows", 5)).to_dict("records")
    name = "amc" if script == "amc" else script
    return jsonl_rows(BENCHMARKS(tmp_path / "rows")[name])


TRAIN_STAND_INS = {"gvpo_math_qwen2.5-math-7b": recipe_data.math_lighteval_train,
                   "cw_grpo_openrs_r1-distill-qwen-1.5b": recipe_data.open_rs_train,
                   "gpg_geoqa_qwen2.5-vl-3b": recipe_data.geoqa_r1v_train}


def recipe_reads(recipe: str, set_name: str, path: str, tmp_path: Path) -> int:
    """How many problems the recipe's own loader reads from ``path`` (as its task, or as evaluation set
    ``set_name`` beside a stand-in training file)."""
    config = ["--config", str(CLUSTER / f"{recipe}.yaml")]
    if not set_name:
        return len(build_task(parse_config([*config, "--task.path", path])).train)
    cfg = parse_config(config)
    sets = [dict(s, path=path) for s in cfg.evaluation.sets if s["name"] == set_name]
    assert sets, f"{recipe} has no evaluation set {set_name}"
    train = TRAIN_STAND_INS[recipe](tmp_path / "train", 4)
    cfg = parse_config([*config, "--task.path", train, "--evaluation.sets", json.dumps(sets)])
    return len(build_eval_sets(cfg, build_task(cfg))[0].task.eval)


@pytest.mark.parametrize("script,layout,recipe,set_name", TEXT_SETS, ids=[s[0] for s in TEXT_SETS])
def test_text_dataset_is_prepared_where_and_as_the_recipe_reads_it(script, layout, recipe, set_name, tmp_path):
    rows = text_rows(script, tmp_path)
    source = snapshot(tmp_path / "download", rows, layout)
    out = tmp_path / "data" / "out.jsonl"
    # the official count is checked: a stand-in of a few rows is not the dataset
    refused(prepare(script, "--source", str(source), "--out", str(out)), str(source / layout), f"{len(rows)} rows")
    assert not out.exists()
    done = prepare(script, "--source", str(source), "--out", str(out), "--expect-rows", str(len(rows)))
    assert done.returncode == 0, done.stderr
    assert recipe_reads(recipe, set_name, str(out), tmp_path) == len(rows)
    # the recipe reads this very path (what the script writes by default)
    cfg = parse_config(["--config", str(CLUSTER / f"{recipe}.yaml")])
    read = cfg.task.options["path"] if not set_name else \
        next(s["path"] for s in cfg.evaluation.sets if s["name"] == set_name)
    assert default_output(script) == read


def test_an_output_that_cannot_be_written_is_one_line(tmp_path):
    """A read-only or blocked --out (a root-owned /data under the image's uid 1000) ended in a traceback."""
    rows = text_rows("math500", tmp_path)
    source = snapshot(tmp_path / "download", rows, "test.jsonl")
    (tmp_path / "blocker").write_text("a file where a folder should be")
    refused(prepare("math500", "--source", str(source), "--out", str(tmp_path / "blocker" / "o.jsonl"),
                    "--expect-rows", str(len(rows))), "--out: cannot write", "blocker")
    assert (tmp_path / "blocker").read_text() == "a file where a folder should be"


def test_a_row_without_a_required_field_is_named_by_file_row_and_field(tmp_path):
    rows = text_rows("math500", tmp_path)
    rows[3]["answer"] = "  "
    source = snapshot(tmp_path / "download", rows, "test.jsonl")
    line = refused(prepare("math500", "--source", str(source), "--out", str(tmp_path / "o.jsonl"),
                           "--expect-rows", str(len(rows))), str(source / "test.jsonl"), "line 4", "'answer'")
    assert "empty" in line
    del rows[3]["answer"]
    rows[1]["problem"] = 7
    source = snapshot(tmp_path / "download2", rows, "train.jsonl")
    # as a command: exit code 2 and the one line, no traceback
    refused(command("aime24", "--source", str(source), "--out", str(tmp_path / "o.jsonl"),
                    "--expect-rows", str(len(rows))), str(source / "train.jsonl"), "line 2", "'problem'", "not text")
    refused(prepare("aime24", "--source", str(tmp_path / "nothing")), "--source", "nothing")
    refused(prepare("aime24", "--source", str(tmp_path)), "holds no file of the 'train' split")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"problem": "1+1", "answer": "2"}\n{"problem": \n')
    line = refused(prepare("aime24", "--source", str(broken)), str(broken), "line 2")
    assert line.startswith("error: --source:"), line  # the option the user gave, not the trainer's task.path
    assert not (tmp_path / "o.jsonl").exists()


def test_an_output_the_script_did_not_write_is_never_replaced(tmp_path):
    rows = text_rows("minerva", tmp_path)
    source = snapshot(tmp_path / "download", rows, "data/train-00000-of-00001.parquet")
    out = tmp_path / "data" / "minerva.jsonl"
    out.parent.mkdir()
    out.write_text("the user's own file\n")
    args = ["--source", str(source), "--out", str(out), "--expect-rows", str(len(rows))]
    refused(prepare("minerva", *args, "--force"), str(out), "not written by a prepare script")
    assert out.read_text() == "the user's own file\n"
    out.unlink()
    assert command("minerva", *args).returncode == 0  # as a command: exit code 0
    written = out.read_bytes()
    refused(prepare("minerva", *args), str(out), "--force")  # its own output: only with --force
    assert prepare("minerva", *args, "--force").returncode == 0 and out.read_bytes() == written
    out.write_text(out.read_text() + "{}\n")  # edited since: the user's now
    refused(prepare("minerva", *args, "--force"), "changed since")
    assert out.read_text().endswith("{}\n")


def _geoqa_train_snapshot(folder: Path, n: int, card_rows: int | None) -> Path:
    """leonardPKU/GEOQA_R1V_Train_8K's download: two parquet shards and the dataset card."""
    import pandas as pd

    rows = pd.read_parquet(recipe_data.geoqa_r1v_train(folder / "rows", n)).to_dict("records")
    (folder / "data").mkdir(parents=True)
    half = n // 2
    pd.DataFrame(rows[:half]).to_parquet(folder / "data" / "train-00000-of-00002.parquet")
    pd.DataFrame(rows[half:]).to_parquet(folder / "data" / "train-00001-of-00002.parquet")
    if card_rows is not None:
        (folder / "README.md").write_text(
            "---\ndataset_info:\n  features:\n  - name: image\n    dtype: image\n  splits:\n  - name: train\n"
            f"    num_bytes: 1000\n    num_examples: {card_rows}\n---\n")
    return folder


def test_geoqa_train_is_checked_against_its_card_and_read_by_the_recipe(tmp_path):
    source = _geoqa_train_snapshot(tmp_path / "dl", 6, card_rows=6)
    out = tmp_path / "data" / "train.parquet"
    done = prepare("geoqa_train", "--source", str(source), "--out", str(out))
    assert done.returncode == 0, done.stderr
    task = build_task(parse_config(["--config", str(CLUSTER / "gpg_geoqa_qwen2.5-vl-3b.yaml"), "--task.path",
                                    str(out)]))
    assert len(task.train) == 6 and task.train[0]["answer"]
    # a shard missing from the download: fewer rows than its card says
    (source / "data" / "train-00001-of-00002.parquet").unlink()
    refused(prepare("geoqa_train", "--source", str(source), "--out", str(tmp_path / "o.parquet")), "3 rows", "6")
    # a corrupt diagram is named by its shard, row and field
    import pandas as pd

    bad = _geoqa_train_snapshot(tmp_path / "dl2", 4, card_rows=4)
    shard = bad / "data" / "train-00001-of-00002.parquet"
    frame = pd.read_parquet(shard)
    frame.at[1, "image"] = {"bytes": b"not a png", "path": None}
    frame.to_parquet(shard)
    refused(prepare("geoqa_train", "--source", str(bad), "--out", str(tmp_path / "o.parquet")), str(shard),
            "row 1", "'image'")
    nocard = _geoqa_train_snapshot(tmp_path / "dl3", 2, card_rows=None)
    refused(prepare("geoqa_train", "--source", str(nocard)), "--expect-rows")


def test_geoqa_test_copies_the_images_the_recipe_reads(tmp_path):
    """AMAP-ML/GPG's prompts file and Geo170K's test images (the stand-in writes both in R1-V's eval layout)."""
    prompts = Path(recipe_data.geoqa_r1v_test(tmp_path / "R1-V", 4))  # images under tmp/R1-V/R1-V-eval/Geo170K
    images = prompts.parent
    out = tmp_path / "data" / "geoqa_test_prompts.jsonl"
    refused(prepare("geoqa_test", "--source", str(prompts), "--images", str(images), "--out", str(out)), "754")
    done = prepare("geoqa_test", "--source", str(prompts), "--images", str(images), "--out", str(out),
                   "--expect-rows", "4")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (out.parent / "Geo170K" / "images" / "test").iterdir()) == [f"{i}.png"
                                                                                             for i in range(4)]
    assert recipe_reads("gpg_geoqa_qwen2.5-vl-3b", "geoqa_test", str(out), tmp_path) == 4
    (images / "Geo170K" / "images" / "test" / "2.png").write_bytes(b"truncated")
    refused(prepare("geoqa_test", "--source", str(prompts), "--images", str(images), "--out",
                    str(tmp_path / "o" / "p.jsonl"), "--expect-rows", "4"), "line 3", "'image_path'")


@pytest.mark.slow
def test_alfworld_games_are_copied_where_the_recipe_reads_them(tmp_path):
    pytest.importorskip("alfworld")
    from mmrl.envs.alfworld import list_games

    source = Path(recipe_data.alfworld_official_tree(tmp_path / "download", n_per_type=1))
    counts = {s: len(list_games(source, s)) for s in ("train", "valid_seen")}
    out = tmp_path / "alfworld"
    refused(prepare("alfworld", "--source", str(source), "--out", str(out)), "train", "3,553")
    expect = f"train={counts['train']},valid_seen={counts['valid_seen']}"
    done = prepare("alfworld", "--source", str(source), "--out", str(out), "--expect-rows", expect)
    assert done.returncode == 0, done.stderr
    task = build_task(parse_config(["--config", str(CLUSTER / "gmpo_alfworld_qwen2.5-1.5b-instruct.yaml"),
                                    "--task.games_root", str(out)]))
    assert len(task.train) == counts["train"] and len(task.eval) == counts["valid_seen"]
    refused(prepare("alfworld", "--source", str(source), "--out", str(out), "--expect-rows", expect), "--force")
    refused(prepare("alfworld", "--source", str(tmp_path)), "json_2.1.1")


def test_every_dataset_a_recipe_reads_has_its_prepare_script():
    """Each data path of examples/cluster/*.yaml is the default output of one prepare script."""
    outputs = {default_output(p.stem.removeprefix("prepare_")) for p in CLUSTER.glob("prepare_*.py")
               if p.stem != "prepare_common"}
    for recipe in CLUSTER.glob("*.yaml"):
        cfg = parse_config(["--config", str(recipe)])
        paths = [cfg.task.options.get("path") or cfg.task.options.get("games_root")]
        paths += [s["path"] for s in cfg.evaluation.sets if s.get("path")]
        for path in paths:
            assert path in outputs, f"{recipe.name}: {path} has no prepare script"

