#!/usr/bin/env python3
"""A natural-language corpus for the study's long runs: the English prose of the Python
documentation as Debian's python3.11-doc ships it, byte-level tokens, with a held-out split.

    apt-get install -y python3.11-doc          # /usr/share/doc/python3.11/html
    python bench/corpus.py                     # -> ~/.cache/nanoccl/corpus/python3.11-doc
    python bench/corpus.py --source DIR --out OUT   # any folder of Sphinx HTML pages

Source: every ``*.html`` page under --source (default /usr/share/doc/python3.11/html, the
HTML build of the Python 3.11 documentation, package python3.11-doc), in sorted order of
their paths, except the generated index pages (genindex*, py-modindex, search, contents).
Of each page the text of Sphinx's main body (``<div class="body" role="main">``) is kept:
paragraphs, headings, lists and tables as lines of text; code blocks (``<pre>``), scripts,
styles and the pilcrow links of headings are left out, so that what remains is prose.
Whitespace is collapsed, each page is one document, documents are separated by a blank line.

Tokens: the UTF-8 bytes of the text (vocabulary 256, which gpt2-tiny's 512 holds):
``train.txt`` and ``val.txt`` are at once the text and the token files that
``trainers/train.py --data OUT`` reads (a byte is a token).

Held-out split: the documents ranked by the SHA-256 of their relative path; the first
ceil(--val-fraction x documents) of that order (at least one, never all) are held out
(``val.txt``), the rest train (``train.txt``), both in path order. Whole documents, so no
held-out page shares a paragraph with the training text. ``corpus.json`` names the source
(package and version from dpkg where it is installed), the held-out pages, the byte counts
and the SHA-256 of both files. Nothing depends on the time or the machine: the same source
gives the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import html.parser
import json
import math
import os
import re
import subprocess
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# The file names the trainer reads (trainers/train.py --data FOLDER).
from trainers.data import CORPUS_MANIFEST as MANIFEST  # noqa: E402
from trainers.data import CORPUS_TRAIN as TRAIN_FILE  # noqa: E402
from trainers.data import CORPUS_VAL as VAL_FILE  # noqa: E402

PACKAGE = "python3.11-doc"
DEFAULT_SOURCE = Path("/usr/share/doc/python3.11/html")
FORMAT = "nanoccl-corpus-1"
# Generated pages: indexes of names, not prose.
SKIPPED = re.compile(r"^(genindex.*|py-modindex|search|contents)\.html$")
# Elements whose text is left out, and those that end a line.
DROPPED = {"script", "style", "pre", "head", "title"}
BLOCKS = {"p", "div", "section", "h1", "h2", "h3", "h4", "h5", "h6", "li", "dt", "dd", "tr",
          "br", "table", "ul", "ol", "dl", "blockquote", "figcaption", "caption", "hr"}


def default_out() -> Path:
    """Where a prepared corpus goes by default: outside the checkout, in the user's cache."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "nanoccl" / "corpus" / PACKAGE


class _BodyText(html.parser.HTMLParser):
    """The text inside Sphinx's main body div, one line per block element."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.depth = 0  # open divs inside the body (0: not in it)
        self.found = False
        self.dropped: list[str] = []  # the open elements whose text is left out
        self.parts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = (dict(attrs).get("class") or "").split()
        if self.depth == 0:
            if tag == "div" and ("body" in classes or ("role", "main") in attrs):
                self.depth, self.found = 1, True
            return
        if tag == "div":
            self.depth += 1
        if tag in DROPPED or (tag == "a" and "headerlink" in classes):
            self.dropped.append(tag)
        if tag in BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if self.depth == 0:
            return
        if self.dropped and self.dropped[-1] == tag:
            self.dropped.pop()
        if tag in BLOCKS:
            self.parts.append("\n")
        if tag == "div":
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if self.depth and not self.dropped:
            self.parts.append(data.replace("\n", " "))  # source line breaks: spaces

    def text(self) -> str:
        raw = unicodedata.normalize("NFC", "".join(self.parts))
        lines = (re.sub(r"[ \t\r\f\v\u00a0]+", " ", line).strip() for line in raw.split("\n"))
        return "\n".join(line for line in lines if line)


def page_text(markup: str) -> str:
    """The prose of one Sphinx HTML page ('' when it has no main body)."""
    parser = _BodyText()
    parser.feed(markup)
    parser.close()
    return parser.text() if parser.found else ""


@dataclass
class Document:
    path: str  # relative to the source, '/'-separated
    text: str

    @property
    def rank_key(self) -> str:
        return hashlib.sha256(self.path.encode()).hexdigest()


def read_documents(source: Path) -> list[Document]:
    """Every prose page under `source`, in sorted path order (pages without text left out)."""
    if not source.is_dir():
        raise FileNotFoundError(
            f"{source}: no such folder (the Python 3.11 documentation: apt-get install -y "
            f"{PACKAGE}, or give --source a folder of Sphinx HTML pages)")
    docs = []
    for path in sorted(source.rglob("*.html")):
        rel = path.relative_to(source).as_posix()
        if SKIPPED.match(path.name) or rel.startswith(("_static/", "_sources/")):
            continue
        text = page_text(path.read_text(encoding="utf-8", errors="replace"))
        if text:
            docs.append(Document(rel, text))
    return docs


def split(docs: Sequence[Document], val_fraction: float) -> tuple[list[Document], list[Document]]:
    """(train, held-out): the held-out documents are the first ceil(fraction x n) in the
    order of the SHA-256 of their paths (at least one, never all); both lists in path order."""
    if len(docs) < 2:
        raise ValueError(f"{len(docs)} document(s) with text: a held-out split needs two")
    if not 0 < val_fraction < 1:
        raise ValueError(f"--val-fraction {val_fraction}: must be in (0, 1)")
    count = min(len(docs) - 1, max(1, math.ceil(val_fraction * len(docs))))
    held = {d.path for d in sorted(docs, key=lambda d: d.rank_key)[:count]}
    return [d for d in docs if d.path not in held], [d for d in docs if d.path in held]


def _join(docs: Sequence[Document]) -> bytes:
    return "".join(d.text + "\n\n" for d in docs).encode("utf-8")


def package_version(package: str = PACKAGE) -> str | None:
    """The installed version of a Debian package (None where dpkg does not know it)."""
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", package],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def prepare(source: Path, out: Path, val_fraction: float = 0.05,
            package: str | None = PACKAGE) -> dict[str, Any]:
    """Writes train.txt, val.txt and corpus.json into `out`; returns the manifest.
    `package`: the Debian package the source comes from (None: a plain folder)."""
    docs = read_documents(source)
    train, val = split(docs, val_fraction)
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, part in ((TRAIN_FILE, train), (VAL_FILE, val)):
        data = _join(part)
        (out / name).write_bytes(data)
        files[name] = {"documents": len(part), "bytes": len(data),
                       "sha256": hashlib.sha256(data).hexdigest()}
    version = package_version(package) if package else None
    manifest = {
        "format": FORMAT,
        "name": package or source.name,
        "source": {"package": package if version else None, "version": version,
                   "path": str(source),
                   "what": ("the English prose of the Python 3.11 documentation (Debian's "
                            f"{package}: its HTML pages' main text, code blocks left out)"
                            if package == PACKAGE and version else
                            "the main text of the Sphinx HTML pages under path")},
        "tokens": "bytes of UTF-8 text (vocabulary 256): train.txt and val.txt are the "
                  "token files",
        "vocab_size": 256,
        "split": {"rule": "held out: the first ceil(val_fraction x documents) by SHA-256 of "
                          "the relative path (at least one, never all)",
                  "val_fraction": val_fraction, "held_out": [d.path for d in val]},
        "documents": len(docs),
        "files": files,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def load(folder: Path) -> dict[str, Any]:
    """A prepared corpus' manifest (ValueError where `folder` holds none, or its files do
    not match it)."""
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{folder}: not a corpus prepared by bench/corpus.py ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} manifest")
    for name in (TRAIN_FILE, VAL_FILE):
        size = (Path(folder) / name).stat().st_size if (Path(folder) / name).is_file() else None
        if size != manifest["files"][name]["bytes"]:
            raise ValueError(f"{Path(folder) / name}: {size} bytes, the manifest says "
                             f"{manifest['files'][name]['bytes']}: prepare it again")
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE,
                   help=f"a folder of Sphinx HTML pages (default {DEFAULT_SOURCE}, package "
                        f"{PACKAGE})")
    p.add_argument("--out", type=Path, default=None,
                   help=f"where train.txt, val.txt and {MANIFEST} go (default {default_out()})")
    p.add_argument("--val-fraction", type=float, default=0.05,
                   help="documents held out (default 0.05)")
    args = p.parse_args(argv)
    out = args.out or default_out()
    package = PACKAGE if args.source.resolve() == DEFAULT_SOURCE.resolve() else None
    try:
        manifest = prepare(args.source, out, args.val_fraction, package)
    except (OSError, ValueError) as exc:
        print(f"corpus: {exc}", file=sys.stderr)
        return 2
    files = manifest["files"]
    print(f"corpus: {manifest['documents']} documents from {args.source} "
          f"({manifest['source']['package'] or 'a folder'}"
          f"{' ' + manifest['source']['version'] if manifest['source']['version'] else ''}): "
          f"{files[TRAIN_FILE]['bytes']} train bytes, {files[VAL_FILE]['bytes']} held out "
          f"({files[VAL_FILE]['documents']} documents) in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
