"""Multi-turn episodes against a scripted environment with known replies: the token tags, masks and
advantages of one group checked by hand (the worked example of docs/environments.md), the loss with environment
tokens masked or not, the shipped environments, and an environment that raises, hangs or answers with
the wrong types."""

import json
import time

import pytest
import torch
from skyrl_gym.envs.base_text_env import BaseTextEnv

from ablate.config import ConfigError, parse
from ablate.rl import losses
from ablate.rl.sampling import EPISODE_FIELDS, Rollout
from ablate.rl.turns import CREDITS, credit_advantages, turn_returns
from ablate.tasks import make_task
from ablate.tasks.base import Problem
from ablate.tasks.environments.calculator import CalculatorEnv, evaluate
from ablate.train import episodes, execution
from ablate.train.models import _new_model, build_tokenizer
from ablate.train.plan import plan_step
from ablate.train.rollout import LMPolicy
from ablate.train.trainer import loss_tokens


class ScriptedEnv(BaseTextEnv):
    """A call "[...]" gets the reply "=R\\n" and a tool-error penalty of 0.1; any other turn ends the episode
    with reward 1 if it says "3", else 0. Behaviours for the bad-input tests by the problem's answer."""

    def __init__(self, env_config=None, extras=None):
        super().__init__()
        self.mode = extras["reward_spec"]["ground_truth"]

    def init(self, prompt):
        if self.mode == "instructions":  # the environment adds its instructions to the prompt
            return [{"role": "system", "content": "Use [a+b]. "}, *prompt], {}
        return prompt, {}

    def step(self, action):
        if self.mode == "raise":
            raise RuntimeError("the environment broke")
        if self.mode == "hang":
            time.sleep(30)
        if self.mode == "bad_types":
            return {"observations": "not a list", "reward": "1", "done": 1, "metadata": {}}
        if action.startswith("["):
            return {"observations": [{"role": "tool", "content": "=R\n"}], "reward": -0.1, "done": False,
                    "metadata": {"tool_call": True, "tool_error": True}}
        return {"observations": [], "reward": float(action == "3"), "done": True, "metadata": {}}


class ScriptedEngine:
    """The rollout engine's protocol with known outputs: at turn t, row j of a call gets SCRIPT[row][t], where
    the row is read from its context (the first turn's calls list the group's rows in order)."""

    def __init__(self, tokenizer, script: dict[int, list[str]]):
        self.tokenizer, self.script, self.pad_id, self.device = tokenizer, script, tokenizer.pad_token_id, torch.device("cpu")
        self.calls: list[tuple[int, list[str] | None]] = []

    def sample(self, prompts, n, temperature, max_new_tokens, greedy=False, noise=None, stop=None):
        self.calls.append((max_new_tokens, stop))
        first = all(len(p) == len(prompts[0]) for p in prompts) and len(self.calls) == 1
        outs = []
        for j, ids in enumerate(prompts):
            row = j if first else next(r for r, turns in self.script.items()
                                       if self.tokenizer.decode(ids, skip_special_tokens=True).endswith(turns[0] + "=R\n"))
            turn = 0 if first else 1
            outs.append(self.tokenizer(self.script[row][turn], add_special_tokens=False)["input_ids"])
        T = max(map(len, outs))
        ids = torch.tensor([o + [self.pad_id] * (T - len(o)) for o in outs])
        mask = torch.tensor([[1.0] * len(o) + [0.0] * (T - len(o)) for o in outs])
        logp = -0.5 * mask
        eos = self.tokenizer.eos_token_id
        return Rollout(ids, torch.ones(len(outs), 1, dtype=torch.long), ids, mask,
                       torch.tensor([o[-1] != eos and not o[-1:] == [self.tokenizer.convert_tokens_to_ids("]")]
                                     for o in outs]),
                       self.tokenizer.batch_decode(ids, skip_special_tokens=True), logp)


@pytest.fixture(scope="module")
def problems_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("env") / "problems.jsonl"
    rows = [{"prompt": f"Q{i}=", "answer": a} for i, a in enumerate(["3"] * 8 + ["raise", "hang", "bad_types"])]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def env_cfg(problems_file, tiny_model_dir, **recipe):
    return parse({"task": {"name": "env", "environment": "tests.test_episodes:ScriptedEnv", "path": problems_file,
                           "num_train": 8, "num_heldout": 1,
                           "episode": {"max_turns": 3, "turn_tokens": 6, "stop": ["]"], "env_timeout_s": 1.0}},
                  "model": {"path": tiny_model_dir},
                  "recipe": {"group_size": 2, "max_new_tokens": 20, "baseline": "group_mean", "scale": "group",
                             "std_ddof": 0, "std_eps": 1e-12, **recipe}})


def by_prompt(task, prompt):  # a problem of the scripted environment: its answer picks the behaviour
    i = int(prompt[1:-1])
    return Problem(f"q{i}", prompt, (["3"] * 8 + ["raise", "hang", "bad_types"])[i])


def test_one_group_tags_masks_and_advantages_by_hand(problems_file, tiny_model_dir):
    cfg = env_cfg(problems_file, tiny_model_dir, credit="turn")
    task = make_task(cfg.task)
    tok = build_tokenizer()
    engine = ScriptedEngine(tok, {0: ["[1+2]", "3<eos>"], 1: ["5<eos>"]})
    ro, total, correct, fmt, over, strict = sample(engine, task, [by_prompt(task, "Q0=")], cfg, tok)
    # episode 0: call (policy) "[1+2]", reply (environment) "=R\n", answer (policy) "3<eos>"; episode 1: "5<eos>"
    assert ro.texts == ["[1+2]=R\n3", "5"]
    assert ro.policy_mask.tolist() == [[1] * 5 + [0] * 3 + [1] * 2, [1, 1] + [0] * 8]
    assert ro.completion_mask.tolist() == [[1] * 10, [1, 1] + [0] * 8]
    assert ro.turn.tolist() == [[0] * 8 + [1, 1], [0] * 10]
    assert ro.behav_logp.tolist() == [[-0.5] * 5 + [0.0] * 3 + [-0.5] * 2, [-0.5] * 2 + [0.0] * 8]
    assert ro.turn_rewards.tolist() == [[-0.1, 1.0, 0.0], [0.0, 0.0, 0.0]]
    counts = dict(zip(EPISODE_FIELDS, ro.episode.T.tolist()))
    assert counts == {"turns": [2, 1], "tool_calls": [1, 0], "tool_errors": [1, 0], "env_errors": [0, 0],
                      "end_done": [1, 1], "end_max_turns": [0, 0], "end_budget": [0, 0]}
    assert total.tolist() == [[pytest.approx(0.9), 0.0]] and correct.tolist() == [[1.0, 0.0]] == strict.tolist()
    assert engine.calls[0] == (6, ["]"]) and engine.calls[1] == (6, ["]"])  # per-turn limit, stop strings
    # the loss's tokens as the plan says: the policy's (recipe.mask_env_tokens), or every token of the episode
    assert torch.equal(loss_tokens(plan_step(cfg, 1), ro), ro.policy_mask)
    unmasked = parse({**_plain(cfg), "recipe": {**_plain(cfg)["recipe"], "mask_env_tokens": False}})
    assert torch.equal(loss_tokens(plan_step(unmasked, 1), ro), ro.completion_mask)
    # the worked example: G_{1,1} = 0.9, G_{1,2} = 1.0, G_{2,1} = 0; mean 0.45, std 0.45
    adv = plan_step(cfg, 1).turn_credit(total, ro.turn_rewards, ro.turn)
    a11, a12, a21 = 1.0, 1.2222222, -1.0
    assert adv[0].tolist() == pytest.approx([a11] * 8 + [a12] * 2, abs=1e-6)  # o_1 gets A_1
    assert adv[1, :2].tolist() == pytest.approx([a21] * 2, abs=1e-6)
    m = episodes.metrics(ro)
    assert m["episode/turns"] == 1.5 and m["episode/tool_calls"] == 0.5 == m["episode/tool_errors"]
    assert m["episode/env_token_frac"] == pytest.approx(3 / 12) and m["episode/end_done"] == 1.0
    assert m["episode/policy_tokens_per_turn"] == pytest.approx(9 / 3) and m["episode/env_errors"] == 0.0


def _plain(cfg):
    from ablate.config import to_dict

    return to_dict(cfg)


def sample(engine, task, problems, cfg, tok):
    """The training batch's episodes of `problems` as step 1 samples them on one rank (rows 0.. of G each)."""
    G = cfg.recipe.group_size
    return episodes.sample_part(engine, task, problems, plan_step(cfg, 1).sampling, tok, (0, 1, 0, 0), 0,
                                len(problems) * G)


def test_design_worked_example_of_turn_credit():
    # G = 2, ddof 0, eps 0: episode 1 = tool error (r = -0.1) then outcome 1, episode 2 = outcome 0 in one turn
    returns = turn_returns(torch.tensor([0.9, 0.0], dtype=torch.float64),
                           torch.tensor([[-0.1, 1.0], [0.0, 0.0]], dtype=torch.float64)).view(1, 2, 2)
    assert returns.flatten().tolist() == pytest.approx([0.9, 1.0, 0.0, 0.0])
    group = CREDITS["turn"](returns, baseline="group_mean", scale="group", ddof=0, eps=0.0)
    assert group[0, 0].tolist() == pytest.approx([1.0, 1.2222222]) and group[0, 1, 0] == pytest.approx(-1.0)
    none = CREDITS["turn"](returns, baseline="group_mean", scale="none", ddof=0, eps=0.0)
    assert none[0, 0].tolist() == pytest.approx([0.45, 0.55]) and none[0, 1, 0] == pytest.approx(-0.45)
    # outcome credit: every turn gets its episode's advantage, the single-turn estimator's
    assert CREDITS["episode"](returns, baseline="group_mean", scale="group", ddof=0, eps=0.0)[0, 0].tolist() == \
        pytest.approx([1.0, 1.0])


def test_turn_credit_of_a_dead_group_keeps_its_turn_deviations_in_reward_units():
    # both episodes: a failed call (-0.1) then outcome 1 -> returns 0.9 each: no spread, the group is dead;
    # the second turns' returns are 1.0, 0.1 above the baseline: divided by 1, not by eps = 1e-6
    returns = turn_returns(torch.tensor([0.9, 0.9], dtype=torch.float64),
                           torch.tensor([[-0.1, 1.0], [-0.1, 1.0]], dtype=torch.float64)).view(1, 2, 2)
    for scale in ("group", "batch", "none"):
        adv = CREDITS["turn"](returns, baseline="group_mean", scale=scale, ddof=1, eps=1e-6)
        assert adv.flatten().tolist() == pytest.approx([0.0, 0.1, 0.0, 0.1])


@pytest.mark.parametrize("credit", list(CREDITS))
def test_credit_registry_conformance(credit):
    # one signature; one turn each: both are the single-turn estimator; a per-prompt offset cancels
    returns = torch.tensor([[[1.0], [0.0], [0.5]], [[2.0], [2.0], [1.0]]], dtype=torch.float64)
    from ablate.rl.advantages import compute_advantages

    out = CREDITS[credit](returns, baseline="leave_one_out", scale="group", ddof=1, eps=1e-6)
    assert out.shape == returns.shape
    assert torch.allclose(out[..., 0], compute_advantages(returns[..., 0], baseline="leave_one_out", scale="group",
                                                          ddof=1, eps=1e-6))
    shifted = CREDITS[credit](returns + torch.tensor([3.0, -1.0], dtype=torch.float64)[:, None, None],
                              baseline="leave_one_out", scale="group", ddof=1, eps=1e-6)
    assert torch.allclose(out, shifted)
    tokens = credit_advantages(credit, returns[..., 0], torch.zeros(6, 1, dtype=torch.float64),
                               torch.zeros(6, 4, dtype=torch.long), baseline="leave_one_out", scale="group")
    assert tokens.shape == (6, 4)


def test_masking_changes_exactly_the_environment_tokens_contribution(problems_file, tiny_model_dir):
    """With a fixed denominator (seq_mean_token_sum_norm) the gradient with environment tokens in the loss is
    the masked one plus the environment tokens' own; with token_mean the sums are re-weighted by the counts."""
    cfg = env_cfg(problems_file, tiny_model_dir)
    task = make_task(cfg.task)
    tok = build_tokenizer()
    torch.manual_seed(0)
    from ablate.train.tool_models import CalculatorSettings

    policy = LMPolicy(_new_model(CalculatorSettings(hidden=32, layers=1, heads=2, intermediate=64), tok), tok,
                      torch.device("cpu"))
    engine = ScriptedEngine(tok, {0: ["[1+2]", "3<eos>"], 1: ["5<eos>"]})
    ro, total, *_ = sample(engine, task, [by_prompt(task, "Q0=")], cfg, tok)
    adv = torch.tensor([1.0, -1.0])
    env = ro.completion_mask - ro.policy_mask
    params = [p for p in policy.module.parameters()]

    def grad(mask, agg):
        logp, _ = execution.token_scores(policy, ro, 1.0)
        loss, _ = losses.POLICY_LOSSES["ppo_clip"](logp, logp.detach(), adv, mask, agg=agg, max_len=20,
                                                   params=losses.LossParams(eps_low=0.2, eps_high=0.2))
        return torch.cat([g.flatten() for g in torch.autograd.grad(loss, params, allow_unused=False)])

    on, off, only_env = (grad(m, "seq_mean_token_sum_norm") for m in (ro.policy_mask, ro.completion_mask, env))
    assert float(only_env.norm()) > 0
    assert torch.allclose(off, on + only_env, atol=1e-6)
    n_pol, n_all, n_env = float(ro.policy_mask.sum()), float(ro.completion_mask.sum()), float(env.sum())
    on, off, only_env = (grad(m, "token_mean") for m in (ro.policy_mask, ro.completion_mask, env))
    assert torch.allclose(off * n_all, on * n_pol + only_env * n_env, atol=1e-5)


def test_the_is_correction_reads_the_policy_tokens_only():
    """Only the policy's tokens have behaviour log-probs: the correction (token MIS, cap 2) sees those; an
    environment token in the loss keeps weight 1 and stays unless its row was rejected whole. The env tokens'
    log w = log 5 would be rejected if read."""
    from functools import partial

    from ablate.rl.corrections import IS_CORRECTIONS
    from ablate.train import offpolicy

    w15, w3, w5 = torch.log(torch.tensor([1.5, 3.0, 5.0])).tolist()
    old = torch.tensor([[w15, w3, w5, 0.0], [w3, w5, w5, 0.0]])  # log w: behaviour log-probs are 0
    behav = torch.zeros(2, 4)
    policy = torch.tensor([[1.0, 1, 0, 1], [1, 0, 0, 0]])  # row 0: a, a, o, a; row 1: a, o, o, (padding)
    trainable = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0]])  # environment tokens in the loss
    mis = partial(IS_CORRECTIONS["mis"], cap=2.0, lo=None, hi=None)
    weights, kept, _ = offpolicy.correct(mis, old, behav, trainable, policy)
    assert torch.allclose(weights, torch.tensor([[1.5, 0.0, 1.0, 1.0], [0.0, 1.0, 1.0, 1.0]]))
    assert kept.tolist() == [[1, 0, 1, 1], [0, 0, 0, 0]]  # row 1's only policy token rejected: the row leaves
    m = offpolicy.step_metrics(old, behav, trainable, weights, kept, {"is_cap_frac": torch.tensor(0.0)}, 0, policy)
    assert m["offpolicy/rejected_token_frac"] == pytest.approx(2 / 4)  # of the 4 policy tokens
    assert m["offpolicy/weight_max"] == pytest.approx(3.0) and m["offpolicy/rejected_seq_frac"] == pytest.approx(0.5)


@pytest.mark.parametrize("answer", ["raise", "hang", "bad_types"])
def test_a_failing_environment_ends_its_episode_with_reward_0(problems_file, tiny_model_dir, answer):
    cfg = env_cfg(problems_file, tiny_model_dir)
    task = make_task(cfg.task)
    tok = build_tokenizer()
    engine = ScriptedEngine(tok, {0: ["7<eos>"], 1: ["3<eos>"]})
    t0 = time.perf_counter()
    ro, total, correct, *_ = sample(engine, task, [by_prompt(task, f"Q{8 + ['raise', 'hang', 'bad_types'].index(answer)}=")],
                                    cfg, tok)
    assert time.perf_counter() - t0 < 5  # the hang is cut at env_timeout_s = 1 s per episode
    assert total.tolist() == [[0.0, 0.0]] and correct.tolist() == [[0.0, 0.0]]
    assert episodes.metrics(ro)["episode/env_errors"] == 1.0
    assert ro.turn_rewards.abs().sum() == 0


def test_an_unknown_environment_is_a_config_error(tiny_model_dir):
    for name, hint in [("nope", "unknown environment 'nope'"), ("no_such_module:Env", "no module 'no_such_module'"),
                       ("not a path:", "not a 'module:Class' path")]:
        with pytest.raises(ConfigError, match="task.environment") as err:
            parse({"task": {"name": "env", "environment": name, "path": __file__}, "model": {"path": tiny_model_dir}})
        assert hint in str(err.value)
    with pytest.raises(ConfigError, match="recipe.credit='turn' needs multi-turn"):
        parse({"recipe": {"credit": "turn"}, "model": {"path": tiny_model_dir}})


def test_calculator_environment():
    env = CalculatorEnv(extras={"reward_spec": {"ground_truth": "4042"}, "tool_error_penalty": 0.1})
    out = env.step("[47*86]")
    assert (out["observations"], out["reward"], out["done"]) == ([{"role": "tool", "content": "=4042\n"}], 0.0, False)
    out = env.step("[47*]")
    assert (out["observations"][0]["content"], out["reward"], out["metadata"]["tool_error"]) == ("=error\n", -0.1, True)
    assert env.step("4042")["reward"] == 1.0 and env.step("4041")["done"] is True
    assert evaluate("12-30") == -18 and evaluate("1+2+3") is None and evaluate("") is None


def test_code_environment_runs_code_in_the_sandbox_and_scores_the_submission():
    from ablate.config import TaskConfig
    from ablate.tasks.code import CodeTask
    from ablate.tasks.environments.code import CodeExecEnv

    problem = CodeTask(TaskConfig(name="code", num_train=1, num_heldout=1)).problems("train")[0]
    extras = {"extra_info": {"prompt": problem.prompt, "entry_point": problem.meta[0], "tests": problem.meta[1]},
              "tool_error_penalty": 0.1}
    env = CodeExecEnv(extras=extras)
    out = env.step("let me try <run>print(6 * 7)\nimport sys; print('warn', file=sys.stderr)</run>")
    text = out["observations"][0]["content"]
    assert "stdout:\n42\n" in text and "stderr:\nwarn\n" in text and "exit status: 0" in text
    assert (out["reward"], out["done"], out["metadata"]["tool_error"]) == (0.0, False, False)
    out = env.step("<run>raise ValueError('no')</run>")
    assert "ValueError: no" in out["observations"][0]["content"] and "exit status: 1" in out["observations"][0]["content"]
    assert (out["reward"], out["metadata"]["tool_error"]) == (-0.1, True)
    assert env.step(f"```python\n{problem.answer}```")["reward"] == 1.0  # the reference solution passes the hidden tests
    wrong = env.step(f"```python\ndef {problem.meta[0]}(*a):\n    return None\n```")
    assert wrong["done"] and wrong["reward"] < 1.0


def test_native_sampler_continues_from_token_ids_and_stops_on_stop_strings(tiny_model_dir):
    from ablate.rl.sampling import RowNoise
    from ablate.train.models import load_model, load_tokenizer
    from ablate.train.rollout import prompt_ids

    tok = load_tokenizer(tiny_model_dir)
    policy = LMPolicy(load_model(tiny_model_dir), tok, torch.device("cpu"))
    texts = ["1+2=", "7+1="]
    a = policy.sample(texts, 4, 3.0, 6, noise=RowNoise((0, 1), 8))
    b = policy.sample([prompt_ids(tok, t) for t in texts], 4, 3.0, 6, noise=RowNoise((0, 1), 8))
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.behav_logp, b.behav_logp)
    # a stop string made of a row's second sampled character ends that row right after it, like EOS
    row = next(i for i in range(8) if a.completion_mask[i, :3].sum() == 3 and len(a.texts[i]) >= 2)
    second = a.texts[row][1]
    c = policy.sample(texts, 4, 3.0, 6, noise=RowNoise((0, 1), 8), stop=[second])
    assert c.texts[row] == a.texts[row][:2] and c.completion_mask[row].tolist()[:3] == [1, 1, 0]
    assert not c.truncated[row]
    for i in range(8):  # every row ends at its first stop (or as before); tokens before the stop are unchanged
        n = int(c.completion_mask[i].sum())
        assert torch.equal(c.completion_ids[i, :n], a.completion_ids[i, :n])
        assert second not in c.texts[i][:-1]


def test_train_with_an_unknown_environment_exits_2_before_writing(tmp_path):
    from typer.testing import CliRunner

    from ablate.cli.main import app

    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", "configs/calculator.yaml", "--out", str(out),
                                   "--set", "task.environment=calculatr"])
    assert res.exit_code == 2 and "unknown environment 'calculatr'" in res.output and "configs/calculator.yaml" in res.output
    assert not out.exists()


def test_environment_reply_as_a_chat_template_tool_turn():
    from ablate.train.chat_model import build_tokenizer as chat_tokenizer

    tok = chat_tokenizer(["stdout exit status user assistant tool"] * 4)
    ids = episodes.observation_ids(tok, "exit status: 0", chat=True)
    assert tok.decode(ids) == "<|im_start|>tool\nexit status: 0<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(episodes.observation_ids(tok, "exit status: 0", chat=False)) == "exit status: 0"


def test_the_prompt_is_what_the_environments_init_returns(problems_file, tiny_model_dir):
    cfg = env_cfg(problems_file, tiny_model_dir)
    task = make_task(cfg.task)
    tok = build_tokenizer()
    engine = ScriptedEngine(tok, {0: ["3<eos>"], 1: ["3<eos>"]})
    ro, *_ = sample(engine, task, [Problem("q", "Q0=", "instructions")], cfg, tok)
    assert tok.decode(ro.prompt_ids[0], skip_special_tokens=True) == "Use [a+b]. Q0="
