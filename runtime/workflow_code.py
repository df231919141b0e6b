"""The workflow modules' code, read from disk once per worker process.

The sandbox imports a workflow's modules afresh for each run, so each run has module state of
its own and the sandbox checks the modules' code as it executes. Each such import also found
the module's file again (a stat of its directory and of the file), read its bytecode and
unmarshalled it: for the job workflow's modules, about 0.7 ms of a plain job's run on the
worker's stack. `WorkflowCode`, in front of the import system, hands those imports the code
object it read the first time; the module is still created and executed anew in each sandbox,
with the same name, file and package path, so nothing but the reading is saved.

The code is the one on disk when the process first imported the module (a worker does not
reload its workflows; a deploy restarts it). A module that is not plain source on disk (no
`SourceFileLoader`) is left to the import system.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
import types
from collections.abc import Sequence


class _CodeLoader(importlib.abc.Loader):
    """Executes a module's code object read before."""

    def __init__(self, code: types.CodeType) -> None:
        self._code = code

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the import system's default module

    def exec_module(self, module: types.ModuleType) -> None:
        exec(self._code, module.__dict__)  # the module's own compiled source


class WorkflowCode(importlib.abc.MetaPathFinder):
    """Finds the modules of `package` (and the package itself) from code read once."""

    def __init__(self, package: str) -> None:
        self.package = package
        self._found: dict[str, tuple[importlib.machinery.ModuleSpec, types.CodeType]] = {}
        self._lock = threading.Lock()  # workflow activations run in the SDK's thread pool

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.package and not fullname.startswith(self.package + "."):
            return None
        with self._lock:
            found = self._found.get(fullname)
            if found is None:
                spec = importlib.machinery.PathFinder.find_spec(fullname, path)
                if spec is None or not isinstance(
                    spec.loader, importlib.machinery.SourceFileLoader
                ):
                    return None  # the import system's own way
                code = spec.loader.get_code(fullname)
                if code is None:
                    return None
                found = self._found[fullname] = (spec, code)
        spec, code = found
        out = importlib.machinery.ModuleSpec(
            fullname,
            _CodeLoader(code),
            origin=spec.origin,
            is_package=spec.submodule_search_locations is not None,
        )
        if spec.submodule_search_locations is not None:
            out.submodule_search_locations = list(spec.submodule_search_locations)
        out.cached = spec.cached
        out.has_location = spec.has_location
        return out


def install(package: str = "workflows") -> WorkflowCode:
    """The finder for `package`, first on `sys.meta_path` (once per process)."""
    for finder in sys.meta_path:
        if isinstance(finder, WorkflowCode) and finder.package == package:
            return finder
    finder = WorkflowCode(package)
    sys.meta_path.insert(0, finder)
    return finder
