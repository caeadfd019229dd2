"""compute.parallel: fsdp (FSDP2 `fully_shard`, ablate/train/sharding.py) on 2 gloo ranks gives the
one-process run: the same samples and evals, metrics and final weights to 1e-5 relative, with the
optimizer over 1/2 shards on each rank; its checkpoints resume in one process and a one-process
checkpoint resumes under fsdp, both to the uninterrupted result. Every 2-rank run shares one launch."""

import json
from pathlib import Path

import pytest
from test_distributed import LM_RECIPES, assert_params_close, assert_same_run, close, lm, sigkill_rank1_at_step

from ablate.config import ConfigError, parse, to_dict
from ablate.runs.store import RunStore
from ablate.train import distributed, ranks, sharding
from ablate.train.trainer import train


def fsdp(cfg, **over):
    """`cfg` with compute.parallel 'fsdp' and the sections of `over` merged in."""
    d = to_dict(cfg)
    d["compute"]["parallel"] = "fsdp"
    for k, v in over.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) else v
    return parse(d)


def chain_job(model_dir):
    """4 steps, a checkpoint after each: one process until step 2 (checkpoint 1), then fsdp on 2 ranks
    until rank 1 dies in step 3 (checkpoint 2, written under fsdp), then one process again to the end."""
    return fsdp(lm(model_dir, LM_RECIPES[0]), steps=4, checkpoint_every=1,
                eval={"every": 0, "n_samples": 2, "ks": [1, 2]})


def equal_jobs(model_dir):
    """KL in the reward, 2 epochs x 2 minibatches, micro-batches (LM_RECIPES[1]); and one prompt with
    3 minibatches of 1 row, so a rank has no rows to sample, score or back-propagate (it still takes part
    in the reduce-scatter), under normalised SGD and gradient checkpointing."""
    return [fsdp(lm(model_dir, LM_RECIPES[1])),
            fsdp(lm(model_dir, LM_RECIPES[0]), prompts_per_step=1, steps=2,
                 recipe={"group_size": 3, "minibatches": 3},
                 optim={"optimizer": "normalized_sgd", "lr": 0.01},
                 compute={"micro_batch_tokens": 0, "gradient_checkpointing": True})]


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory, tiny_model_dir):
    from conftest import crash_training_at

    root = tmp_path_factory.mktemp("fsdp")
    chain = chain_job(tiny_model_dir)
    jobs = [(cfg, str(root / f"equal{i}")) for i, cfg in enumerate(equal_jobs(tiny_model_dir))] + \
        [(chain, str(root / "chain"))]
    shards = root / "shards"
    shards.mkdir()
    real = sharding.prepare

    def prepare(policy, cfg, make_optimizer):  # record what each rank's optimizer holds
        optimizer, scheduler = real(policy, cfg, make_optimizer)
        params = [p for g in optimizer.param_groups for p in g["params"]]
        with open(shards / f"rank{distributed.rank()}.jsonl", "a") as f:
            f.write(json.dumps({"rank": distributed.rank(), "local": sum(p.to_local().numel() for p in params),
                                "full": sum(p.numel() for p in params)}) + "\n")
        return optimizer, scheduler

    with pytest.MonkeyPatch.context() as monkeypatch:
        crash_training_at(monkeypatch, chain, jobs[-1][1], 2)  # one process: checkpoint 1, dies in step 2
        monkeypatch.setattr(sharding, "prepare", prepare)
        sigkill_rank1_at_step(monkeypatch, jobs[-1][1], 3)
        with pytest.raises(ranks.RanksFailed):
            ranks.launch(2, jobs)
    # the failure is the SIGKILL of the chain's rank 1; the jobs before it completed
    assert [RunStore(out).status()["state"] for _, out in jobs] == ["completed", "completed", "failed"]
    return jobs, [json.loads(line) for p in shards.iterdir() for line in p.read_text().splitlines()]


@pytest.mark.parametrize("i", [0, 1])
def test_fsdp_on_two_ranks_gives_the_one_process_run(fsdp_runs, tmp_path, i):
    jobs, shards = fsdp_runs
    cfg, two = jobs[i]
    assert train(cfg, str(tmp_path), progress=False) == "completed"  # world size 1: no sharding
    assert_same_run(tmp_path, Path(two))
    assert RunStore(two).read_config()["compute"]["parallel"] == "fsdp"
    # each rank's optimizer held half of every parameter (dim-0 shards), in both runs
    assert sorted(s["rank"] for s in shards) == [0] * len(jobs) + [1] * len(jobs)
    for s in shards:
        assert s["local"] < 0.6 * s["full"]
    assert sum(s["local"] for s in shards) == sum(s["full"] for s in shards) / 2


def test_fsdp_checkpoints_resume_across_world_sizes(fsdp_runs, tmp_path):
    jobs, _ = fsdp_runs
    cfg, chain = jobs[-1]
    store = RunStore(chain)
    assert store.status()["state"] == "failed" and store.status()["step"] in (3, 4)
    ckpt = store.load_checkpoint()  # torch.load(weights_only=True): plain tensors, the one-process format
    assert ckpt["step"] == 2 and all(isinstance(k, int) for k in ckpt["optimizer"]["state"])
    assert train(cfg, chain, progress=False) == "completed"  # one process, from fsdp's checkpoint 2
    assert store.provenance()["resumed_from_steps"] == [1, 2]
    assert train(cfg, str(tmp_path), progress=False) == "completed"  # never interrupted
    one = RunStore(tmp_path)
    w1, w2 = one.load_checkpoint()["model"], store.load_checkpoint()["model"]
    assert w1.keys() == w2.keys()
    for k in w1:
        assert_params_close(w2[k], w1[k])
    o1, o2 = one.load_checkpoint()["optimizer"]["state"], store.load_checkpoint()["optimizer"]["state"]
    for i in o1:
        for k in ("exp_avg", "exp_avg_sq"):
            assert_params_close(o2[i][k], o1[i][k])
    m1, m2 = one.read("metrics"), store.read("metrics")
    assert [r["step"] for r in m2] == list(range(1, cfg.steps + 1))
    assert all(close(m1[j][k], m2[j][k], k) for j in range(cfg.steps) for k in m1[j] if not k.startswith("perf/"))
    assert [r["completion"] for r in one.read("samples")] == [r["completion"] for r in store.read("samples")]


@pytest.mark.parametrize("over, field", [
    ({"task": {"name": "toy_addition"}, "recipe": {"max_new_tokens": 2, "kl_coef": 0.0}}, "task.name"),
    ({"model": {"lora": {"r": 4}}}, "model.lora"),
    ({"recipe": {"adv_whiten": "gae", "baseline": "none", "scale": "none"}}, "recipe.adv_whiten"),
    ({"recipe": {"ref_reset_every": 5, "kl_coef": 0.1}}, "recipe.ref_reset_every"),
])
def test_fsdp_refuses_what_it_does_not_shard(over, field):
    with pytest.raises(ConfigError) as err:
        parse({**over, "compute": {"parallel": "fsdp"}})
    msg = str(err.value)
    assert "compute.parallel='fsdp'" in msg and field in msg and "'ddp'" in msg
    parse({**over, "compute": {"parallel": "ddp"}})  # fine without fsdp


def test_a_warning_under_fsdp_saves_on_every_rank_at_the_same_step(tmp_path):
    """The SLURM warning with a save that is a collective (fsdp gathers the shards): every rank runs it at
    the agreed boundary, rank 0's handler does not run it again, and no rank waits for a peer gone."""
    from test_distributed_launch import EPISODES, RANK_SCRIPT, run_rank_script

    script = RANK_SCRIPT.replace("with preemption.guard(save):", "with preemption.guard(save, collective=True):")
    script = script.replace('log["saved_at"] = step', 'dist.all_reduce(torch.ones(1)); log["saved_at"] = step')
    assert script.count("collective=True") == script.count("dist.all_reduce(torch.ones(1)); log") == 1
    logs = run_rank_script(script, tmp_path)
    for (signalled, at), r0, r1 in zip(EPISODES, *logs):
        assert r0 == {"handled_at": at, "saved_at": at, "exit": -1, "last_step": at, "requeue": True}, signalled
        assert r1 == {"handled_at": at, "saved_at": at, "exit": 0, "last_step": at, "requeue": True}, signalled
