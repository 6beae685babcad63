"""The local backend: a single-process trainer (CPU or one GPU). See :mod:`mmrl.trainer.local`."""

from mmrl.trainer.config import TrainConfig
from mmrl.trainer.local import Trainer, build_trainer, train

__all__ = ["TrainConfig", "Trainer", "build_trainer", "train"]
