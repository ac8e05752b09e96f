"""The storage seam: the same behaviour from memory and a real Redis, and Redis outages."""

from __future__ import annotations

import logging
import pickle
import socket
import struct
import sys
import threading
import time

import numpy as np
import pytest
import redis
from conftest import encode_image, photo, pixelated
from PIL import Image

from flask_animegan.cache import CachedResult, NearDuplicateCache
from flask_animegan.cache.near_duplicate import (
    VERSION,
    Fingerprint,
    Member,
    decode_entry,
    decode_member,
    encode_entry,
    encode_member,
)
from flask_animegan.storage import MemoryStorage, open_storage
from flask_animegan.storage.memory import ITEM_OVERHEAD
from flask_animegan.storage.pages import ResultStore, StoredResult
from flask_animegan.storage.redis import RedisStorage
from flask_animegan.errors import ImageTooLarge
from flask_animegan.inputs.decoding import DecodeLimits, decode_upload

PREFIX = "animegan:test:"
SIDE = 256


@pytest.fixture(params=["memory", "redis"])
def uri(request) -> str:
    """A storage URI of each backend (a fresh redis-server for Redis)."""
    if request.param == "memory":
        return "memory://"
    return request.getfixturevalue("redis_server").uri


def uploaded(image: Image.Image, fmt: str = "PNG", **params) -> Fingerprint:
    """What the service fingerprints of ``image`` uploaded as ``fmt`` for SIDE: its
    decoded, fitted input."""
    data = encode_image(image, fmt, **params)
    return Fingerprint.of(decode_upload(data, DecodeLimits(max_pixels=10**8), size=SIDE).image)


@pytest.fixture(scope="module")
def astronaut() -> dict[str, Fingerprint]:
    """The astronaut as uploaded, re-encoded, with her face pixelated, and another photo."""
    original = photo("astronaut")
    return {"original": uploaded(original, compress_level=0),
            "jpeg q85": uploaded(original, "JPEG", quality=85),
            "face pixelated": uploaded(pixelated(original, (180, 60, 290, 190), 12)),
            "coffee": uploaded(photo("coffee"))}


# -- the storage interface, on both backends ---------------------------------------------

def test_set_get_and_per_key_ttl(uri):
    storage = open_storage(uri, max_bytes=10**6, prefix=PREFIX)
    assert storage.set("long", b"kept", 60) and storage.set("short", b"gone", 0.2)
    assert storage.get("long") == b"kept" and storage.get("short") == b"gone"
    assert storage.get("missing") is None
    time.sleep(0.3)
    assert storage.get("short") is None and storage.get("long") == b"kept"
    assert storage.status()["ok"] is True and storage.healthy


def test_an_index_keeps_its_newest_members_up_to_the_cap(uri):
    storage = open_storage(uri, max_bytes=10**6, prefix=PREFIX)
    for n in range(5):
        assert storage.set_indexed(f"value{n}", b"v%d" % n, index="list", member=b"m%d" % n,
                                   ttl=60, cap=3)
    assert storage.index("list", 10) == [b"m4", b"m3", b"m2"]
    assert storage.index("list", 2) == [b"m4", b"m3"]
    assert storage.index("other", 10) == []
    assert [storage.get(f"value{n}") for n in range(5)] == [b"v0", b"v1", b"v2", b"v3", b"v4"]


def test_each_push_refreshes_the_index_ttl(uri):
    storage = open_storage(uri, max_bytes=10**6, prefix=PREFIX)
    storage.set_indexed("first", b"1", index="list", member=b"a", ttl=0.4, cap=4)
    time.sleep(0.25)
    storage.set_indexed("second", b"2", index="list", member=b"b", ttl=0.4, cap=4)
    time.sleep(0.25)  # the first value is gone, the list lives on
    assert storage.get("first") is None and storage.get("second") == b"2"
    assert storage.index("list", 4) == [b"b", b"a"]
    time.sleep(0.25)
    assert storage.index("list", 4) == [] and storage.get("second") is None


def test_memory_storage_evicts_the_least_recently_used_by_bytes():
    storage = MemoryStorage(3 * (1000 + ITEM_OVERHEAD))
    for key in "abc":
        assert storage.set(key, key.encode() * 1000, 60)
    assert storage.get("a") is not None  # now the most recently used
    assert storage.set("d", b"d" * 1000, 60)
    assert storage.get("b") is None
    assert all(storage.get(key) is not None for key in "acd")
    status = storage.status()
    assert status["entries"] == 3 and status["bytes"] <= status["max_bytes"]
    assert not storage.set("huge", b"x" * 4000, 60)  # alone over the budget: refused
    assert storage.get("huge") is None and storage.get("a") is not None


def test_memory_storage_is_safe_across_threads():
    storage = MemoryStorage(200 * (100 + ITEM_OVERHEAD))

    def work(n: int) -> None:
        for i in range(300):
            storage.set_indexed(f"{n}-{i}", b"x" * 100, index="shared", member=b"%d" % i,
                                ttl=60, cap=8)
            storage.get(f"{n}-{i // 2}")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    status = storage.status()
    assert len(storage.index("shared", 100)) == 8 and status["bytes"] <= status["max_bytes"]


# -- the cache on both backends ------------------------------------------------------------

def get(cache: NearDuplicateCache, namespace: tuple, fingerprint: Fingerprint):
    """The same photo's result in ``namespace`` (one lookup), or None."""
    return cache.lookup(namespace).same_photo(fingerprint)


def make_cache(uri: str, **options) -> NearDuplicateCache:
    return NearDuplicateCache(open_storage(uri, max_bytes=10**8, prefix=PREFIX), ttl=60,
                              **options)


def test_a_re_encoded_copy_hits_and_a_locally_edited_one_misses(uri, astronaut):
    cache = make_cache(uri)
    namespace = ("203.0.113.7", "style", SIDE, "jpeg")
    original = astronaut["original"]
    cache.put(namespace, original, b"A's result", original.size)
    found = get(cache, namespace, astronaut["jpeg q85"])
    assert found is not None and (found.data, found.size) == (b"A's result", original.size)
    for other in ("face pixelated", "coffee"):
        assert get(cache, namespace, astronaut[other]) is None, other
    assert (cache.stats()["hits"], cache.stats()["misses"]) == (1, 2)


def test_clients_styles_sizes_and_formats_do_not_share(uri, astronaut):
    cache = make_cache(uri)
    fingerprint = astronaut["original"]
    cache.put(("203.0.113.7", "a", SIDE, "jpeg"), fingerprint, b"result", (SIDE, SIDE))
    assert get(cache, ("203.0.113.7", "a", SIDE, "jpeg"), fingerprint) is not None
    for other in (("203.0.113.8", "a", SIDE, "jpeg"), (None, "a", SIDE, "jpeg"),
                  ("203.0.113.7", "b", SIDE, "jpeg"), ("203.0.113.7", "a", 128, "jpeg"),
                  ("203.0.113.7", "a", SIDE, "png")):
        assert get(cache, other, fingerprint) is None, other


def test_cache_entries_expire_after_the_ttl(uri, astronaut):
    cache = NearDuplicateCache(open_storage(uri, max_bytes=10**8, prefix=PREFIX), ttl=0.3)
    fingerprint = astronaut["original"]
    cache.put(("c", "s", SIDE, "jpeg"), fingerprint, b"result", (SIDE, SIDE))
    assert get(cache, ("c", "s", SIDE, "jpeg"), fingerprint) is not None
    time.sleep(0.4)
    assert get(cache, ("c", "s", SIDE, "jpeg"), fingerprint) is None


def test_only_the_newest_entries_of_a_namespace_are_candidates(uri, astronaut):
    cache = make_cache(uri, index_cap=2)
    namespace = ("c", "s", SIDE, "jpeg")
    for name in ("original", "face pixelated", "coffee"):  # three different photos
        cache.put(namespace, astronaut[name], name.encode(), (SIDE, SIDE))
    assert get(cache, namespace, astronaut["original"]) is None
    assert get(cache, namespace, astronaut["coffee"]).data == b"coffee"
    assert len(cache.storage.index(f"{VERSION}:index:{cache._digest(namespace)}", 100)) == 2


def corrupt_members(real: bytes) -> list[bytes]:
    """Index members that must be skipped: junk, truncated, altered, pickled, other sizes."""
    return [b"", b"AGF6", b"\x00" * len(real), real[:-1], real + b"\x00",
            b"XXXX" + real[4:], b"AM09" + real[4:],  # another version's magic
            real[:4] + struct.pack("<d", float("nan")) + real[12:],  # a NaN creation time
            real[:12] + struct.pack("<I", 0) + real[16:],  # a width of 0
            pickle.dumps(Member(0.0, b"x" * 16, None, bytes(16))),
            np.random.default_rng(0).bytes(len(real))]


def test_corrupt_index_members_and_entries_are_skipped(uri, astronaut):
    cache = make_cache(uri, index_cap=32)
    namespace = ("c", "s", SIDE, "jpeg")
    index = f"{VERSION}:index:{cache._digest(namespace)}"
    fingerprint = astronaut["original"]
    cache.put(namespace, fingerprint, b"real", (SIDE, SIDE))
    real = cache.storage.index(index, 1)[0]
    assert decode_member(real) is not None
    for n, member in enumerate(corrupt_members(real)):
        assert decode_member(member) is None, n
        cache.storage.set_indexed(f"junk{n}", b"junk", index=index, member=member, ttl=60,
                                  cap=32)
    assert get(cache, namespace, fingerprint).data == b"real"
    # an entry whose value does not parse reads as a miss
    entry_id = decode_member(real).entry_id.hex()
    cache.storage.set(f"{VERSION}:entry:{cache._digest(namespace)}:{entry_id}", b"AE1", 60)
    assert get(cache, namespace, fingerprint) is None


def test_a_file_sent_again_is_found_by_its_keyed_digest_in_one_index_read(uri, astronaut):
    cache = make_cache(uri, key=b"the app's secret")
    namespace = ("203.0.113.7", "style", SIDE, "jpeg")
    data = encode_image(photo("astronaut"), "JPEG", quality=90)
    fingerprint = astronaut["original"]
    upload = cache.upload_digest(data)
    cache.put(namespace, fingerprint, b"A's result", (SIDE, SIDE), upload=upload)
    again = cache.lookup(namespace).same_upload(cache.upload_digest(data))
    assert again is not None and again.data == b"A's result"
    # one more byte is another file: the digest misses, the rule decides (one index read)
    lookup = cache.lookup(namespace)
    assert lookup.same_upload(cache.upload_digest(data + b"\0")) is None
    assert lookup.same_photo(fingerprint).data == b"A's result"
    # another client, style or size never gets it, whatever the digest
    for other in (("203.0.113.8", "style", SIDE, "jpeg"), ("203.0.113.7", "b", SIDE, "jpeg"),
                  ("203.0.113.7", "style", 128, "jpeg")):
        assert cache.lookup(other).same_upload(upload) is None, other
    assert (cache.stats()["hits"], cache.stats()["misses"]) == (2, 0)


def test_the_upload_digest_is_keyed_so_redis_cannot_confirm_a_known_photo(astronaut):
    import hashlib

    data = encode_image(photo("astronaut"), "JPEG", quality=90)
    digests = {NearDuplicateCache(ttl=60, max_bytes=10**6, key=key).upload_digest(data)
               for key in (b"one secret", b"another secret")}
    unkeyed = {hashlib.blake2b(data, digest_size=16).digest(), hashlib.md5(data).digest(),
               hashlib.sha256(data).digest()[:16]}
    assert len(digests) == 2 and not digests & unkeyed
    assert all(len(digest) == 16 for digest in digests)


def test_stats_report_the_storage(uri):
    stats = make_cache(uri).stats()
    assert stats["enabled"] is True and stats["ok"] is True
    assert stats["backend"] == ("memory" if uri == "memory://" else "redis")


# -- Redis: keys, round trips, bytes ---------------------------------------------------------

def test_redis_keys_are_prefixed_hashed_and_expire(redis_server, astronaut):
    cache = make_cache(redis_server.uri)
    pages = ResultStore(open_storage(redis_server.uri, max_bytes=10**6, prefix="animegan:page:"),
                        ttl=60, max_bytes=10**6)
    cache.put(("203.0.113.7", "style", SIDE, "jpeg"),
              astronaut["original"], b"result", (SIDE, SIDE))
    token = pages.add(StoredResult(b"o", b"r", "image/jpeg", "style", (1, 1)))
    client = redis_server.client()
    keys = sorted(key.decode() for key in client.keys("*"))
    assert len(keys) == 3 and f"animegan:page:{token}" in keys
    assert all(key.startswith((f"{PREFIX}{VERSION}:index:", f"{PREFIX}{VERSION}:entry:",
                               "animegan:page:"))
               for key in keys)
    assert not any("203.0.113" in key for key in keys)  # the client's address is hashed
    assert all(0 < client.pttl(key) <= 60_000 for key in keys)


class RoundTrips:
    """Counts what redis-py sends: each send is one request and its replies, a round trip."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        send = redis.connection.AbstractConnection.send_packed_command

        def counted(connection, command, check_health=True):
            self.count += 1
            return send(connection, command, check_health)

        monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)

    def __call__(self, operation) -> int:
        """Round trips ``operation()`` takes."""
        before = self.count
        operation()
        return self.count - before


def test_a_hit_and_a_miss_cost_two_redis_round_trips_each(redis_server, astronaut,
                                                          monkeypatch):
    cache = make_cache(redis_server.uri)
    cache.storage.get("warm-up")  # open the pooled connection (its handshake is once)
    trips = RoundTrips(monkeypatch)
    namespace = ("c", "s", SIDE, "jpeg")
    original, copy = astronaut["original"], astronaut["jpeg q85"]
    # a miss: the lookup, then the put of the new result
    first = original
    assert trips(lambda: get(cache, namespace, first)) == 1
    assert trips(lambda: cache.put(namespace, first, b"result", original.size)) == 1
    # a miss whose candidates fail the checks, in a namespace full of them
    for name in ("face pixelated", "coffee"):
        cache.put(namespace, astronaut[name], b"other", (SIDE, SIDE))
    edited = uploaded(pixelated(photo("astronaut"), (150, 150, 200, 200), 10))
    assert trips(lambda: get(cache, namespace, edited)) == 1
    assert cache.stats()["hits"] == 0
    # a hit: the index, then the entry
    found = []
    assert trips(lambda: found.append(get(cache, namespace, copy))) == 2
    assert found[0].data == b"result"
    # a file sent again: the index, then the entry; one that is not: the index once, for
    # its digest and its fingerprint
    upload = cache.upload_digest(b"the file")
    cache.put(namespace, first, b"sent", original.size, upload=upload)
    assert trips(lambda: found.append(cache.lookup(namespace).same_upload(upload))) == 2
    assert found[-1].data == b"sent"

    def not_sent_before() -> None:
        lookup = cache.lookup(namespace)
        assert lookup.same_upload(cache.upload_digest(b"another file")) is None
        found.append(lookup.same_photo(edited))

    assert trips(not_sent_before) == 1 and found[-1] is None
    commands = redis_server.client().info("commandstats")
    assert commands["cmdstat_exec"]["calls"] == 4  # each put is one MULTI/EXEC


def test_bytes_stored_per_entry_on_redis(redis_server, astronaut):
    """What one cache entry and one result page cost in Redis beside their images.

    ``MEMORY USAGE`` counts what jemalloc allocated: a value is rounded up to its size
    class (four per doubling, so up to +25 %, about +10 % on average).
    """
    cache = make_cache(redis_server.uri)
    pages = ResultStore(open_storage(redis_server.uri, max_bytes=10**6, prefix="page:"),
                        ttl=60, max_bytes=10**6)
    client = redis_server.client()
    namespace = ("203.0.113.7", "style", SIDE, "jpeg")
    index = f"{PREFIX}{VERSION}:index:{cache._digest(namespace)}"
    usage = {}
    for name in ("original", "coffee"):
        result = np.random.default_rng(1).bytes(30_000)  # a 256 px JPEG's order of size
        cache.put(namespace, astronaut[name], result, (SIDE, SIDE))
        usage[name] = client.memory_usage(index, samples=0)
    member = usage["coffee"] - usage["original"]
    entry = {name: client.memory_usage(f"{PREFIX}{VERSION}:entry:{cache._digest(namespace)}:"
                                       f"{decode_member(blob).entry_id.hex()}", samples=0)
             for name, blob in zip(("coffee", "original"), client.lrange(index, 0, -1))}
    extra = max(entry[name] - 30_000 for name in entry)
    token = pages.add(StoredResult(result, result, "image/jpeg", "style", (SIDE, SIDE)))
    page = client.memory_usage(f"page:{token}", samples=0) - 60_000
    print(f"\nper cache entry: its result + up to {extra} B (key, header, allocator "
          f"rounding) + {member} B in its index (a first index: {usage['original']} B); "
          f"per page: its images + {page} B")
    assert len(client.lindex(index, 0)) == struct.calcsize("<4sdII32s2048s16s16s")
    assert member <= 4 * 1024 and usage["original"] <= 4 * 1024
    assert all(0 < entry[name] - 30_000 < 30_000 // 4 + 200 for name in entry)
    assert extra + member <= 32 * 1024  # an entry is at most its result + 32 KiB
    assert page < 60_000 // 4 + 200


# -- Redis outages ----------------------------------------------------------------------------

def timed(operation):
    """``(seconds, result)`` of ``operation()``."""
    started = time.perf_counter()
    result = operation()
    return time.perf_counter() - started, result


def outage_logs(caplog) -> tuple[list[str], list[str]]:
    messages = [r.getMessage() for r in caplog.records if r.name == "flask_animegan"]
    return ([m for m in messages if "is unavailable" in m],
            [m for m in messages if "available again" in m])


def test_a_redis_outage_is_quiet_quick_and_ends_by_itself(redis_server, astronaut, caplog):
    caplog.set_level(logging.WARNING, logger="flask_animegan")
    storage = RedisStorage(redis_server.uri, prefix=PREFIX, retry_after=0.3)
    cache = NearDuplicateCache(storage, ttl=60)
    namespace = ("c", "s", SIDE, "jpeg")
    fingerprint = astronaut["original"]
    cache.put(namespace, fingerprint, b"result", (SIDE, SIDE))
    assert get(cache, namespace, fingerprint) is not None
    redis_server.kill()
    for _ in range(3):
        for operation in (lambda: get(cache, namespace, fingerprint),
                          lambda: cache.put(namespace, fingerprint, b"result", (SIDE, SIDE)),
                          lambda: storage.set("key", b"value", 60),
                          lambda: storage.index("list", 5)):
            seconds, result = timed(operation)
            assert seconds < 0.25 and result in (None, False, [])
        time.sleep(0.2)  # past retry_after: it tries again, and fails again quietly
    assert cache.stats()["ok"] is False and cache.stats()["error"] == "ConnectionError"
    assert not storage.healthy
    down, back = outage_logs(caplog)
    assert len(down) == 1 and not back and str(redis_server.port) in down[0]

    redis_server.start()  # the same port, empty
    time.sleep(0.35)
    assert storage.status()["ok"] is True  # a health check alone sees the recovery
    assert get(cache, namespace, fingerprint) is None  # an empty Redis: a miss, not an outage
    cache.put(namespace, fingerprint, b"again", (SIDE, SIDE))
    assert get(cache, namespace, fingerprint).data == b"again"
    assert storage.status() == {"backend": "redis", "ok": True, "state": "ok", "error": None,
                                "server": f"redis://127.0.0.1:{redis_server.port}/0"}
    down, back = outage_logs(caplog)
    assert len(down) == 1 and len(back) == 1


def test_a_silent_redis_costs_one_timeout_then_none_for_a_while(caplog):
    """A server that accepts connections but never answers (a hung or unreachable host)."""
    caplog.set_level(logging.WARNING, logger="flask_animegan")
    assert MemoryStorage(10).ping() is True
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)  # connections complete in the backlog; nothing ever answers
        uri = f"redis://:s3cret-pass@127.0.0.1:{hole.getsockname()[1]}/2"
        storage = RedisStorage(uri, prefix=PREFIX, retry_after=1.0)
        seconds, found = timed(lambda: storage.get("key"))
        assert found is None and 0.4 < seconds < 1.0  # socket_timeout, no retries
        for _ in range(20):
            seconds, stored = timed(lambda: storage.set("key", b"value", 60))
            assert stored is False and seconds < 0.01
        seconds, answered = timed(storage.ping)  # a health check waits the retry out too
        assert answered is False and seconds < 0.01
        status = storage.status()
        assert status["ok"] is False and status["error"] == "TimeoutError"
        down, _ = outage_logs(caplog)
        assert len(down) == 1
        assert "s3cret" not in down[0] and "s3cret" not in str(status)
        assert status["server"].endswith(f":{hole.getsockname()[1]}/2")


def fill(redis_client) -> None:
    """Make the server full: ``noeviction``, and a maxmemory below what its keys use
    (Redis allows that; the filler's removal ends it)."""
    redis_client.config_set("maxmemory-policy", "noeviction")
    for n in range(12):  # 3 MiB in small commands (a big one's buffer counts while it runs)
        redis_client.set(f"filler:{n}", b"x" * (256 << 10))
    used = int(redis_client.info("memory")["used_memory"])
    redis_client.config_set("maxmemory", used - (2 << 20))


def unfill(redis_client) -> None:
    redis_client.delete(*redis_client.keys("filler:*"))


def test_a_full_redis_refuses_writes_as_a_state_of_its_own(redis_server, caplog):
    """``noeviction`` at maxmemory: reads answer, every write is refused at once; one
    line for the episode, not one per write; a ping does not end it, a write does."""
    caplog.set_level(logging.WARNING, logger="flask_animegan")
    storage = RedisStorage(redis_server.uri, prefix=PREFIX, retry_after=0.3)
    pages = ResultStore(storage, ttl=60, max_bytes=10**6)
    assert storage.set("kept", b"before", 60)
    fill(redis_server.client())
    for _ in range(5):
        seconds, stored = timed(lambda: storage.set("new", b"value", 60))
        assert stored is False and seconds < 0.25
        assert not storage.set_indexed("v", b"1", index="list", member=b"m", ttl=60, cap=3)
        assert storage.get("kept") == b"before"  # reads answer while full
    assert pages.add(PAGE) is None  # not kept: the upload answers with the page itself
    assert storage.ping() is True and not storage.healthy
    assert storage.status()["state"] == "full" and storage.status()["ok"] is False
    full = [m for m in (r.getMessage() for r in caplog.records) if "is full" in m]
    assert len(full) == 1 and "unavailable" not in caplog.text
    unfill(redis_server.client())
    assert storage.set("new", b"value", 60) and storage.healthy
    assert storage.set("again", b"value", 60)
    assert caplog.text.count("takes writes again") == 1


def test_stores_on_one_redis_share_its_connection_pool_and_health(redis_server):
    pages = open_storage(redis_server.uri, max_bytes=0, prefix="page:")
    cache = open_storage(redis_server.uri, max_bytes=0, prefix="cache:")
    assert pages._server is cache._server
    assert pages.set("k", b"page", 60) and cache.set("k", b"cache", 60)
    assert (pages.get("k"), cache.get("k")) == (b"page", b"cache")


# -- result pages --------------------------------------------------------------------------

PAGE = StoredResult(b"original jpeg", b"result bytes", "image/webp", "Hayao", (640, 480))


def test_result_pages_round_trip_on_both_backends(uri):
    store = ResultStore(open_storage(uri, max_bytes=10**6, prefix="page:"), ttl=60,
                        max_bytes=10**6)
    token = store.add(PAGE)
    assert store.get(token) == PAGE
    assert store.get(token[:-1] + ("A" if token[-1] != "A" else "B")) is None
    for bad in ("", "../../etc/passwd", "*", "x" * 200, "a b"):
        assert store.get(bad) is None
    with pytest.raises(ImageTooLarge, match="ANIMEGAN_RESULT_MAX_BYTES"):
        store.add(StoredResult(b"o" * 600_000, b"r" * 500_000, "image/png", "s", (1, 1)))


def test_result_pages_are_not_handed_out_while_redis_is_down(redis_server):
    """No id for a page that no instance could find: add() says so (the form then
    answers with the page itself), and pages kept before the outage come back with it."""
    storage = RedisStorage(redis_server.uri, prefix="page:", retry_after=0.3)
    store = ResultStore(storage, ttl=60, max_bytes=10**6)
    in_redis = store.add(PAGE)
    assert in_redis is not None
    redis_server.kill()
    assert store.get(in_redis) is None  # it lives in Redis, which is gone
    seconds, token = timed(lambda: store.add(PAGE))
    assert seconds < 0.25 and token is None
    redis_server.start()
    time.sleep(0.35)
    after = store.add(PAGE)
    assert after is not None
    assert redis_server.client().exists(f"page:{after}") and store.get(after) == PAGE


# -- choosing a backend ----------------------------------------------------------------------

def test_open_storage_chooses_by_scheme():
    memory = open_storage("memory://", max_bytes=1234, prefix="x:")
    assert isinstance(memory, MemoryStorage) and memory.max_bytes == 1234
    for uri in ("redis://:pw@localhost:6390/1", "rediss://cache.example:6380/0",
                "unix:///run/redis/redis.sock?db=3"):
        storage = open_storage(uri, max_bytes=0, prefix="x:")  # connects on first use only
        assert isinstance(storage, RedisStorage) and storage.prefix == "x:"
        assert "pw" not in str(storage.status())
    assert open_storage("unix:///run/redis/redis.sock?db=3", max_bytes=0,
                        prefix="x:").status()["server"] == "unix:///run/redis/redis.sock?db=3"
    with pytest.raises(ValueError, match="memory://, redis://, rediss://, unix://") as error:
        open_storage("memcached://user:hunter2@cache:11211", max_bytes=0, prefix="x:")
    assert "hunter2" not in str(error.value)


def test_a_redis_uri_without_redis_py_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "redis", None)  # as if it were not installed
    monkeypatch.delitem(sys.modules, "flask_animegan.storage.redis")
    with pytest.raises(ImportError, match=r"pip install 'flask-animegan\[redis\]'"):
        open_storage("redis://localhost:6379/0", max_bytes=0, prefix="x:")
    assert isinstance(open_storage("memory://", max_bytes=10, prefix="x:"), MemoryStorage)


def test_a_member_round_trips_exactly(astronaut):
    fingerprint = astronaut["original"]
    member = decode_member(encode_member(Member(1.5, b"i" * 16, fingerprint, b"u" * 16)))
    assert member == Member(1.5, b"i" * 16, fingerprint, b"u" * 16)
    assert member.fingerprint.same_photo(fingerprint, 0)


def test_an_entry_round_trips_and_a_cut_one_never_raises():
    """An entry is its header and the result: nothing of the input it was converted from."""
    blob = encode_entry(b"the result", (SIDE, 171))
    assert len(blob) == 20 + len(b"the result")
    assert decode_entry(blob) == CachedResult(b"the result", (SIDE, 171), faces=-1)
    assert decode_entry(encode_entry(b"r", (1, 1), 3)) == CachedResult(b"r", (1, 1), faces=3)
    for end in range(len(blob)):
        assert decode_entry(blob[:end]) is None
    assert decode_entry(blob + b"x") is None
    assert decode_entry(b"AGE4" + blob[4:]) is None  # the format before this one
