"""Schema-driven fuzzing of every endpoint, in-process (ASGI), on the tiny checkpoint: schemathesis
reads /openapi.json, generates valid and invalid requests for each operation (fixed seed, a bounded
number of examples) and fails on any 5xx or any answer that breaks the documented response schema.

The served context is tiny (96 tokens) and the default output cap small, so a generated request
decodes a few dozen tokens at most whatever `max_tokens` it names.
"""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import response_schema_conformance  # noqa: E402

from mkcode.backend.runtime import RuntimeOptions, build_runtime  # noqa: E402
from mkcode.backend.server import ServerOptions, create_app  # noqa: E402
from tests.backend.checkpoint.tiny import tiny_checkpoint  # noqa: E402

EXAMPLES = 100  # per operation and generation mode
CONTEXT = 96


@pytest.fixture(scope="module")
def schema(tmp_path_factory):
    path = tiny_checkpoint(tmp_path_factory.mktemp("ckpt-fuzz"), seed=0)
    rt = build_runtime(
        RuntimeOptions(model=path, device="cpu", progress=False, kv_memory_gb=0.02, max_model_len=CONTEXT)
    )
    app = create_app(rt, options=ServerOptions(served_model_name="tiny", default_max_tokens=8))
    yield schemathesis.openapi.from_asgi("/openapi.json", app)
    rt.close()


def _operations(schema) -> list:
    return [result.ok() for result in schema.get_all_operations()]


def _fuzzer(op, generation, seen: dict[str, set[int]]):
    @given(case=op.as_strategy(generation_mode=generation))
    @settings(
        max_examples=EXAMPLES,
        derandomize=True,  # a fixed seed: the same cases on every run
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case):
        response = case.call_and_validate(checks=[not_a_server_error, response_schema_conformance])
        seen.setdefault(op.label, set()).add(response.status_code)

    return fuzz


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_no_server_errors_and_documented_responses(schema, mode, caplog):
    operations = _operations(schema)
    labels = {op.label for op in operations}
    assert {"POST /v1/chat/completions", "POST /v1/completions", "POST /v1/responses"} <= labels
    generation = schemathesis.GenerationMode(mode)
    seen: dict[str, set[int]] = {}
    for op in operations:
        if mode == "negative" and op.method.upper() != "POST":
            continue  # nothing to make invalid: no body, and any string is a model id
        _fuzzer(op, generation, seen)()
    # no error escaped a handler, not even inside a stream already answered with 200
    assert not [r.getMessage() for r in caplog.records if r.name == "mkcode.server"]
    # the fuzz reached the handlers: valid requests were answered, invalid ones refused with a 400
    posts = [label for label in seen if label.startswith("POST")]
    assert len(posts) == 3, seen
    for label in posts:
        assert (200 in seen[label]) if mode == "positive" else (400 in seen[label]), (label, seen[label])
