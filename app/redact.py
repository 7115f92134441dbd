"""Strip file paths from text shown to clients (``/readyz`` details, error messages).

``redact(text, settings)`` replaces the data directory (as configured and resolved) by
``<data_dir>`` and any other absolute path of two or more components by ``<path>``. One
component (``/readyz``) and URLs (``http://host/a/b``) are left alone; a relative data
directory is replaced only where it starts a path (``data/photos/wal``)."""
from __future__ import annotations

import os
import re

DATA_DIR = "<data_dir>"
PATH = "<path>"
# an absolute path of >= 2 components, not inside a URL, a longer word ("a/b/c", "x://")
# or what follows <data_dir>
_ABSOLUTE = re.compile(r"(?<![\w.:/~>-])(?:/[\w.@+~-]+){2,}/?")
_BEFORE = r"(?<![\w.@+~/-])"  # a path starts here, not inside a longer name


def _data_dir_patterns(settings) -> list[re.Pattern]:
    data_dir = getattr(settings, "data_dir", None)
    if data_dir is None:
        return []
    given = str(data_dir)
    forms = {given, os.path.abspath(given), os.path.realpath(given)}
    patterns = []
    for form in sorted((f for f in forms if f not in ("", ".", "/")), key=len, reverse=True):
        if os.path.isabs(form):  # the whole directory or anything below it
            patterns.append(re.compile(_BEFORE + re.escape(form.rstrip("/")) + r"(?![\w.@+~-])"))
        else:  # "data" alone is a word: only where it starts a path
            patterns.append(re.compile(_BEFORE + re.escape(form.rstrip("/")) + r"(?=/)"))
    return patterns


def redact(text: str | None, settings) -> str | None:
    """``text`` without file paths (None stays None)."""
    if not text:
        return text
    for pattern in _data_dir_patterns(settings):
        text = pattern.sub(DATA_DIR, text)
    return _ABSOLUTE.sub(PATH, text)
