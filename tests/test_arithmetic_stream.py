"""The arithmetic_stream task: an endless training stream, a fixed held-out set disjoint from it by construction, and
the local trainer drawing fresh problems from it (deterministic per seed, resumable)."""

from __future__ import annotations

import random

import pytest

from mmrl.errors import UserError
from mmrl.tasks import GeneratedRows, get_task
from mmrl.tasks.arithmetic_stream import held_out, value
from mmrl.trainer.collect import PromptSampler


def parse(text: str):
    operands, ops, number = [], [], ""
    for ch in text:
        if ch.isdigit():
            number += ch
        else:
            operands.append(int(number))
            ops.append(ch)
            number = ""
    operands.append(int(number))
    return tuple(operands), tuple(ops)


@pytest.mark.parametrize("options", [{"max_operand": 19}, {"ops": "+-*", "terms": 3, "max_operand": 9}])
def test_training_draws_never_hit_the_held_out_problems(options):
    task = get_task("arithmetic_stream", **options)
    assert isinstance(task.train, GeneratedRows)
    held = {row["problem"] for row in task.eval}
    assert len(held) == len(task.eval) > 50
    assert all(held_out(parse(p), 0.2) for p in held)
    trained = [task.train[i]["problem"] for i in range(0, 40_000, 7)]
    assert not any(held_out(parse(p), 0.2) for p in trained)
    assert not held & set(trained)
    # a held-out sum is not trained on in the other order either
    if options.get("terms", 2) == 2:
        swapped = {"+".join(reversed(p.split("+"))) for p in held}
        assert not swapped & set(trained)
    assert len(set(trained)) > 250  # fresh problems, not a handful repeated


def test_the_split_is_fixed_by_the_seed_and_rows_are_the_same_every_time():
    a, b = get_task("arithmetic_stream"), get_task("arithmetic_stream")
    assert a.eval == b.eval
    assert [a.train[i] for i in (0, 5, 2**40)] == [b.train[i] for i in (0, 5, 2**40)]
    other = get_task("arithmetic_stream", seed=1)
    assert other.eval != a.eval and other.train[5] != a.train[5]
    # the partition itself does not move with the seed: one held-out part, differently sampled
    assert all(held_out(parse(row["problem"]), 0.2) for row in other.eval)


def test_answers_follow_precedence_and_rows_read_like_the_arithmetic_task():
    assert value(parse("2+3*4")) == 14 and value(parse("5-2*3")) == -1 and value(parse("7-3-2")) == 2
    task = get_task("arithmetic_stream", ops="+-*", terms=3, max_operand=9)
    for row in task.train[:50]:
        assert int(row["answer"]) == value(parse(row["problem"]))
        assert row["messages"] == [{"role": "user",
                                    "content": f"Compute {row['problem']}. Answer in <answer></answer> tags."}]


def test_reward_parts_are_accuracy_and_format():
    task = get_task("arithmetic_stream")
    row = task.eval[0]
    right, unformatted = task.reward([f"<answer>{row['answer']}</answer>", "no tags"], [row, row])
    assert right.components["math_accuracy"] == 1 and right.components["answer_format"] == 1
    assert right.score == 1.5
    assert unformatted.score == 0 and unformatted.components["answer_format"] == 0


def test_generated_rows_behave_as_a_sequence():
    rows = GeneratedRows(lambda i: {"messages": [{"role": "user", "content": str(i)}], "i": i})
    assert len(rows) == 2**62
    assert [r["i"] for r in rows[3:6]] == [3, 4, 5] and rows[-1]["i"] == 2**62 - 1
    with pytest.raises(IndexError):
        rows[2**62]
    with pytest.raises(ValueError, match="shorter prefix"):
        rows[: 2**40]


def test_a_fixed_training_set_on_request():
    task = get_task("arithmetic_stream", train_size=30)
    assert isinstance(task.train, list) and len(task.train) == 30
    assert task.train == get_task("arithmetic_stream").train[:30]


@pytest.mark.parametrize("options,message", [
    ({"terms": 5}, "task.terms"), ({"ops": "+/"}, "task.ops"), ({"eval_fraction": 0.0}, "task.eval_fraction"),
    ({"eval_size": 0}, "task.eval_size"), ({"train_size": -1}, "task.train_size")])
def test_bad_options_are_one_line(options, message):
    with pytest.raises(UserError, match=message):
        get_task("arithmetic_stream", **options)


def test_the_endless_sampler_is_deterministic_and_resumes_where_it_stopped():
    a = PromptSampler(2**62, seed=3, endless=True)
    first = a.take(8)
    state = a.state_dict()
    assert state["order"] == []  # no epoch order of 2**62 rows is ever built
    second = a.take(8)
    b = PromptSampler(2**62, seed=3, endless=True)
    b.load_state_dict(state)
    assert b.take(8) == second
    assert PromptSampler(2**62, seed=3, endless=True).take(8) == first
    assert PromptSampler(2**62, seed=4, endless=True).take(8) != first
    assert len(set(first + second)) == 16


def test_start_up_checks_read_only_a_prefix_of_an_endless_split(embedded_model_dir):
    from mmrl.models import load_tokenizer
    from mmrl.run.build import encode_all_prompts

    task = get_task("arithmetic_stream")
    cache = encode_all_prompts(task, load_tokenizer(str(embedded_model_dir)), limit=256)
    assert sorted(cache) == list(range(GeneratedRows.CHECKED_PREFIX))


def test_a_run_trains_on_fresh_problems_and_resumes_the_same_draws(tmp_path, embedded_model_dir, small_config):
    from mmrl.trainer.local import build_trainer

    options = {"task.name": "arithmetic_stream", "task.eval_size": 4, "run.checkpoint_every": 1, "run.steps": 1}
    trainer = build_trainer(small_config(tmp_path, **options))
    last = trainer.run()
    assert "accuracy" in last or "eval/pass@1" in last
    after_one = trainer.rollouts.sampler.rng.getstate()
    resumed = build_trainer(small_config(tmp_path, **{**options, "run.steps": 2, "run.resume": True}))
    assert resumed.step == 1 and resumed.rollouts.sampler.endless
    assert resumed.rollouts.sampler.rng.getstate() == after_one
    expected = PromptSampler(2**62, 0, endless=True)
    expected.take(4)
    assert resumed.rollouts.sampler.take(4) == expected.take(4)


def test_the_openrlhf_backend_refuses_an_endless_split(tmp_path):
    from mmrl.openrlhf.launch import resolve_launch

    cfg = _openrlhf_config(tmp_path)
    with pytest.raises(UserError, match="train_size"):
        resolve_launch(cfg, write=False)


def _openrlhf_config(tmp_path):
    from mmrl.run.config import resolve_config

    return resolve_config([({"task.name": "arithmetic_stream", "run.backend": "openrlhf",
                             "run.out_dir": str(tmp_path / "run")}, "test")])


def test_random_problems_fall_held_out_at_about_the_fraction():
    rng = random.Random(0)
    problems = [((rng.randint(0, 999), rng.randint(0, 999)), ("-",)) for _ in range(20_000)]
    share = sum(held_out(p, 0.2) for p in problems) / len(problems)
    assert 0.18 < share < 0.22
