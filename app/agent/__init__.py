"""mkcode.app.agent: the agent loop.

    client = InProcessClient(runtime.engine, runtime.tokenizer, ...)   # or OpenAICompatClient(url, model)
    registry = ToolRegistry(Workspace(cwd), mode="ask")
    agent = Agent(client, registry)
    async for event in agent.run("fix the failing test"):
        ...   # TextDelta, ToolCallStarted, ApprovalRequested (call .answer(...)), TurnFinished, ...
    agent.interrupt()                                                   # from a key binding

Nothing here imports torch at import time (the in-process client imports the engine lazily).
"""

from mkcode.app.agent.client import (
    ChatRequest,
    EngineClient,
    MalformedOutput,
    ModelDone,
    ModelEvent,
    ReasoningChunk,
    TextChunk,
    ToolCallBegin,
    ToolCallReady,
)
from mkcode.app.agent.config import AgentConfig
from mkcode.app.agent.events import (
    AgentError,
    AgentEvent,
    ApprovalRequested,
    Notice,
    ReasoningDelta,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    TurnFinished,
    Usage,
)
from mkcode.app.agent.loop import Agent
from mkcode.app.agent.session import Session

__all__ = [
    "Agent",
    "AgentConfig",
    "AgentError",
    "AgentEvent",
    "ApprovalRequested",
    "ChatRequest",
    "EngineClient",
    "InProcessClient",
    "MalformedOutput",
    "ModelDone",
    "ModelEvent",
    "Notice",
    "OpenAICompatClient",
    "ReasoningChunk",
    "ReasoningDelta",
    "Session",
    "TextChunk",
    "TextDelta",
    "ToolCallBegin",
    "ToolCallFinished",
    "ToolCallReady",
    "ToolCallStarted",
    "TurnFinished",
    "Usage",
]


def __getattr__(name: str):  # lazy: the clients pull in httpx / the engine only when used
    if name == "InProcessClient":
        from mkcode.app.agent.inprocess import InProcessClient

        return InProcessClient
    if name == "OpenAICompatClient":
        from mkcode.app.agent.openai_compat import OpenAICompatClient

        return OpenAICompatClient
    raise AttributeError(name)
