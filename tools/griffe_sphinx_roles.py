"""A griffe extension for the documentation site (mkdocs.yml loads it into mkdocstrings): the
docstrings write cross-references the Sphinx way (``:class:`ReplicaPool```,
``:meth:`~clickhouse_lb.ReplicaPool.plan```), which Markdown would show as they are. Each becomes
inline code with the name the reader would see in Sphinx (the last part after ``~``)."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj|const):`(?P<tilde>~?)(?P<target>[^`]+)`")


def plain(text: str) -> str:
    """``:class:`~a.b.C``` -> ```C```, ``:func:`a.f``` -> ```a.f```."""

    def code(m: re.Match[str]) -> str:
        target = m["target"].strip()
        if m["tilde"]:
            target = target.rpartition(".")[2]
        return f"`{target}`"

    return _ROLE.sub(code, text)


class SphinxRoles(griffe.Extension):
    """Rewrites the roles in every docstring of a loaded package."""

    def _rewrite(self, obj: Any, seen: set[int]) -> None:
        if id(obj) in seen or getattr(obj, "is_alias", False):
            return
        seen.add(id(obj))
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
        for member in obj.members.values():
            self._rewrite(member, seen)

    def on_package(self, *, pkg: Any, **kwargs: Any) -> None:  # griffe 2
        self._rewrite(pkg, set())

    def on_package_loaded(self, *, pkg: Any, **kwargs: Any) -> None:  # griffe 1
        self._rewrite(pkg, set())
