import json

import pytest

from tests.gpu.support import BUILT, built_manifest_entries, gpu_skip_reason


@pytest.fixture(scope="session")
def manifest() -> list[dict]:
    reason = gpu_skip_reason()
    if reason:
        pytest.skip(reason)
    return json.loads((BUILT / "manifest.json").read_text())


@pytest.fixture(scope="module")
def small_dense_case(manifest) -> dict:
    """The cheapest dense plan with LSE (a single launch): for tests about the runtime, not the
    kernel."""
    found = [c for c in built_manifest_entries() if c["form"] == "dense" and c["lse"] and c["softcap"] is None]
    found = min(found, key=lambda c: c["batch"] * c["heads_q"] * c["seq_q"] * c["seq_kv"], default=None)
    if found is None:
        pytest.skip("no dense plan with LSE among the built plans")
    return found
