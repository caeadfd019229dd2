"""The arithmetic task (determinism, disjoint splits, verifiers) and the tiny base model build/load path."""

import json
import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ablate.config import TaskConfig
from ablate.tasks.arithmetic import build, is_heldout, make_problem
from ablate.tasks.base import Problem
from ablate.train.models import BuildSettings, build_base_model, build_tokenizer, load_model, load_tokenizer


def test_task_is_deterministic_in_its_seed():
    a, b = build(TaskConfig(seed=3)), build(TaskConfig(seed=3))
    assert a.problems("train") == b.problems("train")
    assert a.problems("heldout") == b.problems("heldout")
    assert build(TaskConfig(seed=4)).problems("train") != a.problems("train")


def test_splits_are_disjoint_sized_and_on_the_fixed_split():
    cfg = TaskConfig(num_train=500, num_heldout=64)
    task = build(cfg)
    train, held = task.problems("train"), task.problems("heldout")
    assert len(train) == 500 and len(held) == 64
    assert not {p.id for p in train} & {p.id for p in held}
    # the split does not depend on the seed: a held-out problem of one seed is never train in another
    assert all(is_heldout(p.prompt) for p in held) and not any(is_heldout(p.prompt) for p in train)
    other = build(TaskConfig(seed=9, num_train=500))
    assert not {p.id for p in other.problems("train")} & {p.id for p in held}


def test_problem_mix_has_easy_and_hard_problems():
    train = build(TaskConfig()).problems("train")
    kinds = {p.meta for p in train}
    assert ("+", 1, 1) in kinds and ("*", 2, 2) in kinds and {"+", "-", "*"} == {k[0] for k in kinds}
    for p in train:  # answers are the true integer results, never negative
        a, op, b = p.prompt[:-1].partition(p.meta[0])
        assert int(p.answer) == {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op] >= 0


def test_strict_and_gameable_verifiers():
    p = make_problem(12, "*", 3)
    assert p == Problem(id="12*3=", prompt="12*3=", answer="36", meta=("*", 2, 1))
    strict, game = build(TaskConfig()), build(TaskConfig(gameable=True))
    cases = {"36": (1, 1), " 36\n": (1, 1), "36 7": (1, 1), "36<eos>9": (1, 1), "26": (0, 1), "6": (0, 1),
             "360": (0, 0), "036": (0, 1), "37": (0, 0), "": (0, 0), "x6": (0, 0), "3 6": (0, 0)}
    for completion, (s, g) in cases.items():
        assert strict.score(p, completion) == s, completion
        assert strict.train_score(p, completion) == s, completion  # not gameable: train is strict
        assert game.train_score(p, completion) == g, completion
        assert game.score(p, completion) == s, completion  # held-out stays strict
    assert strict.format_score("36") == 1 and strict.format_score(" 7\n") == 1
    assert strict.format_score("3a") == 0 and strict.format_score("") == 0 and strict.format_score("=") == 0
    assert strict.prompt_text(p, None) == "12*3="


def test_subtraction_swaps_to_non_negative():
    p = make_problem(3, "-", 47)
    assert p.prompt == "47-3=" and p.answer == "44"


def test_tokenizer_round_trip(tmp_path):
    tok = build_tokenizer()
    tok.save_pretrained(tmp_path)
    again = load_tokenizer(str(tmp_path))
    text = "47+8=55 x\n"
    ids = again(text)["input_ids"]
    assert ids == tok(text)["input_ids"]
    assert ids[0] == again.bos_token_id and len(ids) == len(text) + 1  # one token per character
    assert again.decode(ids, skip_special_tokens=True) == text
    assert again.padding_side == "left" and again.pad_token == "<pad>" and again.eos_token == "<eos>"
    batch = again(["1+1=", "47+8="], padding=True)
    assert batch["input_ids"][0][0] == again.pad_token_id and batch["attention_mask"][0][0] == 0


def test_build_base_model_tiny_and_reload(tmp_path):
    settings = BuildSettings(steps=3, batch_size=8, hidden=32, layers=1, heads=2, intermediate=64)
    record = build_base_model(tmp_path, settings=settings, progress=False)
    saved = json.loads((tmp_path / "build.json").read_text())
    assert saved["settings_hash"] == settings.hash() and saved["settings"]["steps"] == 3
    assert 0 <= saved["heldout"]["pass1"] <= 1 and record["params"] > 0
    model, tok = load_model(str(tmp_path), "cpu", torch.float32), load_tokenizer(str(tmp_path))
    assert sum(p.numel() for p in model.parameters()) == record["params"]
    enc = tok(["12+3="], return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=3, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] <= enc["input_ids"].shape[1] + 3
    # cached: same settings -> no rebuild (the record on disk is returned unchanged)
    mtime = (tmp_path / "model.safetensors").stat().st_mtime
    assert build_base_model(tmp_path, settings=settings, progress=False) == saved
    assert (tmp_path / "model.safetensors").stat().st_mtime == mtime


def test_build_is_deterministic_in_its_seed(tmp_path):
    settings = BuildSettings(steps=2, batch_size=4, hidden=16, layers=1, heads=2, intermediate=32)
    build_base_model(tmp_path / "a", settings=settings, progress=False)
    build_base_model(tmp_path / "b", settings=settings, progress=False)
    a, b = load_model(str(tmp_path / "a")), load_model(str(tmp_path / "b"))
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name
