"""The documentation site works wherever it is opened (file:// included), and the repository's
LICENSE is the license pyproject.toml declares. Read from the files; nothing is built here."""

from __future__ import annotations

import re

import yaml

from support.paths import REPO

# The opening words of each license text an SPDX identifier names (whitespace collapsed).
LICENSE_OPENINGS = {
    "Apache-2.0": "Apache License Version 2.0, January 2004 http://www.apache.org/licenses/",
    "MIT": "MIT License",
    "BSD-3-Clause": "BSD 3-Clause License",
}


def _mkdocs() -> dict[str, object]:
    loaded = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def _plugin_names(config: dict[str, object]) -> list[str]:
    plugins = config.get("plugins", [])
    assert isinstance(plugins, list)
    return [next(iter(p)) if isinstance(p, dict) else p for p in plugins]


def test_pages_are_files_so_links_work_from_file_urls() -> None:
    # Directory URLs (`page/`) need a web server to serve `page/index.html`: from disk the
    # browser shows a folder listing.
    assert _mkdocs()["use_directory_urls"] is False


def test_search_works_offline() -> None:
    # mkdocs' own search fetches its index, which a browser refuses from a file:// page.
    names = _plugin_names(_mkdocs())
    assert "search" in names and "offline" in names
    assert names.index("search") < names.index("offline")


def test_the_license_file_is_the_license_pyproject_declares() -> None:
    declared = re.search(r'^license = "([^"]+)"$', (REPO / "pyproject.toml").read_text(), re.M)
    assert declared is not None, "pyproject.toml declares no license"
    opening = LICENSE_OPENINGS[declared.group(1)]
    text = " ".join((REPO / "LICENSE").read_text().split())
    assert text.startswith(opening)
    other = [spdx for spdx, words in LICENSE_OPENINGS.items() if spdx != declared.group(1) and words in text]
    assert other == []


def test_the_license_and_the_changelog_are_pages_of_the_site() -> None:
    pages = REPO / "docs" / "pages"
    nav = (REPO / "mkdocs.yml").read_text()
    for page, source in (("license.md", "LICENSE"), ("changelog.md", "CHANGELOG.md")):
        assert f"<!-- gen: include {source} -->" in (pages / page).read_text()
        assert re.search(rf":\s*{re.escape(page)}$", nav, re.M), page
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert "keepachangelog.com" in changelog and "## [Unreleased]" in changelog


def test_a_file_that_is_not_markdown_is_included_as_a_text_block() -> None:
    import sys

    sys.path.insert(0, str(REPO / "docs"))
    import hooks

    included = hooks._include("LICENSE")
    assert included.startswith("```text\n") and included.endswith("\n```\n")
    assert (REPO / "LICENSE").read_text().rstrip("\n") in included
    assert not hooks._include("CHANGELOG.md").startswith("# Changelog")  # the page has its own heading
