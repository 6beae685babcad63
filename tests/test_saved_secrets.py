"""No credential reaches a run directory: ``cluster.extra`` may carry OpenRLHF flags such as a W&B key, and every
backend writes the run's ``config.json`` and ``resumes.jsonl`` with those values masked."""

from __future__ import annotations

import json

import pytest

from mmrl.run.config import validate
from mmrl.run.masking import MASK, mask_urls, masked_config
from mmrl.run.run_dir import RESUMES_NAME, claim
from mmrl.train import parse_config

SECRETS = ("SEKRET-123", "TOK-456", "NEW-789")


def test_a_local_run_and_its_resumes_save_no_credential(tmp_path):
    run = tmp_path / "run"
    extra = {"wandb.api_key": "SEKRET-123", "x.token": "TOK-456", "actor.entropy_coef": 0.0}
    cfg = parse_config(["--out", str(run), "--cluster.extra", json.dumps(extra)])  # the local backend
    owner = claim(cfg)
    owner.record_config(cfg, 0)
    (run / "checkpoints" / "step_0000002").mkdir(parents=True)  # as a run that trained 2 steps leaves it
    (run / "checkpoints" / "step_0000002" / "state.json").write_bytes(b"")
    owner.lock.release()
    saved = (run / "config.json").read_text()
    assert not any(s in saved for s in SECRETS)
    assert json.loads(saved)["cluster"]["extra"] == {"wandb.api_key": MASK, "x.token": MASK, "actor.entropy_coef": 0.0}
    assert cfg.cluster.extra["wandb.api_key"] == "SEKRET-123"  # the live config keeps the value

    # a resume given the same secrets changes nothing; a new secret flag is recorded, masked
    more = {**extra, "hub_token": "NEW-789"}
    again = parse_config(["--out", str(run), "--resume", "--steps", "90", "--cluster.extra", json.dumps(more)])
    owner = claim(again)
    owner.record_config(again, 2)
    owner.lock.release()
    resumes = (run / RESUMES_NAME).read_text()
    assert not any(s in resumes for s in SECRETS)
    [entry] = [json.loads(line) for line in resumes.splitlines()]
    assert entry["changed"]["cluster.extra"][1] == {"wandb.api_key": MASK, "x.token": MASK,
                                                     "actor.entropy_coef": 0.0, "hub_token": MASK}
    assert entry["changed"]["run.steps"] == [60, 90]
    assert (run / "config.json").read_text() == saved


def test_masking_leaves_the_config_it_is_given_alone():
    cfg = parse_config(["--cluster.extra", '{"logger.wandb.key": "k", "data.input_key": "question"}'])
    config = cfg.to_dict()
    shown = masked_config(config)
    assert shown["cluster"]["extra"] == {"logger.wandb.key": MASK, "data.input_key": "question"}
    assert config["cluster"]["extra"]["logger.wandb.key"] == "k"


def test_print_config_shows_no_credential(capsys):
    with pytest.raises(SystemExit) as done:
        parse_config(["--print-config", "--cluster.extra", '{"logger.wandb.key": "SEKRET-123"}'])
    assert done.value.code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["cluster"]["extra"] == {"logger.wandb.key": MASK}


def test_url_passwords_and_other_credential_names_are_masked(tmp_path):
    run = tmp_path / "run"
    extra = {"reward.remote_url": "http://bob:PW-333@rm:5000/score", "wandb.apikey": "PW-222", "hf.passwd": "PW-555",
             "vllm.urls": ["https://carol:PW-666@a/x", "https://b/y"]}
    cfg = parse_config(["--out", str(run), "--cluster.ray_address", "ray://alice:PW-111@head:10001",
                        "--cluster.extra", json.dumps(extra)])
    owner = claim(cfg)
    owner.record_config(cfg, 0)
    owner.lock.release()
    saved = json.loads((run / "config.json").read_text())
    assert "PW-" not in json.dumps(saved)
    assert saved["cluster"]["ray_address"] == "ray://alice:***@head:10001"
    assert saved["cluster"]["extra"] == {"reward.remote_url": "http://bob:***@rm:5000/score", "wandb.apikey": MASK,
                                         "hf.passwd": MASK, "vllm.urls": ["https://carol:***@a/x", "https://b/y"]}


def test_a_url_without_a_password_is_left_as_it_is():
    for text in ("https://huggingface.co/Qwen/x", "http://head:8265/a@b", "git@github.com:org/repo", "ray://h:10001"):
        assert mask_urls(text) == text


def test_a_nested_mapping_in_cluster_extra_is_refused_in_one_line():
    """A flag takes a value or a list of values: a mapping would reach OpenRLHF as its Python text (and escape the
    masking of credential names)."""
    with pytest.raises(ValueError, match=r"cluster.extra\['logger'\] must be a value or a list of values .*"
                                         r"written dotted"):
        validate(parse_config(["--cluster.extra", '{"logger": {"wandb": {"key": "PW-444"}}}']))
