"""What every driver of a multi-turn episode shares: its chat turns and its bookkeeping.

An episode is played by one of several drivers (the local trainer's batched driver, the openrlhf backend's turn-layout
executor, the agent file OpenRLHF's own executor loads); each plays the env its own way (batched, one request at a
time, through OpenRLHF's loop) but they must all make the same training samples from the same episode. So the parts
that decide what a sample holds live here, once:

* :class:`TurnRenderer`: the chat-template pieces of an episode (the first prompt, the feedback after a model turn),
  derived from the tokenizer's own chat template rather than hard-coded markers;
* :class:`EpisodeRecord`: the episode's outcome (``done``, ``truncated``, ``failed``), its step rewards, its counters
  (valid actions, well-formed turns), the anchor state GiGPO groups turns by, the invalid-action penalty of a step,
  and what the episode reports (its summary and the logs of OpenRLHF's response).

Nothing here imports a backend or torch: the drivers import this, never the other way round.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mmrl.envs.base import StepResult
from mmrl.errors import UserError

_USER_SLOT, _ASSISTANT_SLOT = "\x00USER\x00", "\x00ASSISTANT\x00"
OUTCOMES = ("done", "truncated", "failed")


class TurnRenderer:
    """The chat-template pieces of an episode, derived once from the tokenizer's own template.

    ``prompt_text(first_observation)`` is the chat-templated first user turn with the generation prompt.
    ``feedback_text(observation, stop_text)`` is what follows a model turn: the rest of the template's end-of-turn
    (after the stop token the model emitted, when it did), the observation as a user turn, and the next assistant
    header. ``prompt_ids`` / ``feedback_ids`` are their tokens. Derived by rendering a placeholder conversation, so
    any ChatML-like template works (Qwen, SmolLM2, ...); a template that re-renders earlier turns differently (e.g.
    strips reasoning) does not matter, since an episode is built from these pieces, never re-rendered.
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

    def prompt_text(self, first_observation: str) -> str:
        return self._render(self.system + [{"role": "user", "content": first_observation}], True)

    def prompt_ids(self, first_observation: str) -> list[int]:
        return self.encode(self.prompt_text(first_observation))

    @property
    def stop_text(self) -> str:
        """The token text that closes a turn in this template (``<|im_end|>``): its end of turn without the layout."""
        return self.end_of_turn.strip()

    def closes_turn(self, turn_text: str) -> str | None:
        """The template's stop text when ``turn_text`` ends with it (the model closed its turn), else None."""
        return self.stop_text if self.stop_text and turn_text.endswith(self.stop_text) else None

    def feedback_text(self, observation: str, stop_text: str | None) -> str:
        """Text after a model turn. ``stop_text``: the decoded stop token the turn ended with (None: cut short)."""
        tail = self.end_of_turn
        if stop_text and tail.startswith(stop_text):
            tail = tail[len(stop_text):]  # the model already closed its turn with the template's own stop token
        return tail + self.before_observation + observation + self.after_observation

    def feedback_ids(self, observation: str, stop_text: str | None) -> list[int]:
        return self.encode(self.feedback_text(observation, stop_text))


@dataclasses.dataclass(kw_only=True)
class EpisodeRecord:
    """An episode's bookkeeping, kept the same way by every driver: call :meth:`started` after the env's reset,
    :meth:`stepped` after each step, :meth:`end` when the driver stops it (the token budget, an env failure)."""

    rewards: list[float] = dataclasses.field(default_factory=list)  # per env step
    valid_actions: int = 0
    well_formed: int = 0
    task_type: str = ""
    won: bool = False
    outcome: str = ""  # "" while running; then "done" | "truncated" | "failed"
    error: str = ""  # why it failed
    anchor: str = ""  # the state the next turn is taken in (GiGPO's anchor): the env's info["anchor"], else the text

    @property
    def steps(self) -> int:
        return len(self.rewards)

    def end(self, outcome: str, error: str = "") -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"an episode ends {' | '.join(OUTCOMES)}, got {outcome!r}")
        self.outcome, self.error = outcome, error

    def fail(self, error: Exception | str) -> None:
        """End as failed: the env raised (``EnvError``) or could not start; the run goes on without its data."""
        self.end("failed", f"EnvError: {error}" if isinstance(error, Exception) else error)

    def started(self, observation: str, info: dict[str, Any]) -> None:
        self.task_type = str(info.get("task_type", ""))
        self.anchor = str(info.get("anchor", observation))

    def stepped(self, result: StepResult) -> float:
        """Record one env step; returns its invalid-action penalty (``info["penalty"]``, the part of its reward that
        penalises the action's form). A finished episode ends ``done``; otherwise the anchor moves on."""
        info = result.info
        self.rewards.append(float(result.reward))
        self.valid_actions += bool(info.get("action_valid", False))
        self.well_formed += bool(info.get("format_ok", False))
        self.task_type = str(info.get("task_type", self.task_type))
        if result.done:
            self.won = bool(info.get("won", False))
            self.end("done")
        else:
            self.anchor = str(info.get("anchor", result.observation))
        return float(info.get("penalty", 0.0))

    def fits(self, tokens: int, budget: int, *, first: bool = False, budget_name: str = "the budget") -> bool:
        """Whether a prompt of ``tokens`` leaves room for a turn within ``budget``; when not, the episode ends: a first
        prompt that does not fit fails it (nothing was played), a later one truncates it."""
        if tokens < budget:
            return True
        if first:
            self.end("failed", f"the first prompt has {tokens} tokens, {budget_name} is {budget}")
        else:
            self.end("truncated")
        return False

    def summary(self, tokens: int = 0) -> dict[str, Any]:
        steps = max(self.steps, 1)
        return {"won": self.won, "task_type": self.task_type, "outcome": self.outcome, "steps": self.steps,
                "valid_action_rate": self.valid_actions / steps, "format_rate": self.well_formed / steps,
                "return": sum(self.rewards), "tokens": tokens, "error": self.error}

    def logs(self, turns: int) -> dict[str, float]:
        """The episode as OpenRLHF's ``extra_logs`` (numbers only): what the backend's metrics average."""
        steps = max(self.steps, 1)
        return {"won": float(self.won), "env_failed": float(self.outcome == "failed"), "turns": float(turns),
                "format_rate": self.well_formed / steps, "valid_action_rate": self.valid_actions / steps,
                "episode_truncated": float(self.outcome == "truncated")}
