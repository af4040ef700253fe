"""How a call is timed on the GPU: the one implementation behind `python -m frost_runtime bench`
and every bench/ script (bench/common.py builds on it; the runtime cannot import bench/).

- device time, `device_us`: CUDA events around a settled window. WARMUP calls, then the step
  (GRAPH_CALLS calls, eager or replayed from a CUDA graph) is timed once to learn its length;
  then SETTLE_S seconds of back-to-back steps, then as many steps as fill the window, with no
  pause between the two.
- host time, `host_us`: perf_counter around bursts of BURST calls, each from a drained queue.

Why the device window is so long: under sustained tensor-core load the H200 runs at its power
cap, and the SM clock swings between about 1.4 and 1.7 GHz from one 25 ms sample to the next
while the cap's controller follows the power of whatever ran just before (bench/NOTES.md, "the
benchmark's method"). A window of tens of ms samples that swing; settling on the call's own load
and averaging over several hundred ms measures the steady state a serving GPU is in, the same
for every contestant. Graph replays keep a contestant's host launch cost (tens of µs for torch
SDPA) out of the device time, where it would otherwise dominate at short sequences.
"""

import math
import statistics
import time

SETTLE_S = 0.2  # seconds of the call's own load before the timed window
WINDOW_S = 0.4  # seconds of the timed window (`python -m frost_runtime bench --duration`'s default)
GRAPH_CALLS = 20  # calls per timed step (per CUDA graph)
WARMUP = 10  # calls before anything is timed (or captured)
BURST = 64  # host calls per burst


def elapsed_ms(step, times: int = 1) -> float:
    """Device milliseconds of `times` back-to-back calls of `step`, between two CUDA events on
    torch's current stream."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(times):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def device_us(
    call,
    window_s: float = WINDOW_S,
    graph: bool = False,
    calls: int = GRAPH_CALLS,
    settle_s: float = SETTLE_S,
    warmup: int = WARMUP,
) -> tuple[float, int]:
    """Device microseconds per call over a settled window, and how many calls it timed. With
    `graph`, the calls are replayed from a CUDA graph of `calls` calls."""
    import torch

    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    if graph:
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            for _ in range(calls):
                call()
        step = captured.replay
    else:

        def step():
            for _ in range(calls):
                call()

    step_s = max(elapsed_ms(step) * 1e-3, 1e-6)
    for _ in range(math.ceil(settle_s / step_s)):
        step()
    steps = max(10, math.ceil(window_s / step_s))
    return elapsed_ms(step, steps) * 1e3 / (steps * calls), steps * calls


def host_us(call, bursts: int, burst: int = BURST) -> tuple[float, float]:
    """(median, least) host microseconds per call over `bursts` bursts of `burst` calls, each
    from a drained queue."""
    import torch

    samples = []
    for _ in range(bursts):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(burst):
            call()
        samples.append((time.perf_counter() - start) / burst * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples), min(samples)
