"""Many requests on one engine: the `scheduler` (priorities, batching, preemption), the
view of the engine it works through (`core`: `EngineCore`, `Preemptor`), and `pressure`
relief (freeing KV and shrinking buffers when a memory limit is reached). Above the token
loop, the KV store and the memory governor, below the `Engine` facade that owns them."""
