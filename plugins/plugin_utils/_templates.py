# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The collection's document templates under files/ (the submission bundle's README.md, the
report's index.html), rendered with Jinja2, which ansible-core itself depends on.

They are plain Jinja, not Ansible templates: no variables, lookups or filters of a play, only the
values and filters the caller hands over, so that the same values give the same bytes. A value
the template names and the caller did not give fails (StrictUndefined) instead of rendering as
empty text. An .html or .html.j2 template is autoescaped; the others are text. A line holding
only a block tag leaves no line of its own (trim_blocks, lstrip_blocks), and the file's last
newline stays.

Controller side only.
"""

from __future__ import annotations

from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

FILES = Path(__file__).resolve().parents[2] / "files"


def render(name: str, filters: dict | None = None, **values) -> str:
    """files/<name> rendered with values, and filters besides Jinja's own."""
    environment = Environment(
        loader=FileSystemLoader(str(FILES)),
        autoescape=select_autoescape(("html", "html.j2"), default_for_string=False, default=False),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters.update(filters or {})
    return environment.get_template(name).render(**values)
