"""The front-end-neutral layer shared by the TUI, the plain REPL and one-shot mode: backend
selection, sessions on disk, undo snapshots, slash commands, `@file` mentions and the `Conversation`
controller. It never imports Textual nor `mkcode.app.tui` (import-linter contract in pyproject.toml).
"""
