"""The hand-off from a route to the engine thread: a generation becomes a job.

A route (``openai.chat_completions``, ``ollama.chat``, ``llamacpp.completion``...) parses
its dialect into a :class:`~engine.api.GenerateRequest` and calls
:func:`submit_generation` (through ``ServerContext.submit``). That is the whole hand-off:

- **What a job is**: a function ``job(cancel) -> Iterator[Chunk | Final]`` that runs one
  generation: ``generation_job`` (engine/server/generation.py) for a plain request,
  ``session_job`` (engine/server/sessions.py) for a chat turn of a named session. It finds
  the model's engine only when it starts (the model may have been unloaded while the job
  waited), yields one :class:`Chunk` per engine event and a last :class:`Final` (the
  result, the text, which limit or completion rule stopped it), and reports the final
  item to the metrics.
- **Who runs it**: the :class:`~engine.server.worker.EngineWorker`'s thread, the one
  thread that touches an engine (engine/server/worker.py). The job waits in its queue by
  priority; once running, each of the thread's rounds takes one item from every running
  job, so the engine's scheduler batches concurrent generations. A full queue raises
  ``QueueFullError`` here, at once, and the route answers 503 with ``Retry-After``.
- **How events come back**: ``submit_generation`` returns at once with a
  :class:`~engine.server.worker.JobHandle`. Each item the job yields is posted to the
  event loop (``loop.call_soon_threadsafe``) and read with ``async for item in handle``;
  an exception the job raised comes out of the iteration after its earlier items.
  engine/server/streaming.py reads handles for the routes (``first_item``, ``collect``,
  ``items_after``) and cancels them when the client leaves; ``handle.cancel()`` sets the
  job's cancel flag, which the engine checks once per token.
"""

from __future__ import annotations

from engine.engine import Engine, GenerateRequest
from engine.server.errors import from_exception
from engine.server.generation import Chunk, Final, Limits, generation_job
from engine.server.metrics import Metrics
from engine.server.models import LoadedModel, ModelManager
from engine.server.sessions import SessionRegistry, session_job
from engine.server.worker import EngineWorker, JobHandle, Priority

#: What a generation job yields, and so what its handle gives back.
Item = Chunk | Final


def submit_generation(worker: EngineWorker, models: ModelManager, sessions: SessionRegistry,
                      metrics: Metrics, model: LoadedModel, request: GenerateRequest, *,
                      limits: Limits = Limits(),  # noqa: B008
                      priority: Priority = "normal",
                      session: str | None = None) -> JobHandle[Item]:
    """Queue ``request`` as a job on the engine thread and return its handle at once; with
    ``session`` (a chat request) the job is a turn of that named session."""
    def engine_of() -> Engine:
        return models.engine_for(model)

    if session is not None and request.messages is not None:
        job = session_job(engine_of, sessions, session, request.messages,
                          request.options, on_final=metrics.observe_generation,
                          priority=priority, tools=request.tools,
                          template_kwargs=request.chat_template_kwargs)
    else:
        job = generation_job(engine_of, request, limits,
                             on_final=metrics.observe_generation, priority=priority)
    try:
        return worker.submit(job, priority)
    except Exception as exc:
        raise from_exception(exc) from exc
