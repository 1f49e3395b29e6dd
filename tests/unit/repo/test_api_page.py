"""The Python API reference (docs/pages/reference/api.md) documents every name `import dist_jobs`
offers, each once: one `:::` directive (mkdocstrings) or generated function per name, none of them
a whole module, whose members would come a second time (Sweep once showed twice)."""

from __future__ import annotations

import re

import dist_jobs
from support.paths import REPO

PAGE = REPO / "docs" / "pages" / "reference" / "api.md"


def _directives() -> list[str]:
    return re.findall(r"^::: ([\w.]+)$", PAGE.read_text(), re.M)


def _documented() -> list[str]:
    """The dotted path of every object the page documents at its top level."""
    text = PAGE.read_text()
    paths = _directives()
    for relative, name in re.findall(r"^<!-- gen: function (\S+):(\w+) -->$", text, re.M):
        paths.append(".".join(relative.removesuffix(".py").split("/")).removesuffix(".__init__") + "." + name)
    return paths


def test_no_directive_documents_a_whole_module() -> None:
    for path in _directives():
        parts = path.split(".")
        module = REPO.joinpath(*parts)
        # a module would render every member of it, again under the module's own heading
        assert not module.with_suffix(".py").is_file() and not (module / "__init__.py").is_file(), path


def test_every_public_name_is_documented_exactly_once() -> None:
    names = [path.rsplit(".", 1)[-1] for path in _documented()]
    counts = {name: names.count(name) for name in dist_jobs.__all__}
    assert {name: n for name, n in counts.items() if n != 1} == {}


def test_each_directive_names_where_the_exported_object_is_defined() -> None:
    # `::: dist_jobs.api.verbs.submit` must be the `submit` that `dist_jobs.submit` is.
    import importlib

    exported = set(dist_jobs.__all__) - {"__version__", "REQUEUE_EXIT_CODE"}
    for path in _documented():
        module_path, name = path.rsplit(".", 1)
        if name in exported:
            module = importlib.import_module(module_path)
            # dist_jobs hands out the API's names from dist_jobs.api (its __getattr__); read them
            # there, since `dist_jobs.render` is the submodule once anything has imported it.
            source = dist_jobs.api if name in dist_jobs.api.__all__ else dist_jobs
            assert getattr(module, name) is getattr(source, name), path
