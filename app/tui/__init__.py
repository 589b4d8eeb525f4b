"""mkcode's terminal front ends.

`mkcode.app.tui.core` is the front-end-neutral layer (backend selection, sessions on disk, undo
snapshots, slash commands, `@file` mentions, the `Conversation` controller) shared by the Textual
app, the plain REPL and one-shot mode; it never imports Textual. `mkcode.app.tui.app` is the
Textual application. Nothing is imported here so that `import mkcode.app.tui.core` stays light.
"""
