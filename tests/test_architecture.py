"""The house's rules that import-linter does not see: sizes, and the old module names users typed.

The layer contract itself (no upward import, no circle, no private name across folders) is
checked by ``lint-imports`` in ``make test`` (pyproject.toml, tests/import_contracts.py).
"""

import importlib
import pathlib

import pytest

import remat

PACKAGE = pathlib.Path(remat.__file__).parent
MAX_TOP_LEVEL_MODULES = 10
MAX_MODULE_LINES = 700


def test_at_most_ten_modules_at_the_top_level():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_no_module_is_longer_than_700_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long


def test_every_folder_says_what_it_owns_and_imports():
    for init in PACKAGE.glob("*/__init__.py"):
        doc = importlib.import_module(f"remat.{init.parent.name}").__doc__ or ""
        assert "import" in doc and len(doc.splitlines()) >= 3, init.parent.name


@pytest.mark.parametrize("old", sorted(remat.MOVED))
def test_an_old_module_name_is_the_module_it_moved_to(old):
    module = importlib.import_module(old)
    assert module is importlib.import_module(remat.MOVED[old])
    assert module.__name__ == remat.MOVED[old] and module.__spec__.name == remat.MOVED[old]


def test_old_names_work_as_users_wrote_them():
    from remat import zoo  # noqa: F401  (as the tests and benchmarks of earlier releases did)
    from remat.viz import plot_timeline
    from remat.tools.plots import plot_timeline as moved

    assert plot_timeline is moved and remat.zoo is remat.models and remat.planner.make_plan is not None
    with pytest.raises(AttributeError):
        remat.no_such_module
