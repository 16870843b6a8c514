"""`data.source=`: files, folders, globs and Hub datasets resolved through `datasets`, and the refusals a user meets
(each names the value): missing, empty, not UTF-8, a missing column."""

from __future__ import annotations

import json

import datasets  # noqa: F401 - imported before the `hub` fixture starts, as in a user's session: the patch repoints it
import pytest

from framework.data import sources
from framework.errors import InputError


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_a_file_a_folder_and_a_glob_resolve_to_files_with_sizes_and_digests(tmp_path, caplog):
    import hashlib

    for name in ("b.txt", "a.txt"):
        (tmp_path / name).write_text(f"the text of {name}\n")
    (tmp_path / "scan.pdf").write_bytes(b"%PDF-1.4")
    one = sources.resolve(str(tmp_path / "a.txt"))
    assert one.builder == "text" and one.files == {"train": [str(tmp_path / "a.txt")]}
    with caplog.at_level("WARNING"):
        folder = sources.resolve(str(tmp_path))
    assert folder.files == {"train": [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]}  # sorted, .pdf left out
    assert "1 .pdf file left out" in caplog.text
    digest = hashlib.sha256((tmp_path / "a.txt").read_bytes()).hexdigest()[:32]
    assert folder.identity()["files"]["train"][0] == [digest, (tmp_path / "a.txt").stat().st_size]
    assert sources.resolve(str(tmp_path / "*.txt")).files == folder.files
    texts = [t for batch in sources.read_texts(folder, "train", "text") for t in batch]
    assert texts == ["the text of a.txt\n", "the text of b.txt\n"]  # a .txt file is one document


def test_a_folder_keeps_datasets_split_names(tmp_path):
    _jsonl(tmp_path / "train.jsonl", [{"text": "a"}])
    _jsonl(tmp_path / "validation.jsonl", [{"text": "b"}])
    src = sources.resolve(str(tmp_path))
    assert sorted(src.files) == ["train", "validation"] and src.builder == "json"


@pytest.mark.parametrize("spec, message", [
    ("{tmp}/missing.txt", "missing.txt: no such file or folder"),
    ("{tmp}/*.parquet", "matches no files"),
    ("{tmp}/empty.txt", "every file is empty"),
    ("{tmp}/mixed", "mixes formats"),
    ("{tmp}/data.bin", "cannot tell the format of '.bin'"),
])
def test_a_source_that_gives_nothing_is_refused_naming_it(tmp_path, spec, message):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "data.bin").write_bytes(b"x")
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "a.txt").write_text("a")
    _jsonl(tmp_path / "mixed" / "b.jsonl", [{"text": "b"}])
    with pytest.raises(InputError, match=message) as err:
        sources.resolve(spec.format(tmp=tmp_path))
    assert "data.source=" in str(err.value)


def test_bytes_that_are_not_utf8_are_refused_naming_the_file_line_and_offset(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"first line\nsecond: caf" + "é".encode("latin-1") + b"\n")
    with pytest.raises(InputError, match=r"data.source=\S*latin1.txt is not UTF-8 text: byte 22 \(line 2\)"):
        sources.check(sources.resolve(str(path)), "text", ["train"])
    ok = tmp_path / "ok.txt"  # a multi-byte character split across two read blocks is fine
    ok.write_text("ab€" * 5, encoding="utf-8")
    sources.check_utf8(str(ok), chunk=4)


def test_a_missing_column_is_refused_naming_the_columns_there(tmp_path):
    src = sources.resolve(str(_jsonl(tmp_path / "rows.jsonl", [{"body": "x", "id": 1}])))
    with pytest.raises(InputError, match=r"data.column='text' is not a column of .*rows.jsonl.*columns: body, id"):
        sources.check(src, "text", ["train"])
    assert sources.check(src, "body", ["train"]) == ["body", "id"]
    with pytest.raises(InputError, match="data.column='id' of .* holds int values"):
        list(sources.read_texts(src, "train", "id"))


def test_a_hub_dataset_is_read_by_name_at_the_revision_given(tmp_path, hub):
    repo = "me/notes"
    hub.api.create_repo(repo, repo_type="dataset")
    up = tmp_path / "up"
    up.mkdir()
    shas = []
    for words in ("old", "new"):
        _jsonl(up / "train.jsonl", [{"text": f"{words} {i}"} for i in range(3)])
        shas.append(hub.api.upload_folder(folder_path=up, repo_id=repo, repo_type="dataset").oid)
    pinned = sources.resolve(repo, revision=shas[0])
    assert pinned.sha == shas[0] and pinned.format == "json" and pinned.identity() == {"hub": repo, "sha": shas[0]}
    assert next(sources.read_texts(pinned, "train", "text")) == ["old 0", "old 1", "old 2"]
    assert sources.resolve(repo).sha == shas[1]
    with pytest.raises(InputError, match="the Hub at http://127.0.0.1:.* has no dataset repo 'me/absent'"):
        sources.resolve("me/absent")
    with pytest.raises(InputError, match="data.revision=v9: the Hub dataset 'me/notes'"):
        sources.resolve(repo, revision="v9")


def test_a_hub_dataset_with_two_configs_takes_data_config_with_a_did_you_mean(tmp_path, hub, cache):
    repo, up = "me/two-configs", tmp_path / "up2"
    hub.api.create_repo(repo, repo_type="dataset")
    for lang in ("english", "french"):
        (up / lang).mkdir(parents=True)
        _jsonl(up / lang / "train.jsonl", [{"text": f"{lang} {i}"} for i in range(3)])
    (up / "README.md").write_text("---\nconfigs:\n- config_name: english\n  data_files: english/*.jsonl\n"
                                  "- config_name: french\n  data_files: french/*.jsonl\n---\n")
    hub.api.upload_folder(folder_path=up, repo_id=repo, repo_type="dataset")
    with pytest.raises(InputError, match=r"has 2 configs and no default: name one with data.config= "
                                         r"\(english, french\)"):
        sources.splits_of(sources.resolve(repo))
    with pytest.raises(InputError, match=r"data.config='frnch' is not a config .* Did you mean 'french'\?"):
        sources.splits_of(sources.resolve(repo, config="frnch"))
    french = sources.resolve(repo, config="french")
    assert sources.splits_of(french) == ["train"] and french.identity()["config"] == "french"
    assert next(sources.read_texts(french, "train", "text")) == ["french 0", "french 1", "french 2"]


def test_offline_a_pinned_hub_dataset_resolves_without_asking_and_an_unpinned_one_says_how_to_pin(
        tmp_path, hub, cache, monkeypatch):
    from framework.data import hub_source

    repo = "me/offline-notes"
    hub.api.create_repo(repo, repo_type="dataset")
    _jsonl(tmp_path / "train.jsonl", [{"text": "a"}])
    sha = hub.api.upload_file(path_or_fileobj=str(tmp_path / "train.jsonl"), path_in_repo="train.jsonl",
                              repo_id=repo, repo_type="dataset").oid
    assert sources.resolve(repo).sha == sha  # online: resolved, remembered
    monkeypatch.setattr(hub_source, "offline", lambda: True)
    monkeypatch.setattr("huggingface_hub.HfApi.dataset_info", lambda *a, **k: pytest.fail("asked the Hub offline"))
    pinned = sources.resolve(repo, revision=sha)
    assert (pinned.sha, pinned.format) == (sha, "json")
    with pytest.raises(InputError, match=f"HF_HUB_OFFLINE=1 and data.revision=main is not a commit sha.*commit {sha}: "
                                         f"add data.revision={sha}"):
        sources.resolve(repo)
