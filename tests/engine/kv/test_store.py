"""engine.kv.store: keys, RAM → disk tiers, persistence, corruption and failure handling."""

from __future__ import annotations

import errno
import io
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import engine.kv.format as kv_format
from engine.kv.store import KVStore, chunk_key, chunk_keys, default_store_dir

ROOT = Path(__file__).resolve().parents[3]
MODEL = "tiny-llm@cpu:f32"
CT = 4  # tokens per chunk
GEOMETRY = [(2, 8), (2, 8), (1, 16), (3, 4)]  # (heads, head_dim) per KV pair: mixed on purpose


def make_chunk(seed: int, *, geometry: list[tuple[int, int]] | None = None,
               dtype: str = "float32") -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((h, CT, d)).astype(dtype) for h, d in geometry or GEOMETRY]


def key(i: int, model: str = MODEL) -> str:
    """Key of the i-th chunk of the sequence 0, 1, 2, ..."""
    return chunk_key(model, list(range((i + 1) * CT)))


def quantized_bytes(chunk: list[np.ndarray]) -> int:
    return sum(a.size + 4 * a.shape[0] for a in chunk)


def same_arrays(a: list[np.ndarray] | None, b: list[np.ndarray] | None) -> bool:
    assert a is not None and b is not None and len(a) == len(b)
    return all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def file_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("*.kvc"))


def make_store(tmp_path: Path, **overrides: Any) -> KVStore:
    options: dict[str, Any] = {"chunk_tokens": CT, "ram_bytes": 1 << 20, "disk_bytes": 1 << 20,
                               "disk_dir": tmp_path / "kv", "quantize": True}
    options.update(overrides)
    return KVStore(options.pop("model_id", MODEL), **options)


def assert_close(got: list[np.ndarray] | None, want: list[np.ndarray], *, exact: bool) -> None:
    assert got is not None
    assert [(a.dtype, a.shape) for a in got] == [(a.dtype, a.shape) for a in want]
    for g, w in zip(got, want, strict=True):
        if exact:
            assert np.array_equal(g, w)
        else:  # int8: half a step of each head's scale
            step = np.abs(w.astype(np.float32)).max(axis=(1, 2), keepdims=True) / 127
            assert np.all(np.abs(g.astype(np.float32) - w) <= step / 2 + 1e-3 * step + 1e-3)


@pytest.fixture
def store_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger="engine.kv.store")
    return caplog


# -- keys ---------------------------------------------------------------------------


def test_keys_depend_on_the_model_and_the_whole_prefix() -> None:
    tokens = [5, 6, 7, 8, 9, 10, 11, 12]
    assert chunk_key(MODEL, tokens) == chunk_key(MODEL, list(tokens))
    assert chunk_key(MODEL, tokens) == chunk_key(MODEL, np.array(tokens, dtype=np.int32))
    assert chunk_key(MODEL, tokens) != chunk_key("other-model", tokens)
    assert chunk_key(MODEL, tokens) != chunk_key(MODEL, [99, *tokens[1:]])  # same last chunk
    assert chunk_key(MODEL, tokens) != chunk_key(MODEL, tokens[:4])
    assert len(chunk_key(MODEL, tokens)) == 64


def test_chunk_keys_match_chunk_key_of_each_complete_prefix() -> None:
    tokens = list(range(100, 111))  # 2 complete chunks of 4, 3 tokens left over
    keys = chunk_keys(MODEL, tokens, CT)
    assert keys == [chunk_key(MODEL, tokens[:4]), chunk_key(MODEL, tokens[:8])]
    assert chunk_keys(MODEL, tokens[:3], CT) == []


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: chunk_key(MODEL, []), "at least one token"),
        (lambda: chunk_key("", [1]), "model_id"),
        (lambda: chunk_key(MODEL, [1.5, 2.0]), "integer token ids"),  # type: ignore[list-item]
        (lambda: chunk_keys(MODEL, [1, 2], 0), "chunk_tokens"),
    ],
)
def test_bad_key_inputs_say_what_was_expected(call: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_default_dir_is_per_model_under_the_user_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if sys.platform != "linux":
        pytest.skip("XDG_CACHE_HOME only redirects platformdirs on Linux")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    odd = "../models/Qwen 2.5/model.onnx"
    assert default_store_dir(odd).parent == tmp_path / "onnx-local-llm" / "kv"
    assert "/" not in default_store_dir(odd).name and ".." not in default_store_dir(odd).name
    assert default_store_dir(odd) != default_store_dir(odd + "x")
    store = KVStore(odd, chunk_tokens=CT, ram_bytes=0, disk_bytes=1 << 20, disk_dir=None)
    store.put(key(0, odd), make_chunk(0))
    assert len(list(default_store_dir(odd).glob("*.kvc"))) == 1


# -- RAM tier -----------------------------------------------------------------------


@pytest.mark.parametrize("quantize", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_put_get_round_trip_with_mixed_geometry(tmp_path: Path, quantize: bool, dtype: str) -> None:
    store = make_store(tmp_path, quantize=quantize, disk_bytes=0)
    chunk = make_chunk(1, dtype=dtype)
    store.put(key(0), chunk)
    assert store.contains(key(0)) and not store.contains(key(1))
    assert_close(store.get(key(0)), chunk, exact=not quantize)
    assert store.get(key(1)) is None
    stats = store.stats()
    assert (stats["ram_hits"], stats["ram_misses"], stats["puts"]) == (1, 1, 1)
    raw = sum(a.nbytes for a in chunk)
    assert stats["ram_bytes"] == (quantized_bytes(chunk) if quantize else raw)


@pytest.mark.parametrize("quantize", [True, False])
def test_slices_of_a_larger_kv_buffer_are_stored(tmp_path: Path, quantize: bool) -> None:
    # The engine slices chunks out of [heads, max_len, head_dim] buffers: non-contiguous views.
    rng = np.random.default_rng(3)
    buffers = [rng.standard_normal((h, 64, d)).astype(np.float16) for h, d in GEOMETRY]
    chunk = [b[:, 2 * CT:3 * CT, :] for b in buffers]
    store = make_store(tmp_path, quantize=quantize, ram_bytes=0)
    store.put(key(2), chunk)
    assert_close(store.get(key(2)), [np.ascontiguousarray(a) for a in chunk], exact=not quantize)


def test_int8_chunk_is_about_a_quarter_of_float32(tmp_path: Path) -> None:
    chunk = [np.ones((4, CT, 64), np.float32) for _ in range(6)]
    store = make_store(tmp_path, disk_bytes=0)
    store.put(key(0), chunk)
    assert store.stats()["ram_bytes"] == 6 * (4 * CT * 64 + 4 * 4)


def test_caller_cannot_alter_stored_kv(tmp_path: Path) -> None:
    store = make_store(tmp_path, quantize=False, disk_bytes=0)
    chunk = make_chunk(2)
    store.put(key(0), chunk)
    chunk[0][:] = 0.0  # the engine reuses its page buffers
    got = store.get(key(0))
    assert got is not None and not np.all(got[0] == 0.0)
    got[1][:] = 0.0
    assert_close(store.get(key(0)), make_chunk(2), exact=True)


def test_ram_tier_evicts_least_recently_used_within_its_cap(tmp_path: Path) -> None:
    per_chunk = quantized_bytes(make_chunk(0))
    store = make_store(tmp_path, ram_bytes=3 * per_chunk + per_chunk // 2, disk_bytes=0)
    for i in range(3):
        store.put(key(i), make_chunk(i))
    assert store.get(key(0)) is not None  # 0 is now the most recent; 1 is the oldest
    store.put(key(3), make_chunk(3))
    assert [store.contains(key(i)) for i in range(4)] == [True, False, True, True]
    store.put(key(4), make_chunk(4))
    assert [store.contains(key(i)) for i in range(5)] == [True, False, False, True, True]
    stats = store.stats()
    assert stats["ram_entries"] == 3 and stats["ram_bytes"] <= stats["ram_cap_bytes"]
    assert stats["evictions"] == 2


def test_putting_a_stored_key_again_only_refreshes_it(tmp_path: Path) -> None:
    store = make_store(tmp_path, quantize=False)
    store.put(key(0), make_chunk(0))
    store.put(key(0), make_chunk(99))  # equal keys hold identical KV: nothing is rewritten
    assert store.stats()["puts"] == 1
    assert_close(store.get(key(0)), make_chunk(0), exact=True)


def test_non_finite_kv_is_not_stored_and_does_not_raise(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    chunk = make_chunk(0)
    chunk[2][0, 0, 0] = np.nan
    store.put(key(0), chunk)
    assert not store.contains(key(0)) and store.stats()["errors"] == 1


@pytest.mark.parametrize(
    ("chunk", "message"),
    [
        ([], "non-empty list"),
        ([np.zeros((2, CT + 1, 8), np.float32)], r"\[heads, 4, head_dim\]"),
        ([np.zeros((2, CT, 8), np.int32)], "float32/float16/int8/int16"),
        ([np.zeros((CT, 8), np.float32)], "float32/float16/int8/int16 array"),
    ],
)
def test_malformed_chunks_are_refused(
    tmp_path: Path, chunk: list[np.ndarray], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        make_store(tmp_path).put(key(0), chunk)


@pytest.mark.parametrize("bad_key", ["../../etc/passwd", "ABC", "g" * 64, key(0).upper()])
def test_keys_that_are_not_chunk_keys_are_refused(tmp_path: Path, bad_key: str) -> None:
    store = make_store(tmp_path)
    with pytest.raises(ValueError, match="64-hex-digit"):
        store.get(bad_key)
    with pytest.raises(ValueError, match="64-hex-digit"):
        store.put(bad_key, make_chunk(0))


# -- disk tier ----------------------------------------------------------------------


def test_chunks_pushed_out_of_ram_are_served_from_disk_and_promoted(tmp_path: Path) -> None:
    per_chunk = quantized_bytes(make_chunk(0))
    store = make_store(tmp_path, ram_bytes=2 * per_chunk)
    for i in range(3):
        store.put(key(i), make_chunk(i))
    assert store.stats()["ram_entries"] == 2 and store.stats()["disk_entries"] == 3
    first = store.get(key(0))  # from disk, then promoted (pushing chunk 1 out of RAM)
    assert_close(first, make_chunk(0), exact=False)
    stats = store.stats()
    assert (stats["disk_hits"], stats["promotions"], stats["ram_hits"]) == (1, 1, 0)
    again = store.get(key(0))
    assert store.stats()["ram_hits"] == 1 and store.stats()["disk_hits"] == 1
    assert same_arrays(first, again)
    assert store.stats()["demotions"] >= 2


def test_demotion_rewrites_a_chunk_whose_disk_copy_was_evicted(tmp_path: Path) -> None:
    probe = make_store(tmp_path / "probe", quantize=False)
    probe.put(key(0), make_chunk(0))
    file_size = file_bytes(tmp_path / "probe" / "kv")
    raw = sum(a.nbytes for a in make_chunk(0))
    store = make_store(tmp_path, quantize=False, ram_bytes=2 * raw, disk_bytes=2 * file_size)
    for i in range(3):
        store.put(key(i), make_chunk(i))
    # Writing chunk 2 evicted chunk 0's file (disk LRU); pushing 0 out of RAM wrote it back.
    assert [store.contains(key(i)) for i in range(3)] == [True, True, True]
    stats = store.stats()
    assert (stats["ram_entries"], stats["disk_entries"], stats["demotions"]) == (2, 2, 1)
    assert_close(store.get(key(0)), make_chunk(0), exact=True)
    assert store.stats()["disk_hits"] == 1
    store.put(key(3), make_chunk(3))
    store.put(key(4), make_chunk(4))
    assert file_bytes(tmp_path / "kv") <= 2 * file_size
    assert sum(store.contains(key(i)) for i in range(5)) == 3  # RAM 2 + disk 2, sharing 1


def test_disk_tier_never_exceeds_its_cap(tmp_path: Path) -> None:
    store = make_store(tmp_path, ram_bytes=0)
    store.put(key(0), make_chunk(0))
    file_size = file_bytes(tmp_path / "kv")
    capped = make_store(tmp_path / "capped", ram_bytes=0, disk_bytes=int(file_size * 2.5))
    for i in range(6):
        capped.put(key(i), make_chunk(i))
        assert file_bytes(tmp_path / "capped" / "kv") <= int(file_size * 2.5)
    assert [capped.contains(key(i)) for i in range(6)] == [False] * 4 + [True] * 2
    stats = capped.stats()
    assert stats["disk_entries"] == 2 and stats["disk_bytes"] == 2 * file_size
    assert stats["evictions"] == 4
    assert capped.get(key(0)) is None and capped.get(key(5)) is not None


def test_chunks_survive_a_new_store_on_the_same_dir(tmp_path: Path) -> None:
    first = make_store(tmp_path)
    for i in range(3):
        first.put(key(i), make_chunk(i, dtype="float16"))
    served = [first.get(key(i)) for i in range(3)]
    first.close()
    second = make_store(tmp_path)
    assert second.stats()["disk_entries"] == 3 and second.stats()["ram_entries"] == 0
    for i in range(3):
        got = second.get(key(i))
        assert same_arrays(got, served[i])
    assert second.stats()["disk_hits"] == 3


def test_restart_keeps_lru_order_and_applies_a_smaller_cap(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    for i in range(3):
        store.put(key(i), make_chunk(i))
    for age, i in ((300, 1), (200, 0), (100, 2)):  # last used: 2, then 0, then 1
        os.utime(tmp_path / "kv" / f"{key(i)}.kvc", (1e9 - age, 1e9 - age))
    file_size = file_bytes(tmp_path / "kv") // 3
    smaller = make_store(tmp_path, disk_bytes=2 * file_size)
    assert [smaller.contains(key(i)) for i in range(3)] == [True, False, True]
    assert file_bytes(tmp_path / "kv") == 2 * file_size


def test_chunks_used_from_ram_stay_on_disk_for_the_next_start(tmp_path: Path) -> None:
    probe = make_store(tmp_path / "probe")
    probe.put(key(0), make_chunk(0))
    file_size = file_bytes(tmp_path / "probe" / "kv")
    store = make_store(tmp_path, disk_bytes=2 * file_size)
    store.put(key(0), make_chunk(0))
    store.put(key(1), make_chunk(1))
    assert store.get(key(0)) is not None  # a RAM hit, but it counts as use on disk too
    store.put(key(2), make_chunk(2))
    store.close()
    restarted = make_store(tmp_path, disk_bytes=2 * file_size)
    assert [restarted.contains(key(i)) for i in range(3)] == [True, False, True]


def test_another_process_reads_identical_kv(tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import sys
        from pathlib import Path
        import numpy as np
        from engine.kv.store import KVStore, chunk_key
        role, directory = sys.argv[1], Path(sys.argv[2])
        store = KVStore("tiny@cpu", chunk_tokens=4, ram_bytes=1 << 20, disk_bytes=1 << 20,
                        disk_dir=directory / "kv")
        k = chunk_key("tiny@cpu", [7, 8, 9, 10])
        if role == "put":
            rng = np.random.default_rng(5)
            store.put(k, [rng.standard_normal((2, 4, 8)).astype(np.float32),
                          rng.standard_normal((1, 4, 16)).astype(np.float16)])
            np.savez(directory / "served.npz", *store.get(k))
        else:
            np.savez(directory / "read.npz", *store.get(k))
            print(store.stats()["disk_hits"])
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for role in ("put", "get"):
        done = subprocess.run([sys.executable, "-c", script, role, str(tmp_path)], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"
    served, read = np.load(tmp_path / "served.npz"), np.load(tmp_path / "read.npz")
    assert [read[n].dtype for n in read.files] == [np.float32, np.float16]
    assert all(np.array_equal(served[n], read[n]) for n in served.files)


# -- corruption: detected, dropped, counted, never served ----------------------------


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _flip_header_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[70] ^= 0x20  # inside the JSON header
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_flip_last_byte, _truncate, _empty, _flip_header_byte])
def test_damaged_chunk_file_is_dropped_and_recomputed(
    tmp_path: Path, damage: Any, store_log: pytest.LogCaptureFixture
) -> None:
    make_store(tmp_path).put(key(0), make_chunk(0))
    path = tmp_path / "kv" / f"{key(0)}.kvc"
    damage(path)
    store = make_store(tmp_path)  # a restart: RAM is cold, the disk index lists the file
    assert store.contains(key(0))
    assert store.get(key(0)) is None
    assert not path.exists() and not store.contains(key(0))
    stats = store.stats()
    assert stats["corrupt_dropped"] == 1 and stats["disk_misses"] == 1
    assert stats["disk_entries"] == 0 and stats["disk_bytes"] == 0
    assert any("dropped chunk file" in r.getMessage() for r in store_log.records)
    store.put(key(0), make_chunk(0))  # recomputed KV goes back in and is served
    assert_close(store.get(key(0)), make_chunk(0), exact=False)


def test_file_of_another_model_under_our_key_is_never_served(tmp_path: Path) -> None:
    other = make_store(tmp_path, model_id="another-model")
    other.put(key(0), make_chunk(7))  # a valid file, written by another model's store
    store = make_store(tmp_path, ram_bytes=0)
    assert store.get(key(0)) is None
    assert store.stats()["corrupt_dropped"] == 1
    assert not (tmp_path / "kv" / f"{key(0)}.kvc").exists()


def test_renamed_file_is_never_served_under_the_wrong_key(tmp_path: Path) -> None:
    make_store(tmp_path).put(key(0), make_chunk(0))
    directory = tmp_path / "kv"
    (directory / f"{key(0)}.kvc").rename(directory / f"{key(1)}.kvc")
    store = make_store(tmp_path)
    assert store.contains(key(1)) and store.get(key(1)) is None
    assert store.stats()["corrupt_dropped"] == 1 and not list(directory.glob("*.kvc"))


def test_file_replaced_while_running_is_caught(tmp_path: Path) -> None:
    store = make_store(tmp_path, ram_bytes=0, quantize=False)
    store.put(key(0), make_chunk(0))
    store.put(key(1), make_chunk(1))
    directory = tmp_path / "kv"
    os.replace(directory / f"{key(1)}.kvc", directory / f"{key(0)}.kvc")
    assert store.get(key(0)) is None and store.stats()["corrupt_dropped"] == 1


def test_chunk_from_another_chunk_size_or_quantization_is_not_served(tmp_path: Path) -> None:
    make_store(tmp_path, quantize=False).put(key(0), make_chunk(0))
    assert make_store(tmp_path, quantize=True).get(key(0)) is None
    make_store(tmp_path).put(key(0), make_chunk(0))
    assert make_store(tmp_path, chunk_tokens=2 * CT).get(key(0)) is None


def test_unreadable_chunk_is_a_miss_not_an_error(tmp_path: Path) -> None:
    store = make_store(tmp_path, ram_bytes=0)
    store.put(key(0), make_chunk(0))
    path = tmp_path / "kv" / f"{key(0)}.kvc"
    path.unlink()
    path.mkdir()  # reading a directory raises IsADirectoryError inside the store
    assert store.get(key(0)) is None
    assert store.stats()["errors"] == 1 and store.stats()["disk_entries"] == 0
    store.put(key(1), make_chunk(1))
    assert store.get(key(1)) is not None  # the disk tier still works


def test_cache_dir_emptied_while_running(tmp_path: Path) -> None:
    store = make_store(tmp_path, ram_bytes=0)
    store.put(key(0), make_chunk(0))
    for path in (tmp_path / "kv").iterdir():
        path.unlink()
    (tmp_path / "kv").rmdir()
    assert store.get(key(0)) is None  # a miss, not an exception
    store.put(key(1), make_chunk(1))  # the directory is made again
    assert store.get(key(1)) is not None
    assert store.stats()["disk_disabled"] is None and store.stats()["disk_entries"] == 1


def test_stale_temp_files_of_a_killed_writer_are_cleaned_at_start(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    directory.mkdir()
    stale, fresh = directory / f".{key(0)}.1.ab.tmp", directory / f".{key(1)}.2.cd.tmp"
    stale.write_bytes(b"half a chunk")
    fresh.write_bytes(b"being written by a live process")
    os.utime(stale, (1e9, 1e9))
    make_store(tmp_path)
    assert not stale.exists() and fresh.exists()


# -- unusable cache dir: the disk tier turns off with one warning, RAM keeps serving --


def _assert_ram_only_with_one_warning(store: KVStore, log: pytest.LogCaptureFixture,
                                      reason: str) -> None:
    for i in range(3):
        store.put(key(i), make_chunk(i))
    for i in range(3):
        assert_close(store.get(key(i)), make_chunk(i), exact=False)
    stats = store.stats()
    assert stats["disk_disabled"] is not None and reason in stats["disk_disabled"]
    assert stats["disk_entries"] == 0 and stats["ram_hits"] == 3
    disabled = [r for r in log.records if "disk tier disabled" in r.getMessage()]
    assert len(disabled) == 1 and disabled[0].levelno == logging.WARNING


def test_cache_dir_that_cannot_be_created(
    tmp_path: Path, store_log: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    store = make_store(tmp_path, disk_dir=blocker / "kv")
    _assert_ram_only_with_one_warning(store, store_log, "unusable")


def test_read_only_cache_dir(tmp_path: Path, store_log: pytest.LogCaptureFixture) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes through chmod 0o555; the unusable-dir test covers this path")
    directory = tmp_path / "kv"
    directory.mkdir()
    directory.chmod(0o555)
    try:
        store = make_store(tmp_path)
        _assert_ram_only_with_one_warning(store, store_log, "not writable")
    finally:
        directory.chmod(0o755)


def test_disk_cap_smaller_than_one_chunk(
    tmp_path: Path, store_log: pytest.LogCaptureFixture
) -> None:
    store = make_store(tmp_path, disk_bytes=100)
    _assert_ram_only_with_one_warning(store, store_log, "exceeds disk_bytes=100")


class _FullDiskFile(io.BytesIO):
    def write(self, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_full_disk_on_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store_log: pytest.LogCaptureFixture
) -> None:
    store = make_store(tmp_path)
    store.put(key(9), make_chunk(9))  # written before the disk filled up

    def full_disk_open(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if "w" in mode:
            Path(path).touch()  # the file gets created, the data does not fit
            return _FullDiskFile()
        return open(path, mode, *args, **kwargs)

    monkeypatch.setattr(kv_format, "open", full_disk_open, raising=False)
    _assert_ram_only_with_one_warning(store, store_log, "No space left")
    assert store.stats()["errors"] == 1
    assert not list((tmp_path / "kv").glob(".*.tmp"))  # the partial file is cleaned up
    assert store.get(key(9)) is not None  # it was in RAM too


def test_ram_tier_off(tmp_path: Path) -> None:
    store = make_store(tmp_path, ram_bytes=0)
    store.put(key(0), make_chunk(0))
    assert store.stats()["ram_entries"] == 0
    assert store.get(key(0)) is not None and store.stats()["disk_hits"] == 1


def test_closed_store_serves_nothing_and_keeps_its_files(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.put(key(0), make_chunk(0))
    store.close()
    assert store.get(key(0)) is None
    store.put(key(1), make_chunk(1))
    assert len(list((tmp_path / "kv").glob("*.kvc"))) == 1


@pytest.mark.parametrize("quantize", [True, False])
@pytest.mark.parametrize("element", [np.int8, np.int16])
def test_int8_and_int16_cache_rows_are_kept_byte_for_byte_in_ram_and_on_disk(
        tmp_path: Path, quantize: bool, element: type) -> None:
    """An int8 or int16 live cache's rows (values and their scales) are stored as they are,
    never quantized again, and come back the same from a fresh store reading the disk."""
    rng = np.random.default_rng(5)
    top = np.iinfo(element).max
    chunk = [rng.integers(-top, top + 1, (2, CT, 12), dtype=element) for _ in range(2)]
    store = make_store(tmp_path, quantize=quantize)
    store.put(key(0), chunk)
    for got in (store.get(key(0)), make_store(tmp_path, quantize=quantize, ram_bytes=0)
                .get(key(0))):
        assert got is not None
        for a, b in zip(got, chunk, strict=True):
            assert a.dtype == element
            np.testing.assert_array_equal(a, b)
