"""Config: defaults < YAML < flags; bad names and values fail at start with one line naming the field."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest

from mmrl.errors import UserError
from mmrl.train import parse_config
from mmrl.trainer.config import TrainConfig, apply_overrides, validate


def test_precedence_defaults_yaml_flags(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("algo: {name: gvpo, beta: 0.2}\nrollout: {temperature: 0.7, samples_per_prompt: 4}\n"
                    "task: {name: arithmetic, max_operand: 5}\n")
    cfg = parse_config(["--config", str(path), "--rollout.temperature", "0.9", "--algo.beta", "5e-2"])
    assert cfg.algo.name == "gvpo" and cfg.algo.params == {"beta": 0.05}
    assert cfg.rollout.temperature == 0.9 and cfg.rollout.samples_per_prompt == 4
    assert cfg.task.options == {"max_operand": 5}
    assert cfg.optim.lr == TrainConfig().optim.lr


def test_shortcuts():
    cfg = parse_config(["--algo", "gpg", "--task", "arithmetic", "--model", "some/dir", "--steps", "3", "--resume",
                        "--out", "x"])
    assert (cfg.algo.name, cfg.model.name, cfg.run.steps, cfg.run.resume, cfg.run.out_dir) == \
        ("gpg", "some/dir", 3, True, "x")


@pytest.mark.parametrize("overrides,message", [
    ({"rollout.temprature": 1}, "unknown field 'rollout.temprature' (did you mean 'temperature'?)"),
    ({"rolout.temperature": 1}, "unknown field 'rolout.temperature' (did you mean 'rollout'?)"),
    ({"optim.lr": "fast"}, "optim.lr must be a finite number, got 'fast'"),
    ({"run.steps": 2.5}, "run.steps must be an integer"),
    ({"run.plot": "maybe"}, "run.plot must be true or false"),
])
def test_bad_fields_name_themselves(overrides, message):
    with pytest.raises(ValueError) as err:
        apply_overrides(TrainConfig(), overrides, "test")
    assert message in str(err.value)


def test_a_bad_value_names_the_yaml_file_or_command_line_that_set_it(tmp_path):
    """As an unknown field already does: with a --config file and flags, the value to fix is in one of them."""
    config = tmp_path / "typo.yaml"
    config.write_text("rollout: {prompts_per_step: two}\n")
    with pytest.raises(ValueError, match=rf"^config \({re.escape(str(config))}\): rollout.prompts_per_step must be an "
                                         r"integer, got 'two'$"):
        parse_config(["--config", str(config)])
    with pytest.raises(ValueError, match=r"^config \(command line\): run.steps must be an integer, got 'x'$"):
        parse_config(["--steps", "x"])


def test_a_bad_task_option_names_the_yaml_file_that_set_it(tmp_path):
    config = tmp_path / "opts.yaml"
    config.write_text("task: {name: math, format_weight: abc}\n")
    with pytest.raises(UserError, match=rf"^config \({re.escape(str(config))}\): task.format_weight must be a finite "
                                        r"number, got 'abc'$"):
        parse_config(["--config", str(config)])
    config.write_text("task: {name: math, formt_weight: 1.0}\n")
    with pytest.raises(UserError, match=rf"^config \({re.escape(str(config))}\): task 'math' has no option "
                                        r"'formt_weight'"):
        parse_config(["--config", str(config)])
    config.write_text("task: {name: math, format_weight: abc}\n")  # a flag that replaces it leaves nothing to fix
    assert parse_config(["--config", str(config), "--task.format_weight", "0.5"]).task.options["format_weight"] == "0.5"


@pytest.mark.parametrize("field,value,message", [
    ("rollout.top_p", 0.0, "rollout.top_p must be in (0, 1]"),
    ("optim.minibatches", 99, "optim.minibatches must be between 1"),
    ("rollout.replay_historical", 2, "needs --algo gvpo"),
    ("model.dtype", "float8", "model.dtype must be"),
])
def test_validation(field, value, message):
    cfg = TrainConfig()
    apply_overrides(cfg, {field: value}, "test")
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate(cfg)


def test_cli_error_is_one_line_and_exit_code_2():
    proc = subprocess.run([sys.executable, "-m", "mmrl.train", "--algo", "ppo", "--steps", "1"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: unknown algorithm 'ppo'; choose one of: cispo, cw_grpo, "
                                                "dr_grpo, gigpo, gmpo, gpg, grpo, gspo, gvpo, sapo"]


def test_help_lists_algorithms_and_tasks():
    proc = subprocess.run([sys.executable, "-m", "mmrl.train", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    for name in ("grpo", "dr_grpo", "gpg", "gvpo", "gmpo", "cw_grpo", "gspo", "cispo", "sapo", "arithmetic", "math",
                 "--rollout.temperature"):
        assert name in proc.stdout


def test_resume_starts_from_the_runs_saved_config(tmp_path):
    import json

    from mmrl.trainer.config import apply_overrides

    run = tmp_path / "run"
    run.mkdir()
    saved = TrainConfig()
    apply_overrides(saved, {"algo.name": "gvpo", "algo.beta": 0.3, "task.max_operand": 5, "optim.lr": 5e-4,
                            "run.steps": 10}, "test")
    (run / "config.json").write_text(json.dumps(saved.to_dict(), default=str))
    cfg = parse_config(["--out", str(run), "--resume", "--steps", "20"])
    assert (cfg.algo.name, cfg.algo.params, cfg.task.options, cfg.optim.lr) == ("gvpo", {"beta": 0.3},
                                                                               {"max_operand": 5}, 5e-4)
    assert cfg.run.steps == 20 and cfg.run.resume


@pytest.mark.parametrize("flag,value", [("--optim.lr", "inf"), ("--optim.weight_decay", ".inf"),
                                        ("--rollout.temperature", "nan"), ("--sft.lr", "-inf")])
def test_a_non_finite_number_fails_at_start_naming_its_field(flag, value):
    """An inf lr or weight decay turns every weight into NaN in one step (and the run would exit 0)."""
    with pytest.raises(ValueError, match=f"{flag[2:]} must be a finite number"):
        parse_config([flag, value])


def test_betas_are_checked_one_by_one_and_in_range():
    with pytest.raises(ValueError, match=r"optim.betas\[1\] must be a finite number, got 'abc'"):
        parse_config(["--optim.betas", "[0.9, abc]"])
    with pytest.raises(ValueError, match="optim.betas must both be in"):
        validate(parse_config(["--optim.betas", "[1.5, 0.999]"]))


def test_a_section_given_as_a_scalar_and_a_non_utf8_yaml_are_named(tmp_path):
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("optim: 5\n")
    with pytest.raises(ValueError, match="section 'optim' must be a mapping of fields"):
        parse_config(["--config", str(scalar)])
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"run:\n  steps: 3 \xe9\n")
    with pytest.raises(ValueError, match="latin.yaml is not UTF-8"):
        parse_config(["--config", str(latin)])


BILLION_LAUGHS = "cluster:\n  extra:\n    a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"    {b}: &{b} [{', '.join(['*' + a] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True))


@pytest.mark.parametrize("text,message", [
    (BILLION_LAUGHS, r"bomb.yaml is refused: line \d+ column \d+: aliases expand this value to more than 100000"),
    ("run:\n  steps: &s [1, *s]\n", r"bomb.yaml is refused: line 2 column 10: an alias refers to a value that "
                                     "contains it"),
    ("run:\n\tsteps: 3\n", r"bomb.yaml is not valid YAML: line 2 column 1: a tab where YAML allows only spaces"),
    ("run: {steps: 3,\n\tseed: 2}\n", r"bomb.yaml is not valid YAML: line 2 column 1: a tab"),
    ("run:\n  steps: [1, 2\n", r"bomb.yaml is not valid YAML: line 3 column 1: expected ',' or ']'"),
    ("run: " + "[" * 5000 + "]" * 5000 + "\n", "bomb.yaml is not valid YAML: the document nests values too deeply"),
])
def test_a_hostile_or_broken_yaml_config_is_one_line_at_once(tmp_path, text, message):
    """An alias bomb (nine levels of nine: 387 million values from 400 bytes) is refused while it is read, before
    anything walks it; a tab or a syntax error is named by line and column."""
    import time

    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=message) as caught:
        parse_config(["--config", str(path)])
    assert "\n" not in str(caught.value) and time.perf_counter() - start < 5


@pytest.mark.parametrize("text,line,key,first", [
    ("rollout:\n  prompts_per_step: 2\n  prompts_per_step: 3\n", 3, "prompts_per_step", 2),
    ("task:\n  name: math\nrun:\n  steps: 2\ntask:\n  name: arithmetic\n", 5, "task", 1),
    ("cluster:\n  extra: {a: 1, a: 2}\n", 2, "a", 2),
])
def test_a_key_written_twice_in_a_yaml_config_is_refused_naming_its_line(tmp_path, text, line, key, first):
    """PyYAML keeps the last of two equal keys without a word: a repeated task: section replaced the first whole."""
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=rf"^config: .*dup.yaml is not valid YAML: line {line} column \d+: key "
                                        rf"'{key}' is repeated \(first at line {first}\); YAML would keep only the "
                                        rf"last$"):
        parse_config(["--config", str(path)])


def test_a_yaml_merge_may_still_be_overridden_by_the_mappings_own_keys(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text("cluster:\n  extra:\n    base: &b {x: 1, y: 2}\n    own: {<<: *b, y: 3}\n")
    assert parse_config(["--config", str(path)]).cluster.extra["own"] == {"x": 1, "y": 3}


def test_a_flag_value_with_an_alias_bomb_stays_text():
    from mmrl.values import yaml_scalar

    bomb = "[" + ", ".join(["&a [x, x, x, x, x, x, x, x, x, x]"] + ["*a"] * 9) + "]"
    assert yaml_scalar(bomb) == [["x"] * 10] * 10  # small enough
    nested = "&a [" + ", ".join("*a" for _ in range(3)) + "]"
    assert yaml_scalar(nested) == nested  # refers to itself: kept as the text it is
    levels = [f"&l{i} [{', '.join([f'*l{i - 1}' if i else 'x'] * 10)}]" for i in range(7)]
    laughs = "[" + ", ".join(levels) + "]"
    assert yaml_scalar(laughs) == laughs


def test_task_options_keep_their_text_and_are_typed_by_the_task():
    """Text options are read as written ("007" and "yes" stay text); numbers and flags are converted by the option's
    type, and a value of the wrong kind is one line naming the option, not a traceback."""
    from mmrl.tasks.base import get_task

    cfg = parse_config(["--task", "math", "--task.answer_key", "007", "--task.system_prompt", "yes"])
    assert cfg.task.options == {"answer_key": "007", "system_prompt": "yes"}
    task = get_task("arithmetic", **parse_config(["--task.max_operand", "5", "--task.one_shot", "true"]).task.options)
    assert task is not None
    for option, value, message in [("format_weight", "abc", "task.format_weight must be a finite number"),
                                   ("format_weight", "nan", "task.format_weight must be a finite number"),
                                   ("max_operand", "2.5", "task.max_operand must be an integer"),
                                   ("one_shot", "yes", "task.one_shot must be true or false")]:
        with pytest.raises(ValueError, match=message):
            get_task("arithmetic", **{option: value})
    with pytest.raises(ValueError, match="task.template must be text, got 5"):
        get_task("math", path="x.jsonl", template=5)


def test_trust_remote_code_is_off_by_default_and_explained_in_help(capsys):
    from mmrl.train import main

    assert parse_config([]).model.trust_remote_code is False
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--model.trust_remote_code BOOL let transformers run Python code shipped with the model" in text
    assert "(default: False)" in text.split("--model.trust_remote_code BOOL let", 1)[1][:300]


def test_every_config_field_has_its_help_text_in_its_metadata():
    from mmrl.trainer.config import SECTIONS, EvalSetConfig

    classes = [(section, cls) for section, cls in SECTIONS.items()] + [("evaluation.sets[]", EvalSetConfig)]
    missing = [f"{section}.{f.name}" for section, cls in classes for f in dataclasses.fields(cls)
               if not f.metadata.get("help")]
    assert not missing, (f"config fields without help text: {', '.join(missing)}. In mmrl/trainer/config.py declare "
                         "each as `name: type = setting(default, \"what it does\", range)` (range: at_least(n), "
                         "above(n), one_of(choices), unit_interval(...) or Range(text, check); leave it out when any "
                         "value of the type is valid), then run `python -m mmrl.trainer.config_doc` to regenerate "
                         "docs/config.md")


def test_docs_config_md_is_generated_from_the_code():
    from mmrl.trainer.config_doc import COMMAND, DOC, render

    assert DOC.is_file() and DOC.read_text(encoding="utf-8") == render(), f"{DOC} is stale: run `{COMMAND}`"


def test_help_shows_each_fields_help_text_and_range():
    from mmrl.trainer.config import SECTIONS

    text = " ".join(subprocess.run([sys.executable, "-m", "mmrl.train", "--help"], capture_output=True, text=True,
                                   timeout=120, env={**os.environ, "COLUMNS": "2000"}).stdout.split())
    assert f"YAML file with sections {'/'.join(SECTIONS)}" in text
    flagged = {"model": {"name"}, "task": {"name", "options"}, "algo": {"name", "params"}}  # --model, --task.X, ...
    for section, cls in SECTIONS.items():
        own = [f for f in dataclasses.fields(cls) if f.name not in flagged.get(section, set())]
        assert not own or f" {section}: " in text, f"--help has no group of the {section} section"
        for f in dataclasses.fields(cls):
            if f.name in flagged.get(section, set()):
                continue
            limit = f.metadata.get("range")
            shown = " ".join((f.metadata["help"] + (f"; {limit.text}" if limit else "")).split())
            assert f"--{section}.{f.name}" in text and shown in text, (section, f.name)


def test_the_range_check_reads_the_fields_metadata():
    from mmrl.trainer.config import SECTIONS

    checked = 0
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            limit = f.metadata.get("range")
            if limit is None or not isinstance(f.default, int | float) or isinstance(f.default, bool):
                continue
            cfg = TrainConfig()
            for bad in (-1, -1.0, 10**9):  # one of them is outside every numeric range of the config
                setattr(getattr(cfg, section), f.name, type(f.default)(bad))
                if not limit.ok(getattr(getattr(cfg, section), f.name), cfg):
                    with pytest.raises(ValueError, match=re.escape(f"config: {section}.{f.name} {limit.text}")):
                        validate(cfg)
                    checked += 1
                    break
    assert checked >= 30, checked


@pytest.mark.parametrize("flags,message", [
    (["--algo", "gpgg"], "unknown algorithm 'gpgg'"),
    (["--rollout.samples_per_prompt", "1"], "rollout.samples_per_prompt must be >= 2"),
    (["--steps", "0"], "run.steps must be >= 1"),
    (["--task", "arithmatic"], "unknown task 'arithmatic'"),
    (["--algo.f_nrom", "std"], "algorithm 'grpo' has no hyper-parameter 'f_nrom'"),
    (["--task.max_operand", "many"], "task.max_operand must be an integer"),
])
def test_print_config_refuses_what_a_run_refuses(flags, message, capsys, tmp_path):
    """A printed config passed for a valid one (exit 0) although a run would refuse it; now the same one line and
    exit code 2, and nothing printed or written."""
    from mmrl.train import main

    out = tmp_path / "run"
    assert main(["--print-config", "--out", str(out), *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and message in captured.err and len(captured.err.strip().splitlines()) == 1
    assert not out.exists()
    with pytest.raises(SystemExit) as done:
        main(["--print-config", "--out", str(out)])
    assert done.value.code == 0 and json.loads(capsys.readouterr().out)["algo"]["name"] == "grpo"


@pytest.mark.parametrize("flags,module,extra", [(["--model.lora_rank", "4"], "peft", "lora"),
                                                (["--run.tensorboard", "true"], "tensorboard", "loggers"),
                                                (["--run.wandb", "proj"], "wandb", "loggers")])
def test_an_option_whose_package_is_missing_is_refused_at_start(flags, module, extra, monkeypatch):
    """A vision-only install has no PEFT, TensorBoard or W&B: one line naming the extra, before anything is written."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    with pytest.raises(ValueError, match=rf"needs {module}, which is not installed: pip install \"mmrl\[{extra}\]\""):
        validate(parse_config(flags))
