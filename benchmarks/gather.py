"""The rollout gather at 2 ranks: tensor collectives (`distributed.gather_objects`) vs pickling the whole
rollout (`all_gather_object`, how it was gathered before), on this machine, printed as a ratio.

    python benchmarks/gather.py [--rows 128] [--tokens 1024] [--prompt 256] [--repeats 10]

Two ranks (gloo, CPU; `ranks.run_ranks`, as `ablate train --nproc 2`) each hold half of a rollout
of `rows` completions of `tokens` tokens (ids int64, mask and behaviour log-probs float32, prompts of
`prompt` tokens, 3,000-character texts) and gather it `repeats` times each way; both ways must give the
same tensors bit for bit. Threads: 1 per rank.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from ablate.rl.sampling import Rollout  # noqa: E402
from ablate.train import distributed, ranks  # noqa: E402


def pickled(obj):
    out = [None] * distributed.world()
    dist.all_gather_object(out, distributed.to_device(obj, "cpu"))
    return out


def rank(rows: int, tokens: int, prompt: int, repeats: int) -> dict[str, float]:
    torch.set_num_threads(1)
    distributed.init_from_env(torch.device("cpu"))
    n = len(range(rows)[distributed.split(rows)])
    g = torch.Generator().manual_seed(distributed.rank())
    ro = Rollout(torch.randint(0, 150_000, (n, prompt), generator=g), torch.ones(n, prompt, dtype=torch.long),
                 torch.randint(0, 150_000, (n, tokens), generator=g), torch.ones(n, tokens),
                 torch.zeros(n, dtype=torch.bool), ["x" * 3000] * n, torch.randn(n, tokens, generator=g))
    seconds = {}
    for name, gather in [("pickled", pickled), ("tensors", distributed.gather_objects)]:
        gather(ro)  # warm-up
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(repeats):
            parts = gather(ro)
        seconds[name] = (time.perf_counter() - t0) / repeats
        assert all(torch.equal(p.behav_logp, q.behav_logp) and p.texts == q.texts
                   for p, q in zip(parts, pickled(ro)))
    dist.destroy_process_group()
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=10)
    a = ap.parse_args()
    s = ranks.run_ranks(2, rank, a.rows, a.tokens, a.prompt, a.repeats)[0]
    print(f"rollout {a.rows} x {a.tokens} tokens, 2 ranks: pickled {s['pickled'] * 1e3:.1f} ms, "
          f"tensor collectives {s['tensors'] * 1e3:.1f} ms per gather; speed-up {s['pickled'] / s['tensors']:.1f}x")


if __name__ == "__main__":
    main()
