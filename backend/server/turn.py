"""The server's adapter over the turn pipeline: a chat request (from /v1/chat/completions or
/v1/responses, reduced to a `TurnRequest`) → a running `Turn`, with the pipeline's refusals as 400s.

Everything about the turn itself (rendering, grammar, parsing, stop / tool-call / cancel logic, the
event vocabulary) lives in `mkcode.backend.turn`; the endpoints only turn its events into their
wire formats.
"""

from __future__ import annotations

from typing import Any

from mkcode.backend.server.errors import APIError, bad_request
from mkcode.backend.server.limits import check_prompt_fits
from mkcode.backend.server.state import ServerState
from mkcode.backend.turn.pipeline import Turn, TurnPipeline
from mkcode.backend.turn.prepare import sampling_params as _sampling_params
from mkcode.backend.turn.request import TurnOptions, TurnRequest, TurnRequestError


def _bad(e: TurnRequestError) -> APIError:
    return bad_request(e.message, param=e.param, code=e.code)


def pipeline(state: ServerState) -> TurnPipeline:
    """The state's pipeline, built on first use (it keeps the prompt cache across requests). Tests
    may set `state.turn_pipeline` to a fake before the first request."""
    built = getattr(state, "turn_pipeline", None)
    if built is None:
        options = TurnOptions(
            default_sampling=state.options.default_sampling,
            forced_thinking_tokens=state.options.forced_thinking_tokens,
        )
        built = TurnPipeline(state.engine, state.tokenizer, options=options, grammars=state.grammars)
        state.turn_pipeline = built  # type: ignore[attr-defined]
    return built


async def start_turn(state: ServerState, request: TurnRequest, field: str) -> Turn:
    """Start a chat turn: the prompt is checked against the model's context first (a 400 naming
    the request's `field`), and a request without an output cap gets the server's default."""
    check_prompt_fits(state.tokenizer, state.max_model_len, [request.messages, request.tools], field)
    request.max_tokens = state.max_tokens(request.max_tokens)
    try:
        return await pipeline(state).start(request)
    except TurnRequestError as e:
        raise _bad(e) from None


def sampling_params(state: ServerState, prompt_len: int, **given: Any):
    """SamplingParams for /v1/completions (no chat template), refusals as 400s."""
    try:
        return _sampling_params(pipeline(state).options, state.max_model_len, prompt_len, **given)
    except TurnRequestError as e:
        raise _bad(e) from None


def submit(state: ServerState, request: Any) -> Any:
    """Queue a raw engine request (/v1/completions); the engine's refusals become 400s."""
    try:
        return pipeline(state).submit_request(request)
    except TurnRequestError as e:
        raise _bad(e) from None
