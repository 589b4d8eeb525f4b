"""mkcode's plain line-mode REPL (`mkcode --plain`): prompt-toolkit input, rich output."""
