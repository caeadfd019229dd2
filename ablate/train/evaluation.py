"""Held-out evaluation: pass@k, maj@k and greedy accuracy under the strict verifier, on a schedule and
before training (docs/metrics.md); `eval.repeats` evaluations with their own sampling noise. Sampled by the
run's rollout engine (`trainer.build_engine`): the policy's own loop, or vLLM with the trained weights."""

from __future__ import annotations

import numpy as np
import torch

from ablate.config import RunConfig
from ablate.rl import stats
from ablate.rl.sampling import EVAL, Rollout, RowNoise
from ablate.runs.store import RunStore
from ablate.tasks import score_batch, task_labels
from ablate.tasks.base import Problem
from ablate.tasks.mixture import per_task_eval
from ablate.train import distributed, episodes


@torch.no_grad()
def evaluate(engine, task, heldout: list[Problem], cfg: RunConfig, tokenizer, max_new_tokens: int, chunk: int = 64,
             step: int = 0, repeat: int = 0):
    """Held-out pass@k (strict verifier, n samples of at most `max_new_tokens` at eval temperature), greedy
    accuracy, samples, and the correct count of each problem ([M]). Sampling noise is keyed by (seed, step,
    chunk, repeat > 0), so repeat 0 is what a single evaluation samples and training never depends on
    eval.repeats; each rank samples its share of a chunk's problems."""
    e, n = cfg.eval, cfg.eval.n_samples
    counts, rewards, lengths, greedy, samples, answers, oks = [], [], [], [], [], [], []
    # maj@k votes over the task's extracted answers; a task without `extract` votes on the verifier
    # outcome: every correct sample counts as one answer, each wrong one as its own stripped text
    extract = getattr(task, "extract", None)
    for start in range(0, len(heldout), chunk):
        probs = heldout[start:start + chunk]
        prompts = [task.prompt_text(p, tokenizer) for p in probs]
        key = (cfg.seed, step, start, EVAL) + ((repeat,) if repeat else ())
        ro, scores, g_ok = eval_chunk(engine, task, probs, prompts, cfg, max_new_tokens, key)
        counts += (scores >= 1).sum(1).tolist()
        oks += (scores >= 1).tolist()
        answers += [[extract(t) if extract else ("<correct>" if ok else t.strip())
                     for t, ok in zip(ro.texts[i * n:(i + 1) * n], (scores[i] >= 1).tolist())]
                    for i in range(len(probs))]
        rewards.append(scores.flatten())
        lengths.append(ro.lengths.cpu())
        greedy += g_ok
        if start == 0:
            samples = [{"split": "heldout", "prompt": prompts[i], "completion": ro.texts[i * n],
                        "reward": float(scores[i, 0]), "correct": bool(scores[i, 0] >= 1)}
                       for i in range(min(e.num_samples_logged, len(probs)))]
    row = {f"eval/pass@{k}": stats.mean_pass_at_k(counts, n, k) for k in e.ks}
    row.update({f"eval/maj@{k}": stats.mean_maj_at_k(answers, oks, k) for k in e.ks})
    row.update(per_task_eval(task_labels(task, heldout), counts, n, e.ks))  # task mixtures only
    row.update({
        "eval/greedy_acc": float(np.mean(greedy)),
        "eval/reward_mean": float(torch.cat(rewards).mean()),
        "eval/completion_len_mean": float(torch.cat(lengths).float().mean()),
        "eval/frac_never_solved": float(np.mean([c == 0 for c in counts])),
        "eval/frac_always_solved": float(np.mean([c == n for c in counts])),
    })
    if hasattr(engine, "exact_pass1"):
        row["eval/pass@1_exact"] = engine.exact_pass1(heldout)
    return row, samples, counts


def evaluate_repeats(engine, task, heldout: list[Problem], cfg: RunConfig, tokenizer, max_new_tokens: int,
                     step: int):
    """`eval.repeats` evaluations: their mean row (one repeat: its row as is), the samples of repeat 0, and
    one `eval_problems` row per repeat (docs/run-folders.md): every problem's correct count out of n."""
    done = [evaluate(engine, task, heldout, cfg, tokenizer, max_new_tokens, step=step, repeat=r)
            for r in range(cfg.eval.repeats)]
    rows, ids = [row for row, _, _ in done], [p.id for p in heldout]
    problems = [{"repeat": r, "n": cfg.eval.n_samples, "problems": ids, "correct": counts}
                for r, (_, _, counts) in enumerate(done)]
    mean = rows[0] if len(rows) == 1 else {k: float(np.mean([x[k] for x in rows])) for k in rows[0]}
    return mean, done[0][1], problems


def eval_chunk(engine, task, probs: list[Problem], prompts: list[str], cfg: RunConfig, max_new: int,
               key: tuple[int, ...]):
    """n samples of each problem with the row noise of `key`, their strict scores [B, n] and the greedy
    decodes' correctness [B]; each rank samples its share, all ranks get everything."""
    n = cfg.eval.n_samples

    def mine(part: slice):
        if episodes.is_env(task):  # multi-turn episodes: the environment scores them
            return episodes.eval_part(engine, task, probs[part], n, cfg.eval.temperature, max_new, engine.tokenizer,
                                      key, part.start * n, len(probs) * n)
        noise = RowNoise(key, len(probs) * n, part.start * n, part.stop * n)
        ro = engine.sample(prompts[part], n, cfg.eval.temperature, max_new, noise=noise)
        scores = torch.tensor(score_batch(task, [p for p in probs[part] for _ in range(n)], ro.texts, train=False))
        g = engine.sample(prompts[part], 1, 1.0, max_new, greedy=True)
        return ro, scores.view(-1, n), [task.score(p, t) >= 1 for p, t in zip(probs[part], g.texts)]

    parts = distributed.map_shards(len(probs), mine)
    ro = Rollout.cat([p[0] for p in parts], engine.pad_id)
    return ro, torch.cat([p[1] for p in parts]), [ok for p in parts for ok in p[2]]


def log_eval(store: RunStore, step: int, row: dict, samples: list[dict], train_reward: float | None,
             problems: list[dict] = ()) -> None:
    if train_reward is not None:
        row = {**row, "eval/train_minus_heldout_reward": train_reward - row["eval/reward_mean"]}
    store.append("evals", {"step": step, **row})
    for s in samples:
        store.append("samples", {"step": step, **s})
    for q in problems:
        store.append("eval_problems", {"step": step, **q})
