"""Named evaluation sets (config ``evaluation.sets``): parsed with one-line errors, built from the run's task, and
evaluated by the local trainer with each set's own sampling."""

from __future__ import annotations

import json

import pytest

from mmrl.run.config import validate
from mmrl.run.eval_sets import build_eval_sets
from mmrl.train import parse_config


def _math_file(path, n, answer_key="answer", offset=0):
    def gold(i):
        return f"\\boxed{{{i + offset + 1}}}" if answer_key == "solution" else str(i + 1 + offset)

    rows = [{"problem": f"What is {i + offset} + 1?", answer_key: gold(i)} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("sets,message", [
    ("[{name: a, samples: 4}]", r"evaluation.sets\[0\].samples must be 1 when temperature is 0"),
    ("[{name: a, metrc: x}]", r"evaluation.sets\[0\] has no field 'metrc' \(did you mean 'metric'\?\)"),
    ("[{name: a}, {name: a}]", r"evaluation.sets\[1\].name 'a' is used twice"),
    ("[{samples: 1}]", r"evaluation.sets\[0\].name must be a non-empty name"),
    ("[{name: a, samples: 4, temperature: 0.6, metric: avg@8}]", r"metric must be pass@1, pass@4 or avg@4"),
    ("[{name: a, top_p: 0}]", r"evaluation.sets\[0\].top_p must be in \(0, 1\]"),
    ("[{name: a, repetition_penalty: 0}]", r"evaluation.sets\[0\].repetition_penalty must be > 0"),
    ("{name: a}", "evaluation.sets must be a list"),
])
def test_bad_eval_sets_fail_with_one_line_naming_the_entry(sets, message):
    with pytest.raises(ValueError, match=message):
        validate(parse_config(["--evaluation.sets", sets]))


def test_sets_are_built_from_the_run_task_with_their_own_options(tmp_path):
    train = _math_file(tmp_path / "train.jsonl", 12)
    bench = _math_file(tmp_path / "bench.jsonl", 5, answer_key="solution", offset=100)
    sets = json.dumps([
        {"name": "held_out"},
        {"name": "bench", "path": bench, "options": {"answer_key": "solution", "template": "Q: {problem}"},
         "max_problems": 3},
    ])
    cfg = parse_config(["--task", "math", "--task.path", train, "--task.eval_fraction", "0.25",
                        "--evaluation.sets", sets])
    from mmrl.run.build import build_task

    task = build_task(cfg)
    held, benchmark = build_eval_sets(cfg, task)
    assert held.task.eval == task.eval and len(task.eval) == 3 and held.task.reward is task.reward
    assert len(benchmark.task.eval) == 3  # max_problems
    assert benchmark.task.eval[0]["messages"][-1]["content"] == "Q: What is 100 + 1?"
    assert benchmark.task.eval[0]["answer"] == "\\boxed{101}"
    assert benchmark.max_new_tokens(cfg) == cfg.rollout.max_new_tokens
    bad = parse_config(["--evaluation.sets", json.dumps([{"name": "x", "path": bench}])])  # arithmetic: no files
    with pytest.raises(ValueError, match=r"evaluation.sets\[0\] \(x\).path: task 'arithmetic' does not read"):
        build_eval_sets(bad, build_task(bad))
    missing = parse_config(["--task", "math", "--task.path", train, "--evaluation.sets",
                            json.dumps([{"name": "gone", "path": str(tmp_path / "gone.jsonl")}])])
    with pytest.raises(ValueError, match=r"^config: evaluation.sets\[0\] \(gone\).path: no such file"):
        build_eval_sets(missing, build_task(missing))


def test_local_trainer_evaluates_each_set_with_its_own_sampling(tmp_path, embedded_model_dir, small_config,
                                                                 monkeypatch):
    import mmrl.trainer.collect as collect_module
    import mmrl.trainer.evaluate as evaluate_module
    import mmrl.trainer.local as local_module

    seen = []
    real_generate = evaluate_module.generate

    def recording_generate(model, tokenizer, prompts, max_new_tokens, temperature, top_p, *args, **kwargs):
        seen.append((len(prompts), max_new_tokens, temperature, top_p, kwargs.get("repetition_penalty", 1.0)))
        return real_generate(model, tokenizer, prompts, max_new_tokens, temperature, top_p, *args, **kwargs)

    monkeypatch.setattr(evaluate_module, "generate", recording_generate)
    monkeypatch.setattr(collect_module, "generate", recording_generate)  # the training rollouts
    train = _math_file(tmp_path / "train.jsonl", 16)
    bench = _math_file(tmp_path / "bench.jsonl", 3, offset=50)
    cfg = small_config(tmp_path, **{
        "task.name": "math", "task.path": train, "task.eval_fraction": 0.25, "run.steps": 1,
        "rollout.repetition_penalty": 1.2,
        "evaluation.sets": [{"name": "sampled", "samples": 2, "temperature": 0.7, "top_p": 0.9, "metric": "avg@2"},
                            {"name": "greedy", "path": bench, "max_new_tokens": 5, "repetition_penalty": 1.05}]})
    trainer = local_module.build_trainer(cfg)
    trainer.run()
    record = json.loads((trainer.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"eval/sampled/avg@2", "eval/sampled/pass@2", "eval/greedy/pass@1", "eval/average"} <= set(record)
    assert record["eval/average"] == pytest.approx((record["eval/sampled/avg@2"] + record["eval/greedy/pass@1"]) / 2)
    assert "eval/pass@1" not in record  # the default evaluation is replaced by the sets
    # 4 held-out problems x 2 samples, rollout.max_new_tokens, no penalty: the rollout's is for training only
    assert (4 * 2, 12, 0.7, 0.9, 1.0) in seen
    assert (3, 5, 0.0, 1.0, 1.05) in seen  # greedy: one response per problem, the set's max_new_tokens and penalty
    assert seen[-3][-1] == 1.2  # the training step's rollout (then the final evaluation's two sets)


def test_eval_cli_evaluates_the_configs_sets_with_the_same_settings(tmp_path, embedded_model_dir, monkeypatch):
    """``python -m mmrl.eval --config`` of a config with ``evaluation.sets``: every set, with its own sampling, the
    same call as the trainer's; ``--max-problems`` caps each set."""
    import yaml

    import mmrl.trainer.evaluate as evaluate_module
    from mmrl.eval import main

    seen = []
    real_generate = evaluate_module.generate

    def recording_generate(model, tokenizer, prompts, max_new_tokens, temperature, top_p, *args, **kwargs):
        seen.append((len(prompts), max_new_tokens, temperature, top_p, kwargs.get("repetition_penalty", 1.0)))
        return real_generate(model, tokenizer, prompts, max_new_tokens, temperature, top_p, *args, **kwargs)

    monkeypatch.setattr(evaluate_module, "generate", recording_generate)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "task": {"name": "math", "path": _math_file(tmp_path / "train.jsonl", 16), "eval_fraction": 0.25},
        "rollout": {"max_new_tokens": 7},
        "evaluation": {"sets": [
            {"name": "sampled", "samples": 2, "temperature": 0.7, "top_p": 0.9, "metric": "avg@2"},
            {"name": "bench", "path": _math_file(tmp_path / "bench.jsonl", 3, offset=50), "max_new_tokens": 5,
             "repetition_penalty": 1.05}]}}))
    out = tmp_path / "eval.json"
    assert main(["--config", str(config), "--model.threads", "1", "--max-problems", "2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["sampled"]["problems"] == 2 and result["bench"]["problems"] == 2
    assert result["average"] == pytest.approx((result["sampled"]["avg@2"] + result["bench"]["pass@1"]) / 2)
    assert (2 * 2, 7, 0.7, 0.9, 1.0) in seen and (2, 5, 0.0, 1.0, 1.05) in seen
