"""``pull`` from a Hub stand-in on 127.0.0.1 (tests/app/hub_standin.py) serving forged
repositories: the GGUF that fits best is chosen, downloaded, verified, converted and
renamed into the library whole; faults (a dropped connection, a corrupt file, a full disk,
a repository of nothing runnable) end with a clear message and no model folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest
from engine.hub.browse import NotSupported, best, variants
from engine.hub.download import DownloadError
from engine.hub.fit import FITS, SHORTER, TOO_BIG, Fit
from engine.hub.pull import PullEvent, pull
from engine.model.folders import find_model_dirs
from tests.app.hub_standin import HubStandin
from tests.engine.hub.repos import GGUF_REPO, UNSUPPORTED_REPO, gguf_repo, unsupported_repo

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    root = tmp_path_factory.mktemp("repos")
    return {GGUF_REPO: gguf_repo(root), UNSUPPORTED_REPO: unsupported_repo(root)}


@pytest.fixture
def hub(repos):
    with HubStandin(repos) as standin:
        yield standin


def _whole_file_gets(hub: HubStandin, suffix: str) -> list[str | None]:
    """Range headers of the file's downloads (the header reads, bytes=0-..., left out)."""
    return [r for r in hub.ranges(suffix) if r is None or not r.startswith("bytes=0-")]


def _answer(folder: Path) -> str:
    engine = Engine.load(folder, EngineConfig(intra_op_threads=1))
    result = engine.generate(GenerateRequest(prompt="hello", options=GenerateOptions(
        max_new_tokens=4, temperature=0.0, stop_on_eos=False)))
    assert len(result.token_ids) == 4
    return result.text


def test_a_gguf_repo_gives_its_q4_k_m_converted_into_a_library_folder(hub, tmp_path):
    events: list[PullEvent] = []
    result = pull(GGUF_REPO, tmp_path / "models", endpoint=hub.url, progress=events.append,
                  bandwidth=1e10)
    assert result.variant.quant == "Q4_K_M"
    assert "Tiny-Q4_K_M.gguf (Q4_K_M), the best that fits" in result.summary
    assert result.folder == tmp_path / "models" / "Tiny-q4_k_m"
    assert events[0].status == "pulling manifest"
    assert events[-1].status == "success"
    assert any(e.total for e in events)  # byte progress was reported
    # only the finished folder is in the library: no staging folder, no other file
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["Tiny-q4_k_m"]
    assert list(find_model_dirs(tmp_path / "models")) == [result.folder]
    assert (result.folder / "pull.json").is_file()
    _answer(result.folder)
    # only the chosen file was downloaded
    assert _whole_file_gets(hub, "Q8_0.gguf") == []


def test_a_named_file_or_quantization_is_taken_as_asked(hub, tmp_path):
    result = pull(f"{GGUF_REPO}:Q8_0", tmp_path, endpoint=hub.url, progress=lambda e: None)
    assert result.variant.path == "Tiny-Q8_0.gguf"
    assert result.folder.name == "Tiny-q8_0"


def _variant(quant: str, size: int, label: str):
    from engine.hub.browse import Variant

    fit = Fit(label, size, 1, 100, 100 if label == FITS else 10, 10**9, "host_ram", "cpu",
              None, None)
    return Variant("o/r", "gguf", f"r-{quant}.gguf", quant, size, fit, ())


def test_the_choice_is_q4_k_m_when_several_fit_else_the_largest_that_fits():
    fits = [_variant("Q4_0", 10, FITS), _variant("Q4_K_M", 11, FITS),
            _variant("Q8_0", 20, FITS)]
    assert best(fits).quant == "Q4_K_M"
    tight = [_variant("Q3_K_M", 8, FITS), _variant("Q4_0", 10, FITS),
             _variant("Q4_K_M", 11, SHORTER), _variant("Q8_0", 20, TOO_BIG)]
    assert best(tight).quant == "Q4_0"  # the best that fits whole beats a shorter context
    shorter = [_variant("Q4_K_M", 11, SHORTER), _variant("Q8_0", 20, TOO_BIG)]
    assert best(shorter).quant == "Q4_K_M"
    with pytest.raises(NotSupported, match="too big for this machine"):
        best([_variant("Q8_0", 20, TOO_BIG)])


def test_a_dropped_connection_is_resumed_where_it_stopped(hub, tmp_path):
    size = (hub.repos[GGUF_REPO].files["Tiny-Q4_K_M.gguf"]).size
    hub.drop_after["Q4_K_M.gguf"] = size // 2
    with pytest.raises(DownloadError, match="continue"):
        pull(GGUF_REPO, tmp_path, endpoint=hub.url, progress=lambda e: None)
    assert list(find_model_dirs(tmp_path)) == []  # nothing half-written in the library
    result = pull(GGUF_REPO, tmp_path, endpoint=hub.url, progress=lambda e: None)
    ranges = _whole_file_gets(hub, "Q4_K_M.gguf")
    assert ranges[0] is None and len(ranges) == 2
    assert ranges[1] is not None and int(ranges[1][6:-1]) >= size // 4  # resumed, not restarted
    _answer(result.folder)


def test_a_second_pull_of_the_same_model_waits_its_turn(hub, tmp_path):
    """Two pulls of one model at once (two worker threads, the CLI beside the app) would
    write the same staging files and remove them under each other: the second is refused
    while the first's process lives; a lock its dead process left is taken over."""
    lock = tmp_path / ".pull-Tiny-q4_k_m.lock"
    tmp_path.mkdir(exist_ok=True)
    lock.write_text(str(os.getpid()), encoding="utf-8")  # a pull running here now
    with pytest.raises(DownloadError, match="already being pulled"):
        pull(GGUF_REPO, tmp_path, endpoint=hub.url, progress=lambda e: None)
    assert lock.exists() and not (tmp_path / ".pull-Tiny-q4_k_m").exists()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    lock.write_text(gone, encoding="utf-8")  # left by a process that has ended
    result = pull(GGUF_REPO, tmp_path, endpoint=hub.url, progress=lambda e: None)
    assert result.folder.name == "Tiny-q4_k_m" and not lock.exists()


def test_a_server_error_keeps_what_was_downloaded_for_the_next_pull(hub, tmp_path):
    """A dropped connection, then a 503 when the pull is tried again: the part written
    before stays, and the third try continues from it instead of starting over."""
    size = (hub.repos[GGUF_REPO].files["Tiny-Q4_K_M.gguf"]).size
    hub.drop_after["Q4_K_M.gguf"] = size // 2
    with pytest.raises(DownloadError):
        pull(GGUF_REPO, tmp_path, endpoint=hub.url, progress=lambda e: None)
    hub.fail_once["Q4_K_M.gguf"] = 503
    with pytest.raises(DownloadError):
        pull(GGUF_REPO, tmp_path, endpoint=hub.url, progress=lambda e: None)
    assert (tmp_path / ".pull-Tiny-q4_k_m").exists()  # the part survived the 503
    result = pull(GGUF_REPO, tmp_path, endpoint=hub.url, progress=lambda e: None)
    last = hub.ranges("Q4_K_M.gguf")[-1]
    assert last is not None and int(last[6:-1]) >= size // 4  # continued, not restarted
    _answer(result.folder)


def test_a_corrupt_file_is_refused_and_removed(hub, tmp_path):
    hub.corrupt.add("Q4_K_M.gguf")
    with pytest.raises(DownloadError, match="failed verification"):
        pull(GGUF_REPO, tmp_path, endpoint=hub.url, progress=lambda e: None)
    assert list(tmp_path.iterdir()) == []  # no model folder, no staging folder, no part


def test_a_full_disk_is_refused_before_the_first_byte(hub, tmp_path):
    # a full disk is stood for by the free-space function pull() takes (the tests cannot
    # mount a small file system): 10 kB free
    with pytest.raises(DownloadError, match="disk full") as err:
        pull(GGUF_REPO, tmp_path, endpoint=hub.url, progress=lambda e: None,
             free_space=lambda folder: 10_000)
    assert "free" in err.value.message
    assert _whole_file_gets(hub, ".gguf") == []
    assert list(find_model_dirs(tmp_path)) == []


def test_a_repo_with_nothing_this_engine_runs_says_so_and_why(hub, tmp_path):
    with pytest.raises(NotSupported) as err:
        pull(UNSUPPORTED_REPO, tmp_path, endpoint=hub.url, progress=lambda e: None)
    message = err.value.message
    assert "holds nothing this engine runs" in message and ".safetensors" in message
    assert "GGUF" in message and "ONNX" in message
    with pytest.raises(NotSupported, match="neither a catalog name nor a repository"):
        pull("no such thing", tmp_path, endpoint=hub.url, progress=lambda e: None)


def test_variants_read_sizes_from_the_hub_and_label_each(hub):
    found = variants(GGUF_REPO, endpoint=hub.url, bandwidth=1e10)
    assert [v.quant for v in found] == ["Q4_0", "Q4_K_M", "Q6_K", "Q8_0"]
    sizes = {f.path: f.size for f in hub.repos[GGUF_REPO].files.values()}
    assert all(v.download_bytes == sizes[v.path] for v in found)
    assert all(v.fit.label == FITS and v.fit.tokens_per_second for v in found)


def test_cli_pull_gives_a_folder_that_generate_answers_from(hub, tmp_path):
    env = {"HF_ENDPOINT": hub.url, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path),
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    models = tmp_path / "models"
    done = subprocess.run([sys.executable, "-m", "engine", "pull", GGUF_REPO, "--models-dir",
                           str(models)], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert "Q4_K_M" in done.stdout and "downloading" in done.stderr
    folder = models / "Tiny-q4_k_m"
    answer = subprocess.run([sys.executable, "-m", "engine", "generate", "--model",
                             str(folder), "--prompt", "hello", "--max-new-tokens", "4"],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip()


def test_a_cancelled_pull_leaves_no_model_and_the_next_one_continues(hub, tmp_path):
    from engine.hub.download import DownloadCancelled

    hub.chunk, hub.delay_s = 16 * 1024, 0.01
    seen = []

    def cancel_midway() -> bool:
        seen.append(1)
        return len(seen) > 8

    with pytest.raises(DownloadCancelled):
        pull(GGUF_REPO, tmp_path, endpoint=hub.url, progress=lambda e: None,
             cancelled=cancel_midway)
    assert list(find_model_dirs(tmp_path)) == []
    assert [p.name for p in tmp_path.iterdir()] == [".pull-Tiny-q4_k_m"]  # kept to resume
    hub.delay_s = 0.0
    result = pull(GGUF_REPO, tmp_path, endpoint=hub.url, progress=lambda e: None)
    ranges = _whole_file_gets(hub, "Q4_K_M.gguf")
    assert ranges[0] is None and ranges[-1] is not None  # the second asked for the rest
    assert [p.name for p in tmp_path.iterdir()] == [result.folder.name]


def test_an_onnx_repo_is_taken_as_it_is(tmp_path):
    from tests.engine.hub.repos import ONNX_REPO, onnx_repo
    from tests.forge import ForgeSpec

    with HubStandin({ONNX_REPO: onnx_repo(tmp_path / "repo", ForgeSpec())}) as standin:
        result = pull(ONNX_REPO, tmp_path / "models", endpoint=standin.url,
                      progress=lambda e: None)
    assert result.variant.format == "onnx" and result.folder.name == "tiny-onnx"
    assert "(fits)" in result.summary
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["tiny-onnx"]
    _answer(result.folder)
