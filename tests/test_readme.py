"""Every fenced code block of README.md, run as a new user would run it (issue 18 acceptance).

The blocks run in README order against one real server (uvicorn in a subprocess, started
here), in one scratch working directory, so a block sees what the blocks above it made (the
index ``photos``, a backup file). Each block matches exactly one rule of :data:`RULES`, and
its test id names the rule (``pytest -v tests/test_readme.py`` lists every block and what was
done with it). A block that matches no rule fails: a new kind of block needs a rule here, never
a silent skip. The rules, in the order they are tried:

- ``answer``: a ``json`` block right after a shell block shows that block's last answer: its
  top-level keys must be those of the answer the block really got (shortened values, ``...``,
  are fine; a key added to or gone from the API is not).
- ``output``: a block tagged ``text`` or ``json``, or untagged and not starting with a command:
  output or a formula shown in the text, not run.
- ``make``: a shell block running ``make demo`` or ``make test``, rewritten to their
  equivalents: ``make demo`` is checked to run ``bucketsearch demo`` (``make -n demo``), then
  ``bucketsearch demo`` runs on 20,000 codes with 1 s runs (the same job, shorter;
  ``--keep-serving`` dropped so that it ends); ``make test`` is ``make -n test`` (the suite is
  not run from inside the suite; the dry run checks the target and its commands).
- ``stopped-server``: a shell block running ``bucketsearch repair`` (it needs the server
  stopped): the test's server is stopped, the block runs on its data directory, the server is
  started again.
- ``serve-only``: a shell block of ``bucketsearch serve`` commands only: each is checked
  against the serve command's parser; the test's server stands in for them (a second server or
  ``--workers`` is not started here: tests/test_follow.py and tests/test_prometheus_workers.py
  run those).
- ``shell``: any other ``bash``/``sh``/``shell``/``console`` block, run by bash with ``-e`` and
  ``pipefail``; a ``bucketsearch serve ...`` line is checked against the serve command's
  parser and replaced by the server this test started; ``curl`` fails on an HTTP error.
- ``python``: a ``python`` block, run by the project's interpreter.

In every block run, ``localhost:8000`` / ``127.0.0.1:8000`` (and ``("127.0.0.1", 8000)``)
become the test server's address, and the working directory holds the input files the
examples name (:data:`INPUT_FILES`).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, ServerProcess

pytestmark = pytest.mark.slow  # slow: make test-long

README = ROOT / "README.md"
BIN = Path(sys.executable).parent
SHELL_LANGS = ("bash", "sh", "shell", "console")
OUTPUT_LANGS = ("text", "json")
#: an untagged block starting with one of these is a command someone forgot to tag
COMMAND_WORDS = ("bucketsearch", "curl", "make", "python", "pip", "docker", "uvicorn", "git",
                 "$ ")
BLOCK_TIMEOUT_S = 600
#: ``make demo``'s equivalent here: the same job on fewer codes and shorter runs
DEMO_EQUIVALENT = "bucketsearch demo --n 20000 --duration 1 --out out/demo"
#: files the README's examples read, made in the working directory (bits and labels)
INPUT_FILES = ("db.npy", "q.npy", "l.npy", "m.npy")
CURL_WRAPPER = 'curl() { command curl --fail-with-body -sS "$@"; echo; }\n'


@dataclass
class Block:
    line: int  # 1-based line of the opening fence
    lang: str
    text: str

    def first_line(self) -> str:
        return next((ln.strip() for ln in self.text.splitlines() if ln.strip()), "")


def read_blocks(text: str) -> list[Block]:
    """The fenced blocks (```lang ... ```) of a Markdown text; an unclosed fence is an error."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^```\s*([\w+-]*)\s*$", lines[i])
        if m is None:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and not re.match(r"^```\s*$", lines[i]):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"README.md line {start + 1}: a code fence that is never closed")
        blocks.append(Block(start + 1, m.group(1).lower(), "\n".join(body) + "\n"))
        i += 1
    return blocks


# ------------------------------------------------------------------------- rules: which block
def is_output(block: Block) -> bool:
    return block.lang in OUTPUT_LANGS or (
        block.lang == "" and not block.first_line().startswith(COMMAND_WORDS))


def is_shell(block: Block) -> bool:
    return block.lang in SHELL_LANGS


def runs_make(block: Block) -> bool:
    return is_shell(block) and re.search(r"^\s*make\s+(demo|test)\b", block.text, re.M)


def runs_repair(block: Block) -> bool:
    return is_shell(block) and re.search(r"^\s*bucketsearch\s+repair\b", block.text, re.M)


SERVE_LINE = re.compile(r"^\s*([A-Z_][A-Z0-9_]*=\S*\s+)*bucketsearch\s+serve\b")


def only_serves(block: Block) -> bool:
    commands = [ln for ln in block.text.replace("\\\n", " ").splitlines()
                if ln.strip() and not ln.strip().startswith("#")]
    return is_shell(block) and bool(commands) and all(SERVE_LINE.match(c) for c in commands)


def shown_answer(block: Block) -> bool:
    """A ``json`` block right after a shell block: that block's answer, shown."""
    i = next((i for i, b in enumerate(BLOCKS) if b is block), 0)
    return block.lang == "json" and i > 0 and is_shell(BLOCKS[i - 1])


RULES = (  # (name, matches)
    ("answer", shown_answer),
    ("output", is_output),
    ("make", runs_make),
    ("stopped-server", runs_repair),
    ("serve-only", only_serves),
    ("shell", is_shell),
    ("python", lambda block: block.lang == "python"),
)


def rule_of(block: Block) -> str | None:
    return next((name for name, matches in RULES if matches(block)), None)


BLOCKS = read_blocks(README.read_text())


# ------------------------------------------------------------------------- rewriting
def with_address(text: str, port: int) -> str:
    """The README's server address (port 8000) -> the test server's."""
    text = re.sub(r"\b(localhost|127\.0\.0\.1):8000\b", rf"\g<1>:{port}", text)
    return re.sub(r"""(["']127\.0\.0\.1["'],\s*)8000\b""", rf"\g<1>{port}", text)


def serve_parser() -> argparse.ArgumentParser:
    from bucketsearch.app import cli
    parser = argparse.ArgumentParser(prog="bucketsearch serve", exit_on_error=False)
    cli.add_arguments(parser)
    return parser


def without_serve(text: str) -> str:
    """Drop each ``bucketsearch serve ...`` command (the test's server stands in for it) after
    checking its flags with the serve command's own parser."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():  # continuation lines joined
        if not re.search(r"\bbucketsearch\s+serve\b", line):
            out.append(line)
            continue
        words = shlex.split(line, comments=True)
        while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # VAR=value prefixes
            words.pop(0)
        if words[:2] == ["bucketsearch", "serve"]:
            try:
                serve_parser().parse_args(words[2:])
            except (argparse.ArgumentError, SystemExit) as exc:
                raise AssertionError(f"README: {line.strip()!r} is not a valid serve "
                                     f"command: {exc}") from None
            out.append(f"# (the test's server stands in for) {line.strip()}")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def console_commands(block: Block, text: str) -> str:
    """A ``console`` block's commands: its ``$ `` lines without the prompt (and the lines that
    continue them); the other lines are output."""
    if block.lang != "console":
        return text
    out, continued = [], False
    for line in text.splitlines():
        if line.startswith("$ ") or continued:
            out.append(line[2:] if line.startswith("$ ") and not continued else line)
            continued = line.endswith("\\")
    return "\n".join(out) + "\n"


def make_equivalents(text: str) -> str:
    """``make demo`` -> a check that the target runs ``bucketsearch demo`` (``make -n``; a line
    of its own, so that ``-e`` stops the block when it fails), then :data:`DEMO_EQUIVALENT`;
    ``make test`` -> ``make -n test``."""
    make_n = f"make -n -C {shlex.quote(str(ROOT))}"
    check = f"{make_n} demo | grep 'bucketsearch demo' >/dev/null"
    text = re.sub(r"^(\s*)make\s+demo\b", rf"\g<1>{check}\n\g<1>{DEMO_EQUIVALENT}", text,
                  flags=re.M)
    return re.sub(r"^(\s*)make\s+test\b", rf"\g<1>{make_n} test", text, flags=re.M)


# ------------------------------------------------------------------------- running
def run(argv: list[str], workdir: Path, block: Block) -> str:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "COLUMNS": "120"}
    out = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True,
                         timeout=BLOCK_TIMEOUT_S)
    assert out.returncode == 0, (f"README.md line {block.line} ({block.lang}) failed with exit "
                                 f"code {out.returncode}:\n--- block as run ---\n{argv[-1]}\n"
                                 f"--- stdout ---\n{out.stdout[-4000:]}\n--- stderr ---\n"
                                 f"{out.stderr[-4000:]}")
    return out.stdout


def run_shell(script: str, workdir: Path, block: Block) -> str:
    return run(["bash", "-e", "-o", "pipefail", "-c", CURL_WRAPPER + script], workdir, block)


def top_level_keys(text: str) -> set[str]:
    """The keys of the outermost object of a JSON text, read without parsing it (the README
    shortens values with ``...``)."""
    keys, depth = set(), 0
    for m in re.finditer(r'"(?:[^"\\]|\\.)*"\s*:?|[{}\[\]]', text):
        token = m.group(0)
        if token in "{[":
            depth += 1
        elif token in "}]":
            depth -= 1
        elif token.endswith(":") and depth == 1:
            keys.add(token.rstrip(": ").strip('"'))
    return keys


def write_inputs(workdir: Path) -> None:
    """The files the examples read: 64-bit codes of 2,000 database items and 100 queries in
    10 classes, and their class labels."""
    rng = np.random.default_rng(18)
    centers = rng.integers(0, 2, size=(10, 64), dtype=np.uint8)
    lb, lq = rng.integers(0, 10, 2000), rng.integers(0, 10, 100)
    flip = lambda labels: (rng.random((len(labels), 64)) < 0.1).astype(np.uint8)  # noqa: E731
    np.save(workdir / "db.npy", centers[lb] ^ flip(lb))
    np.save(workdir / "q.npy", centers[lq] ^ flip(lq))
    np.save(workdir / "l.npy", lb)
    np.save(workdir / "m.npy", lq)


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """One server and one working directory for every block, in README order."""
    root = tmp_path_factory.mktemp("readme")
    workdir = root / "work"
    workdir.mkdir()
    write_inputs(workdir)
    # no warm-up: the blocks' first requests compile what they use (faster than compiling all)
    server = ServerProcess(root / "data", {"BUCKETSEARCH_WARMUP": "0"}).start(timeout=300)
    yield server, workdir, {}
    server.stop()


def test_every_block_matches_a_rule():
    unmatched = [f"line {b.line}: ```{b.lang} {b.first_line()[:60]!r}" for b in BLOCKS
                 if rule_of(b) is None]
    assert not unmatched, ("README blocks no rule of tests/test_readme.py covers (add a rule; "
                           "never skip silently):\n" + "\n".join(unmatched))
    assert len(BLOCKS) >= 5 and sum(rule_of(b) != "output" for b in BLOCKS) >= 4


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("block", BLOCKS,
                         ids=[f"L{b.line}-{b.lang or 'plain'}-{rule_of(b)}" for b in BLOCKS])
def test_readme_block(block, session):
    server, workdir, answers = session
    rule = rule_of(block)
    assert rule is not None, (f"README.md line {block.line}: ```{block.lang} block matches no "
                              "rule of tests/test_readme.py")
    if rule == "answer":
        previous = BLOCKS[BLOCKS.index(block) - 1]
        assert previous.line in answers, f"the block above line {block.line} did not run"
        real = json.loads(answers[previous.line].strip().splitlines()[-1])
        assert top_level_keys(block.text) == set(real), (
            f"README.md line {block.line} shows an answer with the keys "
            f"{sorted(top_level_keys(block.text))}; the server answered {sorted(real)}")
        return
    if rule == "output":
        if block.lang == "":
            assert not block.first_line().startswith(COMMAND_WORDS)
        return
    text = console_commands(block, with_address(block.text, server.port))
    if rule == "python":
        run([sys.executable, "-c", text], workdir, block)
    elif rule == "make":
        run_shell(make_equivalents(without_serve(text)), workdir, block)
    elif rule == "stopped-server":
        server.stop()
        try:
            script = re.sub(r"--data-dir\s+\S+", f"--data-dir {shlex.quote(str(server.data_dir))}",
                            without_serve(text))
            run_shell(script, workdir, block)
        finally:
            server.start(timeout=300)
    elif rule == "serve-only":
        assert without_serve(text).count("# (the test's server stands in for)") >= 1
    else:
        answers[block.line] = run_shell(without_serve(text), workdir, block)


# ------------------------------------------------------------------------- the rules' own tests
def test_the_rules_on_made_up_blocks():
    md = ("```bash\nmake demo\n```\n```\n4. load test\n```\n```\ncurl x\n```\n"
          "```yaml\na: 1\n```\n```bash\nbucketsearch repair --data-dir data --index p\n```\n")
    md += "```sh\n# a writer\nX=1 bucketsearch serve --port 1 \\\n  --workers 2\n```\n"
    rules = [rule_of(b) for b in read_blocks(md)]
    assert rules == ["make", "output", None, None, "stopped-server", "serve-only"]
    with pytest.raises(ValueError, match="line 1"):
        read_blocks("```bash\necho open\n")


def test_top_level_keys_of_a_shortened_answer():
    text = '{"a":[{"b":1}, ...],"c":{"d":"x:\\"y"},\n"e":null}'
    assert top_level_keys(text) == {"a", "c", "e"}


def test_rewrites():
    assert with_address("curl localhost:8000/x http://127.0.0.1:8000/y", 1234) == \
        "curl localhost:1234/x http://127.0.0.1:1234/y"
    assert with_address('HTTPConnection("127.0.0.1", 8000)', 99) == \
        'HTTPConnection("127.0.0.1", 99)'
    assert with_address("localhost:80001", 5) == "localhost:80001"
    assert without_serve("K=v bucketsearch serve --data-dir d --port 8000\necho hi\n") \
        .splitlines()[1] == "echo hi"
    with pytest.raises(AssertionError, match="not a valid serve command"):
        without_serve("bucketsearch serve --no-such-flag\n")
    check, demo_line, test_line = make_equivalents("make demo   # c\nmake test\n").splitlines()
    assert check.endswith("demo | grep 'bucketsearch demo' >/dev/null")
    assert demo_line == f"{DEMO_EQUIVALENT}   # c"
    assert test_line.startswith("make -n -C ") and test_line.endswith(" test")
    console = Block(1, "console", "")
    assert console_commands(console, "$ echo a \\\n  b\na b\n$ ls\nx\n") == \
        "echo a \\\n  b\nls\n"
