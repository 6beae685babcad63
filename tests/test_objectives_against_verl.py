"""benchmarks/objectives.py --against-verl without verl: the refusal when the folder holds no importable verl, and the
check that runs before timing, on a small core_algos written here in verl's calling convention (a faithful one and one
whose sequence mean is wrong)."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

FAKE_CONFIG = '''
class PolicyLossConfig:
    def __init__(self, loss_mode):
        self.loss_mode = loss_mode


class ActorConfig:
    def __init__(self, **fields):
        self.__dict__.update(fields)
        self.global_batch_info = {}
'''

FAKE_CORE_ALGOS = '''
from collections import defaultdict

import torch

ESTIMATORS, LOSSES = {}, {}


def get_adv_estimator_fn(name):
    if name not in ESTIMATORS:
        raise ValueError(f"Unknown advantage estimator simply: {name}")
    return ESTIMATORS[name]


def get_policy_loss_fn(name):
    if name not in LOSSES:
        raise ValueError(f"Unsupported loss mode: {name}")
    return LOSSES[name]


def grpo(token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True, config=None):
    scores = token_level_rewards.sum(-1)
    by_uid = defaultdict(list)
    for i, uid in enumerate(index):
        by_uid[uid].append(scores[i])
    adv = torch.stack([(scores[i] - torch.stack(by_uid[uid]).mean())
                       / ((torch.stack(by_uid[uid]).std() + epsilon) if norm_adv_by_std_in_grpo else 1.0)
                       for i, uid in enumerate(index)])
    return adv[:, None] * response_mask, adv[:, None] * response_mask


def gpg(token_level_rewards, response_mask, index, epsilon=1e-6, f_norm=1.0, alpha=1.0, config=None):
    scores = token_level_rewards.sum(-1)
    adv, _ = grpo(token_level_rewards, response_mask, index, norm_adv_by_std_in_grpo=False)
    return adv * len(scores) / max(int(torch.count_nonzero(scores)), 1), None


def agg_loss(loss_mat, mask, mode):
    if mode == "token-mean":
        return (loss_mat * mask).sum() / mask.sum()
    if mode == "seq-mean-token-mean":
        return SEQ_MEAN
    if mode == "seq-mean-token-sum-norm":
        return (loss_mat * mask).sum(-1).mean() / mask.shape[-1]
    raise ValueError(mode)


def vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config):
    ratio = torch.exp(log_prob - old_log_prob)
    clipped = ratio.clamp(1 - config.clip_ratio_low, 1 + config.clip_ratio_high)
    return agg_loss(torch.maximum(-advantages * ratio, -advantages * clipped), response_mask, loss_agg_mode), {}


def gpg_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config):
    return agg_loss(-log_prob * advantages, response_mask, loss_agg_mode), {}


ESTIMATORS.update(grpo=grpo, gpg=gpg)
LOSSES.update(vanilla=vanilla, gpg=gpg_loss)
'''
RIGHT_SEQ_MEAN = "((loss_mat * mask).sum(-1) / mask.sum(-1)).mean()"
WRONG_SEQ_MEAN = "(loss_mat * mask).sum() / mask.sum()"  # a token mean where a sequence mean is asked


def write_verl(root: Path, core_algos: str) -> Path:
    for package in ("verl", "verl/trainer", "verl/trainer/ppo", "verl/workers"):
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").write_text("")
    (root / "verl" / "__init__.py").write_text('__version__ = "0.0-test"\n')
    (root / "verl" / "workers" / "config.py").write_text(FAKE_CONFIG)
    (root / "verl" / "trainer" / "ppo" / "core_algos.py").write_text(textwrap.dedent(core_algos))
    return root


@pytest.fixture
def objectives(monkeypatch):
    """benchmarks/objectives.py as a module; sys.path, torch's thread count and any ``verl`` a test imported are put
    back afterwards."""
    monkeypatch.setattr(sys, "path", [str(BENCHMARKS), *sys.path])
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k in ("summary", "verl_objectives")}
    spec = importlib.util.spec_from_file_location("bench_objectives_verl", BENCHMARKS / "objectives.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()
    yield module
    torch.set_num_threads(threads)
    for name in [k for k in sys.modules if k in ("summary", "verl_objectives", "verl") or k.startswith("verl.")]:
        del sys.modules[name]
    sys.modules.update(saved)


def run(objectives, verl_path: Path, out: Path) -> int:
    return objectives.main(["--against-verl", "--verl-path", str(verl_path), "--n", "16", "--t", "32", "--group", "4",
                            "--repeats", "2", "--runs", "2", "--threads", "1", "--out", str(out)])


def test_a_folder_without_verl_is_refused_in_one_line(objectives, tmp_path, capsys):
    assert run(objectives, tmp_path, tmp_path / "out" / "objectives") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"--verl-path {tmp_path}" in err and "verl/trainer/ppo/core_algos.py" in err
    assert not (tmp_path / "out").exists()


def test_a_verl_that_cannot_import_is_refused_naming_the_missing_module(objectives, tmp_path, capsys):
    write_verl(tmp_path, "import a_dependency_verl_needs_but_is_not_installed\n")
    assert run(objectives, tmp_path, tmp_path / "out" / "objectives") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "a_dependency_verl_needs_but_is_not_installed" in err and "pip install" in err


def test_pairs_that_compute_the_same_loss_are_checked_then_timed(objectives, tmp_path):
    write_verl(tmp_path / "verl-install", FAKE_CORE_ALGOS.replace("SEQ_MEAN", RIGHT_SEQ_MEAN))
    assert run(objectives, tmp_path / "verl-install", tmp_path / "objectives") == 0
    summary = json.loads((tmp_path / "objectives.json").read_text())
    outcome = {c["case"]: c["outcome"] for c in summary["cases"]}
    # grpo / dr_grpo / token-mean agree as they are; gpg once each side is divided by its own α
    assert outcome["grpo"] == outcome["grpo token_mean"] == outcome["dr_grpo"] == outcome["gpg"] == "same"
    assert outcome["gvpo vs verl grpo"] == "not compared"
    assert outcome["gmpo"] == outcome["cw_grpo vs verl clip_cov"] == "not timed"  # this core_algos has neither
    assert summary["versions"]["verl"] == "0.0-test"
    ratio = {r["label"]: r for r in summary["rows"] if r["metric"].startswith("mmrl ÷ verl")}
    assert set(ratio) == {"grpo", "grpo token_mean", "dr_grpo", "gpg", "cw_grpo vs verl grpo", "gvpo vs verl grpo",
                          "gigpo vs verl grpo"}
    assert ratio["grpo"]["n"] == 2 and all(v > 0 for v in ratio["grpo"]["values"].values())


def test_a_verl_loss_that_differs_stops_the_benchmark_before_timing(objectives, tmp_path, capsys):
    write_verl(tmp_path / "verl-install", FAKE_CORE_ALGOS.replace("SEQ_MEAN", WRONG_SEQ_MEAN))
    assert run(objectives, tmp_path / "verl-install", tmp_path / "objectives") == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("objectives: run 0: grpo: ") and "different results" in err
    assert not (tmp_path / "objectives.json").exists()
