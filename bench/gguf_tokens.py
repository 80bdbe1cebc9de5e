"""``import-gguf``'s rebuilt tokenizers against llama.cpp's own, on GGUF vocabularies made
here: a SentencePiece-style ("llama": pieces and scores, byte fallback) one trained on this
repository's docs and Python's standard library, and the forge's byte-level BPE ("gpt2",
the qwen2 split). Both tokenize held-out text; the token ids must be the same.

    .venv/bin/python -m bench.gguf_tokens [--peers-python .venv-peers/bin/python]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sysconfig
from pathlib import Path

from bench.gguf_agreement import REPO

_THEIRS = """
import json, sys
from llama_cpp import Llama
job = json.load(open(sys.argv[1]))
llm = Llama(model_path=job["gguf"], vocab_only=True, verbose=False)
print(json.dumps(llm.tokenize(job["text"].encode(), add_bos=job["bos"], special=False)))
"""


def spm_gguf(path: Path) -> Path:
    """A llama GGUF whose vocabulary is a SentencePiece BPE trained here (scores follow the
    merge order, as SentencePiece's do)."""
    from gguf import GGUFWriter
    from tokenizers import SentencePieceBPETokenizer

    texts = [(REPO / "README.md").read_text(), (REPO / "docs/INSTALL.md").read_text()]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts += [p.read_text(errors="ignore") for p in sorted(stdlib.glob("*.py"))[:60]]
    sp = SentencePieceBPETokenizer(add_prefix_space=True)
    sp.train_from_iterator(texts, vocab_size=3000, min_frequency=2, special_tokens=["<unk>"],
                           show_progress=False)
    vocab = json.loads(sp.to_str())["model"]["vocab"]
    pieces = [p for p, _ in sorted(vocab.items(), key=lambda kv: kv[1]) if p != "<unk>"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    w = GGUFWriter(str(path), "llama")
    for add, value in ((w.add_block_count, 1), (w.add_context_length, 128),
                       (w.add_embedding_length, 64), (w.add_feed_forward_length, 128),
                       (w.add_head_count, 4), (w.add_head_count_kv, 4)):
        add(value)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(pieces))
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(pieces))])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--peers-python", default=str(REPO / ".venv-peers/bin/python"))
    p.add_argument("--work", default=str(REPO / "bench/out/gguf_tokens"))
    args = p.parse_args()
    from engine.model.gguf import _Reader, _vocab
    from engine.model.gguf_tokenizer import build_tokenizer
    from tests.engine.model.gguf_forge import TinySpec, tokenizer_source, write_gguf

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    text = ((REPO / "docs/llamacpp-fields.md").read_text()
            + "\n  naïve café — 東京 \t tabs, ünïcödé 🙂 and 12345 digits\n")
    report = {}
    for kind, gguf in (("llama (SentencePiece)", spm_gguf(work / "spm.gguf")),
                       ("gpt2 (byte-level BPE)", write_gguf(work / "bpe.gguf", TinySpec(),
                                                            tokenizer_source(work)))):
        vocab = _vocab(_Reader(gguf))
        ours = build_tokenizer(vocab).encode(text).ids
        job = work / "job.json"
        job.write_text(json.dumps({"gguf": str(gguf), "text": text,
                                   "bos": vocab.model == "llama"}))
        done = subprocess.run([args.peers_python, "-c", _THEIRS, str(job)], check=True,
                              capture_output=True, text=True, timeout=600)
        theirs = json.loads(done.stdout.strip().splitlines()[-1])
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False))
                      if a != b), None)
        report[kind] = {"tokens": len(ours), "llama_cpp_tokens": len(theirs),
                        "identical": ours == theirs, "first_difference": first}
    (work / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
