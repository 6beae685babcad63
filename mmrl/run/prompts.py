"""Prompt rendering both backends share: a row's chat-templated prompt (`encode_prompt`) and the start-up checks of
prompts with images (`task_has_images`, `check_prompts`). Tokenizer and processor only, no model. A multi-turn
episode's chat-template pieces are `mmrl.envs.episode.TurnRenderer`.
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
