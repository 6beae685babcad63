"""What both backends share: the config tree (:mod:`mmrl.run.config`), the build layer (:mod:`mmrl.run.build`), the
run folder, checkpoints, loggers, metrics, schedules, evaluation sets and their scores, and prompt rendering
(:mod:`mmrl.run.prompts`). Neither backend is imported here: mmrl/trainer (local) and mmrl/openrlhf import this."""
