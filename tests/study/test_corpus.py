"""bench/corpus.py and the trainer's corpus data: generated Sphinx pages (corpus_pages.py), so
that no test needs Debian's python3.11-doc."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus_pages import write_pages  # noqa: E402
from study_helpers import REPO  # noqa: E402

import corpus  # noqa: E402  (bench/ is on sys.path through study_helpers)
from trainers import data  # noqa: E402


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    folder = tmp_path_factory.mktemp("html")
    return folder, write_pages(folder, count=8, paragraphs=20)


def test_the_prose_of_the_main_body_only(pages: tuple[Path, list[str]], tmp_path: Path) -> None:
    source, titles = pages
    manifest = corpus.prepare(source, tmp_path, val_fraction=0.25, package=None)
    text = (tmp_path / "train.txt").read_text() + (tmp_path / "val.txt").read_text()
    for title in titles:
        assert text.count(title + "\n") == 1, title  # one document each, its heading a line
    for left_out in ("NAVIGATION", "SIDEBAR", "FOOTER", "NOTITLE", "scripted", "color: red",
                     "code_line", "\u00b6", "INDEXPAGE", "STATICPAGE"):
        assert left_out not in text, left_out
    assert "An item & more.\n" in text  # entities decoded, list items a line each
    # A paragraph broken across source lines is one line; documents end with a blank line.
    lines = text.split("\n")
    assert sum(1 for line in lines if line.count(".") >= 4) == 8 * 20, "paragraph lines"
    assert text.endswith("\n\n") and "\n\n\n" not in text
    assert manifest["documents"] == 8 and manifest["vocab_size"] == 256
    assert manifest["source"] == {"package": None, "version": None, "path": str(source),
                                  "what": "the main text of the Sphinx HTML pages under path"}


def test_the_held_out_split_is_whole_documents_and_deterministic(
        pages: tuple[Path, list[str]], tmp_path: Path) -> None:
    source, titles = pages
    first = corpus.prepare(source, tmp_path / "a", val_fraction=0.25, package=None)
    again = corpus.prepare(source, tmp_path / "b", val_fraction=0.25, package=None)
    for name in ("train.txt", "val.txt", "corpus.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    held = first["split"]["held_out"]
    assert len(held) == 2 and first == again  # ceil(0.25 x 8)
    train = (tmp_path / "a" / "train.txt").read_text()
    val = (tmp_path / "a" / "val.txt").read_text()
    held_titles = {t for t in titles if t + "\n" in val}
    assert len(held_titles) == 2 and not any(t + "\n" in train for t in held_titles)
    # No paragraph of a held-out page is in the training text.
    paragraphs = {line for line in val.split("\n") if line.count(".") >= 4}
    assert len(paragraphs) == 2 * 20 and not paragraphs & set(train.split("\n"))
    for name in ("train.txt", "val.txt"):
        body = (tmp_path / "a" / name).read_bytes()
        assert first["files"][name]["bytes"] == len(body)
    assert corpus.load(tmp_path / "a") == first
    # At least one held out, never all.
    assert len(corpus.prepare(source, tmp_path / "c", 0.01, None)["split"]["held_out"]) == 1
    assert len(corpus.prepare(source, tmp_path / "d", 0.99, None)["split"]["held_out"]) == 7


def test_a_corpus_that_does_not_match_its_manifest_is_refused(
        pages: tuple[Path, list[str]], tmp_path: Path) -> None:
    corpus.prepare(pages[0], tmp_path, 0.25, None)
    with (tmp_path / "train.txt").open("ab") as fh:
        fh.write(b"more")
    with pytest.raises(ValueError, match="prepare it again"):
        corpus.load(tmp_path)
    with pytest.raises(ValueError, match="not a corpus"):
        corpus.load(tmp_path / "nowhere")


def test_the_cli_names_the_package_when_the_source_is_missing(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "corpus.py"), "--source",
                           str(tmp_path / "missing"), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "apt-get install -y python3.11-doc" in proc.stderr, proc.stderr


def test_the_trainer_trains_on_train_and_evaluates_on_held_out(
        pages: tuple[Path, list[str]], tmp_path: Path) -> None:
    corpus.prepare(pages[0], tmp_path, 0.25, None)
    train_bytes = (tmp_path / "train.txt").read_bytes()
    val_bytes = (tmp_path / "val.txt").read_bytes()
    source = data.make_source("gpt2-nano", 4, 16, 256, 1, str(tmp_path))
    x, y = source.global_batch(3)
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        assert bytes(row_x) in train_bytes and row_x[1:] == row_y[:-1]
    (held_x, held_y), what = data.held_out(16, 256, 1, str(tmp_path), None, 5)
    assert str(tmp_path / "val.txt") in what and held_x.shape == (5, 16)
    # Evenly spaced windows from the start to the end of the held-out text, whatever the seed.
    assert bytes(held_x[0].tolist()) == val_bytes[:16]
    assert bytes(held_y[-1].tolist()) == val_bytes[-16:]
    again, _ = data.held_out(16, 256, 99, str(tmp_path), None, 5)
    assert torch.equal(again[0], held_x)
    # --eval-data takes a corpus folder or a text file; a plain --data file holds nothing out.
    (plain_x, _), _ = data.held_out(16, 256, 1, None, str(tmp_path / "val.txt"), 5)
    assert torch.equal(plain_x, held_x)
    with pytest.raises(ValueError, match="holds nothing out"):
        data.held_out(16, 256, 1, str(tmp_path / "train.txt"), None, 5)
    with pytest.raises(ValueError, match="--eval-data must be"):
        data.held_out(16, 256, 1, None, str(tmp_path / "missing.txt"), 5)
    # Synthetic data: another seed's sequences, not the training batches'.
    (syn_x, _), what = data.held_out(16, 256, 1, None, None, 4)
    assert "synthetic" in what
    assert not torch.equal(syn_x, data.SyntheticTokens(256, 16, 4, 1).global_batch(0)[0])


def test_the_debian_corpus_manifest_names_its_package(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The package and its version, as dpkg reports them, go into corpus.json."""
    folder = tmp_path / "html"
    write_pages(folder, count=3, paragraphs=2)
    monkeypatch.setattr(corpus, "package_version", lambda package: "3.11.2-6+test")
    manifest = corpus.prepare(folder, tmp_path / "out", 0.05, corpus.PACKAGE)
    assert manifest["source"]["package"] == "python3.11-doc"
    assert manifest["source"]["version"] == "3.11.2-6+test"
    assert "Python 3.11 documentation" in manifest["source"]["what"]
    assert json.loads((tmp_path / "out" / "corpus.json").read_text()) == manifest
