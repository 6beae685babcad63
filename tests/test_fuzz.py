"""A fuzz harness: hypothesis over the data loaders, the config layer and checkpoint files.

Every generated input must either load or fail as a ``UserError`` of one line naming the problem (which
`mmrl.cli.run_cli` turns into exit code 2 with no traceback; `test_the_command_line_maps_each_category_to_exit_2`
checks that mapping once per category in a real process), and must never write into an existing run. No model is
loaded inside a hypothesis loop; example counts are modest so the suite stays fast.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import string
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from mmrl.errors import UserError
from mmrl.run.checkpoint import DIGEST, STATE, TENSORS, load_checkpoint, load_latest, save_checkpoint
from mmrl.run.config import SECTIONS as CONFIG_SECTIONS
from mmrl.run.config import TrainConfig, apply_overrides, load_yaml, validate
from mmrl.run.run_dir import claim
from mmrl.tasks import get_task
from mmrl.train import parse_config

FUZZ = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert text and "\n" not in text and "Traceback" not in text, text
    return text


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with its SHA-256: what "nothing written" is checked against."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def existing_run(tmp_path_factory) -> Path:
    """A finished-looking run of ours: config.json, metrics.jsonl and one intact checkpoint."""
    run = tmp_path_factory.mktemp("existing") / "run"
    cfg = TrainConfig()
    cfg.run.out_dir = str(run)
    save_checkpoint(run, 3, {"model": {"w": torch.arange(8.0)}}, keep=2)
    (run / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2, default=str))
    (run / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n{"step": 2}\n')
    return run


# --------------------------------------------------------------------------------------------- data loaders

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=False),
                    st.text(max_size=12), st.sampled_from(["0.10", "12", "007", "", " ", "nan", "1e3"]))
cells = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=4), scalars, max_size=2))
keys = st.sampled_from(["problem", "answer", "question", "solution", "Answer", ""]) | st.text(max_size=6)
rows = st.lists(st.dictionaries(keys, cells, max_size=4), min_size=0, max_size=6)
encodings = st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "latin-1", "cp1252"])


REASONS = ["not valid JSON", "not UTF-8", "has no column", "has no rows", "has no '", "has an empty", "is a JSON",
           "not a readable parquet", "not text", "cells, the header", "header has empty", "columns of different",
           "must hold a JSON list", "nests JSON"]


def expect_loaded_or_one_line(path: Path, written: list[dict] | None = None) -> None:
    try:
        task = get_task("math", path=str(path), eval_fraction=0)
    except UserError as exc:
        assert path.name in one_line(exc) or "task." in str(exc), str(exc)
        event("refused: " + next((k for k in REASONS if k in str(exc)), "other"))
        return
    event("loaded")
    for sample in task.train:  # loaded: every answer is non-empty text
        assert isinstance(sample["answer"], str) and sample["answer"].strip()
    if written is not None:  # ... and exactly the text written
        wanted = {r["problem"]: r["answer"] for r in written}
        assert all(s["answer"] == wanted[s["problem"]] for s in task.train)


@FUZZ
@given(rows=rows, suffix=st.sampled_from([".jsonl", ".json", ".csv"]), encoding=encodings)
def test_fuzz_tables_of_random_rows_types_and_encodings(tmp_path, rows, suffix, encoding):
    path = tmp_path / f"data{suffix}"
    if suffix == ".jsonl":
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    elif suffix == ".json":
        text = json.dumps(rows, ensure_ascii=False)
    else:
        header = sorted({k for r in rows for k in r})
        text = ",".join(header) + "\n" + "".join(",".join(str(r.get(k, "")) for k in header) + "\n" for r in rows)
    try:
        path.write_bytes(text.encode(encoding))
    except UnicodeEncodeError:
        path.write_bytes(text.encode(encoding, errors="replace"))
    expect_loaded_or_one_line(path)


answers = st.text(alphabet=string.printable.strip() + "αβ√", min_size=1, max_size=10).filter(lambda a: a.strip())


@FUZZ
@given(answers=st.lists(answers, min_size=1, max_size=8, unique=True), missing=st.integers(-1, 7),
       suffix=st.sampled_from([".jsonl", ".csv", ".parquet"]))
def test_fuzz_answers_are_kept_as_written_or_the_missing_one_is_named(tmp_path, answers, missing, suffix):
    import csv

    import pyarrow as pa
    import pyarrow.parquet as pq

    written = [{"problem": f"p{i}", "answer": a} for i, a in enumerate(answers)]
    if 0 <= missing < len(written):
        written[missing]["answer"] = None
    path = tmp_path / f"data{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps({k: v for k, v in r.items() if v is not None}) + "\n" for r in written))
    elif suffix == ".csv":
        with path.open("w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["problem", "answer"])
            out.writerows([[r["problem"], r["answer"] or ""] for r in written])
    else:
        pq.write_table(pa.Table.from_pylist(written), path)
    if 0 <= missing < len(written):
        event("a missing answer")
        with pytest.raises(UserError) as err:
            get_task("math", path=str(path), eval_fraction=0)
        text = one_line(err.value)
        # the file's line (after csv's header line), or a parquet row's count from 0
        place = {".jsonl": f"line {missing + 1} ", ".csv": f"line {missing + 2} ", ".parquet": f"row {missing} "}
        where = "has no column" if len(written) == 1 and suffix == ".jsonl" else place[suffix]
        assert str(path) in text and where in text and "'answer'" in text, text
        return
    expect_loaded_or_one_line(path, written)


@FUZZ
@given(data=st.binary(max_size=300), suffix=st.sampled_from([".jsonl", ".json", ".csv", ".parquet"]))
def test_fuzz_random_bytes(tmp_path, data, suffix):
    path = tmp_path / f"data{suffix}"
    path.write_bytes(data)
    expect_loaded_or_one_line(path)


# --------------------------------------------------------------------------------------------- the config layer

SECTIONS = [*CONFIG_SECTIONS, "modle", "x"]  # the real sections and two that are not
FIELDS = ["name", "lr", "steps", "seed", "samples_per_prompt", "temperature", "out_dir", "dtype", "betas", "beta",
          "path", "threads", "overwrite", "resume", "clip_low", "extra", "nodes", "zero_stage", "typo_field"]
values = st.one_of(st.sampled_from(["-1e-3", "0", "-1", "1e9", "nan", "inf", "true", "yes", "[1, 2]", "{a: 1}", "",
                                    "grpo", "gvpo", "math", "embedded:tiny-qwen2", "'", "]["]),
                   st.text(max_size=8), st.integers(-5, 10**6).map(str), st.floats().map(str))
flags = st.tuples(st.sampled_from(SECTIONS), st.sampled_from(FIELDS), values, st.booleans())


def argv_of(picked) -> list[str]:
    argv = []
    for section, field, value, joined in picked:
        flag = f"--{section}.{field}"
        argv += [f"{flag}={value}"] if joined else [flag, value]
    return argv


@FUZZ
@given(picked=st.lists(flags, max_size=4), short=st.lists(st.sampled_from(
    [["--algo"], ["--task"], ["--model"], ["--steps"], ["--resume"], ["--algo", "nope"], ["--steps", "-3"],
     ["--bogus"], ["-x"], ["--print-config=1"]]), max_size=2))
def test_fuzz_flags_parse_and_validate_or_fail_as_one_line(existing_run, picked, short):
    before = snapshot(existing_run)
    argv = argv_of(picked) + [x for s in short for x in s] + ["--out", str(existing_run)]
    try:
        cfg = parse_config(argv)
        validate(cfg)
        claim(cfg).lock.release()  # an existing run: only a compatible --resume may claim it
        assert cfg.run.resume or cfg.run.overwrite, argv
        event("accepted")
    except UserError as exc:
        one_line(exc)
        event("refused")
    assert snapshot(existing_run) == before


yaml_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.sampled_from(FIELDS) | st.text(max_size=5), inner, max_size=3), max_leaves=6)


@FUZZ
@given(doc=st.dictionaries(st.sampled_from(SECTIONS) | st.text(max_size=6), yaml_values, max_size=4))
def test_fuzz_yaml_configs(tmp_path, doc):
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    cfg = TrainConfig()
    try:
        apply_overrides(cfg, load_yaml(str(path)), str(path))
        validate(cfg)
        event("accepted")
    except UserError as exc:
        one_line(exc)
        event("refused")


# --------------------------------------------------------------------------------------------- checkpoint files


@pytest.fixture(scope="module")
def checkpoint_files(tmp_path_factory) -> dict[str, bytes]:
    run = tmp_path_factory.mktemp("ckpt")
    save_checkpoint(run, 1, {"model": {"w": torch.arange(256.0)}, "optimizer": {}}, keep=1)
    folder = run / "checkpoints" / "step_0000001"
    return {name: (folder / name).read_bytes() for name in (STATE, TENSORS, DIGEST)}


damage = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0, 0.999)),
    st.tuples(st.just("flip"), st.lists(st.tuples(st.floats(0, 0.999), st.integers(0, 7)), min_size=1, max_size=4)),
    st.tuples(st.just("replace"), st.binary(max_size=64)),
)


def damaged(data: bytes, how) -> bytes:
    kind, arg = how
    if kind == "truncate":  # at least two bytes go: dropping only SHA256SUMS' final newline is no damage
        return data[: min(int(len(data) * arg), len(data) - 2)]
    if kind == "flip":
        out = bytearray(data)
        for where, bit in arg:
            out[int(len(out) * where)] ^= 1 << bit
        if bytes(out) == data:  # the flips cancelled out: flip the first byte (not the last, for the same reason)
            out[0] ^= 1
        return bytes(out)
    return arg


@FUZZ
@given(how=damage, which=st.sampled_from([STATE, TENSORS, DIGEST]), with_digest=st.booleans())
@example(how=("flip", [(0.0, 0), (0.0, 0)]), which=DIGEST, with_digest=True)  # flips that cancel out
@example(how=("truncate", 0.999), which=DIGEST, with_digest=True)  # a cut within the last two bytes
def test_fuzz_damaged_checkpoints_are_refused_or_fall_back(tmp_path, checkpoint_files, how, which, with_digest):
    for step in (1, 2):  # step 1 intact, step 2 with one file damaged (or its SHA256SUMS missing)
        folder = tmp_path / "checkpoints" / f"step_{step:07d}"
        folder.mkdir(parents=True, exist_ok=True)
        for name, good in checkpoint_files.items():
            (folder / name).write_bytes(damaged(good, how) if step == 2 and name == which else good)
        if step == 2 and not with_digest:
            (folder / DIGEST).unlink()
    newest = tmp_path / "checkpoints" / "step_0000002"
    with pytest.raises(UserError) as refused:  # every damage is found: SHA256SUMS covers both files, and is required
        load_checkpoint(newest)
    one_line(refused.value)
    event(f"{which} {how[0]}: refused, fell back")
    path, state, skipped = load_latest(tmp_path)
    assert path.name == "step_0000001" and skipped == [newest]
    assert torch.equal(state["model"]["w"], torch.arange(256.0))


# --------------------------------------------------------------------------------------------- the command line


def test_the_command_line_maps_each_category_to_exit_2(tmp_path, existing_run):
    """One real process per category: exit code 2, one line on stderr, no traceback, the existing run untouched."""
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"problem": "1+1", "answer": "2"}\n{"problem": "x\xff"}\n')
    torn = tmp_path / "torn"  # a copy of the run whose only checkpoint is damaged: nothing to resume from
    shutil.copytree(existing_run, torn)
    state = torn / "checkpoints" / "step_0000003" / TENSORS
    state.write_bytes(state.read_bytes()[:100])
    cases = {
        "data": ["--task", "math", "--task.path", str(bad), "--out", str(existing_run), "--run.overwrite", "true"],
        "config": ["--optim.lr", "-1e-3", "--out", str(existing_run), "--resume"],
        "flag": ["--out", str(existing_run), "--rollout.temperature"],
        "resume": ["--out", str(existing_run), "--resume", "--algo", "gvpo"],
        "checkpoint": ["--out", str(torn), "--resume", "--steps", "4"],
    }
    before = snapshot(existing_run)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for name, argv in cases.items():
        done = subprocess.run([sys.executable, "-m", "mmrl.train", *argv], env=env, capture_output=True, text=True,
                              timeout=300)
        lines = [x for x in done.stderr.splitlines() if x.startswith("error:")]
        assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, (name, done.stderr)
    assert snapshot(existing_run) == before
