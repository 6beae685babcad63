"""The algorithm layer: one pure-torch module per policy objective, registered by name.

>>> import mmrl.algos as algos
>>> algo = algos.get("gvpo", beta=0.1)
>>> adv = algo.advantages(rewards, group_ids)                      # once per rollout batch, [N]
>>> stats = algo.batch_stats(rewards, group_ids, adv, old_logprobs, mask)
>>> loss, metrics = algo.policy_loss(logprobs=logprobs, old_logprobs=old_logprobs, advantages=adv, mask=mask,
...                                   group_ids=group_ids, stats=stats)

Nothing here imports a trainer, a model or a tokenizer.
"""

from mmrl.algos import cispo, cw_grpo, dr_grpo, gigpo, gmpo, gpg, grpo, gspo, gvpo, sapo  # noqa: F401  (registers them)
from mmrl.algos.base import ALGORITHMS, Algorithm, Resampling, TurnSteps, get, hyperparameters, register

__all__ = ["ALGORITHMS", "Algorithm", "Resampling", "TurnSteps", "get", "hyperparameters", "register"]
