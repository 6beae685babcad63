"""mmrl/values.py: config fields, hyper-parameters and task options share one type check and differ only in the
text they read."""

from __future__ import annotations

from pathlib import Path

import pytest

import mmrl.algos as algos
from mmrl.run.config import TrainConfig, apply_overrides
from mmrl.tasks.base import get_task
from mmrl.values import as_default_type, exact_scalar, yaml_scalar


def config_field(field: str, value):
    cfg = TrainConfig()
    apply_overrides(cfg, {field: value}, "test")
    section, name = field.split(".")
    return getattr(getattr(cfg, section), name)


# the same wrong value is refused with the same kind by each of the three callers
@pytest.mark.parametrize("check", [
    lambda v: config_field("run.steps", v),                    # an int config field
    lambda v: algos.get("gpg", max_resample=v),                # an int hyper-parameter
    lambda v: get_task("arithmetic", max_operand=v),           # an int task option
])
@pytest.mark.parametrize("value,accepted", [(7, 7), (1e3, 1000), (2.5, None), (True, None), (None, None)])
def test_the_three_callers_agree_on_an_integer(check, value, accepted):
    if accepted is None:
        with pytest.raises(ValueError, match=f"must be an integer, got {value!r}"):
            check(value)
    else:
        check(value)  # no error: 1e3 written as a float is the integer 1000 for all three


def test_each_caller_reads_only_its_own_text():
    assert config_field("optim.lr", "5e-4") == 5e-4 and config_field("optim.betas", "[0.8, 0.9]") == (0.8, 0.9)
    assert exact_scalar("007", "") == "007" and exact_scalar("7", 0) == 7 and exact_scalar("TRUE ", False) is True
    assert exact_scalar("[1]", 0) == "[1]"  # not YAML: refused as an integer afterwards, not read as a list
    with pytest.raises(ValueError, match="task.max_operand must be an integer, got '\\[1\\]'"):
        get_task("arithmetic", max_operand="[1]")
    with pytest.raises(ValueError, match="gpg.max_resample must be an integer, got '3'"):
        algos.get("gpg", max_resample="3")  # hyper-parameters arrive typed: Python text is not read
    assert yaml_scalar("not: [valid") == "not: [valid"


@pytest.mark.parametrize("value", [5, None, 1.5, ["a"]])
def test_a_text_config_field_is_not_rewritten_from_another_kind(value):
    """`run.wandb: null` in YAML used to become the W&B project "None", and `name: 5` the text "5"."""
    with pytest.raises(ValueError, match=r"config \(test\): run.wandb must be text, got .* \(quote it in YAML\)"):
        config_field("run.wandb", value)


def test_a_path_is_text_and_a_none_default_takes_an_integer_or_none(tmp_path):
    assert config_field("run.out_dir", tmp_path / "x") == str(tmp_path / "x")
    assert algos.get("dr_grpo", max_tokens=None).max_tokens is None
    assert algos.get("dr_grpo", max_tokens=64.0).max_tokens == 64
    with pytest.raises(ValueError, match="max_tokens must be an integer or null, got 'abc'"):
        algos.get("dr_grpo", max_tokens="abc")
    assert as_default_type("x", Path("a"), "") == "a"


def test_a_mapping_is_left_to_its_owners_check():
    from mmrl.run.config import validate
    from mmrl.train import parse_config

    with pytest.raises(ValueError, match="cluster.extra must be a mapping of OpenRLHF flags"):
        validate(parse_config(["--cluster.extra", "5"]))


def test_a_tuple_is_checked_element_by_element():
    assert as_default_type("x", [1, "2"], (0.5, 0), yaml_scalar) == (1.0, 2)
    with pytest.raises(ValueError, match=r"x\[1\] must be an integer, got 2.5"):
        as_default_type("x", [1, 2.5], (0.5, 0))
    with pytest.raises(ValueError, match="x must be a list of 2 values"):
        as_default_type("x", [1], (0.5, 0))
