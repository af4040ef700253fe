"""frostc's attention for vLLM V1: a `vllm.general_plugins` entry point registering the backend
`FROSTC` (`vllm serve MODEL --attention-backend FROSTC`, with `FROSTC_PLAN_SET` naming a set from
`frostc from-config CONFIG --engine vllm`). Tested against vLLM 0.32.0 (`VLLM_VERSION`).

    plans.py    the set, and the engine's settings checked against it   (no vLLM import)
    step.py     a step's metadata in the plans' slots                   (no vLLM import)
    launch.py   one layer through its kind's plan                        (no vLLM import)
    backend.py  vLLM's backend, metadata builder and impl classes
"""

VLLM_VERSION = "0.32.0"  # the version the plugin is tested against; pip install 'frost-runtime[vllm]'


def register() -> None:
    """vLLM calls this once per process (engine, workers): add FROSTC to its backend registry.
    Safe to call again (vLLM refuses a name registered twice)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    from frost_vllm.backend import NAME

    if NAME not in AttentionBackendEnum.__members__:
        register_backend(NAME, "frost_vllm.backend.FrostcBackend")
