"""The embedded default (its tokenizer, the shipped model), model specs, and evaluation (pass@k maths and the CLI)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mmrl.models import load_model, load_tokenizer, resolve
from mmrl.models.recipes.embedded import train_tokenizer
from mmrl.run.scoring import pass_at_k


def test_tokenizer_is_deterministic_and_qwen_like():
    a, b = train_tokenizer(), train_tokenizer()
    text = "<|im_start|>user\nCompute 12+7.<|im_end|>"
    assert a(text)["input_ids"] == b(text)["input_ids"]
    assert a.decode(a(text)["input_ids"]) == text
    assert [t for t in a.tokenize("1234")] == ["1", "2", "3", "4"]  # digits one per token, as Qwen2
    for special in ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|image_pad|>"):
        assert a.convert_tokens_to_ids(special) != a.unk_token_id


def test_embedded_model_loads_and_generates_the_format(embedded_model_dir):
    tok = load_tokenizer("embedded:tiny-qwen2")
    model = load_model("embedded:tiny-qwen2")
    assert sum(p.numel() for p in model.parameters()) < 500_000
    prompt = tok.apply_chat_template([{"role": "user", "content": "Compute 2+3. Answer in <answer></answer> tags."}],
                                     tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=12, do_sample=False, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    text = tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert text.startswith("<answer>") and text.endswith("</answer>")


def test_model_spec_errors_are_one_line(tmp_path):
    with pytest.raises(ValueError, match="no such directory"):
        resolve("./does/not/exist")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="neither config.json nor a .gguf"):
        resolve(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="no such GGUF file"):
        resolve(str(tmp_path / "model.gguf"))
    with pytest.raises(ValueError, match="model: 'nobody/no-such-model' is not a local path, and it is not in the"):
        load_model("nobody/no-such-model")  # HF_HUB_OFFLINE=1 in tests: a hub id needs a cache or network


def test_pass_at_k_estimator():
    assert pass_at_k(4, 0, 1) == 0 and pass_at_k(4, 4, 4) == 1
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - (7 * 6) / (10 * 9))


def test_eval_cli_on_a_run_directory(tmp_path, embedded_model_dir):
    run = tmp_path / "run"
    train = [sys.executable, "-m", "mmrl.train", "--steps", "1", "--out", str(run), "--rollout.prompts_per_step", "2",
             "--rollout.samples_per_prompt", "2", "--rollout.max_new_tokens", "12", "--run.progress", "false",
             "--run.plot", "false"]
    subprocess.run(train, check=True, capture_output=True, timeout=300)
    out = tmp_path / "eval.json"
    proc = subprocess.run([sys.executable, "-m", "mmrl.eval", "--model", str(run), "--k", "3",
                           "--rollout.max_new_tokens", "12", "--max-problems", "5", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["checkpoint"].endswith("step_0000001") and result["problems"] == 5
    for key in ("pass@1", "pass@3", "avg@3"):
        assert 0.0 <= result[key] <= 1.0 and key in proc.stdout
    assert result["pass@3"] >= result["pass@1"]
    bad = subprocess.run([sys.executable, "-m", "mmrl.eval", "--task", "nope"], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and bad.stderr.startswith("error: unknown task 'nope'")


def test_eval_reads_a_model_folder_as_a_model_not_as_a_run(embedded_model_dir):
    """A transformers model folder has a config.json too; only a run's config.json (our sections) makes it a run."""
    from mmrl.eval import model_from_run

    assert (embedded_model_dir / "config.json").exists()
    assert model_from_run(str(embedded_model_dir)) == (str(embedded_model_dir), None, None)


@pytest.fixture
def no_evaluation(monkeypatch):
    """Fails the test if the evaluation itself starts: --out is to be checked before it."""
    import mmrl.run.build

    def reached(*args, **kwargs):
        raise AssertionError("the evaluation started")

    monkeypatch.setattr(mmrl.run.build, "build_task", reached)


def test_eval_out_is_checked_before_the_evaluation(tmp_path, capsys, no_evaluation):
    from mmrl.eval import main
    from mmrl.run.run_dir import claim
    from mmrl.train import parse_config

    run = tmp_path / "run"
    cfg = parse_config(["--out", str(run)])
    owner = claim(cfg)
    owner.record_config(cfg, step=0)
    owner.lock.release()
    saved = (run / "config.json").read_text()
    (tmp_path / "file").write_text("x")
    (tmp_path / "old.json").write_text("{}")
    cases = {
        "does not exist": ["--out", str(tmp_path / "nope" / "eval.json")],
        "is not a folder": ["--out", str(tmp_path / "file" / "eval.json")],
        "is a folder; give a file name": ["--out", str(tmp_path)],
        "already exists; pass --overwrite-out": ["--out", str(tmp_path / "old.json")],
        "is one of the files of the mmrl run": ["--out", str(run / "config.json"), "--overwrite-out"],
        "cannot write into '/proc'": ["--out", "/proc/eval.json"],
        "--save-samples: ": ["--save-samples", str(run / "samples.jsonl"), "--overwrite-samples"],
        "--out and --save-samples both name": ["--out", str(tmp_path / "same.json"), "--save-samples",
                                               str(tmp_path / "." / "same.json")],
    }
    for message, flags in cases.items():
        assert main(flags) == 2, message
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert (run / "config.json").read_text() == saved and (tmp_path / "old.json").read_text() == "{}"
    with pytest.raises(AssertionError, match="the evaluation started"):  # asked for: on to the evaluation
        main(["--out", str(tmp_path / "old.json"), "--overwrite-out"])
    with pytest.raises(AssertionError, match="the evaluation started"):
        main(["--out", str(run / "eval.json")])  # a file of one's own beside a run's is fine


def test_eval_results_that_cannot_be_written_are_one_line(tmp_path):
    from mmrl.errors import RunError
    from mmrl.eval import write_results

    (tmp_path / "eval.json").write_text('{"earlier": 1}')
    write_results(str(tmp_path / "eval.json"), {"pass@1": 0.5}, overwrite=True)
    assert json.loads((tmp_path / "eval.json").read_text()) == {"pass@1": 0.5}
    # a file that appeared at --out during the evaluation (checked free at start) is kept without --overwrite-out
    (tmp_path / "eval.json").write_text('{"a second evaluation": 1}')
    with pytest.raises(RunError, match=r"appeared during the evaluation and was kept; the results are printed above"):
        write_results(str(tmp_path / "eval.json"), {"pass@1": 0.5})
    assert json.loads((tmp_path / "eval.json").read_text()) == {"a second evaluation": 1}
    # nor does a link there lead the write elsewhere, whatever temporary name it has
    (tmp_path / "elsewhere.txt").write_text("mine")
    for name in ("new.json", ".new.json.tmp"):
        (tmp_path / name).symlink_to(tmp_path / "elsewhere.txt")
    with pytest.raises(RunError, match="appeared during the evaluation"):
        write_results(str(tmp_path / "new.json"), {"pass@1": 0.5})
    write_results(str(tmp_path / "other.json"), {"pass@1": 0.5})
    assert (tmp_path / "elsewhere.txt").read_text() == "mine" and (tmp_path / ".new.json.tmp").is_symlink()
    with pytest.raises(RunError, match=r"--out: cannot write .* \(No such file or directory\); the results are "
                                       r"printed above"):
        write_results(str(tmp_path / "gone" / "eval.json"), {"pass@1": 0.5})
