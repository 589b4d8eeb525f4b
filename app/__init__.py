"""mkcode.app: everything a person touches (CLI, TUI, one-shot mode, the agent loop)."""
