"""The built-in tools the model can call."""

from mkcode.tools.builtin.edit_file import EditFile
from mkcode.tools.builtin.glob_files import Glob
from mkcode.tools.builtin.grep import Grep
from mkcode.tools.builtin.list_dir import ListDir
from mkcode.tools.builtin.read_file import ReadFile
from mkcode.tools.builtin.run_shell import RunShell
from mkcode.tools.builtin.write_file import WriteFile
from mkcode.tools.spec import Tool


def default_tools() -> list[Tool]:
    return [ReadFile(), ListDir(), Glob(), Grep(), EditFile(), WriteFile(), RunShell()]


__all__ = ["EditFile", "Glob", "Grep", "ListDir", "ReadFile", "RunShell", "WriteFile", "default_tools"]
