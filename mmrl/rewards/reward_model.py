"""A learned reward model as a reward source (the GVPO paper's App. C uses one for summarisation).

Any Hugging Face sequence-classification checkpoint works: its first logit on (prompt, completion) is the score.
Scores are clipped to ``[-score_clip, score_clip]`` so that the declared range is finite and one outlier cannot
dominate a group; a non-finite score becomes the floor with a reason (the `Reward` wrapper does that).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from mmrl.errors import UserError
from mmrl.rewards.base import Reward, RewardResult, Sample


class RewardModelScorer:
    def __init__(self, path: str, batch_size: int = 16, max_length: int = 1024, score_clip: float = 10.0,
                 device: str = "cpu", prompt_key: str = "prompt_text"):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from mmrl.hub import locate_path_or_hub_id

        where = path if os.path.isdir(os.path.expanduser(path)) else locate_path_or_hub_id(path, "task.reward_model")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(os.path.expanduser(where))
            self.model = AutoModelForSequenceClassification.from_pretrained(os.path.expanduser(where))
        except (OSError, ValueError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UserError(f"task.reward_model: cannot load {path!r}: {first}") from None
        from mmrl.chat_template import check_tokenizer_template

        check_tokenizer_template(self.tokenizer, os.path.expanduser(where))
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = self.model.to(device).eval()
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.batch_size, self.max_length, self.score_clip = batch_size, max_length, score_clip
        self.device, self.prompt_key = device, prompt_key

    def _text(self, completion: str, sample: Sample) -> str:
        prompt = str(sample.get(self.prompt_key) or sample.get("problem") or "")
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}], tokenize=False)
        return prompt + "\n" + completion

    @torch.no_grad()
    def scores(self, completions: Sequence[str], samples: Sequence[Sample]) -> list[float]:
        texts = [self._text(c, s) for c, s in zip(completions, samples, strict=True)]
        out: list[float] = []
        for i in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(texts[i : i + self.batch_size], return_tensors="pt", padding=True, truncation=True,
                                 max_length=self.max_length).to(self.device)
            logits = self.model(**enc).logits[:, 0].float()
            out.extend(logits.tolist())
        return out

    def as_reward(self, name: str = "reward_model") -> Reward:
        clip = self.score_clip

        def batch(completions: Sequence[str], samples: Sequence[Sample]) -> list[RewardResult]:
            results = []
            for s in self.scores(completions, samples):
                clipped = min(max(s, -clip), clip)
                results.append(RewardResult(clipped, None if clipped == s else f"reward model score {s:.3g} clipped"))
            return results

        return Reward(name, -clip, clip, batch)
