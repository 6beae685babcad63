"""benchmarks/alfworld.py builds its RL runs' config from its flags: the flags reach the resolved config, and the
defaults keep earlier benchmark commands reproducible (no engine, no model)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from mmrl.run.config import resolve_config, validate

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "alfworld.py"


@pytest.fixture(scope="module")
def benchmark():
    # loaded under its own name: the script shares its file name with the ``alfworld`` package
    spec = importlib.util.spec_from_file_location("mmrl_alfworld_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rl_config(benchmark, flags: list[str], games: Path):
    args = benchmark.build_parser().parse_args(flags)
    cfg = resolve_config([(benchmark.rl_base_overrides(args, games), "benchmark")])
    validate(cfg)  # what build_trainer checks at start
    return cfg


def test_default_flags_keep_a_constant_lr_without_warm_up(benchmark, tmp_path):
    cfg = rl_config(benchmark, [], tmp_path)
    assert (cfg.optim.warmup_steps, cfg.optim.schedule, cfg.optim.min_lr_ratio) == (0, "constant", 0.0)
    assert cfg.optim.lr == 2e-4 and cfg.optim.epochs == 2 and cfg.task.options["games_root"] == str(tmp_path)
    assert (cfg.rollout.prompts_per_step, cfg.rollout.samples_per_prompt, cfg.rollout.temperature) == (4, 4, 0.7)


def test_lr_schedule_flags_reach_the_config(benchmark, tmp_path):
    cfg = rl_config(benchmark, ["--rl-warmup-steps", "10", "--rl-schedule", "cosine", "--rl-min-lr-ratio", "0.1",
                                "--rl-lr", "1e-4"], tmp_path)
    assert (cfg.optim.warmup_steps, cfg.optim.schedule, cfg.optim.min_lr_ratio, cfg.optim.lr) == (10, "cosine", 0.1,
                                                                                                   1e-4)


def test_algo_params_reach_the_objective(benchmark, tmp_path):
    from mmrl import algos

    cfg = rl_config(benchmark, ["--algo-param", "clip_low=0.2", "--algo-param", "clip_high=0.2"], tmp_path)
    assert cfg.algo.params == {"clip_low": 0.2, "clip_high": 0.2}
    objective = algos.get("gmpo", **cfg.algo.params)
    assert (objective.clip_low, objective.clip_high) == (0.2, 0.2)


def test_an_algo_param_one_objective_lacks_fails_before_any_run(benchmark, tmp_path):
    args = benchmark.build_parser().parse_args(["--algos", "gmpo,grpo", "--algo-param", "clip_mode=sequence"])
    with pytest.raises(ValueError, match="grpo.*clip_mode"):
        benchmark.check_objectives(benchmark.rl_base_overrides(args, tmp_path), args.algos.split(","))
    args = benchmark.build_parser().parse_args(["--algos", "gmpo", "--algo-param", "clip_mode=sequence"])
    benchmark.check_objectives(benchmark.rl_base_overrides(args, tmp_path), ["gmpo"])


def test_a_malformed_algo_param_fails_at_start(benchmark, tmp_path):
    with pytest.raises(ValueError, match="KEY=VALUE"):
        rl_config(benchmark, ["--algo-param", "clip_low"], tmp_path)


def test_a_floor_without_cosine_fails_at_start(benchmark, tmp_path):
    with pytest.raises(ValueError, match="min_lr_ratio"):
        rl_config(benchmark, ["--rl-min-lr-ratio", "0.1"], tmp_path)


def test_an_unknown_schedule_is_refused_by_the_parser(benchmark):
    with pytest.raises(SystemExit):
        benchmark.build_parser().parse_args(["--rl-schedule", "step"])


def test_the_summary_holds_each_seeds_gain_for_the_results_page(benchmark, tmp_path):
    warm = [{"seed": 0, "valid_seen/greedy": 0.3, "valid_unseen/greedy": 0.2}]
    rl = [{"algorithm": "grpo", "seed": s, "steps": 30, "seconds": 100.0 + s, "held-out greedy, start": 0.3,
           "held-out greedy, end": 0.4 + 0.1 * s, "unseen, start": 0.2, "unseen, end": 0.25} for s in (0, 1)]
    benchmark.write_alfworld_summary(tmp_path / "alfworld-x", {}, warm, rl)
    rows = {(r["label"], r["metric"]): r for r in json.loads((tmp_path / "alfworld-x.json").read_text())["rows"]}
    gain = rows[("grpo", "valid_seen greedy success gain by RL step 30")]
    assert gain["values"] == pytest.approx({"0": 0.1, "1": 0.2}) and gain["mean"] == pytest.approx(0.15)
    assert rows[("warm start", "held-out valid_seen greedy success")]["values"] == {"0": 0.3}


def test_the_layout_flag_reaches_the_rl_runs(benchmark, tmp_path):
    assert rl_config(benchmark, [], tmp_path).rollout.agent_layout == "episode"
    assert rl_config(benchmark, ["--layout", "turn"], tmp_path).rollout.agent_layout == "turn"
