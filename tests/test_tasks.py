"""Tasks: the bundled generator and the math loader on local files, with bad data failing at start."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from mmrl.tasks import TASKS, get_task


def test_arithmetic_split_is_disjoint_and_deterministic():
    a = get_task("arithmetic", max_operand=9, seed=1)
    b = get_task("arithmetic", max_operand=9, seed=1)
    assert [r["problem"] for r in a.train] == [r["problem"] for r in b.train]
    train = {r["problem"] for r in a.train}
    held = {r["problem"] for r in a.eval}
    assert not train & held and len(train) + len(held) == 100 and len(held) == 20
    row = a.train[0]
    x, y = row["problem"].split("+")
    assert int(row["answer"]) == int(x) + int(y)
    perfect = a.reward([f"<answer>{r['answer']}</answer>" for r in a.train], a.train)
    assert all(r.score == 1.5 for r in perfect)  # accuracy 1 + 0.5 x format 1


def test_arithmetic_reward_scores_text_after_the_answer_below_a_clean_answer():
    """Accuracy alone reads the answer tag and ignores what follows it; the default format term is what makes a
    response that runs on after ``</answer>`` (to the length cap) worth less than one that stops."""
    task = get_task("arithmetic")
    row = task.train[0]
    clean, trailing = task.reward([f"<answer>{row['answer']}</answer>", f"<answer>{row['answer']}</answer>4</answer>6"],
                                  [row, row])
    assert clean.components["math_accuracy"] == trailing.components["math_accuracy"] == 1.0
    assert clean.score == 1.5 and trailing.score == 1.0 and trailing.reason == "text after </answer>"
    unweighted = get_task("arithmetic", format_weight=0.0)
    assert [r.score for r in unweighted.reward([f"<answer>{row['answer']}</answer>4"], [row])] == [1.0]


def test_arithmetic_options_are_checked():
    with pytest.raises(ValueError, match="task.ops"):
        get_task("arithmetic", ops="/")
    with pytest.raises(ValueError, match="has no option 'digits'"):
        get_task("arithmetic", digits=3)
    with pytest.raises(ValueError, match="unknown task"):
        get_task("arithmetics")


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".csv"])
def test_math_task_loads_local_files(tmp_path, suffix):
    rows = [{"problem": f"What is {i} squared?", "answer": str(i * i)} for i in range(20)]
    path = tmp_path / f"data{suffix}"
    frame = pd.DataFrame(rows)
    {".jsonl": lambda: frame.to_json(path, orient="records", lines=True), ".parquet": lambda: frame.to_parquet(path),
     ".csv": lambda: frame.to_csv(path, index=False)}[suffix]()
    task = get_task("math", path=str(path), eval_fraction=0.25)
    assert len(task.train) == 15 and len(task.eval) == 5
    assert task.train[0]["messages"][0]["role"] == "system" and "<think>" in task.train[0]["messages"][0]["content"]
    good = "<think>it is easy</think><answer>" + task.train[0]["answer"] + "</answer>"
    [r] = task.reward([good], [task.train[0]])
    assert r.score == 1.5 and r.components == {"math_accuracy": 1.0, "think_answer_format": 1.0}


def test_math_task_bad_data_fails_with_one_line_naming_the_field(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"question": "1+1", "answer": "2"}) + "\n")
    with pytest.raises(ValueError, match=r"task.problem_key: .* has no column 'problem'"):
        get_task("math", path=str(path))
    assert get_task("math", path=str(path), problem_key="question", eval_fraction=0).train[0]["answer"] == "2"
    path.write_text(json.dumps({"problem": "1+1", "answer": ""}) + "\n")
    with pytest.raises(ValueError, match="d.jsonl line 1 has an empty 'answer'"):
        get_task("math", path=str(path))
    with pytest.raises(ValueError, match="no such file"):
        get_task("math", path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="needs a data file"):
        get_task("math")


def test_math_task_format_reward_and_template_options(tmp_path):
    """``format_reward: think_close`` scores Open-RS's closing-tag check (CW-GRPO's App. C), and ``template`` wraps
    the problem in the user turn (Open-RS's evaluation query); a wrong value is one line naming the option."""
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"problem": "1+1", "answer": "2"}) + "\n")
    task = get_task("math", path=str(path), eval_fraction=0, format_reward="think_close", system_prompt="",
                    template="Solve: {problem} Box it.")
    assert task.format_key == "think_close_format"
    assert task.train[0]["messages"] == [{"role": "user", "content": "Solve: 1+1 Box it."}]
    [scored] = task.reward(["1+1 is 2.\n</think>\n\\boxed{2}"], task.train)
    assert scored.components == {"math_accuracy": 1.0, "think_close_format": 1.0}
    with pytest.raises(ValueError, match="task.format_reward must be one of"):
        get_task("math", path=str(path), format_reward="think")
    with pytest.raises(ValueError, match="task.template must contain"):
        get_task("math", path=str(path), template="no placeholder")


def test_hub_ids_go_through_datasets(monkeypatch):
    """A hub id is handed to `datasets.load_dataset`; offline, that fails as one clear line naming task.path."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="task.path: cannot load dataset 'someone/not-cached'"):
        get_task("math", path="someone/not-cached")


def test_registry():
    assert {"arithmetic", "math"} <= set(TASKS)


def test_countdown_problems_are_distinct_and_their_solutions_correct():
    from mmrl.rewards.countdown import evaluate_expression
    from mmrl.tasks.countdown import countdown_problems

    for n in (2, 3):
        problems = countdown_problems(6, n)
        keys = [(tuple(nums), target) for nums, target, _ in problems]
        assert len(keys) == len(set(keys))
        for nums, target, solution in problems:
            value, used = evaluate_expression(solution)
            assert value == target and sorted(used) == sorted(nums)
    task = get_task("countdown", n_numbers=3, max_number=4)
    assert not {r["problem"] for r in task.train} & {r["problem"] for r in task.eval}
    with pytest.raises(ValueError, match="task.max_number"):
        get_task("countdown", n_numbers=4, max_number=99)


def test_text_task_defaults_keep_the_bare_question_the_embedded_models_were_trained_on():
    from mmrl.tasks.arithmetic import arithmetic_prompt
    from mmrl.tasks.countdown import countdown_prompt

    row = get_task("arithmetic").train[0]
    a, b = row["problem"].split("+")
    assert row["messages"] == [{"role": "user", "content": arithmetic_prompt(int(a), "+", int(b))}]
    row = get_task("countdown").train[0]
    assert row["messages"] == [{"role": "user", "content": countdown_prompt(row["numbers"], row["target"])}]


@pytest.mark.parametrize("name", ["arithmetic", "countdown"])
def test_instruct_chat_has_a_system_prompt_and_a_worked_example_in_the_answer_format(name):
    bare, task = get_task(name), get_task(name, system_prompt="Be brief.", one_shot=True)
    example_q, example_a = task.train[0]["messages"][1:3]
    for plain, row in zip(bare.train + bare.eval, task.train + task.eval, strict=True):
        system, q, a, question = row["messages"]
        assert system == {"role": "system", "content": "Be brief."}
        assert (q, a) == (example_q, example_a) and q["role"] == "user" and a["role"] == "assistant"
        assert question == plain["messages"][0]  # the question itself is unchanged
    # the example's reply is itself a full-score completion of the example's problem
    solved = next(r for r in task.train if r["messages"][-1] == example_q)
    [result] = task.reward([example_a["content"]], [solved])
    assert result.components[task.accuracy_key] == 1.0 and result.components["answer_format"] == 1.0


def test_math_one_shot_example_is_in_the_r1_format(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"problem": f"What is {i}+1?", "answer": str(i + 1)}) + "\n"
                            for i in range(10)))
    task = get_task("math", path=str(path), one_shot=True)
    system, q, a, question = task.eval[0]["messages"]
    assert system["role"] == "system" and question["content"].startswith("What is")
    [result] = task.reward([a["content"]], [{"answer": "12"}])
    assert result.components == {"math_accuracy": 1.0, "think_answer_format": 1.0}


def test_pretrained_models_get_the_instruct_chat_unless_the_user_chose(tmp_path):
    from mmrl.run.build import build_task
    from mmrl.run.config import TrainConfig
    from mmrl.tasks.base import TASK_PRETRAINED_OPTIONS, options_for_model

    assert set(TASK_PRETRAINED_OPTIONS) == {"arithmetic", "arithmetic_stream", "countdown", "math"}
    assert options_for_model("arithmetic", {"ops": "+-"}, embedded=True) == {"ops": "+-"}
    chosen = options_for_model("arithmetic", {"one_shot": False}, embedded=False)
    assert chosen["one_shot"] is False and chosen["system_prompt"].startswith("Solve the problem")
    assert options_for_model("geoqa", {}, embedded=False) == {}

    cfg = TrainConfig()
    cfg.model.name = "smollm2-135m-instruct"
    task = build_task(cfg)  # builds the task only: no model is loaded
    assert [m["role"] for m in task.train[0]["messages"]] == ["system", "user", "assistant", "user"]
    assert cfg.task.options["one_shot"] is True  # recorded in the run's config.json, so resume and eval agree
    embedded = TrainConfig()
    assert len(build_task(embedded).train[0]["messages"]) == 1 and embedded.task.options == {}


def test_errors_in_the_eval_path_file_name_task_eval_path(tmp_path):
    """A held-out file's problems are reported under the option that named it, not as the training file's."""
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"problem": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(4)))
    with pytest.raises(ValueError, match=r"^task.eval_path: no such file .*nope.jsonl"):
        get_task("math", path=str(train), eval_path=str(tmp_path / "nope.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"problem": "1+1", "answer": "2"}) + "\n" + json.dumps({"problem": "2+2"}) + "\n")
    with pytest.raises(ValueError, match=r"^task.eval_path: .*bad.jsonl line 2 has no 'answer'"):
        get_task("math", path=str(train), eval_path=str(bad))
    bad.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"^task.eval_path: .*bad.jsonl line 1 is not valid JSON"):
        get_task("math", path=str(train), eval_path=str(bad))


def test_the_held_out_file_must_not_be_the_training_file_in_any_spelling(tmp_path):
    from mmrl.errors import UserError

    (tmp_path / "data").mkdir()
    train = tmp_path / "data" / "train.jsonl"
    train.write_text("".join(json.dumps({"problem": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(4)))
    for spelling in (str(train), str(tmp_path / "data" / ".." / "data" / "train.jsonl")):
        with pytest.raises(UserError, match=r"^task.eval_path: '.*train.jsonl' is the training file task.path"):
            get_task("math", path=str(train), eval_path=spelling)


def test_max_samples_below_zero_is_refused_and_zero_reads_every_row(tmp_path):
    from mmrl.errors import UserError

    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"problem": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(4)))
    with pytest.raises(UserError, match=r"^task.max_samples must be >= 0 \(0 reads every row\), got -1$"):
        get_task("math", path=str(train), max_samples=-1)  # rows[:-1] silently dropped the last row
    assert len(get_task("math", path=str(train), max_samples=0, eval_fraction=0).train) == 4
    assert len(get_task("math", path=str(train), max_samples=3, eval_fraction=0).train) == 3
