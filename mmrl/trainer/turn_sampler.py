"""Multi-turn sampling with a KV cache carried across turns: a turn reads only what is new since the last one.

Without a cache, every turn of an episode re-reads the whole episode so far (prompt, earlier turns, feedback): the
pre-fill of turn t costs the whole context again, so an episode of T turns pays ~T²/2 context reads.
:class:`CachedTurnSampler` keeps each running episode's keys and values between calls. A call:

1. matches each episode to its cache row by identity, and checks that the episode's context still starts with the
   tokens the row holds (anything else, e.g. a new episode, starts a fresh row);
2. gathers the rows of the still-running episodes and compacts each row's real slots to the right (finished
   episodes drop out; the holes left by padding in the previous call are squeezed out);
3. pre-fills only the new tokens of every row (the last token of the previous turn, which was sampled but not yet
   read, and the env's feedback), left-padded into one block;
4. decodes all rows together, one token per forward, until every row has sampled a stop token or the turn budget.

Rows of different lengths share one cache tensor: each row has its own position ids (its real token count) and the
attention mask is built here as a 4-D additive mask over cache slots (real slots of the row, causal within the new
block), so padding and finished rows never reach a real token's attention. Every query may also attend to its own
slot, so a padding query is never fully masked (which would give NaN in its slot). Positions and masks equal those of
a left-padded full-context forward, so the sampler's log-probs are those of re-scoring the finished episode (tested:
``test_episode_masks_and_rescoring_equal_the_samplers_turn_logprobs``, which samples with this class).

Sampling is the tempered policy (``logits / temperature``, optional nucleus ``top_p``), greedy at temperature 0, as
in :func:`mmrl.trainer.rollout.generate`; the recorded log-prob is of the distribution the token was drawn from.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from mmrl.trainer.text_sampler import cache_keyword, draw_tokens


@dataclasses.dataclass
class Turn:
    """One model turn: its tokens (with the stop token when it stopped), text, and the sampler's log-probs."""

    token_ids: list[int]
    text: str
    stopped: bool  # ended with a stop token (False: cut at the per-turn budget)
    logprobs: list[float] | None = None


@dataclasses.dataclass
class _Row:
    episode: Any  # held so that its id() stays unique while the row lives
    fed: list[int]  # the episode's context tokens whose keys and values are in the cache row


class CachedTurnSampler:
    """A multi-turn policy (running episodes -> their next turns) that keeps a KV cache per episode across calls.

    ``batch_size`` bounds the rows of one forward (more running episodes are split into independent row groups);
    ``prefill_tokens`` bounds query tokens × cache slots per pre-fill forward (longer new blocks are read in chunks),
    which bounds the attention matrix the first turn's prompt pre-fill materialises.
    """

    def __init__(self, model, tokenizer, max_new_tokens: int, temperature: float, top_p: float = 1.0,
                 batch_size: int = 64, with_logprobs: bool = False, prefill_tokens: int = 4_000_000) -> None:
        from mmrl.trainer.rollout import eos_ids

        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.batch_size = max(1, batch_size)
        self.with_logprobs = with_logprobs
        self.prefill_tokens = prefill_tokens
        self.stop = torch.tensor(eos_ids(tokenizer, model), dtype=torch.long)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else int(self.stop[0])
        self._groups: list[_RowGroup] = []

    def __call__(self, episodes: list) -> list:
        was_training = self.model.training
        self.model.eval()
        try:
            groups = self._regroup(episodes)
            turns: dict[int, Turn] = {}
            with torch.no_grad():
                for group in groups:
                    for episode, turn in zip(group.episodes(), group.sample_turn(self), strict=True):
                        turns[id(episode)] = turn
        finally:
            self.model.train(was_training)
        self._groups = groups
        return [turns[id(episode)] for episode in episodes]

    def _regroup(self, episodes: list) -> list[_RowGroup]:
        """Row groups for this call: each old group keeps its still-running episodes; new ones fill fresh groups."""
        wanted = {id(e) for e in episodes}
        kept, placed = [], set()
        for group in self._groups:
            group.keep([i for i, row in enumerate(group.rows) if id(row.episode) in wanted])
            if group.rows:
                kept.append(group)
                placed.update(id(row.episode) for row in group.rows)
        fresh = [e for e in episodes if id(e) not in placed]
        for start in range(0, len(fresh), self.batch_size):
            kept.append(_RowGroup([_Row(e, []) for e in fresh[start:start + self.batch_size]]))
        return kept

    def sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A token per row from ``logits [B, V]``, and its log-prob under the distribution it was drawn from."""
        return draw_tokens(logits, self.temperature, self.top_p)


def _slot_layer_class():
    from transformers.cache_utils import DynamicLayer

    class SlotLayer(DynamicLayer):
        """A cache layer over a preallocated buffer ``[rows, kv_heads, capacity, head_dim]``: appending writes in place
        and hands out views (``DynamicLayer`` concatenates, copying the whole cache for every decoded token)."""

        def __init__(self, buffers: tuple[torch.Tensor, torch.Tensor] | None, length: int, reserve: int) -> None:
            super().__init__()
            self.reserve = reserve
            self.length = 0
            self.buffers = buffers
            if buffers is not None:
                self.dtype, self.device = buffers[0].dtype, buffers[0].device
                self.is_initialized = True
                self._view(length)

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            self.dtype, self.device = key_states.dtype, key_states.device
            self.is_initialized = True

        def _view(self, length: int) -> None:
            self.length = length
            self.keys = self.buffers[0][:, :, :length]
            self.values = self.buffers[1][:, :, :length]

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self.length + key_states.shape[-2]
            if self.buffers is None or end > self.buffers[0].shape[2]:
                grown = []
                for old, new in zip(self.buffers or (None, None), (key_states, value_states), strict=True):
                    shape = (new.shape[0], new.shape[1], end + self.reserve, new.shape[3])
                    buffer = new.new_empty(shape)
                    if old is not None:
                        buffer[:, :, :self.length] = old[:, :, :self.length]
                    grown.append(buffer)
                self.buffers = tuple(grown)
            self.buffers[0][:, :, self.length:end] = key_states
            self.buffers[1][:, :, self.length:end] = value_states
            self._view(end)
            return self.keys, self.values

    return SlotLayer


class _RowGroup:
    """Up to ``batch_size`` episodes sharing one cache (a :class:`SlotLayer` per model layer); ``real [rows, slots]``
    marks the slots that hold a token of the row's episode."""

    def __init__(self, rows: list[_Row]) -> None:
        self.rows = rows
        self.layers: list = []
        self.real = torch.zeros((len(rows), 0), dtype=torch.bool)

    def episodes(self) -> list:
        return [row.episode for row in self.rows]

    def keep(self, indices: list[int]) -> None:
        self.rows = [self.rows[i] for i in indices]
        index = torch.tensor(indices, dtype=torch.long)
        for layer in self.layers:
            layer.buffers = tuple(b.index_select(0, index.to(b.device)) for b in layer.buffers)
            layer._view(layer.length)
        self.real = self.real.index_select(0, index)

    def _compact(self, reserve: int) -> None:
        """Move each row's real slots to the right end, in order (width = the longest row), into fresh buffers with
        ``reserve`` free slots for this turn."""
        counts = self.real.sum(1)
        width = int(counts.max()) if len(self.rows) else 0
        slots = self.real.shape[1]
        # for each row: the indices of its real slots, right-aligned; padding points at slot 0 and is marked unreal
        order = torch.argsort((~self.real).int() * slots * 2 + torch.arange(slots), dim=1)  # real slots first
        position = torch.arange(width)[None, :] - (width - counts)[:, None]  # negative: the left padding
        index = order.gather(1, position.clamp(min=0))
        self.real = position >= 0
        layer_class = _slot_layer_class()
        compacted = []
        for layer in self.layers:
            buffers = []
            for old in layer.buffers:
                buffer = old.new_empty((old.shape[0], old.shape[1], width + reserve, old.shape[3]))
                expanded = index.to(old.device)[:, None, :, None].expand(-1, old.shape[1], -1, old.shape[3])
                buffer[:, :, :width] = old[:, :, :slots].gather(2, expanded)
                buffers.append(buffer)
            compacted.append(layer_class(tuple(buffers), width, reserve))
        self.layers = compacted

    def _forward(self, sampler: CachedTurnSampler, ids: torch.Tensor, positions: torch.Tensor,
                 new_real: torch.Tensor, reserve: int) -> torch.Tensor:
        """Read ``ids [B, q]`` (at ``positions``; ``new_real`` marks real tokens) after the cache; returns the last
        position's logits and appends the block to the cache."""
        from transformers.cache_utils import Cache

        model = sampler.model
        device = next(model.parameters()).device
        rows, q = ids.shape
        old = self.real.shape[1]
        allowed = torch.zeros((rows, q, old + q), dtype=torch.bool)
        allowed[:, :, :old] = self.real[:, None, :]
        causal = torch.tril(torch.ones((q, q), dtype=torch.bool))
        allowed[:, :, old:] = causal[None] & new_real[:, None, :]
        allowed[:, torch.arange(q), old + torch.arange(q)] = True  # own slot: no query is fully masked
        dtype = model.dtype if model.dtype.is_floating_point else torch.float32
        if torch.is_autocast_enabled(device.type):
            dtype = torch.get_autocast_dtype(device.type)
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[:, None]
        if not self.layers:
            layer_class = _slot_layer_class()
            self.layers = [layer_class(None, 0, reserve) for _ in range(model.config.num_hidden_layers)]
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                    use_cache=True, logits_to_keep=1, **{cache_keyword(model): Cache(layers=self.layers)})
        self.real = torch.cat([self.real, new_real], dim=1)
        return out.logits[:, -1]

    def sample_turn(self, sampler: CachedTurnSampler) -> list:
        rows = len(self.rows)
        new = []
        for row in self.rows:
            context = row.episode.context
            if len(context) <= len(row.fed) or context[:len(row.fed)] != row.fed:
                raise RuntimeError("an episode's context no longer extends what its KV-cache row holds; a cached "
                                   "policy needs contexts that only grow between turns")
            new.append(context[len(row.fed):])
        width = max(len(n) for n in new)
        reserve = width + sampler.max_new_tokens
        if self.layers:
            self._compact(reserve)
        # pre-fill the new tokens, left-padded into one block, in chunks of bounded attention size
        ids = torch.full((rows, width), sampler.pad, dtype=torch.long)
        new_real = torch.zeros((rows, width), dtype=torch.bool)
        positions = torch.zeros((rows, width), dtype=torch.long)
        for i, (row, tokens) in enumerate(zip(self.rows, new, strict=True)):
            ids[i, width - len(tokens):] = torch.tensor(tokens)
            new_real[i, width - len(tokens):] = True
            positions[i, width - len(tokens):] = torch.arange(len(row.fed), len(row.fed) + len(tokens))
        logits = None
        start = 0
        while start < width:
            chunk = max(1, sampler.prefill_tokens // max(1, rows * (self.real.shape[1] + width)))
            end = min(width, start + chunk)
            logits = self._forward(sampler, ids[:, start:end], positions[:, start:end], new_real[:, start:end],
                                   reserve)
            start = end
        for row, tokens in zip(self.rows, new, strict=True):
            row.fed = row.fed + tokens
        next_position = torch.tensor([len(row.fed) for row in self.rows], dtype=torch.long)
        # decode
        sampled: list[list[int]] = [[] for _ in range(rows)]
        logprobs: list[list[float]] = [[] for _ in range(rows)]
        running = torch.ones(rows, dtype=torch.bool)
        stopped = [False] * rows
        for step in range(sampler.max_new_tokens):
            tokens, token_logprobs = sampler.sample(logits)
            tokens, token_logprobs = tokens.cpu(), token_logprobs.cpu()
            for i in running.nonzero().flatten().tolist():
                sampled[i].append(int(tokens[i]))
                logprobs[i].append(float(token_logprobs[i]))
            ends = torch.isin(tokens, sampler.stop) & running
            for i in ends.nonzero().flatten().tolist():
                stopped[i] = True
            running &= ~ends
            if not running.any() or step == sampler.max_new_tokens - 1:
                break  # the last sampled tokens are read at the start of the next turn, with the feedback
            feed = torch.where(running, tokens, torch.full_like(tokens, sampler.pad))
            logits = self._forward(sampler, feed[:, None], next_position[:, None], running[:, None].clone(), reserve)
            for i in running.nonzero().flatten().tolist():
                self.rows[i].fed.append(int(tokens[i]))
            next_position += running.long()
        decode = sampler.tokenizer.decode
        return [Turn(tokens, decode(tokens, skip_special_tokens=True), stopped[i],
                     logprobs[i] if sampler.with_logprobs else None) for i, tokens in enumerate(sampled)]
