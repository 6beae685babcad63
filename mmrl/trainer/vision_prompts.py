"""Vision prompts for the trainer and evaluation: start-up checks, a bounded cache of encoded prompts, and groups.

Text prompts are all encoded at start (cheap); image prompts are not: a GeoQA-sized set holds thousands of images
whose patches would take gigabytes. So at start every row's images are opened far enough to read their size
(a missing or corrupt image fails there, naming the row) and the exact prompt length is computed from the sizes and
the text; the pixels are processed when a prompt is first sampled and kept in a small LRU cache.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from tqdm import tqdm

from mmrl.batch import Group, Response
from mmrl.vision.processor import VisionProcessor, VisionPrompt


class PromptCache:
    """Encoded prompts of one split by row index, the ``capacity`` most recently used kept."""

    def __init__(self, processor: VisionProcessor, rows: list[dict[str, Any]], split: str, max_prompt_tokens: int,
                 capacity: int = 1024):
        self.processor, self.rows, self.split = processor, rows, split
        self.max_prompt_tokens, self.capacity = max_prompt_tokens, capacity
        self.entries: OrderedDict[int, VisionPrompt] = OrderedDict()

    def get(self, index: int) -> VisionPrompt:
        if index in self.entries:
            self.entries.move_to_end(index)
            return self.entries[index]
        prompt = self.processor.encode(self.rows[index]["messages"], f"{self.split} row {index}",
                                       self.max_prompt_tokens)
        self.entries[index] = prompt
        if len(self.entries) > self.capacity:
            self.entries.popitem(last=False)
        return prompt

    def group(self, index: int, responses: list[Response] | None = None) -> Group:
        """A group for row ``index``: its annotated sample (``coord_frame``, ``resized_hw``, ``original_hw``),
        prompt ids and images."""
        prompt = self.get(index)
        sample = self.processor.annotate(self.rows[index], prompt)
        return Group(index, sample, prompt.prompt_ids, list(responses or []), vision=prompt.inputs)


def prompts_vision(groups_and_counts: list[tuple[Group, int]]):
    """The `VisionBatch` of the prompts ``generate`` receives (each group's images repeated ``n`` times), or None
    when no group has images."""
    from mmrl.vision.inputs import VisionBatch

    rows = [g.vision for g, n in groups_and_counts for _ in range(n)]
    return VisionBatch(rows) if any(r is not None for r in rows) else None


def generate_groups(model, tokenizer, processor: VisionProcessor, rows: list[dict[str, Any]], n: int,
                    max_new_tokens: int, temperature: float, max_prompt_tokens: int, batch_size: int,
                    progress: bool = False, top_p: float = 1.0, repetition_penalty: float = 1.0) -> list[Group]:
    """``n`` sampled responses for each row (evaluation), encoding images a chunk of prompts at a time so that
    only one chunk's pixels are ever in memory."""
    from mmrl.trainer.rollout import generate

    cache = PromptCache(processor, rows, "eval", max_prompt_tokens, capacity=0)
    per_chunk = max(1, batch_size // n)
    groups: list[Group] = []
    bar = tqdm(total=len(rows), desc="eval", unit="problem", dynamic_ncols=True, disable=not progress)
    for start in range(0, len(rows), per_chunk):
        chunk = [cache.group(i) for i in range(start, min(start + per_chunk, len(rows)))]
        todo = [(g, n) for g in chunk]
        responses = generate(model, tokenizer, [g.prompt_ids for g, _ in todo for _ in range(n)], max_new_tokens,
                             temperature, top_p, batch_size, vision=prompts_vision(todo),
                             repetition_penalty=repetition_penalty)
        for i, g in enumerate(chunk):
            g.responses, g.vision = responses[i * n : (i + 1) * n], None  # the pixels are not needed any more
        groups += chunk
        bar.update(len(chunk))
    bar.close()
    return groups
