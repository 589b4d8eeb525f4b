"""The front-end-neutral layer shared by the TUI, the plain REPL and one-shot mode (no Textual)."""
