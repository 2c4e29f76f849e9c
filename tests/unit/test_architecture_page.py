"""The architecture page is in the repository and what cites it holds: every test that cites
ARCHITECTURE.md finds the page, and a quoted section ('ARCHITECTURE.md, "Errors a person can act
on"') is on it; the README points to it. Its import table is checked in test_import_layers.py."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "ARCHITECTURE.md"
CITED_SECTION = re.compile(r'ARCHITECTURE\.md, "([^"]+)"')


def _flat(text: str) -> str:
    """Text with every run of whitespace (a docstring's line breaks too) as one space."""
    return " ".join(text.split())


def citations() -> dict[str, list[str]]:
    """Test file -> the page sections it quotes, for every test file naming ARCHITECTURE.md."""
    found = {}
    for path in sorted((REPO / "tests").rglob("*.py")):
        text = _flat(path.read_text())
        if "ARCHITECTURE.md" in text and path != Path(__file__):
            found[str(path.relative_to(REPO))] = CITED_SECTION.findall(text)
    return found


def test_the_tests_that_cite_the_page_find_it_and_what_they_quote():
    cited = citations()
    assert "tests/unit/test_import_layers.py" in cited  # the walk found the citing tests
    page = _flat(PAGE.read_text())
    missing = {test: quoted for test, sections in cited.items()
               for quoted in sections if quoted not in page}
    assert missing == {}, f"quoted in a test but not on {PAGE.name}"


def test_the_readme_points_to_the_page():
    assert "ARCHITECTURE.md" in (REPO / "README.md").read_text()
