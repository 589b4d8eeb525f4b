"""mkcode.backend.turn: one chat turn, from messages to a stream of typed events.

`events` is the one event vocabulary of a model turn (shared by the parser, the server and the
agent); `pipeline.TurnPipeline` renders the prompt off the event loop, applies the tool-call grammar,
runs the engine request and turns its text into those events. The server's endpoints and the
agent's in-process client are thin adapters over it. Modules are imported where used: this package
init stays empty so that torch-free users (the agent's event types) pay for nothing else.
"""
