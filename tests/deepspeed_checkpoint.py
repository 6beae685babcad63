"""A real DeepSpeed checkpoint written and read back on this CPU, and crafted copies of its files, as the openrlhf
backend's policy actor saves and resumes them: a ZeRO-2 bf16 engine built by mmrl's strategy, one rank over gloo.
Run as a script by tests/test_safe_loading.py (a process of its own: DeepSpeed keeps its process group and torch's
weights-only setting is per process)::

    python tests/deepspeed_checkpoint.py WORK_DIR

writes ``WORK_DIR/report.json``: whether mmrl's strategy restored the checkpoint exactly, and for each crafted file
what mmrl's strategy said and whether DeepSpeed's own loader ran the file's code.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
FILES = {"model": "mp_rank_00_model_states.pt", "optimizer": "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(work: Path) -> None:
    sys.path.insert(0, str(TESTS))
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1",
                       "LOCAL_RANK": "0", "DS_ACCELERATOR": "cpu"})
    from mmrl.openrlhf.rehearsal import install_worker_shims

    install_worker_shims()  # what each rehearsal worker runs first: OpenRLHF's CUDA calls become no-ops
    import deepspeed
    import torch
    from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler, DynamicLossScaler
    from openrlhf.models import Actor
    from test_safe_loading import RunsCode
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mmrl.openrlhf.checkpoint import deepspeed_types, weights_only_loading
    from mmrl.openrlhf.launch import resolve_launch
    from mmrl.openrlhf.strategy import MmrlDeepspeedStrategy, host_rendezvous_store, keep_collectives_on_gloo
    from mmrl.train import parse_config

    torch.set_num_threads(1)
    hosted = host_rendezvous_store()  # noqa: F841 -- on 127.0.0.1, alive while this process is
    keep_collectives_on_gloo()  # as the strategy's setup_distributed does before it joins the group
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    cfg = parse_config(["--backend", "openrlhf", "--out", str(work / "run"), "--cluster.gpus_per_node", "1",
                        "--cluster.vllm_engines", "1"])
    args = resolve_launch(cfg, write=False).args
    assert args.ds.param_dtype == "bf16"
    strategy = MmrlDeepspeedStrategy(seed=0, max_norm=1.0, micro_train_batch_size=1, train_batch_size=1,
                                     zero_stage=2, args=args)
    strategy.world_size, strategy.accumulated_gradient = 1, 1
    optim = {"optim": "adam", "muon": {}, "adam": {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0},
             "lr_scheduler": "constant", "lr_warmup_ratio": 0.0, "max_norm": 1.0, "scheduler_steps": 4}

    def engine(seed: int):
        torch.manual_seed(seed)
        actor = Actor(Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                                                   num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)))
        actor.packing_samples = False
        actor, _, _ = strategy.prepare((actor, optim))
        return actor.model

    def state(e) -> dict:
        opt = e.optimizer.optimizer.state_dict()["state"]
        return {"weights": {n: p.detach().float().clone() for n, p in e.module.named_parameters()},
                "exp_avg": [s["exp_avg"].clone() for s in opt.values()]}

    trained = engine(1)
    loss = trained(torch.tensor([[3, 5, 7, 9]])).logits.float().pow(2).mean()
    trained.backward(loss)
    trained.step()
    saved = state(trained)
    ckpt = work / "checkpoints" / "_actor"
    strategy.save_ckpt(trained, str(ckpt), "global_step1", client_state={"global_step": 1})
    folder = ckpt / "global_step1"

    report: dict = {"files": sorted(p.name for p in folder.iterdir())}
    # the rotation past ckpt.max_num (2: one tag kept beside the new one) on real saves, with a user's folder beside
    # the tags (the oldest folder there) and a user's file inside the first tag
    rotated = work / "rotated" / "_actor"
    (rotated / "analysis").mkdir(parents=True)
    (rotated / "analysis" / "plot.txt").write_text("mine")
    for step in (1, 2, 3):
        strategy.save_ckpt(trained, str(rotated), f"global_step{step}", max_num=2, client_state={"global_step": step})
        if step == 1:
            (rotated / "global_step1" / "eval.json").write_text("mine too")
    report["rotated"] = sorted(p.relative_to(rotated).as_posix() for p in rotated.rglob("*") if p.is_file())
    fresh = engine(2)
    _, client = strategy.load_ckpt(fresh, str(ckpt))
    loaded = state(fresh)
    report["restored"] = {"client_state": client.get("global_step"),
                          "weights": all(torch.equal(saved["weights"][n], w) for n, w in loaded["weights"].items()),
                          "exp_avg": len(saved["exp_avg"]) > 0 and all(
                              torch.equal(a, b) for a, b in zip(saved["exp_avg"], loaded["exp_avg"], strict=True))}

    # the loss scaler of an fp16 run, as DeepSpeed's ZeRO optimizer makes it (DeepSpeed has no fp16 on a CPU)
    scaler = CreateLossScaler(torch.half, 0, True, {"init_scale": 2.0 ** 16, "scale_window": 500, "min_scale": 1.0,
                                                    "delayed_shift": 2, "consecutive_hysteresis": False})
    assert isinstance(scaler, DynamicLossScaler)
    torch.save({"loss_scaler": scaler}, work / "scaler.pt")
    with weights_only_loading(work):
        back = torch.load(work / "scaler.pt", weights_only=True)["loss_scaler"]
    report["fp16_scaler"] = vars(back) == vars(scaler)

    for kind, name in FILES.items():
        crafted = work / f"crafted_{kind}"
        shutil.copytree(ckpt, crafted)
        marker = work / f"ran_{kind}"
        with torch.serialization.safe_globals(deepspeed_types()):
            content = torch.load(crafted / "global_step1" / name, weights_only=True)
        content["note"] = RunsCode(marker)
        torch.save(content, crafted / "global_step1" / name)
        outcome = {}
        try:
            strategy.load_ckpt(engine(3), str(crafted))
            outcome["mmrl"] = "loaded"
        except ValueError as exc:
            outcome["mmrl"] = str(exc)
        outcome["mmrl_ran_code"] = marker.exists()
        marker.unlink(missing_ok=True)
        try:
            engine(4).load_checkpoint(str(crafted))  # DeepSpeed's own loader, as OpenRLHF calls it
        except Exception as exc:  # noqa: BLE001 -- whatever DeepSpeed makes of the extra key, the code ran first
            outcome["deepspeed_error"] = f"{type(exc).__name__}: {exc}"[:200]
        outcome["deepspeed_ran_code"] = marker.exists()
        report[kind] = outcome
    (work / "report.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
