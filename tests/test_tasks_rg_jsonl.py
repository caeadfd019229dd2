"""reasoning-gym and JSONL tasks: seeding, disjointness, verifiers, prompts, file errors."""

import json

import pytest
import reasoning_gym
from math_verify import parse, verify

from ablate.config import TaskConfig
from ablate.tasks import Problem, check_disjoint, extract_boxed, extract_tagged, make_task
from ablate.tasks.jsonl import math_equal

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """(with_template, without_template): char-level tokenizers saved and reloaded from disk."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(["<unk>", "\n"] + [chr(i) for i in range(32, 127)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    fast.save_pretrained(plain := tmp_path_factory.mktemp("plain"))
    fast.chat_template = TEMPLATE
    fast.save_pretrained(chat := tmp_path_factory.mktemp("chat"))
    return AutoTokenizer.from_pretrained(chat), AutoTokenizer.from_pretrained(plain)


def rg(**kw):
    kw = {"dataset": "chain_sum", "num_train": 50, "num_heldout": 20, **kw}
    return make_task(TaskConfig(name="reasoning_gym", **kw))


def test_rg_deterministic_and_sized():
    a, b, c = rg(seed=3), rg(seed=3), rg(seed=4)  # same seed, same problems
    assert a.problems("train") == b.problems("train") and a.problems("heldout") == b.problems("heldout")
    assert a.problems("train") != c.problems("train")
    assert len(a.problems("train")) == 50 and len(a.problems("heldout")) == 20
    assert a.name == "reasoning_gym:chain_sum"


def test_rg_neighbouring_seeds_overlap_so_heldout_uses_an_offset():
    # Why HELDOUT_SEED_OFFSET exists: item i of seed s+1 is item i+1 of seed s.
    s0, s1 = (reasoning_gym.create_dataset("chain_sum", size=5, seed=s) for s in (0, 1))
    assert s1[0]["question"] == s0[1]["question"]
    task = rg(dataset="basic_arithmetic", num_train=300, num_heldout=100)
    check_disjoint(task)
    train = {task.entry(p)["question"] for p in task.problems("train")}
    held = [task.entry(p)["question"] for p in task.problems("heldout")]
    assert not train & set(held) and len(set(held)) == 100


def test_rg_problem_fields_and_entry():
    task = rg()
    p = task.problems("train")[0]
    entry = task.entry(p)
    assert p.id == "train-0" and p.meta == ("chain_sum", "train", 0)
    assert p.prompt == entry["question"] + "\nGive your final answer in <answer></answer> tags."
    assert p.answer == entry["answer"] and entry["metadata"]["source_dataset"] == "chain_sum"
    assert all(q.id.startswith("heldout-") for q in task.problems("heldout"))


def test_rg_scores_with_the_datasets_verifier():
    p = (task := rg()).problems("train")[0]
    wrong = str(int(p.answer) + 1)
    assert task.score(p, f"thinking... <answer> {p.answer} </answer>") == 1.0
    assert task.score(p, f"so \\boxed{{{p.answer}}}") == 1.0
    assert task.score(p, f"  {p.answer}\n") == 1.0  # fallback: the whole stripped completion
    assert task.score(p, f"<answer>{wrong}</answer>") == 0.0
    assert task.score(p, f"<answer>{wrong}</answer> <answer>{p.answer}</answer>") == 1.0  # last tag
    assert task.score(p, f"<answer>{wrong}</answer> \\boxed{{{p.answer}}}") == 0.0  # tags beat boxed
    assert task.train_score(p, f"<answer>{p.answer}</answer>") == 1.0
    # reasoning-gym's default verifier gives partial credit when the gold is a substring.
    text = f"it is {p.answer}"
    assert task.score(p, f"<answer>{text}</answer>") == pytest.approx(len(p.answer) / len(text))


def test_rg_format_score():
    completions = ["<answer>7</answer>", "a\n<answer>\n7\n</answer>", "<answer> </answer>", "<answer>7", r"\boxed{7}"]
    assert [rg().format_score(c) for c in completions] == [1, 1, 0, 0, 0]


def test_rg_prompt_text(tokenizers):
    with_tpl, without_tpl = tokenizers
    p = rg().problems("train")[0]
    assert rg().prompt_text(p, with_tpl) == p.prompt
    assert rg(chat_template=True).prompt_text(p, with_tpl) == f"<|user|>{p.prompt}\n<|assistant|>"
    with pytest.raises(ValueError, match="no chat_template"):
        rg(chat_template=True).prompt_text(p, without_tpl)


def test_rg_too_few_heldout_and_unknown_dataset(monkeypatch):
    monkeypatch.setattr(reasoning_gym, "create_dataset",
                        lambda name, size, seed: [{"question": "same", "answer": "1"}] * size)
    with pytest.raises(ValueError, match="only 0 of 20 held-out"):
        rg()
    monkeypatch.undo()
    with pytest.raises(ValueError, match="not registered"):
        rg(dataset="no_such_dataset")


def test_extractors():
    assert extract_boxed(r"a \boxed{1} b \boxed{\frac{1}{2}} c") == r"\frac{1}{2}"
    assert extract_boxed(r"\boxed{\frac{1}{2}") is None and extract_boxed("12") is None
    assert extract_tagged("<answer>1</answer><answer> 2 </answer>") == "2" and extract_tagged("<answer>1") is None


def test_make_task_and_check_disjoint():
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        make_task(TaskConfig(name="nope"))
    leaky = type("Leaky", (), {"name": "leaky", "problems": lambda self, s: [Problem(s, "same", "1")]})
    with pytest.raises(ValueError, match="1 held-out prompt"):
        check_disjoint(leaky())


def write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def jl(path, **kw):
    return make_task(TaskConfig(name="jsonl", path=path, **kw))


def test_jsonl_seeded_split(tmp_path):
    path = write(tmp_path / "d.jsonl", [{"prompt": f"q{i}", "answer": str(i)} for i in range(50)])
    a, b, c = jl(path, seed=1), jl(path, seed=1), jl(path, seed=2)
    assert len(a.problems("train")) == 45 and len(a.problems("heldout")) == 5  # 10% < 128
    assert len(jl(path, num_heldout=3).problems("heldout")) == 3  # num_heldout < 10%
    assert len(jl(path, num_train=10).problems("train")) == 10
    assert a.problems("heldout") == b.problems("heldout") != c.problems("heldout")
    check_disjoint(a)
    p = a.problems("train")[0]
    assert p.id == f"train-L{int(p.prompt[1:]) + 1}" and p.answer == p.prompt[1:]


def test_jsonl_duplicates_removed_from_heldout(tmp_path):
    rows = [{"prompt": "dup", "answer": "1"}] * 10 + [{"prompt": f"q{i}", "answer": "2"} for i in range(10, 40)]
    task = jl(write(tmp_path / "d.jsonl", rows), seed=1)  # seed 1 shuffles "dup" twice into the last 4
    check_disjoint(task)
    assert [p.prompt for p in task.problems("heldout")] == ["q16", "q36"] and len(task.problems("train")) == 36
    with pytest.raises(ValueError, match="every held-out prompt is also in train"):
        jl(write(tmp_path / "same.jsonl", rows[:10]))


def test_jsonl_heldout_path(tmp_path):
    train = write(tmp_path / "t.jsonl", [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}])
    held = write(tmp_path / "h.jsonl", [{"prompt": "b", "answer": "2"}, {"prompt": "c", "answer": 3}])
    task = jl(train, heldout_path=held)
    assert [p.prompt for p in task.problems("train")] == ["a", "b"]
    assert task.problems("heldout") == [Problem("heldout-L2", "c", "3")]  # numbers become strings


def test_math_verify_behaviour():
    # What math-verify itself does, which math_equal works around or relies on.
    assert parse(r"\frac12") == [] and verify(parse("1/2"), parse("0.5"))
    assert verify(parse("$hello$"), parse("$ehllo$"))  # words are products of symbols
    assert math_equal("1/2", "0.5") and math_equal("1/2", r"\frac12") and math_equal("1/2", r"\frac{2}{4}")
    assert math_equal("x+1", "1+x") and math_equal("1,000", "1000") and math_equal(r"\boxed{5}", "5")
    assert math_equal("3", "3.0") and math_equal("2, 3", "3, 2") and math_equal("5", "x=5")
    assert not math_equal("0.333", "1/3") and not math_equal("2", "2.000001")
    assert not math_equal("hello", "ehllo") and math_equal("hello", "Hello")


def test_jsonl_scoring_boxed(tmp_path):
    task = jl(write(tmp_path / "d.jsonl", [{"prompt": f"q{i}", "answer": "1/2"} for i in range(3)]))
    p = Problem("train-L1", "half?", "1/2")
    completions = [r"so \boxed{0.5}", r"\boxed{\frac{1}{2}}", r"\boxed{0.49}", "0.5", "<answer>0.5</answer>"]
    assert [task.score(p, c) for c in completions] == [1, 1, 0, 0, 0]  # no box, no answer
    assert task.train_score(p, r"\boxed{0.5}") == 1.0
    assert [task.format_score(c) for c in (r"\boxed{3}", r"\boxed{", r"\boxed{}", "3")] == [1, 0, 0, 0]


def test_jsonl_scoring_answer_tag(tmp_path, tokenizers):
    with_tpl, _ = tokenizers
    task = jl(write(tmp_path / "d.jsonl", [{"prompt": "half?", "answer": "1/2"}] * 2), answer_format="answer_tag",
              chat_template=True, heldout_path=write(tmp_path / "h.jsonl", [{"prompt": "q", "answer": "1"}]))
    p = task.problems("train")[0]
    assert task.score(p, "<answer> 0.5 </answer>") == 1.0
    assert task.score(p, r"\boxed{0.5}") == 0.0
    assert [task.format_score(c) for c in ("<answer>1</answer>", "<answer></answer>", r"\boxed{1}")] == [1, 0, 0]
    assert task.prompt_text(p, with_tpl) == "<|user|>half?\n<|assistant|>"


@pytest.mark.parametrize("lines, message", [
    (['{"prompt": "a", "answer": "1"}', "", '{"prompt": "b",'], r"d.jsonl:3: bad JSON"),
    (['{"prompt": "a", "answer": "1"}', '{"prompt": "b"}'], r"d.jsonl:2: missing key 'answer'"),
    (['["a", "1"]'], r"d.jsonl:1: expected an object"),
    (['{"prompt": 1, "answer": "1"}'], r"d.jsonl:1: 'prompt' must be a string"),
    ([], r"d.jsonl: no rows"),
    (None, r"d.jsonl: no such file"),
])
def test_jsonl_bad_files(tmp_path, lines, message):
    with pytest.raises(ValueError, match=message):
        jl(write(tmp_path / "d.jsonl", lines) if lines is not None else str(tmp_path / "d.jsonl"))
