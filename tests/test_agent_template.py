"""The embedded agent model's tool-calling chat template: plain chats render as before, tool calls round-trip."""

from __future__ import annotations

import pytest

pytest.importorskip("alfworld")  # the agent tokenizer is trained on ALFWorld's vocabulary

from mmrl.cache import EMBEDDED_AGENT_NAME  # noqa: E402
from mmrl.models import load_tokenizer  # noqa: E402
from mmrl.models.recipes.embedded import CHAT_TEMPLATE  # noqa: E402


def act(action: str) -> str:
    """
    Take one action in the game.

    Args:
        action: An admissible action.
    """
    return action


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(EMBEDDED_AGENT_NAME)


@pytest.mark.parametrize("generation_prompt", [True, False])
def test_plain_chats_render_as_with_the_plain_template(tokenizer, generation_prompt):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "go"},
                {"role": "assistant", "content": "<think>x</think><action>look</action>"}]
    for chat in (messages, messages[1:]):
        assert tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=generation_prompt) == \
            tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=generation_prompt,
                                          chat_template=CHAT_TEMPLATE)


def test_tool_calls_render_and_parse_back(tokenizer):
    call = {"type": "function", "function": {"name": "act", "arguments": {"action": "go to desk 1"}}}
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "play"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "act", "content": "You arrive at desk 1."}]
    text = tokenizer.apply_chat_template(chat, tools=[act], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n") and '"name": "act"' in text
    assert '<tool_call>\n{"name": "act", "arguments": {"action": "go to desk 1"}}\n</tool_call><|im_end|>' in text
    assert text.endswith("<|im_start|>tool\nYou arrive at desk 1.<|im_end|>\n<|im_start|>assistant\n")
    prefix = tokenizer(text, add_special_tokens=False)["input_ids"]
    reply = '<tool_call>\n{"name": "act", "arguments": {"action": "take key 1"}}\n</tool_call><|im_end|>'
    parsed = tokenizer.parse_response(tokenizer(reply, add_special_tokens=False)["input_ids"], prefix=prefix,
                                      tools=[act])
    assert parsed["tool_calls"] == [{"type": "function", "function": {"name": "act",
                                                                      "arguments": {"action": "take key 1"}}}]
    plain = tokenizer.parse_response(tokenizer("I look.<|im_end|>", add_special_tokens=False)["input_ids"],
                                     prefix=prefix)
    assert plain == {"role": "assistant", "content": "I look."}
