"""mkcode.tools: the tools the model calls, their sandbox and permission policy.

No torch and no Textual in here (DESIGN §2)."""
