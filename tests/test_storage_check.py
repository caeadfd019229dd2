"""An Optuna storage is checked once, when the search spec is loaded (search.check_storage), against real
storages: SQLite files and Optuna journals written by Optuna itself, and the dev PostgreSQL server
(scripts/postgres-dev). A storage that is not a database or not reachable is a SpecError naming where the
URL came from; a good one is accepted, and nothing is written by the check."""

import os
import subprocess
from pathlib import Path

import optuna
import pytest

from ablate.experiments.search import check_storage
from ablate.experiments.sweep import SpecError

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


@pytest.fixture(scope="module")
def postgres_url():
    url = os.environ.get("ABLATE_TEST_POSTGRES_URL") or subprocess.run(
        [str(ROOT / "scripts" / "postgres-dev"), "url"], capture_output=True, text=True).stdout.strip()
    assert url.startswith("postgresql://"), f"no PostgreSQL URL ({url!r}): start it with `scripts/postgres-dev start`"
    return url


def test_storages_optuna_wrote_are_accepted_and_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    optuna.create_study(storage="sqlite:///s.db")
    journal = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(tmp_path / "j.log")))
    optuna.create_study(storage=journal)
    assert check_storage("sqlite:///s.db", "--storage") == f"sqlite:///{tmp_path / 's.db'}"
    assert check_storage("journal:j.log", "--storage") == f"journal:{tmp_path / 'j.log'}"
    # not there yet: accepted (the study creates it), and the check creates nothing
    assert check_storage("sqlite:///new/s.db", "--storage") == f"sqlite:///{tmp_path / 'new' / 's.db'}"
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("url, words", [
    ("sqlite:///adir", "is a folder"),
    ("sqlite:///notes.txt", "is not an SQLite database"),
    ("sqlite:///notes.txt/s.db", "notes.txt is a file, not a folder"),
    ("sqlite:///", "no file after the prefix"),
    ("journal:notes.txt", "is not an Optuna journal"),
    ("journal:adir", "is a folder"),
    ("not-a-url", "not a storage URL; allowed: sqlite:///PATH, journal:PATH"),
    ("sqlite:///a\nb.db", "not a storage URL"),
    ("sqlite:///{d}/s.db", "holds '{' or '}'"),  # Optuna would fail formatting its URL template
    ("postgresql://nobody@127.0.0.1:1/x", "cannot connect"),
])
def test_bad_storages_name_the_option_and_what_is_allowed(tmp_path, monkeypatch, url, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir").mkdir()
    (tmp_path / "notes.txt").write_text("not a database\n")
    with pytest.raises(SpecError) as err:
        check_storage(url, "--storage")
    assert str(err.value).startswith(f"--storage: {url!r}: ") and words in str(err.value), str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "notes.txt"]


def test_postgresql_reachable_is_accepted_a_missing_database_is_not_and_passwords_are_hidden(postgres_url):
    assert check_storage(postgres_url, "--storage") == postgres_url
    missing = postgres_url.rsplit("/", 1)[0] + "/no_such_database_xyz"
    with pytest.raises(SpecError, match="cannot connect: .*no_such_database_xyz"):
        check_storage(missing, "t.yaml: storage")
    secret = postgres_url.replace("postgres@", "postgres:hunter2@").rsplit("/", 1)[0] + "/no_such_database_xyz"
    with pytest.raises(SpecError) as err:
        check_storage(secret, "t.yaml: storage")
    assert "hunter2" not in str(err.value) and "***" in str(err.value)
