"""The worker loads a folder made by ``import-gguf`` like any other model folder, and
answers a chat with it (a real server on loopback, the ``openai`` client)."""

from __future__ import annotations

from pathlib import Path

import openai
from gguf import GGMLQuantizationType as QT

from engine.model.gguf import import_gguf
from tests.engine.model.gguf_forge import TinySpec, tokenizer_source, write_gguf
from tests.engine.server.live import serve


def test_worker_loads_an_imported_gguf_folder_and_chats(tmp_path: Path):
    gguf = write_gguf(tmp_path / "tiny.gguf", TinySpec("qwen2", QT.Q4_0),
                      tokenizer_source(tmp_path))
    root = tmp_path / "models"
    import_gguf(gguf, root / "tiny-gguf")
    live = serve(None, root)
    try:
        with live.admin() as admin:
            loaded = admin.post("/v1/models/load", json={"model": str(root / "tiny-gguf")})
            assert loaded.status_code == 200, loaded.text
            model_id = loaded.json()["id"]
            assert model_id.endswith("tiny-gguf")
        client = openai.OpenAI(base_url=live.url + "/v1", api_key="x")
        answer = client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "hello"}], max_tokens=5,
            temperature=0)
        assert answer.choices[0].finish_reason in ("length", "stop")
        assert answer.usage is not None and answer.usage.completion_tokens >= 1
    finally:
        live.stop()
