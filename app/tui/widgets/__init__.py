"""The transcript's building blocks, the prompt and the status bar."""
