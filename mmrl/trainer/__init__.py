"""The local backend: a single-process trainer, CPU or one GPU (:mod:`mmrl.trainer.local`), with its sampler,
episodes, update and evaluation. What both backends share is :mod:`mmrl.run`."""
