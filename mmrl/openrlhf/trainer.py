"""``MmrlPPOTrainer``: OpenRLHF's single-controller ``PPOTrainer`` with mmrl's experience maker and, when the objective
has a resampling rule (GPG's β_th, ``Algorithm.resampling``), the resampling generator.

It subclasses the plain class behind ``PPOTrainer`` (``__ray_actor_class__``), is re-wrapped with ``ray.remote``, and
keeps OpenRLHF's whole loop (``fit``: generate → make experience → train the policy actors → sync weights to vLLM →
log, evaluate, checkpoint). Only two members built in ``__init__`` are replaced, right after OpenRLHF built them,
and, with ``evaluation.sets``, ``evaluate`` runs each set from its own prompt file with its own sampling. With GVPO's
historical replay, each policy checkpoint also saves the replay store, and ``--resume`` loads it back.
"""

from __future__ import annotations

from pathlib import Path

import ray
import torch
from openrlhf.datasets import PromptDataset
from openrlhf.datasets.utils import blending_datasets
from openrlhf.trainer.ppo_trainer import PPOTrainer
from openrlhf.trainer.ppo_utils.experience import Experience

import mmrl.algos as algos
from mmrl.openrlhf.args import hide_wandb_key
from mmrl.openrlhf.checkpoint import ACTOR_DIR, checkpoint_folder
from mmrl.openrlhf.evaluation import average, set_generate_kwargs, set_metrics
from mmrl.openrlhf.experience import MmrlExperienceMaker
from mmrl.openrlhf.metrics import StepMetrics
from mmrl.openrlhf.replay import SampleReplay
from mmrl.openrlhf.sampling import MmrlSamplesGenerator


class MmrlPPOTrainer(PPOTrainer.__ray_actor_class__):
    def __init__(self, pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                 reference_model_group, vllm_engines, **generate_kwargs) -> None:
        hide_wandb_key(strategy.args)  # before OpenRLHF's __init__ records the arguments as the W&B config
        super().__init__(pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                         reference_model_group, vllm_engines, **generate_kwargs)
        spec = strategy.args.mmrl
        self.experience_maker = MmrlExperienceMaker(actor_model_group, critic_model_group, reward_model_group,
                                                    reference_model_group, self.kl_ctl, strategy, self.tokenizer,
                                                    mmrl_spec=spec)
        # always mmrl's generator: it stops at run.steps; it resamples only when the objective has a rule
        rule = algos.get(spec.algo, **spec.params).resampling()
        replayed = spec.replay_historical
        replay = SampleReplay(spec.samples_per_prompt, replayed) if replayed else None
        self.experience_maker.replay = replay
        self.samples_generator = MmrlSamplesGenerator(
            strategy=strategy, prompts_dataloader=self.prompts_dataloader, eval_dataloader=self.eval_dataloader,
            tokenizer=self.tokenizer, vllm_engines=vllm_engines, group_size=spec.samples_per_prompt,
            valid_threshold=rule.valid_fraction, max_resample=rule.max_rounds, max_steps=spec.steps,
            replay=replay)
        self.metrics = StepMetrics(spec.metrics_path, resume=spec.resume)
        self._eval_set_loaders: dict[str, object] = {}

    def get_max_steps(self) -> int:
        """The length of the policy's lr schedule (the driver hands it to the actors): the run's optimizer steps
        (`mmrl.openrlhf.args.optimizer_steps`), not OpenRLHF's count of the prompt set's, which is longer whenever
        the prompts cover more than ``run.steps`` (GPG's resampling reserve, whole episodes): a linear or cosine
        schedule would then stop short of its end."""
        return self.strategy.args.mmrl.optimizer_steps

    def _compute_rollout_stats(self, experiences):
        """OpenRLHF's rollout statistics, the spread of the step's advantages within groups (``mmrl/adv_group_std``,
        ``mmrl/adv_zero_spread``), the sampler-trainer log-prob gap (``rollout/logprob_gap_mean`` ...), and the
        replay's of this step (``replay/*``) when GVPO replays."""
        stats = {**super()._compute_rollout_stats(experiences),
                 **{f"mmrl/{k}": v for k, v in self.experience_maker.spread.items()},
                 **self.experience_maker.rollout_gap}
        replay = self.experience_maker.replay
        return {**stats, **replay.metrics} if replay is not None else stats

    def save_logs_and_checkpoints(self, global_step: int, logs_dict=None, client_states=None) -> None:
        self.metrics.write(global_step, logs_dict or {})
        self.last_client_states = dict(client_states or {})
        super().save_logs_and_checkpoints(global_step, logs_dict, client_states)
        if global_step % self.args.ckpt.save_steps == 0:
            self.save_replay(f"global_step{global_step}")

    def save_best_checkpoint(self, eval_metrics, global_step, client_states=None):
        best = self.best_eval_metric_value
        super().save_best_checkpoint(eval_metrics, global_step, client_states)
        if self.best_eval_metric_value != best:  # OpenRLHF saved a best_ tag, which `latest` now names
            self.save_replay(f"best_global_step{global_step}")

    def save_replay(self, tag: str) -> None:
        """With replay: the store, saved inside the policy checkpoint ``tag`` just written. A tag DeepSpeed did not
        write (``--ckpt.disable_ds``) cannot be resumed, so it gets no store either."""
        replay = self.experience_maker.replay
        folder = Path(self.args.ckpt.path) / ACTOR_DIR / tag
        if replay is not None and folder.is_dir():
            replay.save(folder)

    def fit(self, global_step: int = 0) -> None:
        """OpenRLHF's loop, with what the local trainer does and OpenRLHF's loop does not: with ``run.eval_every`` >
        0, an evaluation of the model before its first update (step 0: the base model's row beside the trained one);
        after the last step, an evaluation (``run.eval_every 0`` means "only at the end"; OpenRLHF's ``--eval.steps
        -1`` means never) and a checkpoint (so that ``--resume`` can continue any finished run)."""
        resumed = int(self.init_checkpoint_states()["global_step"])
        self.samples_generator.steps_done = resumed or global_step
        if resumed and self.experience_maker.replay is not None:  # the tag DeepSpeed loaded: `latest` names it
            self.experience_maker.replay.restore(checkpoint_folder(Path(self.args.ckpt.path) / ACTOR_DIR, None),
                                                 Experience)
        if not (resumed or global_step) and self.eval_dataloader and self.args.eval.steps > 0:
            self.evaluate(0, **self._eval_generate_kwargs())
        super().fit(global_step)
        last = self.metrics.last_step
        if not last:
            return
        if self.eval_dataloader and last % self.args.eval.steps:
            self.evaluate(last, **self._eval_generate_kwargs())
        self.metrics.flush()
        if last % self.args.ckpt.save_steps:
            states = {**self.last_client_states, "best_eval_metric_key": self.best_eval_metric_key,
                      "best_eval_metric_value": self.best_eval_metric_value,
                      "latest_eval_metric_value": self._latest_eval_metric_value}
            ray.get(self.actor_model_group.async_run_method(method_name="save_checkpoint", tag=f"global_step{last}",
                                                            client_states=states))
            self.save_replay(f"global_step{last}")

    def _eval_generate_kwargs(self) -> dict:
        """OpenRLHF's evaluation sampling, as its loop builds it, without the rollout's top-k and repetition penalty,
        as the local backend evaluates (``evaluation.sets`` replace it set by set)."""
        return {**self.generate_kwargs, "top_k": -1, "repetition_penalty": 1.0,
                "temperature": self.args.eval.temperature,
                "n_samples_per_prompt": self.args.eval.n_samples_per_prompt}

    def _eval_set_loader(self, file: str):
        """A set's prompts as OpenRLHF builds its eval dataloader (``prepare_datasets``), once per file."""
        if file not in self._eval_set_loaders:
            args = self.strategy.args
            data = blending_datasets(file, None, self.strategy, dataset_split="train")
            dataset = PromptDataset(data, self.tokenizer, self.strategy, input_template=args.data.input_template)
            self._eval_set_loaders[file] = self.strategy.setup_dataloader(
                dataset, 1, True, False, dataset.collate_fn, num_workers=args.data.dataloader_num_workers)
        return self._eval_set_loaders[file]

    @torch.no_grad()
    def evaluate(self, global_step, **generate_kwargs):
        """``evaluation.sets``: every set generated from its own file with its own sampling, logged as
        ``eval/<set>/<metric>`` and ``eval/average``; without sets, OpenRLHF's own evaluation."""
        specs = self.strategy.args.mmrl.eval_sets
        logs = (self._evaluate_sets(global_step, specs, generate_kwargs) if specs
                else super().evaluate(global_step, **generate_kwargs))
        self.metrics.write_eval(global_step, logs)
        return logs

    def _evaluate_sets(self, global_step, specs, generate_kwargs) -> dict[str, float]:
        logs: dict[str, float] = {}
        generator = self.samples_generator
        for spec in specs:
            previous, generator.eval_dataloader = generator.eval_dataloader, self._eval_set_loader(spec["file"])
            try:
                samples = generator.generate_eval_samples(**set_generate_kwargs(spec, generate_kwargs))
            finally:
                generator.eval_dataloader = previous
            correct = [float(v) for e in samples for v in e.info[spec["correct_key"]].flatten().tolist()]
            logs.update(set_metrics(spec, correct))
        logs["average"] = average(specs, logs)
        if self.wandb_logger:
            self.wandb_logger.log_eval(global_step, logs)
        if self.tensorboard_logger:
            self.tensorboard_logger.log_eval(global_step, logs)
        return logs


MmrlPPOTrainerRayActor = ray.remote(MmrlPPOTrainer)
