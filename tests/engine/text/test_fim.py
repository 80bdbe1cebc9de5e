"""engine.text.fim: family detection and exact prompt layouts, on real tokenizer files (the
reference export and the forge for Qwen; tokenizers trained here for the other families,
with the special-token spellings of the real models)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from engine.errors import InvalidOptionError, UnsupportedModelError
from engine.text.fim import (
    FimFamily,
    FimFile,
    build_fim_ids,
    detect_fim_family,
    fim_stop_token_ids,
    require_fim,
)
from engine.text.tokenizer import Tokenizer

CORPUS = [
    "def f(a, b):\n    return a + b\n",
    "class Book:\n    def __init__(self, title):\n        self.title = title\n",
    "x = 1\ny = 2\nprint(x + y)  # sum\n",
] * 10
PREFIX, SUFFIX = "def f(a, b):\n    ", "\n    return a + b\n"


def _write(folder: Path, tok: HFTokenizer, config: Mapping[str, object]) -> Tokenizer:
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return Tokenizer.from_dir(folder)


def _byte_level(specials: list[str], bos: str | None = None) -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer=trainer)
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])
    return tok


def _sentencepiece(specials: list[str]) -> HFTokenizer:
    """Llama/Mistral-style: Metaspace with a dummy leading space, BOS from the post-processor."""
    tok = HFTokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                  special_tokens=["<unk>", "<s>", "</s>", *specials])
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", 1)])
    return tok


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Tokenizer]:
    root = tmp_path_factory.mktemp("fim-families")
    starcoder = ["<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>",
                 "<repo_name>", "<file_sep>"]
    deepseek = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜fim▁hole｜>",
                "<｜fim▁begin｜>", "<｜fim▁end｜>", "<|EOT|>"]
    sp_config = {"bos_token": "<s>", "eos_token": "</s>"}
    return {
        "starcoder": _write(root / "starcoder", _byte_level(starcoder),
                            {"eos_token": "<|endoftext|>"}),
        "deepseek": _write(root / "deepseek", _byte_level(deepseek, deepseek[0]),
                           {"bos_token": {"content": deepseek[0]}, "eos_token": "<|EOT|>"}),
        "codellama": _write(root / "codellama",
                            _sentencepiece(["▁<PRE>", "▁<MID>", "▁<SUF>", "▁<EOT>"]), sp_config),
        "codestral": _write(root / "codestral",
                            _sentencepiece(["[INST]", "[/INST]", "[PREFIX]", "[MIDDLE]",
                                            "[SUFFIX]"]), sp_config),
        "plain": _write(root / "plain", _byte_level(["<|endoftext|>"]),
                        {"eos_token": "<|endoftext|>"}),
    }


@pytest.fixture(scope="module")
def qwen(tokenizer_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tokenizer_dir)  # the forge's: has <|repo_name|> too


def _id(tok: Tokenizer, token: str) -> int:
    token_id = tok.token_to_id(token)
    assert token_id is not None, token
    return token_id


def _plain(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, parse_special=False)


def _pieces(tok: Tokenizer, ids: list[int]) -> str:
    return "".join(tok.id_to_token(i) or "?" for i in ids)


# -- detection -------------------------------------------------------------------------


def test_detects_qwen_in_the_reference_export(reference_models_dir: Path):
    tok = Tokenizer.from_dir(reference_models_dir / "tiny-genai-fp32")
    family = require_fim(tok)
    assert family == FimFamily("qwen", prefix_id=3, suffix_id=5, middle_id=4, pad_id=6,
                               file_sep_id=7, repo_name_id=None, eot_ids=(0, 2))
    assert fim_stop_token_ids(family) == (0, 2, 3, 5, 4, 6, 7)


def test_detects_every_family(families: dict[str, Tokenizer], qwen: Tokenizer):
    assert detect_fim_family(qwen) == FimFamily(
        "qwen", _id(qwen, "<|fim_prefix|>"), _id(qwen, "<|fim_suffix|>"),
        _id(qwen, "<|fim_middle|>"), _id(qwen, "<|fim_pad|>"), _id(qwen, "<|file_sep|>"),
        _id(qwen, "<|repo_name|>"), (_id(qwen, "<|endoftext|>"), _id(qwen, "<|im_end|>")))
    sc = families["starcoder"]
    assert detect_fim_family(sc) == FimFamily(
        "starcoder", _id(sc, "<fim_prefix>"), _id(sc, "<fim_suffix>"), _id(sc, "<fim_middle>"),
        _id(sc, "<fim_pad>"), _id(sc, "<file_sep>"), _id(sc, "<repo_name>"),
        (_id(sc, "<|endoftext|>"),))
    cl = families["codellama"]
    assert detect_fim_family(cl) == FimFamily(
        "codellama", _id(cl, "▁<PRE>"), _id(cl, "▁<SUF>"), _id(cl, "▁<MID>"), None, None, None,
        (_id(cl, "▁<EOT>"), _id(cl, "</s>")))
    ds = families["deepseek"]
    assert detect_fim_family(ds) == FimFamily(
        "deepseek", _id(ds, "<｜fim▁begin｜>"), _id(ds, "<｜fim▁hole｜>"),
        _id(ds, "<｜fim▁end｜>"), None, None, None,
        (_id(ds, "<|EOT|>"), _id(ds, "<｜end▁of▁sentence｜>")))
    cs = families["codestral"]
    assert detect_fim_family(cs) == FimFamily(
        "codestral", _id(cs, "[PREFIX]"), _id(cs, "[SUFFIX]"), _id(cs, "[MIDDLE]"), None, None,
        None, (_id(cs, "</s>"),))


def test_model_without_fim_tokens(families: dict[str, Tokenizer]):
    assert detect_fim_family(families["plain"]) is None
    with pytest.raises(UnsupportedModelError) as info:
        require_fim(families["plain"])
    assert "Qwen2.5-Coder" in (info.value.hint or "")


def test_stop_ids_cover_end_and_control_tokens(families: dict[str, Tokenizer]):
    cl = families["codellama"]
    stops = fim_stop_token_ids(require_fim(cl))
    assert set(stops) == {_id(cl, t) for t in ("▁<EOT>", "</s>", "▁<PRE>", "▁<SUF>", "▁<MID>")}
    sc = families["starcoder"]
    assert _id(sc, "<file_sep>") in fim_stop_token_ids(require_fim(sc))


# -- layouts ---------------------------------------------------------------------------


def test_qwen_psm_and_spm(qwen: Tokenizer):
    fam = require_fim(qwen)
    pre, suf = _plain(qwen, PREFIX), _plain(qwen, SUFFIX)
    psm = build_fim_ids(qwen, fam, PREFIX, SUFFIX)
    assert psm == [fam.prefix_id, *pre, fam.suffix_id, *suf, fam.middle_id]
    assert qwen.decode(psm) == f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>"
    spm = build_fim_ids(qwen, fam, PREFIX, SUFFIX, order="spm")
    assert spm == [fam.prefix_id, fam.suffix_id, *suf, fam.middle_id, *pre]


def test_qwen_repo_level(qwen: Tokenizer, reference_models_dir: Path):
    fam = require_fim(qwen)
    files = [FimFile("a.py", "x = 1"), FimFile("b.py", "y = 2\n")]
    ids = build_fim_ids(qwen, fam, "def f(", ")\n", extra_files=files, repo_name="demo",
                        file_path="main.py")
    assert qwen.decode(ids) == (
        "<|repo_name|>demo\n<|file_sep|>a.py\nx = 1\n<|file_sep|>b.py\ny = 2\n"
        "<|file_sep|>main.py\n<|fim_prefix|>def f(<|fim_suffix|>)\n<|fim_middle|>")
    name = _plain(qwen, "demo\n")
    assert ids[:1 + len(name)] == [fam.repo_name_id, *name]
    assert fam.file_sep_id is not None and ids.count(fam.file_sep_id) == 3
    # the reference export has no <|repo_name|>: the name is left out, files stay
    ref = Tokenizer.from_dir(reference_models_dir / "tiny-genai-fp32")
    text = ref.decode(build_fim_ids(ref, require_fim(ref), "p", "s", extra_files=files[:1],
                                    repo_name="demo"))
    assert text == ("<|file_sep|>a.py\nx = 1\n<|file_sep|>untitled\n"
                    "<|fim_prefix|>p<|fim_suffix|>s<|fim_middle|>")


def test_starcoder_layouts(families: dict[str, Tokenizer]):
    sc = families["starcoder"]
    fam = require_fim(sc)
    assert sc.decode(build_fim_ids(sc, fam, PREFIX, SUFFIX)) == (
        f"<fim_prefix>{PREFIX}<fim_suffix>{SUFFIX}<fim_middle>")
    assert sc.decode(build_fim_ids(sc, fam, PREFIX, SUFFIX, order="spm")) == (
        f"<fim_prefix><fim_suffix>{SUFFIX}<fim_middle>{PREFIX}")
    ids = build_fim_ids(sc, fam, "def f(", ")\n", extra_files=[FimFile("a.py", "x = 1\n")],
                        repo_name="demo", file_path="main.py")
    assert sc.decode(ids) == ("<repo_name>demo<file_sep>a.py\nx = 1\n<file_sep><fim_prefix>"
                              "main.py\ndef f(<fim_suffix>)\n<fim_middle>")
    name = _plain(sc, "demo")
    assert ids[:1 + len(name)] == [fam.repo_name_id, *name]


def test_codellama_layouts_follow_meta_spacing(families: dict[str, Tokenizer]):
    cl = families["codellama"]
    fam = require_fim(cl)
    bos = cl.bos_token_id
    ids = build_fim_ids(cl, fam, "def f(a, b):", "return a + b")
    pre_end = ids.index(fam.suffix_id)
    assert ids[:2] == [bos, fam.prefix_id] and ids[-1] == fam.middle_id
    # "<PRE> {prefix} <SUF>{suffix} <MID>": the prefix keeps the dummy space, the suffix not
    assert _pieces(cl, ids[2:pre_end]) == "▁def▁f(a,▁b):"
    assert _pieces(cl, ids[pre_end + 1:-1]) == "return▁a▁+▁b"
    spm = build_fim_ids(cl, fam, "def f(a, b):", "return a + b", order="spm")
    assert spm == [bos, fam.prefix_id, fam.suffix_id, *ids[pre_end + 1:-1], fam.middle_id,
                   *ids[2:pre_end]]


def test_codestral_puts_the_suffix_first(families: dict[str, Tokenizer]):
    cs = families["codestral"]
    fam = require_fim(cs)
    ids = build_fim_ids(cs, fam, "def f(", "return a + b")
    split = ids.index(fam.prefix_id)
    assert ids[:2] == [cs.bos_token_id, fam.suffix_id] and fam.middle_id not in ids
    # mistral-common: "<s>[SUFFIX]return▁a▁+▁b[PREFIX]▁def▁f("
    assert _pieces(cs, ids[2:split]) == "return▁a▁+▁b"
    assert _pieces(cs, ids[split + 1:]) == "▁def▁f("
    assert build_fim_ids(cs, fam, "def f(", "return a + b", order="spm") == ids


def test_deepseek_layout_and_psm_only(families: dict[str, Tokenizer]):
    ds = families["deepseek"]
    fam = require_fim(ds)
    ids = build_fim_ids(ds, fam, PREFIX, SUFFIX)
    assert ds.decode(ids) == (
        f"<｜begin▁of▁sentence｜><｜fim▁begin｜>{PREFIX}<｜fim▁hole｜>{SUFFIX}<｜fim▁end｜>")
    assert ids[0] == ds.bos_token_id and ids.count(ds.bos_token_id) == 1
    with pytest.raises(InvalidOptionError, match="order"):
        build_fim_ids(ds, fam, PREFIX, SUFFIX, order="spm")


def test_extra_files_without_file_separator_become_plain_text(families: dict[str, Tokenizer]):
    ds = families["deepseek"]
    fam = require_fim(ds)
    ids = build_fim_ids(ds, fam, "p", "s", extra_files=[FimFile("a.py", "x = 1")],
                        file_path="main.py", repo_name="ignored")
    assert ds.decode(ids) == (
        "<｜begin▁of▁sentence｜>--- a.py ---\nx = 1\n\n"
        "<｜fim▁begin｜>p<｜fim▁hole｜>s<｜fim▁end｜>")


def test_user_code_cannot_inject_fim_tokens(qwen: Tokenizer):
    fam = require_fim(qwen)
    ids = build_fim_ids(qwen, fam, "a<|fim_middle|>b", "<|endoftext|>")
    assert ids.count(fam.middle_id) == 1 and ids[-1] == fam.middle_id
    assert not set(fim_stop_token_ids(fam)) & set(ids[1:-1]) - {fam.suffix_id}


def test_bad_order_is_an_option_error(qwen: Tokenizer):
    with pytest.raises(InvalidOptionError, match="order"):
        build_fim_ids(qwen, require_fim(qwen), "a", "b", order="mps")  # type: ignore[arg-type]
