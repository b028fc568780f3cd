"""help(nanoccl): the public types are described, without pages of inherited methods."""

from __future__ import annotations

import pydoc
import typing


def test_help_describes_every_stats_field_and_stays_short() -> None:
    import nanoccl

    text = pydoc.render_doc(nanoccl, renderer=pydoc.plaintext)
    assert len(text.splitlines()) < 400, "help(nanoccl) grew pages again (inherited methods?)"
    assert "Methods inherited from builtins.dict" not in text
    doc = nanoccl.__doc__ or ""
    for cls in (nanoccl.Stats, nanoccl.PeerStats, nanoccl.ByteCounts, nanoccl.ModelledCalls):
        assert f"``{cls.__name__}``" in doc, cls.__name__
        for field in typing.get_type_hints(cls):
            assert field in doc, f"{cls.__name__}.{field} is not described in nanoccl's docstring"
    for name in nanoccl.__all__:
        assert name in text, name
