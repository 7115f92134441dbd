"""A Jepsen-style history test of the real server: concurrent clients insert, delete, re-insert
and search ids of a small shared id space while the server is SIGKILLed and restarted several
times; the recorded history is then checked against a model.

The run. ``THREADS`` client threads (httpx, one request per operation, batches of one id) pick
ids from ``0..ID_SPACE-1`` so that re-inserts (409) and deletes of absent ids happen all the
time. Every insert carries a fresh random 64-bit code, so a code names one insert operation.
Operations: ``insert(id, code)``, ``delete(id)``, a radius-0 search on a code of an id (its
latest or an older one, also codes whose insert failed), and a k-NN search (k=5). Each records
its invocation and completion times (client monotonic clock), the server incarnation it went to,
and its outcome:

* ``ok``: 200 (``deleted`` 0/1 of a delete is kept: it says whether the id was live);
* ``conflict``: 409 "already exists": the insert had no effect and the id was live;
* ``fail``: nothing reached the index: connection refused, 503 (not ready, or a storage error
  where "nothing was acknowledged");
* ``info`` (indeterminate): the connection died after the request was sent, or a 500. The
  operation may or may not have taken effect, but only before the incarnation it went to was
  killed: its window is [invocation, death of that process].

Meanwhile a killer thread SIGKILLs the server ``KILLS`` times and restarts it on the same data
directory (``BUCKETSEARCH_MERGE_THRESHOLD=40``, so background merges, snapshots and WAL
rotations run throughout). At the end the clients stop, the server is killed and restarted once
more, and the final state is read: every id's code by radius-0 searches over every code ever
sent for it, cross-checked against a k-NN dump of the whole index and its size.

The checker.

* Per id (linearizability is local, and every write touches one id): the id is a register
  ``absent | present(code)``; inserts, deletes (with their ``deleted`` answer), 409s, radius-0
  reads and the final state must have a linearization that respects real time (the
  Wing-Gong-Lowe search; ``info`` operations may be placed in their window or left out,
  ``fail`` operations are left out, so a failed write that took effect is caught).
* k-NN reads touch many ids: every returned (id, distance) must belong to an insert that may be
  live during the search (not failed, invoked before the search completed, not removed by an
  acknowledged delete that completed before the search began), ids are unique and ordered by
  (distance, id), and every id that was surely live with its code throughout the search (an
  acknowledged insert completed before, no delete that could interleave) and ranks before the
  last result must be there.
* Any status outside the model (500, 404, 400, ...) is a violation too.

Figures (operations, acknowledged writes, indeterminate, failed, 409 conflicts, kills,
merges, reads checked = searches, write answers checked = delete counts and 409s, violations)
are printed as one ``history:`` line (``pytest -s`` shows it), attached to the test report with
``record_property``, and written as JSON to ``$BUCKETSEARCH_HISTORY_REPORT`` when set.

The default run lasts 40 s of client time, restarts included (about a minute in all).
``BUCKETSEARCH_HISTORY_SECONDS=600`` (for example) runs longer, with one kill per ~12 s (at
least 3); ``BUCKETSEARCH_HISTORY_SEED`` fixes the clients' random choices (kill times and the
threads' interleaving still vary).
"""
from __future__ import annotations

import bisect
import json
import os
import random
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import httpx
import pytest

pytestmark = pytest.mark.slow  # slow: make test-long

BITS = 64
ID_SPACE = 200
THREADS = 4
K = 5
SECONDS = float(os.environ.get("BUCKETSEARCH_HISTORY_SECONDS", "40"))
KILLS = max(3, int(SECONDS // 12))
SEED = int(os.environ.get("BUCKETSEARCH_HISTORY_SEED", str(random.randrange(1 << 30))))
NAME = "hist"
ENV = dict(BUCKETSEARCH_MERGE_THRESHOLD=40)
# operation mix: cumulative probabilities
P_INSERT, P_DELETE, P_READ = 0.35, 0.55, 0.90  # the rest: k-NN
INF = float("inf")
MAX_SEARCH_STATES = 2_000_000  # per id; beyond that the checker gives up (reported)


def hexcode(code: int) -> str:
    return f"{code:016x}"


def distance(a: int, b: int) -> int:
    """Hamming distance; independent of the server's bit order (a permutation of bits)."""
    return (a ^ b).bit_count()


@dataclass
class Op:
    process: int
    kind: str  # insert | delete | read | knn
    id: int | None  # None for k-NN
    code: int  # inserted code, or query code of a read
    epoch: int  # the server incarnation the request went to
    invoke: float
    complete: float = INF
    outcome: str = "pending"  # ok | conflict | fail | info
    status: int | None = None
    deleted: int | None = None
    hits: list = field(default_factory=list)  # reads: [(id, distance), ...] in answer order
    detail: str = ""

    def describe(self) -> str:
        what = {"insert": f"insert({self.id}, {hexcode(self.code)})",
                "delete": f"delete({self.id})",
                "read": f"read({self.id}, {hexcode(self.code)}, r=0)",
                "knn": f"knn({hexcode(self.code)}, k={K})"}[self.kind]
        res = self.outcome + (f" deleted={self.deleted}" if self.deleted is not None else "") \
            + (f" hits={self.hits}" if self.kind in ("read", "knn") and self.outcome == "ok"
               else "") + (f" status={self.status}" if self.status else "") \
            + (f" {self.detail[:120]}" if self.detail else "")
        return (f"p{self.process} e{self.epoch} [{self.invoke:.4f}, {self.complete:.4f}] "
                f"{what} -> {res}")


class Cluster:
    """The one server of the run, its restarts, and the incarnation clients should talk to."""

    def __init__(self, server):
        self.server = server
        self.lock = threading.Lock()
        self.epoch = 0
        self.live_url: str | None = server.url
        self.death: dict[int, float] = {}  # epoch -> monotonic time its process was dead
        self.merges = 0  # merges reported by each incarnation just before its kill

    def target(self):
        with self.lock:
            return None if self.live_url is None else (self.epoch, self.live_url)

    def kill_and_restart(self) -> None:
        try:
            with httpx.Client(timeout=5) as c:
                self.merges += c.get(f"{self.server.url}/v1/indexes/{NAME}").json()["merges"]
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        with self.lock:
            self.live_url = None
            self.server.kill()
            self.death[self.epoch] = time.monotonic()
            self.epoch += 1
        self.server.launch()
        with self.lock:  # requests while it loads must fail cleanly (503 / refused)
            self.live_url = self.server.url
        self.server.wait_ready()


class Recorder:
    def __init__(self):
        self.codes: dict[int, list[int]] = defaultdict(list)  # every code sent for an id
        self.ops: list[Op] = []
        self.lock = threading.Lock()

    def add(self, op: Op) -> None:
        with self.lock:
            self.ops.append(op)


def run_client(process: int, cluster: Cluster, rec: Recorder, stop: threading.Event,
               seed: int) -> None:
    rng = random.Random(seed)
    with httpx.Client(timeout=30.0) as http:
        while not stop.is_set():
            target = cluster.target()
            if target is None:
                time.sleep(0.01)
                continue
            epoch, url = target
            x = rng.random()
            ident = rng.randrange(ID_SPACE)
            if x < P_INSERT:
                code = rng.getrandbits(BITS)
                with rec.lock:
                    rec.codes[ident].append(code)
                op = Op(process, "insert", ident, code, epoch, 0.0)
                path, body = "items", {"ids": [ident], "codes": [hexcode(code)]}
            elif x < P_DELETE:
                op = Op(process, "delete", ident, 0, epoch, 0.0)
                path, body = "items/delete", {"ids": [ident]}
            elif x < P_READ:
                with rec.lock:
                    sent = list(rec.codes[ident])
                if not sent:
                    code = rng.getrandbits(BITS)
                elif rng.random() < 0.8:
                    code = sent[-1]
                else:
                    code = rng.choice(sent)
                op = Op(process, "read", ident, code, epoch, 0.0)
                path, body = "search", {"codes": [hexcode(code)], "max_distance": 0}
            else:
                with rec.lock:
                    sent = list(rec.codes[ident])
                code = sent[-1] if sent and rng.random() < 0.5 else rng.getrandbits(BITS)
                op = Op(process, "knn", None, code, epoch, 0.0)
                path, body = "search", {"codes": [hexcode(code)], "k": K}
            op.invoke = time.monotonic()
            try:
                r = http.post(f"{url}/v1/indexes/{NAME}/{path}", json=body)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                op.complete, op.outcome, op.detail = time.monotonic(), "fail", type(exc).__name__
                rec.add(op)
                time.sleep(0.1)
                continue
            except httpx.TransportError as exc:  # sent, answer lost: may or may not have run
                op.complete, op.outcome, op.detail = time.monotonic(), "info", type(exc).__name__
                rec.add(op)
                continue
            op.complete, op.status = time.monotonic(), r.status_code
            classify(op, r)
            rec.add(op)
            if r.status_code == 503:
                time.sleep(0.1)


def classify(op: Op, r: httpx.Response) -> None:
    if r.status_code == 200:
        op.outcome = "ok"
        data = r.json()
        if op.kind == "delete":
            op.deleted = data["deleted"]
        elif op.kind in ("read", "knn"):
            res = data["results"][0]
            op.hits = list(zip(res["ids"], res["distances"]))
        return
    try:
        op.detail = str(r.json().get("detail"))
    except ValueError:
        op.detail = r.text[:200]
    if r.status_code == 409 and op.kind == "insert" and "already exists" in op.detail:
        op.outcome = "conflict"
    elif r.status_code == 503:
        op.outcome = "fail"  # not ready, or a storage error: nothing was acknowledged
    else:  # outside the model: 500, 404 (an index lost), 400 (a bug here), ...
        op.outcome = "info"
        op.detail = f"UNEXPECTED {r.status_code}: {op.detail}"


def run_killer(cluster: Cluster, stop: threading.Event, t_end: float, kills: int,
               rng: random.Random, errors: list) -> None:
    try:
        for i in range(kills):
            remaining = t_end - time.monotonic()
            wait = remaining / (kills - i + 0.5) * rng.uniform(0.6, 1.4)
            if stop.wait(max(wait, 0.2)):
                return
            cluster.kill_and_restart()
    except Exception as exc:  # a restart that fails ends the run; the test reports it
        errors.append(exc)


# ---------------------------------------------------------------------------------- checker
@dataclass(frozen=True)
class Event:
    """One operation of one id's register, ready for the linearizability search."""

    invoke: float
    end: float  # latest time it can take effect
    kind: str  # ins | conflict | del1 | del0 | del? | read | final
    code: int | None
    present: bool | None  # read: was the id returned for ``code``
    optional: bool  # info operations may also be left out
    op: Op | None


ABSENT = None
INVALID = object()


def step(state, ev: Event):
    k = ev.kind
    if k == "ins":
        return ev.code if state is ABSENT else INVALID
    if k == "conflict":
        return state if state is not ABSENT else INVALID
    if k == "del1":
        return ABSENT if state is not ABSENT else INVALID
    if k == "del0":
        return ABSENT if state is ABSENT else INVALID
    if k == "del?":
        return ABSENT
    if k == "read":
        return state if (state == ev.code) == ev.present else INVALID
    if k == "final":
        return state if state == ev.code else INVALID
    raise ValueError(k)


def linearizable(events: list[Event]) -> bool | None:
    """Wing & Gong's search with Lowe's memo of (linearized set, state): True, False, or None
    when it gave up after MAX_SEARCH_STATES states."""
    events = sorted(events, key=lambda e: e.invoke)
    n = len(events)
    full = (1 << n) - 1
    stack = [(0, ABSENT)]
    seen = set()
    while stack:
        mask, state = stack.pop()
        if mask == full:
            return True
        if (mask, state) in seen:
            continue
        seen.add((mask, state))
        if len(seen) > MAX_SEARCH_STATES:
            return None
        pending = [i for i in range(n) if not mask >> i & 1]
        horizon = min(events[i].end for i in pending)
        for i in pending:
            ev = events[i]
            if ev.invoke > horizon:
                break
            if ev.optional:
                stack.append((mask | 1 << i, state))
            new = step(state, ev)
            if new is not INVALID:
                stack.append((mask | 1 << i, new))
    return False


def finish_time(op: Op, death: dict[int, float]) -> float:
    """Latest moment ``op`` could have taken effect."""
    return op.complete if op.outcome == "ok" or op.outcome == "conflict" else death[op.epoch]


def id_events(ops: list[Op], death: dict[int, float], t_final: float,
              final_code) -> list[Event]:
    events = []
    for op in ops:
        if op.outcome == "fail":
            continue
        if op.outcome == "info":
            if op.kind == "read":
                continue
            end = death[op.epoch]
            if end < op.invoke:  # sent to a process that was already dead
                continue
            kind = "ins" if op.kind == "insert" else "del?"
            events.append(Event(op.invoke, end, kind, op.code, None, True, op))
        elif op.kind == "insert":
            kind = "ins" if op.outcome == "ok" else "conflict"
            events.append(Event(op.invoke, op.complete, kind, op.code, None, False, op))
        elif op.kind == "delete":
            events.append(Event(op.invoke, op.complete, f"del{op.deleted}", None, None, False,
                                op))
        elif op.kind == "read":
            present = any(i == op.id for i, _ in op.hits)
            events.append(Event(op.invoke, op.complete, "read", op.code, present, False, op))
    events.append(Event(t_final, INF, "final", final_code, None, False, None))
    return events


def check_knn_hits(read: Op, per_id: dict[int, list[Op]], death: dict[int, float]) -> list[str]:
    """Soundness of every (id, distance) a search returned, and the order of the answer."""
    problems = []
    ids = [i for i, _ in read.hits]
    if len(set(ids)) != len(ids):
        problems.append(f"duplicate ids in the answer: {read.describe()}")
    if [(d, i) for i, d in read.hits] != sorted((d, i) for i, d in read.hits):
        problems.append(f"answer not ordered by (distance, id): {read.describe()}")
    for ident, dist in read.hits:
        candidates = [op for op in per_id.get(ident, []) if op.kind == "insert"
                      and distance(op.code, read.code) == dist]
        if not any(possibly_live(ins, read, per_id[ident], death) for ins in candidates):
            problems.append(f"returned id {ident} at distance {dist}, but no insert of it with "
                            f"such a code could be live then: {read.describe()}; inserts: "
                            + "; ".join(o.describe() for o in candidates[:5]))
    return problems


def possibly_live(ins: Op, read: Op, ops: list[Op], death: dict[int, float]) -> bool:
    if ins.outcome in ("fail", "conflict") or ins.invoke > read.complete:
        return False
    if ins.outcome == "info" and death[ins.epoch] < ins.invoke:
        return False
    fin = finish_time(ins, death)
    return not any(d.kind == "delete" and d.outcome == "ok" and d.invoke > fin
                   and d.complete < read.invoke for d in ops)


def surely_live(ins: Op, read: Op, ops: list[Op], death: dict[int, float]) -> bool:
    if ins.outcome != "ok" or ins.complete > read.invoke:
        return False
    for d in ops:
        if d.kind != "delete" or d.outcome == "fail" or d.invoke > read.complete:
            continue
        if d.outcome == "info" and death[d.epoch] < d.invoke:
            continue
        if finish_time(d, death) > ins.invoke:
            return False
    return True


def check_knn_complete(read: Op, acked: dict[int, tuple[list[float], list[Op]]],
                       per_id: dict[int, list[Op]], death: dict[int, float]) -> list[str]:
    """Every surely-live item ranking before the last answer (or any, if fewer than k came
    back) must be in the answer. Per id only its last acknowledged insert completed before the
    search can be surely live (an earlier one was deleted before the later one succeeded)."""
    got = {i for i, _ in read.hits}
    last = max((d, i) for i, d in read.hits) if len(read.hits) >= K else None
    problems = []
    for ident, (completes, inserts) in acked.items():
        pos = bisect.bisect_left(completes, read.invoke)
        if ident in got or pos == 0:
            continue
        ins = inserts[pos - 1]
        rank = (distance(ins.code, read.code), ident)
        if (last is None or rank < last) and surely_live(ins, read, per_id[ident], death):
            problems.append(f"missing id {ident} at distance {rank[0]} (surely live: "
                            f"{ins.describe()}): {read.describe()}")
    return problems


def read_final_state(server, rec: Recorder) -> tuple[dict[int, int], list[str]]:
    """``{id: code}`` of the recovered index, from radius-0 searches over every code ever
    sent, cross-checked against a k-NN dump of the whole index and its size."""
    problems = []
    pairs = [(i, c) for i, codes in rec.codes.items() for c in codes]
    found: dict[int, list[int]] = defaultdict(list)
    with server.client() as c:
        for a in range(0, len(pairs), 2000):
            chunk = pairs[a:a + 2000]
            r = c.post(f"/v1/indexes/{NAME}/search",
                       json={"codes": [hexcode(code) for _, code in chunk], "max_distance": 0})
            assert r.status_code == 200, r.text
            for (ident, code), res in zip(chunk, r.json()["results"]):
                for hit in res["ids"]:
                    if hit == ident:
                        found[ident].append(code)
                    else:
                        problems.append(f"final: code {hexcode(code)} sent for id {ident} "
                                        f"returns id {hit}")
        zero = 0
        r = c.post(f"/v1/indexes/{NAME}/search", json={"codes": [hexcode(zero)], "k": 1000})
        assert r.status_code == 200, r.text
        res = r.json()["results"][0]
        dump = dict(zip(res["ids"], res["distances"]))
        size = c.get(f"/v1/indexes/{NAME}").json()["size"]
    final = {}
    for ident, codes in found.items():
        if len(codes) > 1:
            problems.append(f"final: id {ident} is live with {len(codes)} codes "
                            f"{[hexcode(x) for x in codes]}")
        final[ident] = codes[0]
    if len(dump) != len(res["ids"]):
        problems.append("final: duplicate ids in the k-NN dump")
    if set(dump) != set(final):
        problems.append(f"final: the k-NN dump has ids {sorted(set(dump) - set(final))} not "
                        f"found by code, and misses {sorted(set(final) - set(dump))}")
    for ident, code in final.items():
        if ident in dump and dump[ident] != distance(code, zero):
            problems.append(f"final: id {ident} at distance {dump[ident]} in the dump, its "
                            f"code {hexcode(code)} is at {distance(code, zero)}")
    if size != len(dump):
        problems.append(f"final: size {size} but {len(dump)} ids live")
    return final, problems


def check_history(rec: Recorder, death: dict[int, float], t_final: float,
                  final: dict[int, int]) -> tuple[list[str], dict]:
    ops = sorted(rec.ops, key=lambda o: o.invoke)
    per_id: dict[int, list[Op]] = defaultdict(list)
    by_code: dict[int, Op] = {}
    for op in ops:
        if op.kind in ("insert", "delete", "read"):
            per_id[op.id].append(op)
        if op.kind == "insert":
            by_code[op.code] = op
    violations = [f"unexpected answer: {op.describe()}" for op in ops
                  if op.detail.startswith("UNEXPECTED")]
    failed_codes = {op.code for op in ops if op.kind == "insert" and op.outcome == "fail"}
    for op in ops:  # a failed insert must never be seen (a narrower form of the checks below)
        if op.kind == "read" and op.outcome == "ok" and op.code in failed_codes \
                and any(ident == by_code[op.code].id for ident, _ in op.hits):
            violations.append(f"a failed insert is live: {op.describe()}; insert: "
                              f"{by_code[op.code].describe()}")
    for ident, code in final.items():
        if code in failed_codes:
            violations.append(f"final: id {ident} has the code of a failed insert: "
                              f"{by_code[code].describe()}")
    undecided = 0
    for ident in range(ID_SPACE):
        events = id_events(per_id.get(ident, []), death, t_final, final.get(ident))
        verdict = linearizable(events)
        if verdict is None:
            undecided += 1
            violations.append(f"id {ident}: checker gave up after {MAX_SEARCH_STATES} states")
        elif not verdict:
            history = "\n    ".join(op.describe() for op in per_id.get(ident, []))
            violations.append(f"id {ident}: no linearization explains its history (final "
                              f"{hexcode(final[ident]) if ident in final else 'absent'}):"
                              f"\n    {history}")
    acked: dict[int, tuple[list[float], list[Op]]] = {}
    for ident, id_ops in per_id.items():
        inserts = sorted((op for op in id_ops if op.kind == "insert" and op.outcome == "ok"),
                         key=lambda op: op.complete)
        acked[ident] = ([op.complete for op in inserts], inserts)
    searches = [op for op in ops if op.kind in ("read", "knn") and op.outcome == "ok"]
    for read in searches:
        violations += check_knn_hits(read, per_id, death)
        if read.kind == "knn":
            violations += check_knn_complete(read, acked, per_id, death)
    count = defaultdict(int)
    for op in ops:
        count[f"{op.kind}_{op.outcome}"] += 1
    figures = {
        "operations": len(ops),
        "acknowledged": sum(1 for op in ops if op.kind in ("insert", "delete")
                            and op.outcome == "ok"),
        "indeterminate": sum(1 for op in ops if op.outcome == "info"),
        "failed": sum(1 for op in ops if op.outcome == "fail"),
        "conflicts": count["insert_conflict"],
        "reads_checked": len(searches),
        "write_answers_checked": count["delete_ok"] + count["insert_conflict"],
        "final_live_ids": len(final),
        "undecided_ids": undecided,
        "by_kind_outcome": dict(sorted(count.items())),
    }
    return violations, figures


def test_history_with_kills_is_linearizable(bucketsearch_server_factory, tmp_path,
                                            record_property):
    data = tmp_path / "history"
    server = bucketsearch_server_factory(data, **ENV)
    with server.client() as c:
        assert c.post("/v1/indexes", json={"name": NAME, "bits": BITS}).status_code == 201
    cluster = Cluster(server)
    rec = Recorder()
    stop = threading.Event()
    t_start = time.monotonic()
    t_end = t_start + SECONDS
    clients = [threading.Thread(target=run_client, args=(p, cluster, rec, stop, SEED + p),
                                name=f"client-{p}") for p in range(THREADS)]
    killer_errors: list = []
    killer = threading.Thread(target=run_killer, args=(cluster, stop, t_end, KILLS,
                                                       random.Random(SEED), killer_errors),
                              name="killer")
    for t in clients + [killer]:
        t.start()
    try:
        while time.monotonic() < t_end and killer.is_alive():
            time.sleep(0.2)
        killer.join()  # a restart in progress finishes first
    finally:
        stop.set()
        for t in clients:
            t.join()
    if killer_errors:
        raise killer_errors[0]
    kills = cluster.epoch
    cluster.kill_and_restart()  # every incarnation the clients used is now dead
    t_final = time.monotonic()
    final, problems = read_final_state(server, rec)
    violations, figures = check_history(rec, cluster.death, t_final, final)
    violations = problems + violations
    figures.update(kills=kills, merges=cluster.merges, seed=SEED,
                   seconds=round(t_final - t_start, 1), threads=THREADS, id_space=ID_SPACE,
                   violations=len(violations))
    print("\nhistory: " + " ".join(f"{k}={v}" for k, v in figures.items()
                                   if k != "by_kind_outcome"))
    print("history outcomes: " + json.dumps(figures["by_kind_outcome"]))
    record_property("history", json.dumps(figures))
    if os.environ.get("BUCKETSEARCH_HISTORY_REPORT"):
        with open(os.environ["BUCKETSEARCH_HISTORY_REPORT"], "w") as f:
            json.dump(figures, f, indent=1)
    assert kills >= 3, f"only {kills} kills happened"
    assert figures["acknowledged"] > 100 and figures["reads_checked"] > 100, figures
    assert not violations, f"{len(violations)} violations (seed {SEED}):\n" + "\n".join(
        violations[:20])
    assert cluster.merges > 0, "no merge happened during the run"


# ------------------------------------------------------------- the checker on made-up histories
def _history(*ops: Op) -> Recorder:
    rec = Recorder()
    for op in ops:
        rec.ops.append(op)
        if op.kind == "insert":
            rec.codes[op.id].append(op.code)
    return rec


def _verdict(rec: Recorder, final: dict[int, int], death=None) -> list[str]:
    return check_history(rec, death or {0: 100.0}, 200.0, final)[0]


def test_checker_accepts_a_sequential_history():
    rec = _history(Op(0, "insert", 1, 0xA, 0, 1, 2, "ok"),
                   Op(0, "read", 1, 0xA, 0, 3, 4, "ok", hits=[(1, 0)]),
                   Op(0, "insert", 1, 0xB, 0, 5, 6, "conflict"),
                   Op(0, "delete", 1, 0, 0, 7, 8, "ok", deleted=1),
                   Op(0, "delete", 1, 0, 0, 9, 10, "ok", deleted=0),
                   Op(0, "insert", 1, 0xC, 0, 11, 12, "ok"),
                   Op(0, "knn", None, 0xC, 0, 13, 14, "ok", hits=[(1, 0)]))
    assert _verdict(rec, {1: 0xC}) == []


def test_checker_catches_a_lost_acknowledged_insert():
    rec = _history(Op(0, "insert", 1, 0xA, 0, 1, 2, "ok"))
    assert "no linearization" in _verdict(rec, {})[0]


def test_checker_catches_a_failed_insert_that_took_effect():
    rec = _history(Op(0, "insert", 1, 0xA, 0, 1, 2, "fail", status=503))
    assert any("failed insert" in v for v in _verdict(rec, {1: 0xA}))
    rec = _history(Op(0, "insert", 1, 0xA, 0, 1, 2, "fail", status=503),
                   Op(0, "insert", 1, 0xB, 0, 3, 4, "ok"))  # the retry
    assert _verdict(rec, {1: 0xB}) == []
    assert any("live with 2 codes" in v or "no linearization" in v
               for v in _verdict(rec, {1: 0xA}))


def test_checker_lets_an_indeterminate_insert_go_either_way_but_only_before_the_kill():
    rec = _history(Op(0, "insert", 1, 0xA, 0, 1, INF, "info"),
                   Op(1, "read", 1, 0xA, 1, 150, 151, "ok", hits=[]))
    assert _verdict(rec, {}) == []
    # it took effect after the read that saw it absent, although its process was dead by then
    assert _verdict(rec, {1: 0xA}, death={0: 100.0}) != []
    assert _verdict(rec, {1: 0xA}, death={0: 160.0}) == []


def test_checker_catches_stale_and_phantom_reads():
    rec = _history(Op(0, "insert", 1, 0xA, 0, 1, 2, "ok"),
                   Op(0, "delete", 1, 0, 0, 3, 4, "ok", deleted=1),
                   Op(1, "read", 1, 0xA, 0, 5, 6, "ok", hits=[(1, 0)]))
    assert _verdict(rec, {}) != []
    rec = _history(Op(0, "insert", 1, 0xA, 0, 1, 2, "ok"),
                   Op(1, "knn", None, 0xA, 0, 3, 4, "ok", hits=[(7, 0)]))
    assert any("returned id 7" in v for v in _verdict(rec, {1: 0xA}))
    rec = _history(Op(0, "insert", 1, 0xA, 0, 1, 2, "ok"),
                   Op(1, "knn", None, 0xA, 0, 3, 4, "ok", hits=[]))
    assert any("missing id 1" in v for v in _verdict(rec, {1: 0xA}))


def test_checker_allows_a_read_concurrent_with_a_delete_either_answer():
    for hits in ([], [(1, 0)]):
        rec = _history(Op(0, "insert", 1, 0xA, 0, 1, 2, "ok"),
                       Op(0, "delete", 1, 0, 0, 3, 6, "ok", deleted=1),
                       Op(1, "read", 1, 0xA, 0, 4, 5, "ok", hits=hits),
                       Op(1, "knn", None, 0xA, 0, 4, 5, "ok", hits=hits))
        assert _verdict(rec, {}) == []
