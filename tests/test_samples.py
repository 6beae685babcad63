"""Completions a person can read: samples.jsonl of a run, and the writer behind ``mmrl.eval --save-samples``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmrl.batch import Group, Response
from mmrl.rewards.base import RewardResult
from mmrl.samples import RunSamples, group_records, prompt_text, write_samples
from mmrl.tasks import get_task
from mmrl.trainer.local import build_trainer


def test_every_evaluation_writes_a_few_prompts_with_rewards_and_reasons(tmp_path, embedded_model_dir, small_config):
    cfg = small_config(tmp_path, **{"run.steps": 2, "run.eval_every": 1, "run.eval_samples": 3,
                                    "run.eval_sample_prompts": 2})
    trainer = build_trainer(cfg)
    trainer.run()
    records = [json.loads(line) for line in (trainer.run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 2 * 3  # 2 evaluations x 2 prompts x 3 completions
    assert [r["step"] for r in records] == [1] * 6 + [2] * 6  # the step numbers of metrics.jsonl
    held_out = {row["answer"]: prompt_text(row) for row in trainer.task.eval[:2]}
    for r in records:
        assert held_out[r["answer"]] == r["prompt"] and r["prompt"].startswith("Compute ")
        assert isinstance(r["completion"], str) and r["tokens"] >= 1
        assert set(r["parts"]) >= {"math_accuracy", "answer_format"}
        if r["reward"] == 0:
            assert r["reason"], r  # a zero always says why
    # A fresh run in the same directory starts the file again rather than appending to the old run's records.
    build_trainer(small_config(tmp_path, **{"run.steps": 1, "run.overwrite": True,
                                            "run.eval_sample_prompts": 1})).run()
    assert len((trainer.run_dir / "samples.jsonl").read_text().splitlines()) == 2  # 1 prompt x eval_samples 2


def test_resumed_run_drops_the_records_of_steps_it_redoes(tmp_path):
    samples = RunSamples(tmp_path)
    samples.append([{"step": s, "completion": "x"} for s in range(4)])
    with (tmp_path / "samples.jsonl").open("a") as f:
        f.write('{"step": 4, "compl')  # cut short by a kill
    RunSamples(tmp_path, resume_step=2)
    assert [json.loads(x)["step"] for x in (tmp_path / "samples.jsonl").read_text().splitlines()] == [0, 1]


def test_records_hold_parts_reason_and_episode_and_the_writer_refuses_to_clobber(tmp_path):
    sample = {"messages": [{"role": "system", "content": "s"},
                           {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}],
              "answer": "4"}
    good = Response([1, 2], "<answer>4</answer>", RewardResult(1.0, None, {"math_accuracy": 1.0}))
    bad = Response([3], "four", RewardResult(0.0, "no <answer>", {"math_accuracy": 0.0}), truncated=True,
                   episode={"won": False, "steps": 3})
    records = group_records([Group(0, sample, [9], [good, bad]), Group(1, sample, [9], [good])], step=5,
                            max_prompts=1)
    assert len(records) == 2
    assert records[0] == {"step": 5, "problem": 0, "sample": 0, "prompt": "<image> What?", "answer": "4",
                          "completion": "<answer>4</answer>", "tokens": 2, "truncated": False, "reward": 1.0,
                          "parts": {"math_accuracy": 1.0}, "reason": None}
    assert records[1]["reason"] == "no <answer>" and records[1]["episode"] == {"won": False, "steps": 3}

    path = tmp_path / "out" / "samples.jsonl"
    write_samples(path, records)
    assert [json.loads(x) for x in path.read_text().splitlines()] == records
    with pytest.raises(ValueError, match="already exists"):
        write_samples(path, records[:1])
    write_samples(path, records[:1], overwrite=True)
    assert len(path.read_text().splitlines()) == 1
    with pytest.raises(ValueError, match="is a directory"):
        write_samples(tmp_path, records, overwrite=True)


def test_a_samples_file_that_appears_while_they_are_drawn_is_kept(tmp_path, monkeypatch):
    """The check at start found the path free; a file written there meanwhile (a second evaluation) stays, and the
    error is a run error (the results are already printed and saved)."""
    import mmrl.samples
    from mmrl.errors import RunError

    real = mmrl.samples.atomic_write_text

    def appearing(path, text, **kwargs):
        Path(path).write_text("another evaluation's")
        return real(path, text, **kwargs)

    monkeypatch.setattr(mmrl.samples, "atomic_write_text", appearing)
    path = tmp_path / "samples.jsonl"
    with pytest.raises(RunError, match="appeared while the samples were drawn and was kept"):
        write_samples(path, [{"step": 0}])
    assert path.read_text() == "another evaluation's"


def test_prompt_of_a_row_without_a_chat_is_empty():
    assert prompt_text({"game": "x.tw-pddl"}) == ""
    assert prompt_text(get_task("countdown").eval[0]).startswith("Use ")
