"""mkdocs hooks: fill the generated parts of each page and check its executed examples.

A page asks for generated text with an HTML comment on a line of its own, for example
`<!-- gen: spec_reference -->`; `<!-- gen: include BENCHMARKS.md -->` pulls in a file of the
repository (one that is not Markdown, such as LICENSE, as a text block) and
`<!-- gen: docstring dist_jobs/rundir/lock.py -->` a module's docstring,
`<!-- gen: function dist_jobs/api/__init__.py:job -->` a function mkdocstrings cannot reach,
`<!-- gen: file examples/ddp-script/train.py -->` a file as a code block titled with its name,
`<!-- gen: notebook examples/notebook.ipynb -->` a notebook run now, its cells and what they printed
(docs/notebook.py). A page's `console` blocks that start with `$ dist-jobs` are run (docs/gen.py,
run_examples) and a mismatch is an error, so `mkdocs build --strict` fails on a stale example.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen
import notebook

log = logging.getLogger("mkdocs.plugins.dist_jobs")
_DIRECTIVE = re.compile(r"^<!-- gen: (\w+)(?: (\S+))? -->$", re.M)
GENERATORS = {
    "spec_reference": gen.spec_reference,
    "cli_reference": gen.cli_reference,
    "constants_table": gen.constants_table,
    "error_classes": gen.error_classes,
}


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    text, problems = gen.run_examples(_DIRECTIVE.sub(_expand, markdown))
    for problem in problems:
        log.error("%s: an example is stale: %s", page.file.src_path, problem)
    return text


def _expand(match: re.Match[str]) -> str:
    name, arg = match.group(1), match.group(2)
    if name in GENERATORS:
        return GENERATORS[name]()
    if name in WITH_ARGUMENT:
        return WITH_ARGUMENT[name](arg)
    raise ValueError(f"unknown generator {name!r}; known: {sorted(GENERATORS)}, {sorted(WITH_ARGUMENT)}")


def _file(relative: str) -> str:
    """A file of the repository (an example's script or spec) as a code block titled with its
    name: the page shows it, and the page's executed examples find it in their folder."""
    path = gen.REPO / relative
    lang = {".py": "python", ".yaml": "yaml", ".sh": "bash"}.get(path.suffix, "text")
    return f'```{lang} title="{path.name}"\n{path.read_text().rstrip()}\n```\n'


def _include(relative: str) -> str:
    """A repository file: Markdown with its first heading dropped (the page has its own), any
    other file (LICENSE) as a text block, whose line breaks and indentation are its layout."""
    text = (gen.REPO / relative).read_text()
    if not relative.endswith(".md"):
        return "```text\n" + text.rstrip("\n") + "\n```\n"
    return re.sub(r"\A# [^\n]*\n", "", text)


# The directives that take an argument: `<!-- gen: NAME ARGUMENT -->`.
WITH_ARGUMENT: dict[str, Callable[[str], str]] = {
    "include": _include,
    "docstring": gen.docstring,
    "function": gen.function,
    "file": _file,
    "notebook": notebook.notebook,
}
