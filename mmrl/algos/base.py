"""Shared pieces of the algorithm layer: the `Algorithm` contract, the registry and tensor helpers.

Everything here is pure torch on tensors. Shapes used throughout:

* ``rewards``, ``advantages``, ``group_ids``: ``[N]`` (one entry per response),
* ``logprobs``, ``old_logprobs``, ``ref_logprobs``, ``mask``: ``[N, T]`` per response token;
  ``mask`` is 1 on tokens that train (the response's action tokens) and 0 on padding.

Agent rollouts in the turn layout (``rollout.agent_layout turn``) make every env step its own response: ``rewards``
is then the episode's return on each of its turns, and :class:`TurnSteps` says which episode and step each row is,
the step's own reward and the state the action was taken in.

An algorithm never sees a model, a tokenizer or a task.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from mmrl.errors import UserError
from mmrl.values import as_default_type

Tensor = torch.Tensor
Metrics = dict[str, float]

ALGORITHMS: dict[str, type[Algorithm]] = {}


def register(name: str):
    """Class decorator: make an `Algorithm` subclass reachable as ``mmrl.algos.get(name)``."""

    def wrap(cls: type[Algorithm]) -> type[Algorithm]:
        if name in ALGORITHMS:
            raise ValueError(f"algorithm {name!r} is registered twice")
        cls.name = name
        ALGORITHMS[name] = cls
        return cls

    return wrap


def get(name: str, **params: Any) -> Algorithm:
    """Build the algorithm registered as ``name`` with hyper-parameters ``params``.

    Unknown names or unknown/invalid hyper-parameters raise ``ValueError`` with one line naming the culprit.
    """
    if name not in ALGORITHMS:
        raise UserError(f"unknown algorithm {name!r}; choose one of: {', '.join(sorted(ALGORITHMS))}")
    cls = ALGORITHMS[name]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    checked = {}
    for key, value in params.items():
        if key not in fields:
            raise UserError(f"algorithm {name!r} has no hyper-parameter {key!r}; it has: {', '.join(sorted(fields))}")
        # hyper-parameters arrive typed (the config read the text); a None default is "an integer or None"
        default = fields[key].default
        checked[key] = as_default_type(f"algorithm hyper-parameter {name}.{key}", value,
                                       0 if default is None else default, allow_none=default is None)
    return cls(**checked)


def hyperparameters(name: str) -> dict[str, Any]:
    """Default hyper-parameters of a registered algorithm (for ``--help`` and docs)."""
    return {f.name: f.default for f in dataclasses.fields(ALGORITHMS[name])}


@dataclasses.dataclass(frozen=True)
class Resampling:
    """What a rollout loop does before training on a batch (GPG's β_th, the GPG paper's Alg. 1 line 1): while fewer than
    ``valid_fraction`` of the batch's groups are valid (rewards not all equal), it samples a batch of prompts again and
    keeps the valid groups, at most ``max_rounds`` extra rounds, then trains on what it has."""

    valid_fraction: float = 0.0  # 0: no resampling
    max_rounds: int = 0

    @property
    def active(self) -> bool:
        return self.valid_fraction > 0


EPISODE_SCOPES = ("trajectory", "turn")
PENALTY_SCOPES = ("episode", "step")


@dataclasses.dataclass(frozen=True)
class TurnSteps:
    """What an agent rollout in the turn layout knows about each row beyond its reward and group, row-aligned:

    * ``episode_ids`` ``[N]``: the episode (trajectory) the row's turn belongs to, unique within the batch;
    * ``step_index`` ``[N]``: the turn's position in its episode, 0 for the first;
    * ``step_rewards`` ``[N]``: the env's reward for the row's action alone;
    * ``anchors``: the state the action was taken in, as the env's text without history or instructions;
    * ``penalties`` ``[N]`` (zeros when None): the part of ``step_rewards`` that penalises the action's form, as a
      positive number already subtracted (the env's ``info["penalty"]``; ALFWorld's invalid-action penalty).
    """

    episode_ids: Tensor
    step_index: Tensor
    step_rewards: Tensor
    anchors: tuple[str, ...]
    penalties: Tensor | None = None

    @classmethod
    def of(cls, steps: Sequence[Any]) -> TurnSteps:
        """The facts of row-aligned step records (``episode``, ``index``, ``reward``, ``anchor``, ``penalty`` each:
        `mmrl.batch.TurnStep`), as both backends hold them."""
        return cls(torch.tensor([s.episode for s in steps]), torch.tensor([s.index for s in steps]),
                   torch.tensor([s.reward for s in steps], dtype=torch.float32), tuple(s.anchor for s in steps),
                   torch.tensor([s.penalty for s in steps], dtype=torch.float32))

    def __post_init__(self) -> None:
        n = self.episode_ids.shape[0]
        if (self.episode_ids.dim() != 1 or self.step_index.shape != (n,) or self.step_rewards.shape != (n,)
                or len(self.anchors) != n or (self.penalties is not None and self.penalties.shape != (n,))):
            raise ValueError(f"TurnSteps: episode_ids, step_index, step_rewards, anchors and penalties must all have "
                             f"{n} rows")
        if not torch.isfinite(self.step_rewards).all():
            raise ValueError("TurnSteps: step rewards contain NaN or inf")
        if self.penalties is not None and not (torch.isfinite(self.penalties).all() and (self.penalties >= 0).all()):
            raise ValueError("TurnSteps: penalties must be finite and >= 0")

    def penalty_values(self) -> Tensor:
        """``[N]`` float64 penalties (zeros when the env reported none)."""
        if self.penalties is None:
            return torch.zeros(self.episode_ids.shape[0], dtype=torch.float64)
        return self.penalties.to(torch.float64)

    def episode_rows(self) -> tuple[Tensor, Tensor]:
        """(one row index per episode ``[E]``, each row's episode as a dense index 0..E-1 ``[N]``)."""
        _, dense = torch.unique(self.episode_ids, return_inverse=True)
        first = torch.full((int(dense.max()) + 1 if dense.numel() else 0,), self.episode_ids.numel(),
                           dtype=torch.long)
        first = first.scatter_reduce(0, dense, torch.arange(dense.numel()), reduce="amin")
        return first, dense


@dataclasses.dataclass(frozen=True)
class Algorithm(abc.ABC):
    """The contract every objective implements.

    What it needs from a rollout loop is declared here, so that no loop asks an objective's name:

    * :attr:`needs_reference` / :meth:`uses_reference` and :meth:`reference_kl_coef`: keep a frozen reference model;
    * :attr:`on_policy_only`: no importance ratio, exact only with one update per rollout (a loop warns otherwise);
    * :attr:`replays_history`: responses of older policies may be mixed into a group (``rollout.replay_historical``);
    * :attr:`needs_whole_groups`: every response of a group must be in the same micro-batch;
    * :meth:`resampling`: the rule for topping up a batch with too few valid groups;
    * :meth:`with_length_budget`: the objective with its constant length normaliser set from the task's budget;
    * :attr:`needs_steps`: per-step rewards and observations of agent episodes (the turn layout's :class:`TurnSteps`);
    * :attr:`trains_turns`: whether it can train agent episodes in the turn layout at all.

    Then, on tensors:

    * :meth:`advantages` runs once per rollout batch on the whole batch; in the turn layout
      :meth:`turn_advantages` runs instead (by default: each turn carries its episode's advantage).
    * :meth:`batch_stats` runs once per rollout batch on the whole batch and returns statistics that the loss
      needs from the *whole* batch (or whole groups) rather than from one mini-batch (GPG's alpha, CW-GRPO's
      covariance moments): each a number, or a ``[N]`` tensor with one value per response of the batch (a row
      statistic, e.g. of the response's group). A loop hands each (micro-)batch the numbers as they are and the rows
      of the row statistics it holds (:func:`stats_for_rows`).
    * :meth:`policy_loss` runs on every mini-batch and returns ``(scalar loss, metrics)``.
    """

    name: ClassVar[str] = "base"
    #: True when :meth:`policy_loss` reads ``ref_logprobs`` (the trainer then keeps a frozen reference model).
    needs_reference: ClassVar[bool] = False
    #: True when the objective has no importance ratio, i.e. is exact only on-policy (one update per rollout).
    on_policy_only: ClassVar[bool] = False
    #: True when the objective stays exact on responses of older policies replayed into a group (GVPO Theorem 3.2).
    replays_history: ClassVar[bool] = False
    #: True when :meth:`policy_loss` must see every response of a group at once (a split group is an error).
    needs_whole_groups: ClassVar[bool] = False
    #: True when :meth:`batch_stats` reads ``old_logprobs``. Otherwise a trainer making one update per rollout may
    #: skip the separate π_old forward, pass ``old_logprobs=None`` here and give :meth:`policy_loss` the update's own
    #: detached log-probs as π_old (equal to a separate forward's at that single update, up to rounding).
    batch_stats_reads_old_logprobs: ClassVar[bool] = False
    #: True when :meth:`turn_advantages` reads :class:`TurnSteps` (per-step rewards and observations): a multi-turn
    #: task must then be played in the turn layout, where every env step is its own response.
    needs_steps: ClassVar[bool] = False
    #: False when the objective's loss needs whole responses of one prompt in a group, which the turn layout, whose
    #: turns of one group have different prompts, cannot give (a run refuses that combination at start).
    trains_turns: ClassVar[bool] = True

    #: Weight of an entropy bonus, -entropy_coef × the policy's mean token entropy, added by the trainer to every
    #: objective's loss (verl's ``entropy_coeff``; verl-agent's GiGPO/GMPO agent runs use 0.001). 0: none.
    entropy_coef: float = 0.0
    #: The turn layout only: the group statistics of the episode-level advantage run over the group's episodes, one
    #: value each (``trajectory``), or over its turn-samples (``turn``: verl-agent's code, where an episode of 40
    #: steps counts 40 times in its group's mean and std).
    episode_scope: str = "trajectory"
    #: The turn layout only: a malformed step's penalty (the env's ``info["penalty"]``) lowers its whole episode's
    #: return (``episode``: the env's reward as it is) or only its own row (``step``: verl-agent's order, the
    #: penalty subtracted from the row's episode value and step return after discounting; needs ``episode_scope``
    #: turn, whose rows have values of their own).
    penalty_scope: str = "episode"
    #: DAPO's dynamic sampling (arXiv 2503.14476 §3.2, Eq. 11's constraint 0 < |{o_i correct}| < G): while a batch
    #: holds a group whose rewards are all equal (no advantage, no gradient), the rollout loop samples more prompts
    #: and keeps the groups with reward spread, at most this many extra rounds, then trains on what it has. GPG's
    #: resampling rule with every group required valid (:meth:`resampling`). 0: off.
    dynamic_sampling: int = 0
    #: DAPO's overlong reward shaping (arXiv 2503.14476 §3.4, Eq. 13): a response longer than ``max_length`` minus
    #: this many tokens loses ``overlong_penalty`` × (its excess / this buffer) of reward, the whole
    #: ``overlong_penalty`` at ``max_length`` and beyond (:func:`overlong_penalty`). 0: off. Single-turn tasks.
    overlong_buffer: int = 0
    #: The most reward overlong shaping takes away (DAPO: 1, the reward of a correct answer).
    overlong_penalty: float = 1.0
    #: DAPO's L_max, the length the penalty is full at; None: the task's generation budget (``rollout.max_new_tokens``).
    max_length: int | None = None

    def __post_init__(self) -> None:
        if self.entropy_coef < 0:
            raise UserError(f"entropy_coef must be >= 0, got {self.entropy_coef}")
        if self.dynamic_sampling < 0:
            raise UserError(f"dynamic_sampling must be >= 0 (extra sampling rounds), got {self.dynamic_sampling}")
        if self.overlong_buffer < 0 or self.overlong_penalty < 0:
            raise UserError(f"overlong_buffer and overlong_penalty must be >= 0, got {self.overlong_buffer}, "
                            f"{self.overlong_penalty}")
        if self.max_length is not None and not 0 < self.overlong_buffer <= self.max_length:
            raise UserError(f"max_length is overlong shaping's L_max: it needs 0 < overlong_buffer <= max_length, got "
                            f"overlong_buffer {self.overlong_buffer}, max_length {self.max_length}")
        if self.episode_scope not in EPISODE_SCOPES:
            raise UserError(f"episode_scope must be one of {EPISODE_SCOPES}, got {self.episode_scope!r}")
        if self.penalty_scope not in PENALTY_SCOPES:
            raise UserError(f"penalty_scope must be one of {PENALTY_SCOPES}, got {self.penalty_scope!r}")
        if self.penalty_scope == "step" and self.episode_scope != "turn":
            raise UserError("penalty_scope step gives each turn-sample an episode value of its own, which only "
                            "episode_scope turn normalises: set episode_scope turn")
        self.validate()

    def validate(self) -> None:  # noqa: B027 -- optional hook; most objectives have parameters to check
        """Raise ValueError naming the hyper-parameter that is out of range."""

    def uses_reference(self) -> bool:
        return self.needs_reference

    def reference_kl_coef(self) -> float:
        """Weight of the objective's own KL(π_θ || π_ref) term; 0 when it has none."""
        return 0.0

    def resampling(self) -> Resampling:
        """The rollout loop's rule for batches with too few valid groups: DAPO's dynamic sampling (every group valid,
        at most ``dynamic_sampling`` extra rounds) when set; none by default."""
        return Resampling(1.0, self.dynamic_sampling) if self.dynamic_sampling else Resampling()

    def with_length_budget(self, tokens: int) -> Algorithm:
        """This objective with its constant length normaliser set to ``tokens``, the most tokens one trained response
        can hold (the task's generation budget; a whole episode's for multi-turn tasks), and overlong shaping's
        ``max_length`` too when shaping is on. What was set explicitly stays; objectives with a normaliser of their
        own extend this."""
        if self.overlong_buffer and self.max_length is None:
            return dataclasses.replace(self, max_length=tokens)
        return self

    def shaped_rewards(self, rewards: Tensor, lengths: Tensor) -> Tensor:
        """``[N]`` rewards as the objective trains on them: with ``overlong_buffer``, DAPO's length penalty added
        (``lengths`` ``[N]``: each response's trained tokens); the rewards themselves otherwise. A loop calls it on a
        single-turn batch before :meth:`advantages`."""
        if not self.overlong_buffer:
            return rewards
        if self.max_length is None:
            raise ValueError("overlong shaping needs max_length: build the objective with with_length_budget()")
        penalty = overlong_penalty(lengths, self.max_length, self.overlong_buffer, self.overlong_penalty)
        return rewards + penalty.to(rewards.dtype)

    @abc.abstractmethod
    def advantages(self, rewards: Tensor, group_ids: Tensor) -> Tensor:
        """One advantage per response, computed once per rollout batch on the whole batch.

        Args:
            rewards: ``[N]`` float, one finite reward per response.
            group_ids: ``[N]`` int, equal for the responses of one prompt (a group); any values, any order.

        Returns:
            ``[N]`` float32 advantages.
        """

    def turn_advantages(self, rewards: Tensor, group_ids: Tensor, steps: TurnSteps) -> Tensor:
        """One advantage per turn-sample ``[N]`` (the turn layout). By default each turn carries its episode's
        advantage: :meth:`advantages` over the group's episodes (``episode_scope`` trajectory: one value each, so long
        episodes do not weigh more in the group statistics), given to every turn of the episode; or :meth:`advantages`
        over the group's turn-samples (``turn``), each with :meth:`episode_values`. ``rewards`` is the episode's
        return on each of its turns."""
        check_batch(rewards, group_ids)
        first, dense = check_episodes(rewards, group_ids, steps)
        if self.episode_scope == "trajectory":
            return self.advantages(rewards[first], group_ids[first])[dense]
        return self.advantages(self.episode_values(rewards, steps).to(rewards.dtype), group_ids)

    def episode_values(self, rewards: Tensor, steps: TurnSteps) -> Tensor:
        """``[N]`` float64: each turn-sample's episode value, its episode's return; with ``penalty_scope`` step, the
        return without its episode's penalties, less the row's own (a malformed step lowers only its row)."""
        if self.penalty_scope == "episode":
            return rewards.to(torch.float64)
        _, dense = steps.episode_rows()
        penalties = steps.penalty_values()
        per_episode = torch.zeros(int(dense.max()) + 1 if dense.numel() else 0, dtype=torch.float64)
        per_episode = per_episode.index_add(0, dense, penalties)
        return rewards.to(torch.float64) + per_episode[dense] - penalties

    def batch_stats(self, rewards: Tensor, group_ids: Tensor, advantages: Tensor, old_logprobs: Tensor | None,
                    mask: Tensor) -> dict[str, Any]:
        """Statistics :meth:`policy_loss` needs from the whole rollout batch, computed once per batch.

        Args:
            rewards, group_ids, advantages: ``[N]``, as for :meth:`advantages` (``advantages`` is its result).
            old_logprobs: ``[N, T]`` per-token log-probs under the rollout policy, or None when
                :attr:`batch_stats_reads_old_logprobs` is False and the loop skipped that forward.
            mask: ``[N, T]``, 1 on the response tokens that train.

        Returns:
            ``{name: value}``, each a number or a ``[N]`` tensor (one value per response); hand a sub-batch its rows
            with :func:`stats_for_rows`. Empty by default.
        """
        return {}

    def advantages_and_stats(self, rewards: Tensor, group_ids: Tensor, old_logprobs: Tensor | None, mask: Tensor,
                             steps: TurnSteps | None = None) -> tuple[Tensor, dict[str, Any]]:
        """(``[N]`` advantages, :meth:`batch_stats`) of one rollout batch: what every backend computes once per batch
        before the update. ``steps``: the turn layout's row facts (:meth:`turn_advantages`), None otherwise."""
        if steps is not None:
            advantages = self.turn_advantages(rewards, group_ids, steps)
        else:  # DAPO's overlong shaping, when set, lowers the reward the objective trains on (not the logged one)
            rewards = self.shaped_rewards(rewards, mask.sum(1))
            advantages = self.advantages(rewards, group_ids)
        return advantages, self.batch_stats(rewards, group_ids, advantages, old_logprobs, mask)

    def loss_mass(self, mask: Tensor, group_ids: Tensor) -> float:
        """The denominator of :meth:`policy_loss`'s average on a (sub-)batch: responses by default.

        Gradient accumulation weights each micro-batch's loss by ``mass(micro) / mass(mini-batch)``, which makes the
        accumulated gradient exactly that of the whole mini-batch; a distributed backend does the same across ranks.
        """
        return float(mask.shape[0])

    def token_average(self, values: Tensor, mask: Tensor, group_ids: Tensor) -> Tensor:
        """A per-token quantity ``[N, T]`` averaged as this objective averages its loss: each response's token mean,
        summed, over :meth:`loss_mass`. Objectives with another average override it, so that gradient accumulation
        (micro-batch weights ``mass / total``) keeps a term averaged this way exact, like the loss itself."""
        mass = self.loss_mass(mask, group_ids)
        return masked_mean(values, mask, dim=1).sum() / max(mass, 1.0)

    def entropy_bonus(self, entropy: Tensor, mask: Tensor, group_ids: Tensor) -> Tensor:
        """The term a trainer adds to :meth:`policy_loss`: -entropy_coef × the policy's token entropy ``[N, T]``
        (differentiable), averaged by :meth:`token_average`."""
        return -self.entropy_coef * self.token_average(entropy, mask.to(entropy.dtype), group_ids)

    @abc.abstractmethod
    def policy_loss(self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                    group_ids: Tensor, ref_logprobs: Tensor | None = None,
                    stats: dict[str, Any] | None = None) -> tuple[Tensor, Metrics]:
        """The loss to minimise on one (mini- or micro-)batch of B responses. Callers pass every argument by keyword.

        Args:
            logprobs: ``[B, T]`` per-token log-probs of the sampled tokens under the current policy (with gradient).
            old_logprobs: ``[B, T]`` the same under the rollout policy π_old (no gradient).
            advantages: ``[B]``, the rows of :meth:`advantages`' result.
            mask: ``[B, T]``, 1 on response tokens that train, 0 on padding and environment tokens.
            group_ids: ``[B]`` group of each response.
            ref_logprobs: ``[B, T]`` under the frozen reference, when :meth:`uses_reference`; else None.
            stats: :meth:`batch_stats` of the whole batch, cut to these rows (:func:`stats_for_rows`).

        Returns:
            A scalar loss tensor, and ``{name: float}`` metrics for logging.

        Raises:
            ValueError naming the first argument whose shape is not the one above (:func:`check_loss_inputs`).
        """


# --------------------------------------------------------------------------------------------- helpers


def overlong_penalty(lengths: Tensor, max_length: int, buffer: int, factor: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment (arXiv 2503.14476, Eq. 13), ``[N]`` float32, times ``factor``::

        0                                  |y| <= L_max - L_cache
        ((L_max - L_cache) - |y|) / L_cache    L_max - L_cache < |y| <= L_max
        -1                                 L_max < |y|
    """
    excess = (lengths.to(torch.float32) - (max_length - buffer)).clamp(min=0.0, max=float(buffer))
    return -factor * excess / buffer


def stats_for_rows(stats: dict[str, Any], rows: Tensor) -> dict[str, Any]:
    """:meth:`Algorithm.batch_stats` of a whole batch as a sub-batch of its ``rows`` sees them: numbers as they are,
    row statistics (``[N]`` tensors) cut to those rows."""
    return {k: v[rows.to(v.device)] if isinstance(v, Tensor) else v for k, v in stats.items()}


def check_loss_inputs(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, group_ids: Tensor,
                      ref_logprobs: Tensor | None) -> None:
    """ValueError naming the first argument of :meth:`Algorithm.policy_loss` whose shape is not the documented one:
    torch would broadcast most of them (sequence log-probs ``[B, 1]``, one advantage ``[1]``) into a wrong loss."""
    if logprobs.dim() != 2:
        raise ValueError(f"policy_loss: logprobs {list(logprobs.shape)} must be [B, T] (per-token log-probs)")
    for name, value in (("old_logprobs", old_logprobs), ("mask", mask), ("ref_logprobs", ref_logprobs)):
        if value is not None and value.shape != logprobs.shape:
            raise ValueError(f"policy_loss: {name} {list(value.shape)} and logprobs {list(logprobs.shape)} must have "
                             f"the same [B, T] shape")
    for name, value in (("advantages", advantages), ("group_ids", group_ids)):
        if value.shape != logprobs.shape[:1]:
            raise ValueError(f"policy_loss: {name} {list(value.shape)} must be [B], a value per row of logprobs "
                             f"{list(logprobs.shape)}")


def check_batch(rewards: Tensor, group_ids: Tensor) -> None:
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(f"rewards and group_ids must both be [N]; got {tuple(rewards.shape)} and "
                         f"{tuple(group_ids.shape)}")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf; the reward layer must map bad scores to finite values")


def group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary group ids to dense indices 0..G-1 (order of first appearance is not kept; it is not needed)."""
    _, dense = torch.unique(group_ids, return_inverse=True)
    return dense, int(dense.max().item()) + 1 if dense.numel() else 0


def group_sum(values: Tensor, dense: Tensor, n_groups: int) -> Tensor:
    """``[G]`` sums of ``values`` ``[N]`` by dense group index (differentiable; no Python loop over groups)."""
    return torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add(0, dense, values)


def check_episodes(rewards: Tensor, group_ids: Tensor, steps: TurnSteps) -> tuple[Tensor, Tensor]:
    """:meth:`TurnSteps.episode_rows`, after checking that every turn of an episode carries its return and group."""
    first, dense = steps.episode_rows()
    if not (rewards == rewards[first][dense]).all() or not (group_ids == group_ids[first][dense]).all():
        raise ValueError("turn layout: the turns of an episode must all carry the episode's return and group")
    return first, dense


def group_mean_std(values: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample group mean, unbiased group std (0 for single-sample groups) and group size, all ``[N]``."""
    dense, n_groups = group_index(group_ids)
    values = values.to(torch.float64)
    count = group_sum(torch.ones_like(values), dense, n_groups)
    mean = group_sum(values, dense, n_groups) / count
    sq = group_sum((values - mean[dense]) ** 2, dense, n_groups)
    var = torch.where(count > 1, sq / (count - 1).clamp(min=1), torch.zeros_like(sq))
    return mean[dense], var.sqrt()[dense], count[dense]


def group_all_equal(values: Tensor, group_ids: Tensor) -> Tensor:
    """``[N]`` bool: True where every response of the sample's group has exactly the same value (max == min)."""
    dense, n_groups = group_index(group_ids)
    hi = torch.full((n_groups,), float("-inf"), dtype=values.dtype, device=values.device)
    lo = torch.full((n_groups,), float("inf"), dtype=values.dtype, device=values.device)
    hi = hi.scatter_reduce(0, dense, values, reduce="amax")
    lo = lo.scatter_reduce(0, dense, values, reduce="amin")
    return (hi == lo)[dense]


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    return (x * mask).sum() if dim is None else (x * mask).sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean over masked entries; 0 (not NaN) where the mask is empty."""
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def aggregate(token_loss: Tensor, mask: Tensor, mode: str, max_tokens: int | None = None) -> Tensor:
    """Reduce a per-token loss ``[N, T]`` to a scalar.

    * ``seq_mean_token_mean``: mean over tokens of each response, then over responses (GRPO, DeepSeekMath Eq. 3).
    * ``token_mean``: sum over all tokens / number of tokens (DAPO; GPG Eq. 5 and its official math trainers).
    * ``seq_mean_token_sum_norm``: sum over all tokens / (N * max_tokens) with a constant ``max_tokens``
      (Dr.GRPO: no per-length normalisation).

    Responses with no trained token (zero length) contribute zero and never produce NaN.
    """
    if mode == "seq_mean_token_mean":
        n = token_loss.shape[0]
        return masked_mean(token_loss, mask, dim=1).sum() / max(n, 1)
    if mode == "token_mean":
        return masked_mean(token_loss, mask)
    if mode == "seq_mean_token_sum_norm":
        n, t = token_loss.shape
        return masked_sum(token_loss, mask) / (max(n, 1) * (max_tokens or t))
    raise ValueError(f"unknown loss aggregation {mode!r}")


LOSS_AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(π_θ || π_ref) (Schulman 2020; DeepSeekMath Eq. 4): r - log r - 1, r = π_ref/π_θ.

    The log-ratio is clamped to [-20, 20] so that exp never overflows.
    """
    log_ratio = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return torch.exp(log_ratio) - log_ratio - 1.0


def policy_drift_metrics(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Metrics every objective reports: k3 KL(π_θ || π_old) and the entropy proxy -mean log π of sampled tokens."""
    lp = logprobs.detach()
    return {"kl_old": masked_mean(kl_k3(lp, old_logprobs), mask), "entropy_proxy": masked_mean(-lp, mask)}


def kl_to_old(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> tuple[float, float]:
    """(mean, max) over the trained tokens of the per-token k3 KL(π_θ || π_old). The max shows what a mean hides: a
    near-deterministic policy can move a handful of tokens by orders of magnitude while the mean barely changes."""
    kl = kl_k3(logprobs.detach().float(), old_logprobs.float())
    on = mask > 0
    if not on.any():
        return 0.0, 0.0
    return float(kl[on].mean()), float(kl[on].max())


def advantage_spread(advantages: Tensor, group_ids: Tensor, tol: float = 1e-6) -> dict[str, float]:
    """How much learning signal a batch's groups carry: ``adv_group_std``, the mean over groups of the advantages'
    standard deviation within the group (ddof 1; 0 for a group of one), and ``adv_zero_spread``, the share of groups
    whose advantages all lie within ``tol`` of each other (nothing to learn from them); and ``adv_mean``, the mean
    over rows, which is not 0 where rows are not what the baseline averaged over (the turn layout's turn-samples of
    episodes normalised one value per episode: long episodes weigh more)."""
    if advantages.numel() == 0:
        return {"adv_group_std": 0.0, "adv_zero_spread": 0.0, "adv_mean": 0.0}
    values = advantages.detach().to(torch.float64)
    dense, n_groups = group_index(group_ids)
    _, std, _ = group_mean_std(values, group_ids)
    per_group = torch.zeros(n_groups, dtype=torch.float64).scatter(0, dense, std)
    hi = torch.full((n_groups,), float("-inf"), dtype=torch.float64).scatter_reduce(0, dense, values, reduce="amax")
    lo = torch.full((n_groups,), float("inf"), dtype=torch.float64).scatter_reduce(0, dense, values, reduce="amin")
    return {"adv_group_std": float(per_group.mean()), "adv_zero_spread": float(((hi - lo) <= tol).double().mean()),
            "adv_mean": float(values.mean())}


def float_metrics(**values: Tensor | float) -> Metrics:
    return {k: float(v.detach().item()) if isinstance(v, Tensor) else float(v) for k, v in values.items()}
