"""Group bookkeeping of the openrlhf backend: group ids, whole-group micro-batches, exact loss normalisation.

Pure torch; no OpenRLHF import.

* **Group ids.** OpenRLHF's ``SamplesGenerator`` returns each prompt's ``n`` responses consecutively (one vLLM request
  per prompt yields its ``n`` samples) and ``RemoteExperienceMaker.split_rollout_samples`` numbers the rollout samples
  in that order, so sample ``i`` of a rollout step belongs to group ``i // n``. The id travels with the sample through
  the replay buffer in ``Experience.info[GROUP_KEY]``, which OpenRLHF splits and re-stacks per sample.
* **Micro-batches.** OpenRLHF's ``ppo_train`` shuffles single samples; mmrl's actor instead shuffles *groups* and
  cuts the rank's samples into micro-batches of ``train.micro_batch_size`` consecutive samples, so a micro-batch size
  that is a multiple of the group size keeps every group whole (GVPO needs it; the launcher enforces it for gvpo).
* **Turn rows.** In the agent turn layout (``rollout.agent_layout turn``) the agent executor plays each episode turn
  by turn and returns every turn as its own row; the samples generator lays a step's rows out episode after episode
  (:func:`lay_out_turns`), each with its episode's group (the episodes of one game, consecutive runs of ``n`` as
  above) and a :class:`~mmrl.batch.TurnStep` under ``Experience.info[STEP_KEY]``, which the experience maker takes
  off before anything ships (the objective's per-step needs, ``Algorithm.needs_steps``, are read there only). The
  number of rows then varies from step to step: they are dealt to the policy ranks in near-equal contiguous shares
  (:func:`rank_shares`), and a rank with fewer micro-batches than another runs idle ones (no trained token), so that
  every rank takes the same number of DeepSpeed steps.
* **Normalisation.** DeepSpeed scales each micro-batch loss by ``1/gas`` and averages gradients over the ``dp`` ranks.
  Weighting micro-batch ``j``'s loss by ``mass_j / M · dp · gas``, with ``mass = Algorithm.loss_mass`` and ``M`` the
  sum of the masses of every micro-batch of the optimizer step on every rank (one all-reduce), gives exactly the
  gradient of the objective over the whole optimizer step, as the local trainer's accumulation does in one process.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from mmrl.batch import TurnStep

GROUP_KEY = "mmrl_group_id"  # Experience.info key of a sample's group id within its rollout step
STATS_PREFIX = "mmrl_stat/"  # Experience.info keys of the objective's whole-batch statistics (one value per sample)
ROW_STATS_PREFIX = "mmrl_row_stat/"  # ... of its row statistics (each sample's own value, e.g. its group's)
STEP_KEY = "mmrl_turn_step"  # Experience.info key of a turn row's [TurnStep] (the turn layout; never shipped)


def rollout_group_ids(n_samples: int, group_size: int) -> torch.Tensor:
    """``[n_samples]`` group ids of a rollout step whose groups are consecutive runs of ``group_size`` samples."""
    if group_size < 1 or n_samples % group_size:
        raise ValueError(f"a rollout step of {n_samples} samples is not made of whole groups of {group_size}")
    return torch.arange(n_samples) // group_size


def whole_group_micro_batches(group_ids: list[int], micro: int, generator: torch.Generator | None = None
                              ) -> list[list[int]]:
    """Indices of micro-batches of ``micro`` samples: groups in shuffled order, their samples kept together.

    Samples of one group are contiguous in the result; when ``micro`` is a multiple of every group's size, no group
    is split across micro-batches. A short last micro-batch is kept (OpenRLHF's layout checks make it full).
    """
    by_group: dict[int, list[int]] = {}
    for index, gid in enumerate(group_ids):
        by_group.setdefault(int(gid), []).append(index)
    groups = list(by_group.values())
    order = torch.randperm(len(groups), generator=generator).tolist() if generator is not None else range(len(groups))
    flat = [i for g in order for i in groups[g]]
    return [flat[s:s + micro] for s in range(0, len(flat), micro)]


def groups_are_whole(group_ids: torch.Tensor, group_size: int) -> bool:
    """True when every group id in ``group_ids`` appears exactly ``group_size`` times."""
    _, counts = torch.unique(group_ids, return_counts=True)
    return bool((counts == group_size).all())


def loss_scale(mass: float, total_mass: float, dp_size: int, grad_accum: int) -> float:
    """Weight of one micro-batch's (mean) loss so that DeepSpeed's ``1/gas`` and ``1/dp`` averaging give the
    ``loss_mass``-weighted mean over the optimizer step (0 when the step carries no loss at all)."""
    return mass / total_mass * dp_size * grad_accum if total_mass > 0 else 0.0


def runs_of_groups(keys: list, size_of) -> list[tuple[int, int]]:
    """``(start, end)`` of each group in samples whose groups are consecutive runs of one prompt ``key``, the run
    starting at a sample of prompt ``x`` holding ``size_of(x)`` samples (GVPO's replay asks the engines for fewer
    responses of a prompt that has stored ones). A run that overruns the samples or mixes prompts is an error."""
    spans, at = [], 0
    while at < len(keys):
        size = size_of(keys[at])
        end = at + size
        if size < 1 or end > len(keys) or any(k != keys[at] for k in keys[at:end]):
            raise ValueError(f"rollout samples {at}..{end - 1} are not one group of {size} responses to one prompt")
        spans.append((at, end))
        at = end
    return spans


def lay_out_turns(episodes: list[list[tuple[object, TurnStep]]], group_size: int) -> list:
    """The rows of a rollout step in the turn layout, episode after episode: ``episodes[i]`` holds episode ``i``'s
    (row, step) pairs in turn order (an episode whose env failed holds none). Each row gets its episode's group,
    ``i // group_size``, and its step with the episode numbered ``i`` (unique within the step)."""
    rows = []
    for position, turns in enumerate(episodes):
        for row, step in turns:
            row.info[GROUP_KEY] = torch.tensor([position // group_size])
            row.info[STEP_KEY] = [dataclasses.replace(step, episode=position)]
            rows.append(row)
    return rows


def rank_shares(n_rows: int, ranks: int) -> list[range]:
    """``ranks`` contiguous, near-equal, non-empty shares of ``n_rows`` rows (one experience per policy rank)."""
    if n_rows < ranks:
        raise ValueError(f"a rollout step of {n_rows} turn rows cannot give each of {ranks} policy ranks one")
    size = n_rows / ranks
    bounds = [math.floor(r * size) for r in range(ranks)] + [n_rows]
    return [range(bounds[r], bounds[r + 1]) for r in range(ranks)]


def padded_count(counts: int, grad_accum: int) -> int:
    """Micro-batches every rank runs in one ``ppo_train`` epoch: the most any rank has (``counts``, all-reduced with
    max), rounded up to whole optimizer steps of ``grad_accum`` micro-batches."""
    return math.ceil(counts / grad_accum) * grad_accum
