"""`data=text`: the user's files as packed rows, tokenized once (a cache keyed by what made it), refusing a resumed
run on changed data, and through the real CLI: bad input is one `error:` line, exit 2, nothing written."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import assert_resume_is_exact
from torch.utils.data import DataLoader

from framework.data import sources
from framework.data.packing import IGNORE
from framework.data.user_text import TextData, held_out
from framework.errors import InputError

WORDS = ["<pad>", "<eos>", "<unk>", "the", "cat", "sat", "on", "a", "mat", "dog", "ran"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FRAMEWORK_DATA_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _texts(n: int = 40) -> list[str]:
    return [f"document {i}: " + " ".join(WORDS[3 + (i + k) % 8] for k in range(5 + i % 7)) + "\n" for i in range(n)]


def _folder(tmp_path, texts):
    folder = tmp_path / "corpus"
    folder.mkdir(exist_ok=True)
    for i, text in enumerate(texts):
        (folder / f"doc{i:03d}.txt").write_text(text, encoding="utf-8")
    return folder


def _documents(rows) -> list[bytes]:
    """The documents back from packed rows: split the real tokens where position_ids restart (pieces rejoined)."""
    docs: list[list[int]] = []
    for i in range(len(rows)):
        row = rows[i]
        for tok, pos in zip(row["input_ids"].tolist(), row["position_ids"].tolist(), strict=True):
            if pos == 0:
                docs.append([])
            docs[-1].append(tok)
    return docs


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")


def test_a_folder_of_text_files_becomes_packed_byte_rows_with_a_held_out_share(tmp_path, cache):
    texts = _texts(40)
    dm = TextData(str(_folder(tmp_path, texts)), seq_len=32, batch_size=4, val_fraction=0.1)
    dm.setup()
    held = [t for i, t in enumerate(texts) if held_out(i, 0.1)]
    assert len(held) == 4 and held[0] == texts[0]  # every 10th document, from the first: ceil(40 * 0.1)
    train = b"".join(bytes(d) for d in _documents(dm.train_set))
    assert train.rstrip(b"\0") == "".join(t for t in texts if t not in held).encode()  # NUL: the last row's padding
    assert b"".join(bytes(d) for d in _documents(dm.val_set)).rstrip(b"\0") == "".join(held).encode()
    batch = next(iter(DataLoader(dm.train_set, batch_size=4)))
    assert batch["input_ids"].shape == (4, 32) and batch["index"].tolist() == [0, 1, 2, 3]
    assert (batch["labels"][batch["position_ids"] == 0] == IGNORE).all()
    record = dm.record()
    assert record["tokens"] == len("".join(t for t in texts if t not in held).encode())
    assert record["documents"] == 36 and record["format"] == "text" and record["files"][0] == "doc000.txt"
    assert record["packing_efficiency"] >= 0.99 and record["fingerprint"] == dm.fingerprint
    assert (dm.vocab_size, dm.pad_id, dm.eos_id, dm.mask_id) == (256, 0, None, None)


def test_a_tokenizer_gives_its_ids_and_its_eos_after_each_document(tmp_path, cache):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"body": t, "n": i}) for i, t in enumerate(["the cat sat", "a dog ran"]))
                    .replace("}{", "}\n{"))
    dm = TextData(str(path), column="body", seq_len=4, batch_size=1, val_fraction=0.5, packing=False)
    dm.use_tokenizer(_tokenizer())
    dm.setup()
    assert (dm.vocab_size, dm.pad_id, dm.eos_id) == (len(WORDS), 0, 1)
    val, train = dm.val_set[0], dm.train_set[0]  # document 0 is held out
    assert val["input_ids"].tolist() == [3, 4, 5, 1] and train["input_ids"].tolist() == [7, 9, 10, 1]
    assert train["attention_mask"].tolist() == [1, 1, 1, 1] and "position_ids" not in train


def test_a_second_run_reads_the_cache_and_a_changed_source_is_packed_anew(tmp_path, cache, monkeypatch):
    folder = _folder(tmp_path, _texts(12))
    first = TextData(str(folder), seq_len=16, batch_size=2)
    first.setup()
    made = (cache / "text" / first.fingerprint / "done").stat().st_mtime_ns

    def never(*args, **kwargs):
        raise AssertionError("the source was read again")

    with monkeypatch.context() as patch:
        patch.setattr(sources, "read_texts", never)
        patch.setattr(sources, "check", never)
        again = TextData(str(folder), seq_len=16, batch_size=2)
        again.setup()
    assert again.fingerprint == first.fingerprint and torch.equal(again.train_set[3]["input_ids"],
                                                                  first.train_set[3]["input_ids"])
    assert (cache / "text" / first.fingerprint / "done").stat().st_mtime_ns == made
    assert TextData(str(folder), seq_len=8, batch_size=2).fingerprint != first.fingerprint
    tokenized = TextData(str(folder), seq_len=16, batch_size=2)
    tokenized.use_tokenizer(_tokenizer())
    assert tokenized.fingerprint != first.fingerprint

    (folder / "doc003.txt").write_text("an edited document\n")
    os.utime(folder / "doc003.txt", ns=(made + 10**9, made + 10**9))
    edited = TextData(str(folder), seq_len=16, batch_size=2)
    edited.setup()
    assert edited.fingerprint != first.fingerprint
    assert b"an edited document" in b"".join(bytes(d) for d in _documents(edited.train_set))
    with pytest.raises(InputError, match=r"doc003.txt changed \(41 bytes then, 19 now\).*data.allow_changed=true"):
        edited.load_state_dict(first.state_dict())
    edited.load_state_dict(edited.state_dict())
    TextData(str(folder), seq_len=16, batch_size=2, allow_changed=True).load_state_dict(first.state_dict())


def test_a_touched_file_and_a_copy_under_another_path_are_the_same_data(tmp_path, cache, monkeypatch):
    """The fingerprint is the bytes': `touch`, `cp` without -p and a copy elsewhere find the cache and resume."""
    import shutil
    import subprocess

    folder = _folder(tmp_path, _texts(12))
    first = TextData(str(folder), seq_len=16, batch_size=2)
    first.setup()
    subprocess.run(["touch", *map(str, folder.iterdir())], check=True)
    staged = tmp_path / "node-local" / "corpus"
    shutil.copytree(folder, staged, copy_function=shutil.copyfile)  # new inodes and times, as `cp -r` gives
    assert (staged / "doc000.txt").stat().st_mtime_ns != (folder / "doc000.txt").stat().st_mtime_ns

    def never(*args, **kwargs):
        raise AssertionError("the source was tokenized again")

    for where in (folder, staged):
        with monkeypatch.context() as patch:
            patch.setattr(sources, "read_texts", never)
            again = TextData(str(where), seq_len=16, batch_size=2)
            again.setup()
        assert again.fingerprint == first.fingerprint
        again.load_state_dict(first.state_dict())  # a requeued job on re-staged data resumes


def test_the_sources_own_validation_split_is_used_when_it_has_one(tmp_path, cache):
    folder = tmp_path / "splits"
    folder.mkdir()
    for split, n in (("train", 30), ("validation", 3)):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps({"text": f"{split} {i} " * 20}) + "\n"
                                                       for i in range(n)))
    dm = TextData(str(folder), seq_len=64, batch_size=2)
    dm.setup()
    assert dm.val_split == "validation" and dm.record()["val_documents"] == 3 and dm.record()["documents"] == 30
    with pytest.raises(InputError, match="data.val_split='dev' is not a split of .*; its splits: train, validation"):
        TextData(str(folder), val_split="dev")


def test_training_rows_are_sharded_per_rank_in_equal_whole_batches(tmp_path, cache):
    dm = TextData(str(_folder(tmp_path, _texts(40))), seq_len=16, batch_size=4)
    dm.setup()
    shards = []
    for rank in (0, 1):
        dm.trainer = SimpleNamespace(global_rank=rank, world_size=2, global_step=0)  # what Lightning hands it
        shards.append([int(i) for batch in dm.train_dataloader() for i in batch["index"]])
    assert len(shards[0]) == len(shards[1]) > 0 and len(shards[0]) % 4 == 0 and not set(shards[0]) & set(shards[1])
    assert len(shards[0]) * 2 > len(dm.train_set) - 8  # all but the remainder of one batch per rank


def test_too_little_text_for_one_batch_is_refused_naming_the_sizes(tmp_path, cache):
    dm = TextData(str(_folder(tmp_path, _texts(3))), seq_len=64, batch_size=8)
    with pytest.raises(InputError, match="gives 2 training rows of 64 tokens, fewer than one batch of "
                                         "data.batch_size=8"):
        dm.setup()


def test_a_missing_file_through_the_cli_is_one_error_line_exit_2_and_nothing_written(tmp_path, cli):
    run_dir = tmp_path / "run"
    proc = cli("recipe=char_lm", "data=text", f"data.source={tmp_path}/missing.txt", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "missing.txt: no such file or folder" in lines[0]
    assert not run_dir.exists()


def test_prepare_builds_the_cache_the_run_with_the_same_overrides_reads(tmp_path, cache, monkeypatch):
    from framework.data.prepare import prepare

    folder = _folder(tmp_path, _texts(20))
    record = prepare(["recipe=char_lm", "data=text", f"data.source={folder}", "data.seq_len=32",
                      f"hydra.run.dir={tmp_path / 'unused'}"])
    assert record["tokens"] > 0 and record["packing"] and not (tmp_path / "unused").exists()
    monkeypatch.setattr(sources, "read_texts", lambda *a, **k: pytest.fail("the run read the source again"))
    run = TextData(str(folder), seq_len=32, batch_size=4)  # what the run builds from the same overrides
    run.setup()
    assert run.fingerprint == record["fingerprint"] and run.record()["tokens"] == record["tokens"]
    with pytest.raises(InputError, match="data=byte_corpus is built in and has nothing to prepare"):
        prepare(["recipe=char_lm"])


def test_held_out_documents_are_spread_evenly_and_never_none():
    assert [i for i in range(10) if held_out(i, 0.3)] == [0, 3, 6]
    assert sum(held_out(i, 0.05) for i in range(1000)) == 50
    assert np.mean([held_out(i, 0.5) for i in range(2)]) == 0.5


# make test-slow: make test's small run of the your_data guide (tests/test_readme_data.py) trains on a folder of
# text files through the CLI and prepares the cache whose fingerprint the run records
@pytest.mark.slow
def test_a_recipe_trains_on_a_folder_of_text_files_through_the_cli(tmp_path, cli):
    folder, run_dir = _folder(tmp_path, _texts(40)), tmp_path / "run"
    env = {"FRAMEWORK_DATA_CACHE": str(tmp_path / "cache")}
    proc = cli("recipe=char_lm", "data=text", f"data.source={folder}", "data.seq_len=32", "data.batch_size=4",
               "trainer.max_steps=3", "trainer.limit_val_batches=2", f"hydra.run.dir={run_dir}", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["metrics"]["val/loss"] < results["initial_metrics"]["val/loss_init"]
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["TextData"]
    assert state["fingerprint"] == TextData(str(folder), seq_len=32, batch_size=4,
                                            cache_dir=str(tmp_path / "cache")).fingerprint


@pytest.mark.slow  # a fresh interpreter (HF_ENDPOINT is read at import): ~16 s
def test_a_hub_dataset_is_trained_on_by_name_and_revision_in_a_fresh_process_then_offline(tmp_path, cli, hub):
    repo, up = "me/user-text", tmp_path / "up"
    hub.api.create_repo(repo, repo_type="dataset")
    up.mkdir()
    (up / "train.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in _texts(40)))
    sha = hub.api.upload_folder(folder_path=up, repo_id=repo, repo_type="dataset").oid
    (up / "train.jsonl").write_text(json.dumps({"body": "a later commit"}) + "\n")
    hub.api.upload_folder(folder_path=up, repo_id=repo, repo_type="dataset")
    env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "dummy", "HF_HOME": str(tmp_path / "hf"),
           "FRAMEWORK_DATA_CACHE": str(tmp_path / "cache")}
    proc = cli(*TINY_TEXT, f"data.source={repo}", f"data.revision={sha}", "data.column=body", "trainer.max_steps=2",
               f"hydra.run.dir={tmp_path}/run", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)["TextData"]
    assert state["source"] == {"dataset": repo, "revision": sha, "sha": sha}
    # a compute node without internet: the prepared commit trains from the cache, asking nothing
    proc = cli(*TINY_TEXT, f"data.source={repo}", f"data.revision={sha}", "data.column=body", "trainer.max_steps=2",
               f"hydra.run.dir={tmp_path}/offline", env={**env, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://0.0.0.0:9"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "offline" / "results.json").read_text())["data"]["sha"] == sha


TINY_TEXT = ["recipe=char_lm", "data=text", "data.seq_len=32", "data.batch_size=4", "model.dim=32", "model.depth=1",
             "trainer.limit_val_batches=1", "trainer.val_check_interval=null", "trainer.check_val_every_n_epoch=1",
             "threads=1"]


@pytest.mark.slow
def test_a_run_on_text_resumed_mid_epoch_ends_with_the_same_weights(tmp_path, cli, monkeypatch):
    monkeypatch.setenv("FRAMEWORK_DATA_CACHE", str(tmp_path / "cache"))  # the CLI's child inherits it
    folder = _folder(tmp_path, _texts(12))  # 14 rows: 3 batches an epoch, so step 8 is mid-way through the third
    assert_resume_is_exact(cli, [*TINY_TEXT, f"data.source={folder}", "trainer.max_steps=10"], tmp_path,
                           resume_step=8)


@pytest.mark.slow
def test_a_re_staged_copy_resumes_and_a_changed_file_is_refused_by_name(tmp_path, cli):
    """A requeued job: the data copied (`cp -r`, new times and path) resumes; an edited file is refused naming it,
    and data.allow_changed=true goes on with the new data."""
    import subprocess

    folder, run_dir = _folder(tmp_path, _texts(12)), tmp_path / "run"
    env = {"FRAMEWORK_DATA_CACHE": str(tmp_path / "cache")}
    assert cli(*TINY_TEXT, f"data.source={folder}", f"hydra.run.dir={run_dir}", "trainer.max_steps=2",
               env=env).returncode == 0
    staged = tmp_path / "staged"
    subprocess.run(["cp", "-r", str(folder), str(staged)], check=True)
    args = [*TINY_TEXT, f"data.source={staged}", f"hydra.run.dir={run_dir}",
            f"ckpt_path={run_dir}/checkpoints/last.ckpt"]
    proc = cli(*args, "trainer.max_steps=4", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(staged / "doc001.txt", "a") as f:
        f.write("a line added after the run\n")
    proc = cli(*args, "trainer.max_steps=6", env=env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: data.source=") and "doc001.txt changed (33 bytes then, 60 now)" in line, line
    proc = cli(*args, "trainer.max_steps=6", "data.allow_changed=true", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming on data that changed since the checkpoint (doc001.txt changed" in proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.ddp
def test_two_ranks_train_on_text_in_equal_steps(tmp_path, cli):
    proc = cli(*TINY_TEXT, f"data.source={_folder(tmp_path, _texts(40))}", "trainer.max_steps=4",
               "trainer.strategy=ddp", "trainer.devices=2", "trainer.accelerator=cpu", f"hydra.run.dir={tmp_path}/run",
               env={"FRAMEWORK_DATA_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rank0 = json.loads((tmp_path / "run" / "results.json").read_text())
    rank1 = json.loads((tmp_path / "run" / "results.rank1.json").read_text())
    assert rank0["global_step"] == rank1["global_step"] == 4
    assert rank0["metrics"]["val/loss"] == rank1["metrics"]["val/loss"]


def test_a_changed_source_is_packed_anew_saying_why_and_the_old_entry_is_listed_and_removed(tmp_path, cache,
                                                                                            caplog):
    import subprocess
    import sys

    folder = _folder(tmp_path, _texts(12))
    first = TextData(str(folder), seq_len=16, batch_size=2)
    first.setup()
    (folder / "doc004.txt").write_text("an edited document\n")
    edited = TextData(str(folder), seq_len=16, batch_size=2)
    with caplog.at_level("WARNING"):
        edited.setup()
    said = caplog.text
    assert (f"tokenized and packed anew (doc004.txt changed (43 bytes then, 19 now)); the cache it supersedes "
            f"stays ({cache / 'text' / first.fingerprint}") in said, said
    assert f"python -m framework.data cache rm {first.fingerprint}" in said

    from framework.data import cache_cli

    listed = cache_cli.main(["ls"])
    assert first.fingerprint in listed and edited.fingerprint in listed and "2 entries" in listed
    assert str(folder) in listed
    assert cache_cli.main(["rm", first.fingerprint[:8]]).startswith("removed 1 entry")
    listed = cache_cli.main(["ls"])
    assert first.fingerprint not in listed and "1 entries" in listed
    assert (cache / "text" / edited.fingerprint / "done").exists()
    wrong = subprocess.run([sys.executable, "-m", "framework.data", "cache", "rm", "zzz"], capture_output=True,
                           text=True, timeout=120)  # the command line, as a user types it
    assert wrong.returncode == 2 and wrong.stderr.strip().splitlines()[-1].startswith(
        f"error: cache rm zzz: is no entry of {cache / 'text'}")
