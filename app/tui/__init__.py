"""The Textual terminal UI. The front-end-neutral layer it shares with the plain REPL and one-shot
mode lives in `mkcode.app.core`; nothing is imported here so that importing a submodule stays light.
"""
