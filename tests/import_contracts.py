"""A custom import-linter contract: no module takes another module's private names.

import-linter checks which modules import which; this contract also reads *what* they import.
``from ..capture.joint import _storage_key`` in ``remat/solvers/x.py`` breaks it: a helper two
modules need is public, and where two folders need it, it lives in the lower of the two. The one
exception: a package's ``__init__`` may re-export its own modules' names (``remat.models`` keeps
the old zoo's ``_BUILDERS``). Every ``from ... import`` statement counts, also those inside
functions.

    [[tool.importlinter.contracts]]
    type = "private_names"
    containers = ["remat"]
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from importlinter import Contract, ContractCheck, fields, output


def _source_files(package: str) -> dict[str, Path]:
    """module name -> its file, for every module of ``package`` (without importing it)."""
    root = Path(importlib.util.find_spec(package).origin).parent
    modules = {}
    for path in root.rglob("*.py"):
        parts = (package, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _folder(module: str, modules: dict[str, Path]) -> str:
    """The package a module lives in (a package's ``__init__`` lives in the package itself)."""
    return module if modules[module].name == "__init__.py" else module.rpartition(".")[0]


def _private_imports(module: str, modules: dict[str, Path]):
    """(line, imported module, name) for each private name ``module`` imports from remat."""
    tree = ast.parse(modules[module].read_text(), filename=str(modules[module]))
    package = _folder(module, modules)
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        for alias in node.names:
            name = alias.name
            if f"{target}.{name}" in modules or not name.startswith("_") or name.startswith("__"):
                continue
            if target in modules:
                yield node.lineno, target, name


class PrivateNamesContract(Contract):
    """Broken by each ``from X import _name`` of another module (see the module docstring)."""

    type_name = "private_names"

    containers = fields.ListField(subfield=fields.StringField())

    def check(self, graph, verbose: bool) -> ContractCheck:
        broken = []
        for container in self.containers:  # type: ignore[attr-defined]
            modules = _source_files(container)
            for module in sorted(modules):
                for line, target, name in _private_imports(module, modules):
                    reexport = modules[module].name == "__init__.py" and _folder(target, modules) == module
                    if not reexport:
                        broken.append(f"{module}:{line} imports {name} from {target}")
        return ContractCheck(kept=not broken, metadata={"broken": broken})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for line in check.metadata["broken"]:
            output.print_error(f"- {line}", bold=False)
        output.new_line()
        output.print("Make the helper public; where two folders need it, move it to the lower of the two.")
