"""Another checkout's sources importable as package ``oldbs`` beside ``bucketsearch``: its
files with ``bucketsearch.`` rewritten to ``oldbs.``, so two engines run side by side in one
process (bench/bench_ab.py, bench/bench_small_radii.py ``--base``)."""
import importlib.abc
import importlib.util
import os
import sys


class _Rewriter(importlib.abc.SourceLoader):
    def __init__(self, path):
        self.path = path

    def get_filename(self, fullname):
        return self.path

    def get_data(self, path):
        with open(path, "rb") as f:
            return f.read().replace(b"bucketsearch.", b"oldbs.")


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, base: str):
        self.map = {"oldbs": f"{base}/bucketsearch", "oldbs.index": f"{base}/index",
                    "oldbs.app": f"{base}/app", "oldbs.loadtest": f"{base}/loadtest"}

    def find_spec(self, name, path=None, target=None):
        if name != "oldbs" and not name.startswith("oldbs."):
            return None
        parts = name.split(".")
        for n in range(len(parts), 0, -1):
            head = ".".join(parts[:n])
            if head in self.map:
                base = os.path.join(self.map[head], *parts[n:])
                break
        else:
            return None
        if os.path.isdir(base):
            file = os.path.join(base, "__init__.py")
            return importlib.util.spec_from_file_location(
                name, file, loader=_Rewriter(file), submodule_search_locations=[base])
        if os.path.exists(base + ".py"):
            return importlib.util.spec_from_file_location(name, base + ".py",
                                                          loader=_Rewriter(base + ".py"))
        return None


def install(base: str) -> None:
    """Make ``import oldbs...`` load from the checkout at ``base`` (no .pyc written)."""
    sys.dont_write_bytecode = True
    sys.meta_path.insert(0, _Finder(base))
