"""The one module that imports the compiled extension (`mk_native`); everything else goes through
`load()`. A test scans the source tree to keep it that way (docs/ENGINE.md, Layout)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from types import ModuleType

from mkcode.backend.megakernel import abi
from mkcode.backend.megakernel.build import BuildError, build, cached_artifact

_MODULE: ModuleType | None = None


class NativeUnavailable(RuntimeError):
    """The extension could not be built or loaded; the message says why."""


def load(build_if_missing: bool = True) -> ModuleType:
    global _MODULE
    if _MODULE is not None:
        return _MODULE
    path = cached_artifact()
    if path is None:
        if not build_if_missing:
            raise NativeUnavailable("the megakernel extension is not built (run `mkcode kernels build`)")
        try:
            path = build().path
        except BuildError as e:
            raise NativeUnavailable(str(e)) from None
    loader = importlib.machinery.ExtensionFileLoader("mk_native", str(path))
    spec = importlib.util.spec_from_file_location("mk_native", str(path), loader=loader)
    if spec is None:
        raise NativeUnavailable(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    try:
        loader.exec_module(mod)
    except ImportError as e:
        raise NativeUnavailable(f"cannot load {path}: {e}") from None
    if mod.ABI_VERSION != abi.MK_ABI_VERSION:
        raise NativeUnavailable(f"{path}: ABI {mod.ABI_VERSION}, sources say {abi.MK_ABI_VERSION}")
    _MODULE = mod
    return mod
