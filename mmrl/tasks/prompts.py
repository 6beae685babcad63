"""How a text task's question becomes a chat: an optional system prompt, an optional one-shot example, the question.

The trainer renders the chat through the model's own chat template (`mmrl.run.prompts.encode_prompt`), so the same
rows serve every model. Two audiences want different chats:

* The embedded tiny models were pre-trained on the bare question (``Compute 3+4. Answer in <answer></answer> tags.``
  as the only user turn); the task defaults keep exactly that, so their recipes and learning figures stand.
* A real instruct model (SmolLM2-135M-Instruct) does not follow the bare question: it answers ``3 + 4 = 7`` with no
  tags, or wanders when sampled, and scores 0. A system prompt that names the format plus one solved example turn
  (the calculation, then the tagged answer) gets it to answer in format: docs/real-model.md has the measurements.
  Tasks register that as their ``pretrained_options`` (`mmrl.tasks.base.register_task`), which the build applies to
  any model that is not embedded unless the user set the options.
"""

from __future__ import annotations

from typing import Any


def chat(question: str, system_prompt: str = "", example: tuple[str, str] | None = None) -> list[dict[str, Any]]:
    """``[system?] [user example, assistant example]? user question`` as chat messages."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    if example is not None:
        messages += [{"role": "user", "content": example[0]}, {"role": "assistant", "content": example[1]}]
    messages.append({"role": "user", "content": question})
    return messages


def worked_answer(calculation: str, answer: str) -> str:
    """The one-shot example's reply: the calculation on one line, then the tagged answer (the measured best form for
    a small instruct model: writing the sum first raises its accuracy, see docs/real-model.md)."""
    return f"{calculation}\n<answer>{answer}</answer>"
