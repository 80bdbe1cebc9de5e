"""An MTP head as a proposer: one guess per forward from the target's hidden state, verified
like every guess, so the output stays plain greedy's on every runner layout."""

import numpy as np
import pytest

from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest
from tests.forge import ForgeSpec, write_genai_model, write_static_model
from tests.forge.heads import write_f32, write_head, write_hidden_target

SPEC = ForgeSpec()
H, V = SPEC.hidden, SPEC.vocab
BSH: list[int | str] = ["batch", "seq", H]
PROMPT = [5, 17, 42, 99, 7, 300, 12]


def _head_block(model: str, **extra):
    return {"type": "mtp", "model": model, "hidden_size": H,
            "target_hidden_output": "hidden_states", **extra}


@pytest.fixture(scope="module", params=["genai", "optimum", "static", "recompute"])
def folder(request, tmp_path_factory):
    """A target of every layout exposing `hidden_states`, with a random MTP head beside it."""
    out = tmp_path_factory.mktemp(f"mtp-{request.param}")
    if request.param == "genai":
        out = write_genai_model(out, SPEC, hidden_output="hidden_states")
    elif request.param == "static":
        out = write_static_model(out, SPEC, hidden_output="hidden_states")
    else:
        out = write_hidden_target(out, SPEC, kv_cache=request.param == "optimum")
    write_head(out / "random.onnx", {"hidden_states": BSH, "inputs_embeds": BSH}, {"logits": V})
    write_f32(out / "embed.f32", V, H)
    return out


def _load(folder, head):
    return Engine.load(folder, EngineConfig(intra_op_threads=1, prefix_cache=False,
                                            speculative_head=head))


def _run(engine, prompt, mode, n=24):
    engine.runner.reset()
    options = GenerateOptions(temperature=0.0, stop_on_eos=False, max_new_tokens=n,
                              speculative_mode=mode)
    return engine.generate(GenerateRequest(token_ids=tuple(prompt), options=options))


def _oracle_head(engine, folder, prompt, n):
    """A head fitted to the target's own greedy trajectory after `prompt`: the hidden state
    of the position that chose token t+1 maps to token t+2. Right on that trajectory only if
    the proposer reads the right hidden row at every step."""
    answer = list(_run(engine, prompt, "none", n).token_ids)
    seq = [*prompt, *answer]
    runner = engine.runner
    runner.reset()
    runner.forward(np.asarray(seq[:-1], dtype=np.int64), all_logits=True)
    assert runner.last_hidden is not None
    rows = runner.last_hidden[len(prompt) - 1:len(seq) - 2]  # position j chose seq[j + 1]
    targets = np.zeros((len(rows), V), np.float32)
    targets[np.arange(len(rows)), seq[len(prompt) + 1:]] = 10.0
    weights = np.linalg.pinv(rows.astype(np.float64)) @ targets
    assert (np.argmax(rows @ weights, axis=1) == seq[len(prompt) + 1:]).all()
    write_head(folder / "oracle.onnx", {"hidden_states": BSH}, {"logits": V},
               weights={"logits": weights.astype(np.float32)})
    return answer


def test_a_head_that_guesses_right_doubles_tokens_per_forward(folder):
    engine = _load(folder, _head_block("random.onnx", embedding_weights="embed.f32"))
    answer = _oracle_head(engine, folder, PROMPT, 24)
    oracle = _load(folder, _head_block("oracle.onnx"))
    fast = _run(oracle, PROMPT, "mtp")
    assert list(fast.token_ids) == answer
    stats = fast.speculation
    assert stats is not None and stats.acceptance_rate > 0.9
    assert stats.tokens_per_forward > 1.8
    assert oracle.runner.tokens == [*PROMPT, *answer[:-1]]  # rejected guesses left no trace


def test_fifty_seeded_prompts_give_plain_greedy_tokens(folder):
    engine = _load(folder, _head_block("random.onnx", embedding_weights="embed.f32"))
    rng = np.random.default_rng(7)
    proposed = 0
    for _ in range(50):
        prompt = rng.integers(1, V, size=int(rng.integers(3, 20))).tolist()
        plain = _run(engine, prompt, "none", 16)
        fast = _run(engine, prompt, "mtp", 16)
        assert fast.token_ids == plain.token_ids, prompt
        assert engine.runner.tokens == [*prompt, *fast.token_ids[:-1]]
        assert fast.speculation is not None
        proposed += fast.speculation.proposed
    assert proposed >= 50 * 13  # a guess at nearly every step (not the first, not the last)


def test_mtp_runs_beside_other_requests_in_the_scheduler(folder):
    from engine.scheduling.scheduler import Scheduler

    engine = _load(folder, _head_block("random.onnx", embedding_weights="embed.f32"))
    scheduler = Scheduler(engine)
    boxes: dict[str, list] = {"mtp": [], "none": []}
    for mode, box in boxes.items():
        scheduler.submit(GenerateRequest(token_ids=tuple(PROMPT), options=GenerateOptions(
            temperature=0.0, stop_on_eos=False, max_new_tokens=12, speculative_mode=mode)),
            box.append)
    while scheduler.step():
        pass
    plain = _run(engine, PROMPT, "none", 12).token_ids
    assert boxes["mtp"][-1].result.token_ids == boxes["none"][-1].result.token_ids == plain


def test_a_loaded_head_runs_only_when_asked_for(folder):
    """Unlike the seed, a loaded head (or draft) is not adopted by default: the default
    ("auto") guesses by prompt lookup only, exactly as asking for prompt lookup does."""
    engine = _load(folder, _head_block("random.onnx", embedding_weights="embed.f32"))
    assert engine.mtp_head is not None
    assert GenerateOptions().speculative_mode == "auto"

    def stats(mode: str = "auto") -> tuple[int, int, int] | None:
        result = engine.generate(GenerateRequest(token_ids=tuple(PROMPT), options=(
            GenerateOptions(temperature=0.0, max_new_tokens=24, stop_on_eos=False,
                            speculative_mode=mode))))
        s = result.speculation
        return None if s is None else (s.proposed, s.accepted, s.forwards)

    head = stats("mtp")
    assert head is not None and head[0] > 0  # the head guesses when asked
    assert stats() != head
