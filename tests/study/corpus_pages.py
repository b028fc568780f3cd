"""Small Sphinx-like HTML pages for the corpus tests: generated, so that no test needs
Debian's python3.11-doc (bench/corpus.py reads the real ones the same way)."""

from __future__ import annotations

import random
from pathlib import Path

WORDS = ("the a module function returns value list object file path name data which when "
         "this that is are be can with for from into each new default other raises error "
         "argument string number time thread process socket buffer encoding").split()


def sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(6, 14))]
    return " ".join(words).capitalize() + "."


def page(title: str, paragraphs: list[str]) -> str:
    # One line break inside each paragraph, as Sphinx's HTML has (where the source has one).
    body = "".join("<p>" + p.replace(" ", "\n", 1) + "</p>\n" for p in paragraphs)
    return f"""<!DOCTYPE html>
<html><head><title>{title} NOTITLE</title><script>var scripted = 1;</script>
<style>.x {{ color: red }}</style></head>
<body><div class="related" role="navigation">NAVIGATION previous | next</div>
<div class="document"><div class="documentwrapper"><div class="bodywrapper">
<div class="body" role="main">
<section id="s"><h1>{title}<a class="headerlink" href="#s" title="Permalink">\u00b6</a></h1>
{body}<div class="highlight-python3 notranslate"><div class="highlight"><pre><span>code_line = 1</span>
</pre></div></div>
<ul><li><p>An item &amp; more.</p></li></ul>
</section></div></div></div></div>
<div class="sphinxsidebar" role="navigation">SIDEBAR contents</div>
<div class="footer">FOOTER copyright</div></body></html>
"""


def write_pages(folder: Path, count: int = 8, paragraphs: int = 30, seed: int = 5) -> list[str]:
    """`count` pages (library/page<i>.html, tutorial/...), an index page and a static page
    that the corpus leaves out; returns the titles, in page order."""
    rng = random.Random(seed)
    titles = []
    for i in range(count):
        sub = folder / ("library" if i % 2 else "tutorial")
        sub.mkdir(parents=True, exist_ok=True)
        title = f"Page number {i} title"
        paras = [" ".join(sentence(rng) for _ in range(4)) for _ in range(paragraphs)]
        (sub / f"page{i}.html").write_text(page(title, paras), encoding="utf-8")
        titles.append(title)
    (folder / "genindex-A.html").write_text(page("INDEXPAGE", ["index entries"]))
    (folder / "_static").mkdir(exist_ok=True)
    (folder / "_static" / "x.html").write_text(page("STATICPAGE", ["static"]))
    return titles
