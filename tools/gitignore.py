"""Git's ignore rules for the file walks (grep's Python search): which workspace paths a
`.gitignore` excludes, as ripgrep decides when it searches a git repository.

Rules come from `.git/info/exclude` and every `.gitignore` from the repository's root down to a
path's folder; each file's patterns are relative to its folder and matched with gitignore
semantics (pathspec's GitIgnoreSpec); a deeper file's match overrides a shallower one, and a path
inside an ignored folder is ignored whatever the deeper files say (git never reads them). Outside a
git repository nothing is ignored (ripgrep's default). The repository root is looked for from the
walk's start up to the workspace root holding it; rules above the workspace root are not read.

Ignore files are read through directory descriptors (fdwalk), never followed through a symlink, and
at most MAX_RULES_BYTES each.
"""

from __future__ import annotations

import os
import stat

import pathspec

from mkcode.tools import fdwalk
from mkcode.tools.workspace import PathError, Workspace

MAX_RULES_BYTES = 1 << 20
IGNORE_FILE = ".gitignore"


class GitIgnore:
    """Ignore rules for paths below `repo` (an absolute, symlink-free folder in the workspace)."""

    def __init__(self, ws: Workspace, repo: str | None) -> None:
        self.ws = ws
        self.repo = repo
        self._specs: dict[str, pathspec.GitIgnoreSpec | None] = {}  # folder rel to repo -> rules
        self._dirs: dict[str, bool] = {}  # folder rel to repo -> ignored
        self._exclude = self._load(os.path.join(repo, ".git", "info"), "exclude") if repo else None

    @classmethod
    def for_walk(cls, ws: Workspace, start: str) -> GitIgnore:
        """The rules for a walk from `start`: those of the git repository holding it, if any."""
        root = ws.root_of(start)
        d = start
        while root is not None:
            if os.path.lexists(os.path.join(d, ".git")):
                return cls(ws, d)
            if d == root or os.path.dirname(d) == d:
                break
            d = os.path.dirname(d)
        return cls(ws, None)

    def ignored(self, path: str, *, is_dir: bool = False) -> bool:
        """Is the absolute path `path` ignored? False outside the repository."""
        if self.repo is None:
            return False
        rel = os.path.relpath(path, self.repo)
        if rel == os.curdir or rel.startswith("../") or rel == "..":
            return False
        parts = rel.split("/")
        if parts[0] == ".git":
            return True
        for i in range(1, len(parts)):  # an ignored folder hides everything below it
            if self._dir_ignored("/".join(parts[:i])):
                return True
        return self._match(rel, is_dir)

    def _dir_ignored(self, rel: str) -> bool:
        known = self._dirs.get(rel)
        if known is None:
            known = self._dirs[rel] = self._match(rel, True)
        return known

    def _match(self, rel: str, is_dir: bool) -> bool:
        """The last word of the rules from the root's down to the path's own folder."""
        verdict: bool | None = None
        subject = rel + "/" if is_dir else rel
        if self._exclude is not None:
            verdict = self._exclude.check_file(subject).include
        parts = rel.split("/")
        for i in range(len(parts)):
            folder = "/".join(parts[:i])
            spec = self._spec(folder)
            if spec is None:
                continue
            found = spec.check_file("/".join(parts[i:]) + ("/" if is_dir else "")).include
            if found is not None:
                verdict = found
        return bool(verdict)

    def _spec(self, folder: str) -> pathspec.GitIgnoreSpec | None:
        if folder not in self._specs:
            assert self.repo is not None
            self._specs[folder] = self._load(os.path.join(self.repo, folder) if folder else self.repo)
        return self._specs[folder]

    def _load(self, folder: str, name: str = IGNORE_FILE) -> pathspec.GitIgnoreSpec | None:
        try:
            with fdwalk.open_dir(self.ws, folder) as dfd:
                fd = os.open(name, fdwalk.FILE_FLAGS, dir_fd=dfd)
        except (OSError, PathError):
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            data = os.read(fd, MAX_RULES_BYTES)
        except OSError:
            return None
        finally:
            os.close(fd)
        lines = data.decode("utf-8", "replace").splitlines()
        return pathspec.GitIgnoreSpec.from_lines(lines) if any(line.strip() for line in lines) else None
