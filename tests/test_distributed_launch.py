"""A run over several ranks, scheduler side: the profile's shape (`nodes`, `gpus`, `tasks_per_node`), the
torchrun variables every task of a multi-task submitit job gets, and the preemption agreement (every rank
acts on SLURM's warning at the same step boundary). Real processes and real gloo collectives, on CPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import submitit
import torch
import yaml

from ablate.experiments.slurm_profile import load_profile, ranks
from ablate.experiments.sweep import SpecError
from ablate.experiments.worker import export_rank_env
from ablate.train import preemption

ROOT = Path(__file__).resolve().parent.parent


def profile(tmp_path, **keys) -> Path:
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump({"partition": "gpu", **keys}))
    return p


@pytest.mark.parametrize("keys, shape, n", [
    ({}, {}, 1),                                                          # as before: one task
    ({"gpus": 1}, {"gpus_per_node": 1}, 1),
    ({"gpus": 8}, {"tasks_per_node": 8, "gpus_per_node": 8}, 8),        # 1 node x 8 GPUs: 8 ranks
    ({"nodes": 2, "gpus": 8}, {"nodes": 2, "tasks_per_node": 8, "gpus_per_node": 8}, 16),
    ({"tasks_per_node": 2, "cpus": 1}, {"tasks_per_node": 2, "cpus_per_task": 1}, 2),  # CPU ranks
    ({"nodes": 2}, {"nodes": 2}, 2),
])
def test_profile_shape_gives_submitit_nodes_tasks_and_gpus(tmp_path, keys, shape, n):
    params = load_profile(profile(tmp_path, **keys))
    assert params == {"slurm_partition": "gpu", **shape}
    assert ranks(params) == n


@pytest.mark.parametrize("keys, words", [
    ({"nodes": 0}, ["nodes: 0", ">= 1"]),
    ({"tasks_per_node": 0}, ["tasks_per_node: 0", ">= 1"]),
    ({"gpus": -1}, ["gpus: -1", ">= 0"]),
    ({"gpus": 8, "tasks_per_node": 4}, ["tasks_per_node: 4", "gpus: 8", "must be 8"]),
    ({"nodes": "two"}, ["nodes", "expected int, got 'two'"]),
    ({"additional": {"ntasks-per-node": 4}}, ["additional.ntasks-per-node", "nodes, gpus and tasks_per_node"]),
])
def test_bad_profile_shape_names_file_field_and_allowed_values(tmp_path, keys, words):
    p = profile(tmp_path, **keys)
    with pytest.raises(SpecError) as err:
        load_profile(p)
    assert str(p) in str(err.value) and all(w in str(err.value) for w in words), str(err.value)


def test_each_task_of_a_two_task_local_job_is_one_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))

    def _two_rank_all_reduce() -> dict:
        """One task of a 2-task submitit job: export the torchrun variables, then a real gloo all_reduce
        (a local function: cloudpickled by value, as tests/ is not importable in the job)."""
        import os

        import torch
        import torch.distributed as dist

        from ablate.experiments.worker import export_rank_env

        rank = export_rank_env()
        env = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                           "MASTER_PORT")}
        dist.init_process_group("gloo")  # env://: exactly what a torchrun-compatible trainer does
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        out = {"rank": rank, "world": dist.get_world_size(), "sum": float(t.item()), **env}
        dist.destroy_process_group()
        return out

    ex = submitit.LocalExecutor(folder=tmp_path / "submitit")
    ex.update_parameters(tasks_per_node=2, timeout_min=2)
    job = ex.submit(_two_rank_all_reduce)
    res = job.results()
    assert [r["rank"] for r in res] == [0, 1] and [r["RANK"] for r in res] == ["0", "1"]
    assert [r["LOCAL_RANK"] for r in res] == ["0", "1"]
    assert {r["world"] for r in res} == {2} and {r["WORLD_SIZE"] for r in res} == {"2"}
    assert {r["sum"] for r in res} == {3.0}  # 1 + 2: both ranks took part in the same all_reduce
    assert len({(r["MASTER_ADDR"], r["MASTER_PORT"]) for r in res}) == 1  # one rendezvous


def test_one_task_job_and_in_process_export_nothing(monkeypatch):
    monkeypatch.delenv("SUBMITIT_FOLDER", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert export_rank_env() == 0
    assert "RANK" not in os.environ
    assert preemption.agree(True) is True and preemption.agree(False) is False  # no process group: identity


# Two real processes, one gloo group (file rendezvous). The handler mimics submitit's: rank 0 checkpoints
# (save_now), requeues and exits; another rank only logs and returns. One rank alone gets SIGUSR2, mid-step.
# Two episodes in the same processes (torch's import is most of the time): rank 1 warned at step 3, then
# rank 0 warned at step 5.
EPISODES = [(1, 3), (0, 5)]
RANK_SCRIPT = r"""
import json, os, signal, sys
import torch, torch.distributed as dist
from ablate.train import preemption

rank, out = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=2)
logs = []
for signalled, at in EPISODES:
    step, log = 0, {"handled_at": None, "saved_at": None, "exit": None, "last_step": 0}

    def save():
        log["saved_at"] = step

    def submitit_like(signum, frame):
        log["handled_at"] = step
        if rank == 0:
            preemption.save_now()
            raise SystemExit(-1)

    signal.signal(signal.SIGUSR2, submitit_like)
    try:
        with preemption.guard(save):
            while step < 8:
                with preemption.step():
                    step += 1
                    dist.all_reduce(torch.ones(1))  # the step's own collectives
                    if rank == signalled and step == at:
                        os.kill(os.getpid(), signal.SIGUSR2)
                    log["last_step"] = step
    except SystemExit as e:
        log["exit"], log["requeue"] = e.code, preemption.checkpointed_for_requeue()
    logs.append(log)
    dist.barrier()  # both ranks out of the episode before the next one starts
json.dump(logs, open(f"{out}/rank{rank}.json", "w"))
dist.destroy_process_group()  # as the trainer does: a gloo group alive at exit can abort the process (SIGABRT)
""".replace("EPISODES", repr(EPISODES), 1)


def run_rank_script(script: str, tmp_path) -> list:
    """`script` (RANK_SCRIPT or a variant) as ranks 0 and 1, both exiting 0; each rank's episode logs."""
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r), str(tmp_path)],
                              env={**os.environ, "PYTHONPATH": str(ROOT)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_warning_seen_by_one_rank_is_acted_on_by_every_rank_at_the_same_step(tmp_path):
    logs = run_rank_script(RANK_SCRIPT, tmp_path)
    for (signalled, at), r0, r1 in zip(EPISODES, *logs):
        # both stop at the end of step `at`, whichever rank got the signal: rank 0 saved there (the resume
        # loses and repeats no step) and exits as submitit does to requeue; rank 1 leaves quietly rather
        # than wait in step at+1 for a rank 0 that is gone
        assert r0 == {"handled_at": at, "saved_at": at, "exit": -1, "last_step": at, "requeue": True}, signalled
        assert r1 == {"handled_at": at, "saved_at": None, "exit": 0, "last_step": at, "requeue": True}, signalled


@pytest.mark.parametrize("name, n", [("gpu-1node-8gpu", 8), ("gpu-2node-8gpu", 16), ("dev-2task", 2),
                                     ("dev", 1), ("gpu-example", 1)])
def test_shipped_profiles_give_their_ranks(name, n):
    assert ranks(load_profile(ROOT / "slurm" / "profiles" / f"{name}.yaml")) == n


def toy_sweep(tmp_path, more: dict | None = None, **executor):
    from ablate.experiments.sweep import parse_spec

    overrides = {"steps": 3, "prompts_per_step": 5, "recipe.group_size": 3, "eval.every": 2, "eval.n_samples": 3,
                 "eval.ks": [1, 3], "tracking.wandb.mode": "disabled", "compute.threads": 1, **(more or {})}
    return parse_spec({"name": "toy2", "base": {"config": str(ROOT / "configs" / "toy.yaml"), "overrides": overrides},
                       "executor": executor, "out": str(tmp_path / "runs")},
                      "toy2.yaml", Path("."))


def test_local_sweep_with_two_tasks_per_run_gives_the_one_process_runs(tmp_path, monkeypatch):
    """`executor.tasks_per_node: 2`: each run of a local sweep is one 2-task submitit job, 2 gloo ranks."""
    import math

    from ablate.experiments.launch import launch
    from ablate.experiments.status import sweep_status
    from ablate.experiments.sweep import expand
    from ablate.runs.store import RunStore
    from ablate.train.trainer import train

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    sweep = toy_sweep(tmp_path, tasks_per_node=2)  # one run (each fresh process imports torch: seconds)
    runs = expand(sweep)
    assert len(launch(sweep, runs, poll_s=0.2)["submitted"]) == 1
    assert {r["state"] for r in sweep_status(sweep.out)} == {"completed"}
    for run in runs:
        one, two = RunStore(tmp_path / "one" / run.run_id), RunStore(sweep.out / run.run_id)
        assert train(run.config, str(one.root), progress=False) == "completed"
        assert two.provenance()["world_size"] == 2 and one.provenance()["world_size"] == 1
        for log in ("samples", "evals", "metrics"):
            rows1, rows2 = one.read(log), two.read(log)
            assert len(rows1) == len(rows2) > 0 and [r.keys() for r in rows1] == [r.keys() for r in rows2]
            for r1, r2 in zip(rows1, rows2):
                for k in r1:
                    if not k.startswith("perf/"):
                        a, b = r1[k], r2[k]
                        assert (a == b or isinstance(a, float) and math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-7)
                                or a != a and b != b), (log, k, a, b)
        w1, w2 = one.load_checkpoint()["model"], two.load_checkpoint()["model"]
        assert all(torch.allclose(w1[k], w2[k], rtol=1e-5, atol=1e-7) for k in w1)


@pytest.mark.parametrize("executor, words", [
    ({"tasks_per_node": 0}, ["executor.tasks_per_node", "0 is not allowed", ">= 1"]),
    ({"tasks_per_node": "two"}, ["executor.tasks_per_node", "expected int, got 'two'"]),
    ({"tasks_per_node": 2, "name": "slurm"}, ["executor.tasks_per_node: 2", "local executor only", "profile"]),
    ({"tasks_per_node": 2, "name": "debug"}, ["executor.tasks_per_node: 2", "local executor only", "one process"]),
])
def test_bad_local_tasks_per_node_names_the_spec_key_and_allowed_values(tmp_path, executor, words):
    from ablate.experiments.launch import launch
    from ablate.experiments.sweep import expand

    with pytest.raises(SpecError) as err:
        sweep = toy_sweep(tmp_path, **executor)
        launch(sweep, expand(sweep))
    assert "toy2.yaml" in str(err.value) and all(w in str(err.value) for w in words), str(err.value)
    assert not (tmp_path / "runs").exists()  # nothing submitted, nothing written


def test_local_tasks_per_node_beyond_the_gpus_of_this_machine_is_refused_for_cuda_runs(tmp_path):
    from ablate.experiments.executors import local_ranks
    from ablate.experiments.sweep import expand

    sweep = toy_sweep(tmp_path, tasks_per_node=2)
    runs = expand(sweep)  # device: auto, i.e. CUDA on a machine with GPUs
    with pytest.raises(SpecError) as err:
        local_ranks(sweep, "local", sweep.executor, runs, gpus=1)
    assert all(w in str(err.value) for w in ("toy2.yaml", "executor.tasks_per_node: 2", "1 GPU(s)", "at most 1"))
    assert local_ranks(sweep, "local", sweep.executor, runs, gpus=2) == 2
    assert local_ranks(sweep, "local", sweep.executor, runs, gpus=0) == 2  # a CPU machine: gloo ranks
    cpu = toy_sweep(tmp_path, {"device": "cpu"}, tasks_per_node=2)  # CPU runs on a GPU machine: gloo ranks
    assert local_ranks(cpu, "local", cpu.executor, expand(cpu), gpus=1) == 2
