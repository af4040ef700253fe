import json

import pytest

from tests.gpu.support import BUILT, gpu_skip_reason


@pytest.fixture(scope="session")
def manifest() -> list[dict]:
    reason = gpu_skip_reason()
    if reason:
        pytest.skip(reason)
    return json.loads((BUILT / "manifest.json").read_text())
