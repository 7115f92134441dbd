"""Saved reproductions of bugs found by earlier sessions, replayed.

Each file of ``tests/data/repro/`` is one bug: what it reproduces, who found it, the commit
that fixed it, and the steps, as data. Two levels:

* ``"level": "live"``: operations on a :class:`LiveIndex` (``add``, ``delete``, ``merge``,
  ``reopen`` = close and open the folder again, ``knn`` with the expected answer, ``check``),
  in each of ``modes``. An operation may run under an injected storage fault (``fault``: a
  :class:`FaultPlan`, errno by name) and name the exception it must raise (``raises``); a
  raising operation leaves the model unchanged (an error means absent). ``state`` checks
  attributes of the index after the step. ``check`` compares range search at ``radius`` and
  k-NN for each ``k`` with brute force over the model (``tests/naive.py``), ordered by
  (distance, id).
* ``"level": "http"``: requests to the app in process (``helpers.app_client`` with the file's
  ``settings``): ``request`` = [method, path, JSON body?] with an optional bearer ``key``, then
  the expected ``status``, a ``json`` the answer must contain (dicts: these keys, recursively;
  lists: element by element, same length) and a text it ``contains``; ``stop`` / ``start`` /
  ``restart`` the app on the same data directory; ``damage`` flips bytes of a file (``glob``
  under the data directory, ``pick`` its index in sorted order, ``offset`` from the start or,
  negative, from the end, ``xor`` mask) while the app is stopped.

A new bug found: add its file here, not a new test function."""
from __future__ import annotations

import errno
import json
from contextlib import ExitStack
from pathlib import Path

import naive
import numpy as np
import pytest
from helpers import app_client

from bucketsearch.index.codes import pack_hex
from bucketsearch.index.storage import fsio, live, wal
from bucketsearch.index.storage.fsio import FaultPlan
from bucketsearch.index.storage.live import LiveIndex

REPRO_DIR = Path(__file__).parent / "data" / "repro"
FILES = sorted(REPRO_DIR.glob("*.json"))
LEVELS = ("live", "http")
#: Exceptions a step may name in ``raises``.
ERRORS = {name: getattr(module, name) for module in (live, wal)
          for name in dir(module) if name.endswith(("Error", "Failed"))} | {
    "OSError": OSError, "ValueError": ValueError}
LIVE_OPTIONS = dict(background_merge=False, merge_threshold=10**6)


def load(path: Path) -> dict:
    case = json.loads(path.read_text())
    for field in ("title", "reproduces", "found_by", "fixed_in", "level", "steps"):
        assert case.get(field), f"{path.name}: field {field!r} is missing or empty"
    assert case["level"] in LEVELS, f"{path.name}: level {case['level']!r} not in {LEVELS}"
    return case


def cases(level: str) -> list:
    return [pytest.param(path, mode, id=f"{path.stem}-{mode}" if mode else path.stem)
            for path in FILES if load(path)["level"] == level
            for mode in (load(path).get("modes") or [None])]


def test_every_reproduction_is_replayed():
    assert len(FILES) >= 6, FILES
    assert {load(path)["level"] for path in FILES} == set(LEVELS)


# ----------------------------------------------------------------------------- live level
class Model:
    """The acknowledged state: id -> packed code row."""

    def __init__(self, bits: int):
        self.bits, self.rows = bits, {}

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        ids = np.array(sorted(self.rows), dtype=np.int64)
        words = np.array([self.rows[i] for i in ids], dtype=np.uint64).reshape(
            len(ids), -1 if len(ids) else (self.bits + 63) // 64)
        return words, ids


def fault_plan(spec: dict) -> FaultPlan:
    return FaultPlan(**{**spec, "ops": tuple(spec.get("ops", ())),
                        "errno": getattr(errno, spec.get("errno", "ENOSPC"))})


def check_against_brute_force(index: LiveIndex, model: Model, step: dict) -> None:
    xq = pack_hex(step["queries"], model.bits)
    xb, ids = model.arrays()
    lims, D, I, _ = index.range_search(xq, step["radius"])
    want = naive.range_search(xq, xb, ids, model.bits, step["radius"])
    for got, expected, what in zip((lims, D, I), want, ("lims", "distances", "ids")):
        assert np.asarray(got).tolist() == expected.tolist(), f"range search {what}"
    for k in step["k"]:
        D, I, _ = index.search(xq, k)
        want_D, want_I = naive.knn(xq, xb, ids, model.bits, k)
        assert np.asarray(I).tolist() == want_I.tolist(), f"k-NN ids, k={k}"
        assert np.asarray(D).tolist() == want_D.tolist(), f"k-NN distances, k={k}"


def live_step(index: LiveIndex, model: Model, step: dict, open_index) -> LiveIndex:
    """Run one step; returns the index (a new object after ``reopen``)."""
    op = step["op"]
    if op == "add":
        words = pack_hex(step["codes"], model.bits)
        index.add(words, np.array(step["ids"], dtype=np.int64))
        model.rows.update({i: tuple(int(w) for w in row) for i, row in zip(step["ids"], words)})
    elif op == "delete":
        deleted = index.delete(np.array(step["ids"], dtype=np.int64))
        if "deleted" in step:
            assert deleted == step["deleted"]
        for i in step["ids"]:
            model.rows.pop(i, None)
    elif op == "merge":
        index.merge()
    elif op == "reopen":
        index.close()
        index = open_index()
    elif op == "knn":
        D, I, _ = index.search(pack_hex(step["queries"], model.bits), step["k"])
        assert np.asarray(I).tolist() == step["ids"]
        assert np.asarray(D).tolist() == step["distances"]
    elif op == "check":
        check_against_brute_force(index, model, step)
    else:
        raise ValueError(f"op {op!r} is not one of add, delete, merge, reopen, knn, check")
    return index


@pytest.mark.parametrize("path, mode", cases("live"))
def test_live_reproduction(path, mode, tmp_path):
    case = load(path)
    model = Model(case["bits"])

    def open_index() -> LiveIndex:
        return LiveIndex(tmp_path / "index", case["bits"], mode, **LIVE_OPTIONS)

    index = open_index()
    try:
        for number, step in enumerate(case["steps"]):
            where = f"{path.name} step {number} {step}"
            with ExitStack() as stack:
                if "fault" in step:
                    stack.enter_context(fsio.inject(fault_plan(step["fault"])))
                if "raises" in step:
                    stack.enter_context(pytest.raises(ERRORS[step["raises"]]))
                    before = dict(model.rows)
                index = live_step(index, model, step, open_index)
            if "raises" in step:
                model.rows = before  # an error means absent
            for name, value in step.get("state", {}).items():
                got = getattr(index, name)
                assert (bool(got) if isinstance(value, bool) else got) == value, \
                    f"{where}: {name} is {got!r}, want {value!r}"
    finally:
        index.close()


# ----------------------------------------------------------------------------- HTTP level
def contains(got, want, where: str = "") -> None:
    """``got`` holds ``want``: dict keys recursively, lists element by element."""
    if isinstance(want, dict):
        assert isinstance(got, dict), f"{where}: {got!r} is not an object"
        for key, value in want.items():
            assert key in got, f"{where}: no key {key!r} in {got!r}"
            contains(got[key], value, f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: {got!r} != {want!r}"
        for n, (g, w) in enumerate(zip(got, want)):
            contains(g, w, f"{where}[{n}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def damage(data_dir: Path, spec: dict) -> None:
    files = sorted(data_dir.glob(spec["glob"]))
    assert files, f"no file matches {spec['glob']!r}"
    victim = files[spec.get("pick", 0)]
    raw = bytearray(victim.read_bytes())
    raw[spec["offset"]] ^= spec["xor"]
    victim.write_bytes(bytes(raw))


@pytest.mark.parametrize("path, mode", cases("http"))
def test_http_reproduction(path, mode, tmp_path):
    case = load(path)
    data_dir = tmp_path / "data"
    with ExitStack() as running:
        def start():
            return running.enter_context(app_client(data_dir, **case.get("settings", {})))

        client = start()
        for number, step in enumerate(case["steps"]):
            where = f"{path.name} step {number}"
            if step.get("stop") or step.get("restart"):
                running.close()
                client = None
            if step.get("start") or step.get("restart"):
                client = start()
            if "damage" in step:
                assert client is None, f"{where}: damage needs the app stopped first"
                damage(data_dir, step["damage"])
            if "request" in step:
                method, url, *body = step["request"]
                headers = {"Authorization": f"Bearer {step['key']}"} if "key" in step else {}
                r = client.request(method, url, json=body[0] if body else None, headers=headers)
                assert r.status_code == step["status"], f"{where}: {r.status_code} {r.text}"
                if "json" in step:
                    contains(r.json(), step["json"], where)
                if "contains" in step:
                    assert step["contains"] in r.text, f"{where}: {r.text}"
