"""Issue 27 item 5: ``bucketsearch dedup`` on real files (every input format, every output),
against brute force; bad input is one line naming the flag and the value, exit status 2."""
from __future__ import annotations

import json

import numpy as np
import pytest

import naive
from bucketsearch.cli import main
from bucketsearch.index.codes import MAX_BITS, to_hex, to_packed, unpack_words

BITS = 64


@pytest.fixture(scope="module")
def words():
    rng = np.random.default_rng(5)
    w = rng.integers(0, 2**63, size=(300, 1), dtype=np.uint64)
    for i in range(0, 300, 3):  # near-duplicates: a copy of the previous item, 0-3 bits off
        w[i] = w[i - 1] ^ np.uint64(int(rng.integers(0, 8)) << int(rng.integers(0, 60)))
    return w


def _run(capsys, *argv):
    rc = main(["dedup", *map(str, argv), "--no-progress"])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("form", ["npy-bits", "npy-packed", "npy-words", "bin", "hex"])
def test_pairs_csv_from_every_input_format(tmp_path, capsys, words, form):
    path = tmp_path / {"bin": "codes.bin", "hex": "codes.txt"}.get(form, "codes.npy")
    if form == "npy-bits":
        np.save(path, unpack_words(words, BITS))
    elif form == "npy-packed":
        np.save(path, to_packed(words, BITS))
    elif form == "npy-words":
        np.save(path, words)
    elif form == "bin":
        to_packed(words, BITS).tofile(path)
    else:
        path.write_text("# codes\n" + "\n".join(to_hex(words, BITS)) + "\n")
    out = tmp_path / "pairs.csv"
    rc, _, err = _run(capsys, path, "--bits", BITS, "--radius", 3, "--output", "pairs",
                      "--out", out)
    assert rc == 0, err
    lines = out.read_text().splitlines()
    assert lines[0] == "a,b,distance"
    got = [tuple(int(x) for x in line.split(",")) for line in lines[1:]]
    assert got == naive.join_pairs(np.arange(len(words)), words, BITS, 3)
    assert "pairs" in err and not (tmp_path / "pairs.csv.partial").exists()


def test_ndjson_clusters_and_keep(tmp_path, capsys, words):
    src = tmp_path / "codes.npy"
    np.save(src, words)
    ids = np.arange(len(words))
    want = naive.join_pairs(ids, words, BITS, 2)
    rc, _, err = _run(capsys, src, "--bits", BITS, "--radius", 2, "--out", tmp_path / "p.ndjson")
    assert rc == 0, err
    rows = [json.loads(x) for x in (tmp_path / "p.ndjson").read_text().splitlines()]
    assert [(r["a"], r["b"], r["distance"]) for r in rows] == want
    rc, _, err = _run(capsys, src, "--bits", BITS, "--radius", 2, "--output", "clusters",
                      "--out", tmp_path / "c.csv")
    assert rc == 0, err
    lines = (tmp_path / "c.csv").read_text().splitlines()
    assert lines[0] == "id,label"
    got = np.array([[int(x) for x in line.split(",")] for line in lines[1:]])
    nids, nlabels = naive.components(ids, want)
    assert np.array_equal(got[:, 0], nids) and np.array_equal(got[:, 1], nlabels)
    rc, _, err = _run(capsys, src, "--bits", BITS, "--radius", 2, "--output", "keep",
                      "--out", tmp_path / "keep.txt")
    assert rc == 0, err
    kept = [int(x) for x in (tmp_path / "keep.txt").read_text().split()]
    assert kept == naive.keep_first(ids, want).tolist()
    assert len(kept) < len(words)


def test_pairs_to_stdout(tmp_path, capsys, words):
    src = tmp_path / "codes.npy"
    np.save(src, words[:30])
    rc, out, _ = _run(capsys, src, "--bits", BITS, "--radius", 64, "--out", "-")
    assert rc == 0
    assert len(out.splitlines()) == 1 + 30 * 29 // 2


@pytest.mark.parametrize("argv, flag", [
    (["--bits", "2000", "--radius", "3"], f"--bits must be an int in [1, {MAX_BITS}], got '2000'"),
    (["--bits", "x", "--radius", "3"], f"--bits must be an int in [1, {MAX_BITS}], got 'x'"),
    (["--bits", "64", "--radius", "65"], "--radius must be an int in [0, 64], got '65'"),
    (["--bits", "64", "--radius", "3", "--output", "groups"],
     "--output must be one of pairs, clusters, keep, got 'groups'"),
    (["--bits", "64", "--radius", "3", "--format", "csv"], "--format must be one of"),
    (["--bits", "64", "--radius", "3", "--chunk-size", "0"], "--chunk-size must be an int"),
    (["--bits", "64", "--radius", "3", "--format-out", "xml"], "--format-out must be one of"),
    (["--bits", "32", "--radius", "3"], "CODES"),  # 64-bit words given as 32-bit codes
])
def test_bad_input_is_one_line_naming_the_flag(tmp_path, capsys, words, argv, flag):
    src = tmp_path / "codes.npy"
    np.save(src, words)
    rc, out, err = _run(capsys, src, *argv, "--out", tmp_path / "out.csv")
    assert rc == 2
    assert flag in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out.csv").exists()


def test_unreadable_inputs_name_the_file(tmp_path, capsys):
    rc, _, err = _run(capsys, tmp_path / "missing.npy", "--bits", 64, "--radius", 1,
                      "--out", tmp_path / "o.csv")
    assert rc == 2 and "CODES" in err and "missing.npy" in err and "cannot read" in err
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01" * 13)
    rc, _, err = _run(capsys, odd, "--bits", 64, "--radius", 1, "--out", tmp_path / "o.csv")
    assert rc == 2 and "13 bytes" in err and "multiple of 8" in err
    bad = tmp_path / "bad.txt"
    bad.write_text("0123456789abcdef\nnot-hex-at-all!!\n")
    rc, _, err = _run(capsys, bad, "--bits", 64, "--radius", 1, "--out", tmp_path / "o.csv")
    assert rc == 2 and "line 2" in err
    rc, _, err = _run(capsys, bad, "--bits", 64, "--radius", 1, "--out",
                      tmp_path / "nowhere" / "o.csv")
    assert rc == 2 and "--out" in err and "does not exist" in err
