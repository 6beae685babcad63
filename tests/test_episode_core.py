"""mmrl/envs/episode.py, the episode core every driver keeps its books with (the local trainer's, the openrlhf turn
executor, the OpenRLHF agent file): what a step, a budget and a failure do to an episode, and the chat pieces of a
template that is not ChatML. No engine or model: the drivers' own tests play real games."""

from __future__ import annotations

import pytest

from mmrl.envs.base import EnvError, StepResult
from mmrl.envs.episode import EpisodeRecord, TurnRenderer


def test_steps_count_rewards_penalties_anchors_and_the_end():
    record = EpisodeRecord()
    record.started("You are in a room. Your task is to: put a mug in the sink.",
                   {"task_type": "pick_and_place_simple", "anchor": "room"})
    assert (record.task_type, record.anchor, record.outcome) == ("pick_and_place_simple", "room", "")
    penalty = record.stepped(StepResult("Nothing happens.", -0.1, False,
                                        {"action_valid": False, "format_ok": False, "penalty": 0.1}))
    assert penalty == 0.1 and record.anchor == "Nothing happens." and record.outcome == ""  # no anchor: the text
    assert record.stepped(StepResult("You pick up the mug.", 0.0, False,
                                     {"action_valid": True, "format_ok": True, "anchor": "holding mug"})) == 0.0
    assert record.anchor == "holding mug"
    record.stepped(StepResult("You win.", 10.0, True, {"action_valid": True, "format_ok": True, "won": True,
                                                       "anchor": "after"}))
    assert record.won and record.outcome == "done" and record.anchor == "holding mug"  # the last turn's state
    assert record.rewards == [-0.1, 0.0, 10.0] and record.steps == 3
    summary = record.summary(tokens=120)
    assert summary["return"] == pytest.approx(9.9) and summary["tokens"] == 120
    assert summary["valid_action_rate"] == pytest.approx(2 / 3) and summary["format_rate"] == pytest.approx(2 / 3)
    assert record.logs(turns=3) == {"won": 1.0, "env_failed": 0.0, "turns": 3.0, "format_rate": pytest.approx(2 / 3),
                                    "valid_action_rate": pytest.approx(2 / 3), "episode_truncated": 0.0}


def test_budgets_fail_a_first_prompt_and_truncate_a_later_one():
    first = EpisodeRecord()
    assert first.fits(99, 100, first=True)
    assert not first.fits(100, 100, first=True, budget_name="max_episode_tokens")
    assert first.outcome == "failed" and first.error == "the first prompt has 100 tokens, max_episode_tokens is 100"
    later = EpisodeRecord()
    assert not later.fits(150, 100) and (later.outcome, later.error) == ("truncated", "")
    assert later.logs(turns=2)["episode_truncated"] == 1.0


def test_a_failure_names_the_env_error_and_an_unknown_outcome_is_a_bug():
    record = EpisodeRecord()
    record.fail(EnvError("game file not found"))
    assert (record.outcome, record.error) == ("failed", "EnvError: game file not found")
    assert record.logs(turns=0)["env_failed"] == 1.0
    with pytest.raises(ValueError, match="got 'lost'"):
        record.end("lost")


class Tokenizer:
    """A tokenizer whose chat template is not ChatML (one character per token): the pieces come from the template."""

    chat_template = "[[turns]]"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        text = "".join(f"<{m['role']}>{m['content']}</s>\n\n" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


def test_chat_pieces_come_from_the_tokenizers_template():
    renderer = TurnRenderer(Tokenizer(), "Be brief.")
    assert renderer.prompt_text("look around") == "<system>Be brief.</s>\n\n<user>look around</s>\n\n<assistant>"
    assert renderer.stop_text == "</s>"
    assert renderer.closes_turn("<action>look</action></s>") == "</s>" and renderer.closes_turn("cut sho") is None
    closed, cut = renderer.feedback_text("a room", "</s>"), renderer.feedback_text("a room", None)
    assert closed == "\n\n<user>a room</s>\n\n<assistant>" and cut == "</s>" + closed
    assert renderer.feedback_ids("a room", "</s>") == [ord(c) for c in closed]
