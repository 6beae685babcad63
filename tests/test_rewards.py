"""Rewards: hand-made cases with the real math-verify, and hypothesis fuzzing of every parser."""

from __future__ import annotations

import math
import os
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmrl.rewards import REWARDS, Reward, RewardResult, get_reward, reward, weighted
from mmrl.rewards.text import extract_answer, extract_boxed

acc = get_reward("math_accuracy")
fmt = get_reward("think_answer_format")


@pytest.mark.parametrize("completion,answer,score", [
    ("<think>2+2</think><answer>4</answer>", "4", 1.0),
    ("<answer> 4 </answer>", "4", 1.0),
    ("<answer>\\frac{1}{2}</answer>", "0.5", 1.0),
    ("<answer>1/2</answer>", "\\frac{1}{2}", 1.0),
    ("so the result is \\boxed{\\sqrt{2}}", "\\sqrt{2}", 1.0),
    ("<answer>\\boxed{12}</answer>", "12", 1.0),
    ("<answer>5</answer>", "4", 0.0),
    ("4", "4", 0.0),  # no tag and no box: not an answer
    ("<answer></answer>", "4", 0.0),
    ("<answer>x^2+2x+1</answer>", "(x+1)^2", 1.0),
])
def test_math_accuracy_on_hand_made_cases(completion, answer, score):
    [result] = acc([completion], [{"answer": answer}])
    assert result.score == score
    if score == 0:
        assert result.reason


def test_zero_scores_carry_a_reason():
    results = acc(["nothing here", "<answer>7</answer>"], [{"answer": "4"}, {"answer": "4"}])
    assert results[0].reason and "no <answer>" in results[0].reason
    assert results[1].reason == "answer is wrong"


def test_format_reward():
    assert fmt(["<think>a</think> <answer>b</answer>"], [{}])[0].score == 1.0
    assert fmt(["<think>a</think><answer>b</answer> trailing"], [{}])[0].score == 0.0
    assert fmt(["<answer>b</answer>"], [{}])[0].score == 0.0
    answer_only = get_reward("answer_format")
    assert answer_only(["<answer>3</answer>"], [{}])[0].score == 1.0
    assert answer_only(["<answer>3</answer><answer>4</answer>"], [{}])[0].score == 0.0


def test_think_close_format_is_open_rs_check_for_a_prefilled_think_tag():
    """CW-GRPO's App. C / Open-RS format_reward: the chat template of R1-Distill pre-fills <think>, so a completion
    holds only the closing tag; exactly one ``\\n</think>\\n`` scores 1, and the R1-V check would score it 0."""
    close = get_reward("think_close_format")
    completion = "Let me add.\n2 + 2 = 4.\n</think>\n\nThe answer is \\boxed{4}."
    assert close([completion], [{}])[0].score == 1.0
    assert fmt([completion], [{}])[0].score == 0.0  # the whole-shape check cannot see the pre-filled <think>
    assert close(["no closing tag, \\boxed{4}"], [{}])[0].score == 0.0
    assert close(["a</think>b"], [{}])[0].score == 0.0  # the tag must stand on its own line
    [twice] = close(["a\n</think>\nb\n</think>\n"], [{}])
    assert twice.score == 0.0 and "found 2" in twice.reason


def test_weighted_combination_keeps_components_and_range():
    combo = weighted([(acc, 1.0), (fmt, 0.5)])
    assert (combo.low, combo.high) == (0.0, 1.5)
    [r] = combo(["<think>x</think><answer>4</answer>"], [{"answer": "4"}])
    assert r.score == 1.5 and r.components == {"math_accuracy": 1.0, "think_answer_format": 1.0}


def test_a_raising_reward_scores_the_floor_with_the_exception_as_reason():
    @reward("explodes_on_b", register=False)
    def explodes(completion, sample):
        if "b" in completion:
            raise RuntimeError("boom")
        return 1.0

    results = explodes(["a", "b"], [{}, {}])
    assert results[0].score == 1.0
    assert results[1].score == 0.0 and "RuntimeError: boom" in results[1].reason


def test_non_finite_and_out_of_range_scores_are_contained():
    bad = Reward("bad", 0.0, 1.0, lambda c, s: [RewardResult(float("nan")), RewardResult(3.0),
                                                 RewardResult(float("inf"))])
    results = bad(["x", "y", "z"], [{}, {}, {}])
    assert [r.score for r in results] == [0.0, 1.0, 0.0]
    assert all(r.reason for r in results)


def test_whole_batch_failure_is_contained():
    def broken_batch(completions, samples):
        raise MemoryError("reward server down")

    results = Reward("rm", -1.0, 1.0, broken_batch)(["a", "b"], [{}, {}])
    assert [r.score for r in results] == [-1.0, -1.0] and "reward server down" in results[0].reason


TEXT = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=300)
PIECES = ["<think>", "</think>", "<answer>", "</answer>", "\\boxed{", "{", "}", "1", "x", "\\frac{1}{2}", " ", "$",
          "\\", "^", "=", "sqrt", "(", ")"]
TAGGY = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(completion=st.one_of(TEXT, TAGGY), answer=st.one_of(TEXT, TAGGY, st.just("4")))
def test_every_registered_reward_never_raises_and_stays_in_range(completion, answer):
    for r in REWARDS.values():
        [result] = r([completion], [{"answer": answer}])
        assert r.low <= result.score <= r.high
        assert math.isfinite(result.score)


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(TEXT, TAGGY))
def test_answer_parsers_never_raise(text):
    out = extract_answer(text)
    assert out is None or isinstance(out, str)
    boxed = extract_boxed(text)
    assert boxed is None or isinstance(boxed, str)


def test_reward_model_scorer_on_a_tiny_local_model(tmp_path):
    """A learned reward model as reward source (the GVPO paper's App. C), with a tiny classifier built from config."""
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from mmrl.models.recipes.embedded import train_tokenizer
    from mmrl.rewards import RewardModelScorer

    tok = train_tokenizer()
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, num_labels=1, pad_token_id=tok.pad_token_id)
    Qwen2ForSequenceClassification(cfg).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    scorer = RewardModelScorer(str(tmp_path), batch_size=2, score_clip=0.05)
    samples = [{"prompt_text": "Summarise: the cat sat."}] * 3
    raw = scorer.scores(["a cat sat", "dog", "the cat sat on the mat"], samples)
    assert len(set(round(s, 6) for s in raw)) == 3  # different texts, different scores
    rm = scorer.as_reward()
    results = rm(["a cat sat", "dog", "the cat sat on the mat"], samples)
    assert all(-0.05 <= r.score <= 0.05 for r in results)
    again = RewardModelScorer(str(tmp_path), batch_size=3).scores(["a cat sat", "dog", "the cat sat on the mat"],
                                                                  samples)
    assert again == pytest.approx(raw, abs=1e-5)  # batch composition (padding) does not change a score


def test_nested_weighted_rewards_keep_inner_components():
    inner = weighted([(acc, 1.0), (fmt, 0.5)], "task")
    outer = weighted([(inner, 1.0), (get_reward("answer_format"), 2.0)], "task+extra")
    [r] = outer(["<think>x</think><answer>4</answer>"], [{"answer": "4"}])
    assert r.components["math_accuracy"] == 1.0 and r.components["think_answer_format"] == 1.0
    assert r.components["task"] == 1.5 and r.score == 3.5


@pytest.mark.parametrize("answer,score", [
    ("<answer>3+5</answer>", 1.0), ("<answer>5+3</answer>", 1.0), ("<answer>(5)+(3)</answer>", 1.0),
    ("<answer>3*5</answer>", 0.0), ("<answer>8</answer>", 0.0), ("<answer>3+5+0</answer>", 0.0),
    ("<answer>0x3+5</answer>", 0.0), ("<answer>__import__('os')</answer>", 0.0), ("<answer>9**9**9</answer>", 0.0),
    ("<answer>" + "(" * 150 + "3+5" + ")" * 150 + "</answer>", 0.0), ("no tags", 0.0),
])
def test_countdown_reward(answer, score):
    [r] = get_reward("countdown")([answer], [{"numbers": [3, 5], "target": 8}])
    assert r.score == score and (score == 1.0 or r.reason)


def test_same_score_key_runs_the_reward_once_per_distinct_key():
    calls = []

    @reward("test_same_score", 0.0, 1.0, register=False, same_score=lambda text, sample: (text.strip(), sample["a"]))
    def counted(text, sample):
        calls.append(text)
        return float(text.strip() == sample["a"])

    results = counted(["1", " 1", "2", "1", "x"], [{"a": "1"}, {"a": "1"}, {"a": "1"}, {"a": "2"}, {"a": "1"}])
    assert [r.score for r in results] == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert len(calls) == 4  # " 1" with gold "1" shares "1"'s key


def test_math_accuracy_scores_repeated_answers_alike():
    texts = ["<answer>4</answer>", "<answer>2+2</answer>", "<answer>4</answer>", "<answer>5</answer>"]
    results = get_reward("math_accuracy")(texts, [{"answer": "4"}] * 3 + [{"answer": "5"}])
    assert [r.score for r in results] == [1.0, 1.0, 1.0, 1.0]


def slow_check(predicted: str, gold: str) -> tuple[bool, str | None]:
    """A verifier that never finishes in time (module level: the spawned child imports it)."""
    import time

    time.sleep(60)
    return True, None


def equal_check(predicted: str, gold: str) -> tuple[bool, str | None]:
    print("a verifier may print: not an answer")  # the child's answers are a stream of their own
    return predicted == gold, None if predicted == gold else "answer is wrong"


def test_an_overrunning_verifier_is_stopped_and_the_next_call_gets_a_new_one():
    """Off the main thread math-verify runs in a child process: one that overruns is killed at the bound and scores
    0 with a reason; the next call is served by a fresh child."""
    import time

    from mmrl.rewards.verifier_process import IsolatedVerifier

    stuck = IsolatedVerifier(slow_check, timeout=5)
    started = time.monotonic()
    assert stuck("1", "1") == (False, "verifier timed out after 5 s")
    assert time.monotonic() - started < 30
    stuck.check, stuck.timeout = equal_check, 60  # the next child runs this one (60 s: it has to start first)
    assert stuck("2", "2") == (True, None) and stuck("2", "3") == (False, "answer is wrong")
    stuck.close()


def test_math_accuracy_off_the_main_thread_is_bounded_and_still_right():
    """A power tower makes sympy build a 10^10-digit number and hold the GIL; from a worker thread (an asyncio
    executor, a trainer's thread pool) it used to hang for good. It now scores 0 with a reason within the bound, and
    ordinary answers are still verified."""
    import concurrent.futures
    import time

    from mmrl.rewards.text import VERIFY_SECONDS

    accuracy = get_reward("math_accuracy")
    cases = [("<answer>10^{10^{10^{10}}}</answer>", "7"), ("<answer>\\frac{1}{2}</answer>", "0.5"),
             ("<answer>3</answer>", "4")]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        results = pool.submit(lambda: accuracy([c for c, _ in cases], [{"answer": a} for _, a in cases])).result()
    assert time.monotonic() - started < 3 * VERIFY_SECONDS + 30
    assert [r.score for r in results] == [0.0, 1.0, 0.0] and results[0].reason


def test_answer_format_refuses_nested_tags():
    [result] = get_reward("answer_format")(["<answer><answer>7</answer></answer>"], [{"answer": "7"}])
    assert (result.score, result.reason) == (0.0, "nested tags")
    [result] = get_reward("answer_format")(["<answer>7</answer>"], [{"answer": "7"}])
    assert result.score == 1.0


def test_think_boxed_check_is_linear_on_adversarial_completions():
    # the earlier pattern backtracked over every split of its three ``.*``: minutes on these 100 KB completions
    script = ("import time; from mmrl.rewards.geometry import think_then_boxed\n"
              "texts = ['<think>' + '</think>\\\\boxed{' * 7000, '<think>' + '</think>' * 12500,\n"
              "         ' ' * 50_000 + '<think>' + '\\\\boxed{' * 7000,\n"
              "         '<think>' + 'x</think>\\\\boxed{}' * 6000 + '{']\n"
              "start = time.perf_counter(); results = [think_then_boxed(t) for t in texts]\n"
              "print(results, time.perf_counter() - start)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    results, seconds = out.stdout.rsplit("]", 1)
    assert results + "]" == "[False, False, False, True]" and float(seconds) < 1.0


def test_think_boxed_check_agrees_with_the_pattern_it_replaces():
    from mmrl.rewards.geometry import think_then_boxed

    pattern = re.compile(r"^\s*<think>.*?</think>.*\\boxed\{.*\}.*$", re.DOTALL)
    pieces = ["<think>", "</think>", "\\boxed{", "\\boxed", "}", "{", " ", "\n", "x", "<think", "\u2003"]
    rng = random.Random(0)

    def junk() -> str:
        return "".join(rng.choice(pieces) for _ in range(rng.randrange(4)))

    texts = ["".join(rng.choice(pieces) for _ in range(rng.randrange(12))) for _ in range(10_000)]
    for _ in range(10_000):  # the four parts in order with junk between, one of them sometimes left out
        parts = ["<think>", "</think>", "\\boxed{", "}"]
        if rng.random() < 0.3:
            parts.pop(rng.randrange(4))
        texts.append(junk() + "".join(part + junk() for part in parts))
    texts += ["<think>a</think> so \\boxed{3}", "\\boxed{3}", "<think>a</think> \\boxed{}",
              " \n<think></think>\\boxed{}"]
    differ = [t for t in texts if think_then_boxed(t) != bool(pattern.match(t))]
    assert not differ, differ[:5]
    assert 3000 < sum(think_then_boxed(t) for t in texts) < 17_000  # both outcomes are well represented


@pytest.mark.parametrize("predicted,gold,score", [
    ("1000", "1e3", 1.0), ("3e", "1e3", 0.0), ("1000", "$1E3$", 1.0), ("1e3", "1000", 1.0),
    ("0.00001", "1e-05", 1.0), ("1e-05", "0.00001", 1.0), ("150", "1.5E+2", 1.0), ("-2e3", "-2000", 1.0),
    ("10^{400}", "1e400", 1.0), ("1e401", "1e400", 0.0),
    # real expressions with Euler's number stay what they are
    ("2e", "2e", 1.0), ("2e", "1e3", 0.0), ("e^{2}", "e^2", 1.0), ("3e-x", "3e-x", 1.0), ("3e - x", "3e-x", 1.0),
    ("3e-2", "3e-x", 0.0),
])
def test_numbers_in_e_notation_are_scored_as_the_numbers_they_write(predicted, gold, score):
    [result] = acc([f"<answer>{predicted}</answer>"], [{"answer": gold}])
    assert result.score == score, (predicted, gold, result.reason)


def test_math_accuracy_from_a_thread_of_a_script_without_a_main_guard_runs_the_script_once(tmp_path):
    """The off-main-thread verifier is a fresh interpreter, not a multiprocessing child: a spawned child re-ran the
    caller's script (twice its set-up, and a correct answer scored 0 when that set-up outlasted the bound)."""
    script = tmp_path / "score.py"
    script.write_text(textwrap.dedent(f"""
        import concurrent.futures, os
        from mmrl.rewards import get_reward
        with open({str(tmp_path / "runs.txt")!r}, "a") as out:
            out.write(f"{{os.getpid()}}\\n")
        accuracy = get_reward("math_accuracy")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            [result] = pool.submit(accuracy, ["<answer>2+2</answer>"], [{{"answer": "4"}}]).result()
        print(result.score, result.reason)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1.0 None"
    assert len((tmp_path / "runs.txt").read_text().splitlines()) == 1


def test_a_check_the_child_cannot_import_is_refused():
    from mmrl.rewards.verifier_process import IsolatedVerifier

    with pytest.raises(TypeError, match="top level of an importable module"):
        IsolatedVerifier(lambda p, g: (True, None), timeout=5)("1", "1")


@pytest.mark.parametrize("name,completion,single,sample", [
    ("math_accuracy", "<answer>3</answer><answer>4</answer>", "<answer>4</answer>", {"answer": "4"}),
    ("math_accuracy", "<answer>4</answer> or <answer>3</answer>", "<answer>4</answer>", {"answer": "4"}),
    ("math_accuracy", "<answer>\\boxed{3}\\boxed{4}</answer>", "<answer>\\boxed{4}</answer>", {"answer": "4"}),
    ("geoqa_accuracy", "<think>t</think><answer>30°</answer><answer>60°</answer>",
     "<think>t</think><answer>60°</answer>", {"answer": "60°"}),
    ("countdown", "<answer>3+5</answer><answer>5+3</answer>", "<answer>5+3</answer>",
     {"numbers": [3, 5], "target": 8}),
    ("think_boxed_format", "<think>t</think> \\boxed{4} \\boxed{5}", "<think>t</think> \\boxed{4}", {"answer": "4"}),
    ("classification_match", "<answer>cat</answer><answer>dog</answer>", "<answer>dog</answer>", {"answer": "dog"}),
    ("choice_match", "<answer>A</answer><answer>B</answer>", "<answer>B</answer>",
     {"answer": "B", "options": ["x", "y"]}),
])
def test_several_answers_score_zero_with_the_reason(name, completion, single, sample):
    """Paying a completion that lists candidates whenever one of them is right is a reward a policy learns to game."""
    [r] = get_reward(name)([completion], [sample])
    assert r.score == 0.0 and ("several" in r.reason or "<answer> tags" in r.reason), r.reason
    [alone] = get_reward(name)([single], [sample])  # the right answer alone is paid
    assert alone.score > 0, alone.reason


def test_free_reasoning_keeps_the_last_boxed_answer():
    """Without <answer> tags the last \\boxed{} is the answer (verl's and OpenRLHF's rule): a correction counts."""
    [r] = get_reward("math_accuracy")(["so \\boxed{3}. Wait, no: \\boxed{4}"], [{"answer": "4"}])
    assert r.score == 1.0
