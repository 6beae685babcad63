"""Prompt rendering both backends share: a row's chat-templated prompt (`encode_prompt`), the chat-template pieces of
a multi-turn episode (`TurnRenderer`), and the start-up checks of prompts with images (`task_has_images`,
`check_prompts`). Tokenizer and processor only: no model, so the OpenRLHF backend renders a turn exactly as the local
trainer does.
"""

from __future__ import annotations

from typing import Any

from mmrl.errors import UserError
from mmrl.tasks.base import sample_place
from mmrl.vision.images import has_images
from mmrl.vision.processor import VisionProcessor

# A prompt longer than this many characters per allowed token is first measured on that prefix: the prefix's token
# count, less a few tokens for the word cut at its end, is a lower bound of the whole prompt's.
PREFIX_CHARS_PER_TOKEN = 64
PREFIX_SLACK_TOKENS = 8


def encode_prompt(tokenizer, messages: list[dict], max_prompt_tokens: int) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:  # a base model without a chat template: plain concatenation
        text = "\n".join(m["content"] for m in messages) + "\n"
    cut = PREFIX_CHARS_PER_TOKEN * (max_prompt_tokens + 1)
    if len(text) > cut:  # a huge prompt (a 10 MB row): its prefix alone proves it too long, in milliseconds
        head = len(tokenizer(text[:cut], add_special_tokens=False)["input_ids"])
        if head > max_prompt_tokens + PREFIX_SLACK_TOKENS:
            raise UserError(f"rollout.max_prompt_tokens: a prompt has more than {head - PREFIX_SLACK_TOKENS} tokens "
                             f"({len(text)} characters), more than {max_prompt_tokens}")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) > max_prompt_tokens:
        raise UserError(f"rollout.max_prompt_tokens: a prompt has {len(ids)} tokens, more than {max_prompt_tokens}")
    return ids



_USER_SLOT, _ASSISTANT_SLOT = "\x00USER\x00", "\x00ASSISTANT\x00"


class TurnRenderer:
    """The chat-template pieces of an episode, derived once from the tokenizer's own template.

    ``prompt_ids(first_observation)`` is the chat-templated first user turn with the generation prompt.
    ``feedback_ids(observation, closed)`` is what follows a model turn: the rest of the template's end-of-turn (after
    the stop token the model emitted, when ``closed``), the observation as a user turn, and the next assistant header.
    Derived by rendering a placeholder conversation, so any ChatML-like template works (Qwen, SmolLM2, ...); a
    template that re-renders earlier turns differently (e.g. strips reasoning) does not matter, since the sequence is
    built from tokens, never re-rendered.
    """

    def __init__(self, tokenizer, system_prompt: str | None = None):
        self.tokenizer = tokenizer
        self.system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        if not getattr(tokenizer, "chat_template", None):
            raise UserError("multi-turn tasks need a tokenizer with a chat template")
        base = self.system + [{"role": "user", "content": "u"}, {"role": "assistant", "content": _ASSISTANT_SLOT}]
        closed = self._render(base, generation_prompt=False)
        extended = self._render(base + [{"role": "user", "content": _USER_SLOT}], generation_prompt=True)
        if not extended.startswith(closed) or _USER_SLOT not in extended[len(closed):]:
            raise UserError("the tokenizer's chat template does not render a conversation as a prefix of its "
                             "continuation; multi-turn episodes need one that does")
        end_of_turn = closed[closed.index(_ASSISTANT_SLOT) + len(_ASSISTANT_SLOT):]
        before, _, after = extended[len(closed):].partition(_USER_SLOT)
        self.end_of_turn = end_of_turn  # e.g. "<|im_end|>\n"
        self.before_observation, self.after_observation = before, after

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt_ids(self, first_observation: str) -> list[int]:
        return self.encode(self._render(self.system + [{"role": "user", "content": first_observation}], True))

    def feedback_ids(self, observation: str, stop_text: str | None) -> list[int]:
        """Tokens after a model turn. ``stop_text``: the decoded stop token the turn ended with (None: cut short)."""
        tail = self.end_of_turn
        if stop_text and tail.startswith(stop_text):
            tail = tail[len(stop_text):]  # the model already closed its turn with the template's own stop token
        return self.encode(tail + self.before_observation + observation + self.after_observation)


def task_has_images(task: Any, probe: int = 32) -> bool:
    """True when the task's rows carry images (the first ``probe`` rows of either split are looked at)."""
    return any(has_images(row) for rows in (task.train, task.eval) for row in rows[:probe])


def check_prompts(task: Any, processor: VisionProcessor, max_prompt_tokens: int, max_checked: int = 50_000) -> None:
    """Fail at start, naming the row, on an unreadable image or a prompt longer than ``max_prompt_tokens``."""
    for split, rows in (("train", task.train), ("eval", task.eval)):
        for i, row in enumerate(rows[:max_checked]):
            where = f"{task.name} {sample_place(row, split, i)}"
            length = processor.prompt_length(row, where)
            if length > max_prompt_tokens:
                raise UserError(f"rollout.max_prompt_tokens: {where} has {length} prompt tokens (images included), "
                                 f"more than {max_prompt_tokens}; raise it, lower model.max_pixels or filter the data")
