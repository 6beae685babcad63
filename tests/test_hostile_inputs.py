"""Hostile and broken inputs found by the trial (benchmarks/trial.py): each ends in one line naming the file, row
or field, or in the right result, never in a traceback, a hang or a silently different run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmrl.errors import UserError, printable
from mmrl.tasks.tables import load_rows

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------------- paths


def test_a_yaml_out_dir_expands_the_home_folder_and_variables(tmp_path, monkeypatch):
    from mmrl.train import parse_config

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MMRL_TEST_RUNS", str(tmp_path / "runs"))
    for written, expected in (("~/r", tmp_path / "home" / "r"), ("$HOME/r", tmp_path / "home" / "r"),
                              ("${MMRL_TEST_RUNS}/r", tmp_path / "runs" / "r")):
        (tmp_path / "c.yaml").write_text(f"run:\n  out_dir: '{written}'\n")
        assert parse_config(["--config", str(tmp_path / "c.yaml")]).run.out_dir == str(expected)


def test_an_unset_variable_in_a_path_is_refused_naming_the_field(tmp_path, monkeypatch):
    from mmrl.train import parse_config

    monkeypatch.delenv("MMRL_TEST_UNSET", raising=False)
    with pytest.raises(UserError, match=r"run\.out_dir: .*\$MMRL_TEST_UNSET, which is not set"):
        parse_config(["--out", "$MMRL_TEST_UNSET/r"])
    with pytest.raises(UserError, match=r"task\.path: .*\$MMRL_TEST_UNSET"):
        load_rows("$MMRL_TEST_UNSET/d.jsonl")


def test_task_paths_and_eval_outputs_expand_variables(tmp_path, monkeypatch):
    from mmrl.eval import parse_command

    monkeypatch.setenv("MMRL_TEST_DATA", str(tmp_path))
    (tmp_path / "d.jsonl").write_text(json.dumps({"problem": "p", "answer": "1"}) + "\n")
    assert load_rows("$MMRL_TEST_DATA/d.jsonl")[0]["answer"] == "1"
    _, args = parse_command(["--out", "$MMRL_TEST_DATA/e.json", "--save-samples", "~/s.jsonl"])
    assert args.out == str(tmp_path / "e.json") and args.save_samples == os.path.expanduser("~/s.jsonl")


def test_path_fields_say_the_rule_in_their_help():
    import dataclasses

    from mmrl.run.config import SECTIONS

    paths = [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls) if f.metadata.get("path")]
    assert {"run.out_dir", "model.name", "task.reward_model"} <= set(paths)
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            if f.metadata.get("path"):
                assert "$VAR" in f.metadata["help"], f"{section}.{f.name}"


# --------------------------------------------------------------------------------------------------- data files


def test_a_key_written_twice_in_a_jsonl_row_is_refused(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"problem": "p", "answer": "1"}\n{"problem": "q", "answer": "2", "answer": "3"}\n')
    with pytest.raises(UserError, match=r"d\.jsonl line 2 has the key 'answer' twice"):
        load_rows(str(path))


def test_a_key_written_twice_in_a_json_file_names_its_line(tmp_path):
    path = tmp_path / "d.json"
    path.write_text('[\n  {"problem": "p", "answer": "1"},\n  {"problem": "q",\n   "problem": "r", "answer": "2"}\n]\n')
    with pytest.raises(UserError, match=r"d\.json line 4 has the key 'problem' twice"):
        load_rows(str(path))


def test_a_lone_surrogate_names_the_line_and_field(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"problem": "p", "answer": "1"}\n{"problem": "x \\ud800 y", "answer": "2"}\n')
    with pytest.raises(UserError, match=r"d\.jsonl line 2 field 'problem' holds \\ud800"):
        load_rows(str(path))
    (tmp_path / "ok.jsonl").write_text('{"problem": "\\ud83d\\ude00", "answer": "1"}\n')  # a whole pair is a character
    assert load_rows(str(tmp_path / "ok.jsonl"))[0]["problem"] == "\U0001f600"


def test_an_empty_held_out_file_is_refused(tmp_path):
    from mmrl.tasks import get_task

    (tmp_path / "train.jsonl").write_text(json.dumps({"problem": "p", "answer": "1"}) + "\n")
    (tmp_path / "eval.jsonl").write_text("")
    with pytest.raises(UserError, match=r"task\.eval_path: .*eval\.jsonl has no rows"):
        get_task("math", path=str(tmp_path / "train.jsonl"), eval_path=str(tmp_path / "eval.jsonl"))


def test_a_parquet_float32_answer_is_read_as_written(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"problem": ["a", "b", "c"], "answer": pa.array([0.1, 1.0, 0.00001], pa.float32()),
                      "half": pa.array([0.1, 2.5, 3.0], pa.float16())})
    pq.write_table(table, tmp_path / "d.parquet")
    rows = load_rows(str(tmp_path / "d.parquet"))
    assert [str(r["answer"]) for r in rows] == ["0.1", "1.0", "0.00001"]
    assert [str(r["half"]) for r in rows] == ["0.1", "2.5", "3.0"]


def test_a_data_file_over_the_size_bound_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "big.jsonl"
    path.write_text((json.dumps({"problem": "p" * 1000, "answer": "1"}) + "\n") * 2100)  # ~2 MiB
    monkeypatch.setenv("MMRL_MAX_DATA_MB", "1")
    with pytest.raises(UserError, match=r"big\.jsonl is 2 MiB, more than the 1 MiB a data file may be"):
        load_rows(str(path))
    monkeypatch.setenv("MMRL_MAX_DATA_MB", "3")
    assert len(load_rows(str(path))) == 2100


# ------------------------------------------------------------------------------------------------ chat templates


def model_with_template(tmp_path, template: str) -> Path:
    from mmrl.cache import EMBEDDED_NAME
    from mmrl.models import shipped_model

    folder = tmp_path / "model"
    shutil.copytree(shipped_model(EMBEDDED_NAME), folder)
    (folder / "chat_template.jinja").write_text(template)
    return folder


@pytest.mark.parametrize(("template", "why"), [
    ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}", "did not finish"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "SecurityError"),
    ("{% for i in range(10**12) %}{{ i }}{% endfor %}", "OverflowError"),
], ids=["nested-loops", "escape", "huge-range"])
def test_a_hostile_chat_template_is_one_line_naming_its_file(tmp_path, monkeypatch, template, why):
    from mmrl import chat_template
    from mmrl.models.loading import load_tokenizer

    monkeypatch.setattr(chat_template, "SECONDS", 2)
    folder = model_with_template(tmp_path, template)
    with pytest.raises(UserError, match="chat_template.jinja: its chat template is refused") as info:
        load_tokenizer(str(folder))
    assert why in str(info.value) and "\n" not in str(info.value)


def test_a_plain_chat_template_from_a_folder_loads(tmp_path):
    from mmrl.models.loading import load_tokenizer

    folder = model_with_template(tmp_path, "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                                           "{% if add_generation_prompt %}<assistant>{% endif %}")
    tok = load_tokenizer(str(folder))
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True) == "<user>hi<assistant>"


# ------------------------------------------------------------------------------------------------- model files


def test_broken_gguf_files_are_one_line(tmp_path):
    import struct

    from mmrl.models.gguf_cache import check_gguf

    (tmp_path / "random.gguf").write_bytes(os.urandom(4096))
    (tmp_path / "lying.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**40, 1) + bytes(64))
    (tmp_path / "short.gguf").write_bytes(b"GGU")
    for name, why in (("random", "is not a GGUF file"), ("lying", "lists 1099511627776 tensors"),
                      ("short", "is not a GGUF file")):
        with pytest.raises(UserError, match=f"{name}.gguf {why}" if why.startswith("is") else f"{name}.gguf .*{why}"):
            check_gguf(tmp_path / f"{name}.gguf")


def test_a_truncated_gguf_is_one_line(tmp_path):
    pytest.importorskip("gguf")
    import numpy as np
    from gguf import GGUFWriter

    from mmrl.models.gguf_cache import check_gguf

    writer = GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    writer.add_tensor("w", np.ones((64, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    check_gguf(tmp_path / "m.gguf")  # whole: accepted
    data = (tmp_path / "m.gguf").read_bytes()
    (tmp_path / "m.gguf").write_bytes(data[: len(data) - 4096])
    with pytest.raises(UserError, match=r"m\.gguf is damaged"):
        check_gguf(tmp_path / "m.gguf")


def test_broken_safetensors_are_one_line_naming_the_file(tmp_path):
    import struct

    from safetensors.torch import save_file

    from mmrl.models.loading import check_safetensors

    save_file({"w": torch.ones(4, 4)}, tmp_path / "good.safetensors")
    check_safetensors(tmp_path / "good.safetensors")
    (tmp_path / "huge.safetensors").write_bytes(struct.pack("<Q", 2**60) + b"{}")
    header = json.dumps({"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 1 << 30]}}).encode()
    (tmp_path / "lying.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(64))
    for name in ("huge", "lying"):
        with pytest.raises(UserError, match=f"model: .*{name}.safetensors is damaged"):
            check_safetensors(tmp_path / f"{name}.safetensors")


# -------------------------------------------------------------------------------------------------- checkpoints


def rehashed(folder: Path) -> Path:
    from mmrl.files import file_sha256
    from mmrl.run.checkpoint import DIGEST, STATE, TENSORS

    (folder / DIGEST).write_text("".join(f"{file_sha256(folder / n)}  {n}\n" for n in (STATE, TENSORS)))
    return folder


def edited_checkpoint(tmp_path, edit) -> Path:
    from mmrl.run.checkpoint import read_state, save_checkpoint, write_state

    folder = save_checkpoint(tmp_path, 3, {"model": {"w": torch.ones(8)}}, keep=2)
    state = read_state(folder)
    edit(state)
    for name in list(folder.iterdir()):
        name.unlink()
    write_state(folder, state)
    return rehashed(folder)


@pytest.mark.parametrize(("edit", "why"), [
    (lambda s: s.update(step="3"), "step is '3', not a whole number >= 0"),
    (lambda s: s.update(step=-5), "step is -5, not a whole number >= 0"),
    (lambda s: s["rng"].update(torch=s["rng"]["torch"][:100]), "rng/torch is not torch's generator state"),
    (lambda s: s["rng"].update(numpy=["MT19937", [1, 2], 0, 0, 0.0]), "rng/numpy is not NumPy's"),
    (lambda s: s["model"]["w"].__setitem__(2, float("nan")), "model/w holds NaN or infinite values"),
], ids=["step-text", "step-negative", "rng-short", "numpy-short", "nan-weight"])
def test_a_rehashed_checkpoint_with_wrong_contents_is_damaged(tmp_path, edit, why):
    from mmrl.run.checkpoint import load_checkpoint, load_latest

    folder = edited_checkpoint(tmp_path, edit)
    with pytest.raises(UserError, match="checkpoint .*step_0000003 is damaged") as info:
        load_checkpoint(folder)
    assert why in str(info.value)
    with pytest.raises(UserError, match="none of its 1 checkpoints can be read"):
        load_latest(tmp_path)


def test_a_checkpoint_weight_of_another_shape_is_one_line():
    from mmrl.models.lora import load_policy_weights

    model = torch.nn.Linear(4, 3)
    with pytest.raises(UserError, match=r"checkpoint run/step_1: its weight weight has shape \[5, 4\], the model's "
                                        r"\[3, 4\]"):
        load_policy_weights(model, {"model": {"weight": torch.zeros(5, 4), "bias": torch.zeros(3)}}, "run/step_1")
    with pytest.raises(UserError, match="it has no weight bias"):
        load_policy_weights(model, {"model": {"weight": torch.zeros(3, 4)}}, "run/step_1")


def test_a_config_json_edited_since_the_checkpoint_is_refused(tmp_path):
    from mmrl.run.masking import masked_config
    from mmrl.run.run_dir import claim, refuse_edited_config
    from mmrl.train import parse_config

    cfg = parse_config(["--out", str(tmp_path / "run")])
    owner = claim(cfg)
    owner.record_config(cfg, 0)
    owner.lock.release()
    trained = masked_config(cfg.to_dict())
    refuse_edited_config(tmp_path / "run", trained, tmp_path / "run" / "checkpoints" / "step_0000001")
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    saved["optim"]["lr"] = 0.5
    saved["run"]["steps"] = 99  # a field a resume may change: not refused
    (tmp_path / "run" / "config.json").write_text(json.dumps(saved))
    with pytest.raises(UserError, match=r"config\.json says optim\.lr is 0\.5, but .*step_0000001 was trained with "
                                        r"0\.001"):
        refuse_edited_config(tmp_path / "run", trained, tmp_path / "run" / "checkpoints" / "step_0000001")


# ------------------------------------------------------------------------------------------------------- run folder


def test_the_lock_of_a_folder_made_read_only_is_released_without_an_error(tmp_path, monkeypatch, caplog):
    from mmrl.run import run_dir

    lock = run_dir.RunLock(tmp_path / "run")
    lock.acquire()

    def refused(self, *args, **kwargs):  # a read-only folder (the suite may run as root, whom chmod does not stop)
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "unlink", refused)
    lock.release()
    assert not lock.held and "the lock file .mmrl.lock stays (Permission denied)" in caplog.text


# -------------------------------------------------------------------------------------------------- what is printed


def test_a_newline_or_bidi_override_is_escaped_in_printed_lines():
    assert printable("runs/a\nINFO forged") == "runs/a\\nINFO forged"
    assert printable("runs/\u202eevil") == "runs/\\u202eevil"
    assert printable("runs/é ü 数") == "runs/é ü 数"


def test_an_error_line_with_a_newline_in_out_stays_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    out = subprocess.run([sys.executable, "-m", "mmrl.train", "--out", str(tmp_path / "file") + "/a\nerror: forged"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "\\nerror: forged" in out.stderr


def test_a_yaml_with_too_many_values_and_no_alias_says_so(monkeypatch):
    from mmrl import values
    from mmrl.values import YAMLBoundError, safe_yaml

    monkeypatch.setattr(values, "MAX_YAML_VALUES", 2000)
    with pytest.raises(YAMLBoundError, match="holds more than 2000 values") as info:
        safe_yaml("a:\n" + "".join(f"  k{i}: {i}\n" for i in range(2_001)))
    assert "alias" not in str(info.value)


def test_a_math_verify_timeout_is_not_called_a_wrong_answer(monkeypatch):
    import logging

    import math_verify

    from mmrl.rewards import text

    def slow_verify(*args, **kwargs):
        logging.getLogger("math_verify.grader").warning("Timeout during comparison")
        return False

    monkeypatch.setattr(math_verify, "verify", slow_verify)
    ok, reason = text.math_verify_match("2", "3")
    assert not ok and "timed out" in reason and "wrong" not in reason


# ------------------------------------------------------------------------------------------------------- envs


def test_alfworld_resets_do_not_block_the_event_loop(alfworld_games):
    import asyncio
    import time

    from mmrl.envs.alfworld import AlfWorldEnv, list_games

    games = list_games(alfworld_games)
    envs = [AlfWorldEnv(games[i % len(games)].path) for i in range(4)]

    async def main() -> float:
        longest, done = [0.0], False

        async def ticker() -> None:
            last = time.perf_counter()
            while not done:
                await asyncio.sleep(0.01)
                now = time.perf_counter()
                longest[0] = max(longest[0], now - last)
                last = now

        tick = asyncio.create_task(ticker())
        start = time.perf_counter()
        firsts = await asyncio.gather(*(env.reset() for env in envs))
        total = time.perf_counter() - start
        done = True
        await tick
        await asyncio.gather(*(env.close() for env in envs))
        assert all(first for first, _ in firsts)
        return longest[0] / total

    assert asyncio.run(main()) < 0.6  # the loop went on while the games loaded (before: one stall of all of it)


def test_a_permission_error_while_running_is_one_line(capsys):
    from mmrl.cli import run_cli

    def main(argv):
        raise PermissionError(13, "Permission denied", "/runs/r/.mmrl-run.json.1234.tmp")

    assert run_cli(main, []) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["error: cannot use /runs/r/.mmrl-run.json.1234.tmp: Permission denied (a file "
                                        "or folder this command reads or writes was made read-only, or another "
                                        "user's)"]
