"""nnsight's trace body for the cache benchmarks: nnsight compiles a `with` block from its source
file, so the trace lives in a module of its own."""

from __future__ import annotations

import nnsight


def trace_batch(model, x, stop: int) -> list:
    """The outputs of blocks 0..stop-1 of a wrapped GPT-2, the forward stopped after the last."""
    return trace_blocks(model, x, list(range(stop)))


def trace_blocks(model, x, blocks: list[int]) -> list:
    """The outputs of the given blocks (increasing) of a wrapped GPT-2, the forward stopped after the last."""
    with model.trace(x) as tracer:
        outs = nnsight.save([model.transformer.h[i].output for i in blocks])
        tracer.stop()
    return [o[0] if isinstance(o, tuple) else o for o in outs]
