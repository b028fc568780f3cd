"""docs/configuration.md against the settings the library defines.

The first table must list exactly the settings of the library's table (common/config.cc, read
through nanoccl._C.default_settings()), each with the code's default; the second every
NANOCCL_ variable the C++ reads from the environment outside that table. A setting added,
renamed or given another default without the page following fails here.
"""

from __future__ import annotations

import re

from bench_helpers import REPO

PAGE = REPO / "docs" / "configuration.md"


def tables() -> list[dict[str, str]]:
    """The page's tables, in order: variable name -> default cell."""
    found: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    for line in PAGE.read_text().splitlines():
        if line.startswith("| Variable |"):
            current = {}
            found.append(current)
        elif current is not None and line.startswith("| `NANOCCL_"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            current[cells[0].strip("`")] = cells[1]
        elif current is not None and not line.startswith("|"):
            current = None
    return found


def test_every_setting_of_the_code_is_documented_with_its_default() -> None:
    import nanoccl

    code = {f"NANOCCL_{name.upper()}": value for name, value in nanoccl._C.default_settings()}
    per_group = tables()[0]
    assert sorted(per_group) == sorted(code), (
        f"only in the code: {sorted(set(code) - set(per_group))}; "
        f"only in docs/configuration.md: {sorted(set(per_group) - set(code))}")
    for name, cell in per_group.items():
        literal = re.fullmatch(r"`([^`]*)`", cell)
        if literal:
            assert literal.group(1) == code[name], f"{name}: docs say {cell}, code {code[name]!r}"
        else:  # a description ("*(empty)*", "from torchrun / host") stands for an empty value
            assert code[name] == "", f"{name}: docs say {cell}, code {code[name]!r}"


def test_every_variable_read_outside_the_table_is_documented() -> None:
    read = set()
    for path in (REPO / "common").glob("*.cc"):
        read |= set(re.findall(r'getenv\("(NANOCCL_[A-Z_]+)"\)', path.read_text()))
    assert read, "no getenv(\"NANOCCL_...\") found in common/: has the code moved?"
    documented = set(tables()[1])
    assert read <= documented, f"not in docs/configuration.md: {sorted(read - documented)}"
