"""mmrl: RL post-training for language, vision-language and agent models.

Layers (lower ones never import upper ones): ``mmrl.algos`` (pure torch objectives), ``mmrl.rewards`` (pure reward
functions), ``mmrl.tasks`` (prompts + rewards), ``mmrl.models`` (loading), ``mmrl.trainer`` (the local backend),
``mmrl.train`` / ``mmrl.eval`` (command lines).
"""

__version__ = "0.1.0"
