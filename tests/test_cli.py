"""The ``remat`` command end to end (``remat.tools.cli.main``): every command on a tiny zoo model and on a
``module:factory`` model, each writing a PNG or JSON that is read back; and the one-line errors."""

import re

import matplotlib.image
import pytest

import remat
from remat.tools.cli import main, parse_budget

from .cli_models import tiny_mlp

FACTORY = "tests.cli_models:tiny_mlp"
MODELS = [pytest.param(["cnn_bn", "--size", "tiny"], id="zoo"), pytest.param([FACTORY], id="factory")]


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def assert_png(path):
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 100 and image.shape[1] > 100 and image[..., :3].std() > 0.01


# ---------------------------------------------------------------------------- commands


@pytest.mark.parametrize("model", MODELS)
def test_plan_saves_a_plan_that_loads_and_plots(model, tmp_path, capsys):
    saved = tmp_path / "plan.json"
    code, out, err = run(capsys, "plan", *model, "--budget", "0.95", "--solver", "rotor", "--save", saved)
    assert code == 0, err
    assert "Plan for" in out and "predicted peak" in out
    plan = remat.Plan.load(saved)
    assert plan.solver == "rotor" and plan.peak_bytes <= plan.budget_bytes

    code, out, err = run(capsys, "plot", saved, "--output", tmp_path / "timeline.png")
    assert code == 0, err
    assert_png(tmp_path / "timeline.png")
    code, out, err = run(capsys, "plot", saved, "--output", tmp_path / "schedule.svg", "--kind", "schedule")
    assert code == 0, err
    assert "<svg" in (tmp_path / "schedule.svg").read_text()


@pytest.mark.parametrize("model", MODELS)
def test_sweep_prints_the_front_and_plots_it(model, tmp_path, capsys):
    code, out, err = run(capsys, "sweep", *model, "--solvers", "rotor", "chen_sqrt", "--budgets", "1", "0.7",
                         "--output", tmp_path / "sweep.png")
    assert code == 0, err
    assert "rotor" in out and "chen_sqrt" in out and "100%" in out
    assert_png(tmp_path / "sweep.png")


@pytest.mark.parametrize("model", MODELS)
def test_bench_measures_planned_against_eager(model, tmp_path, capsys):
    code, out, err = run(capsys, "bench", *model, "--budget", "0.95", "--solver", "rotor", "--rounds", "2",
                         "--output", tmp_path / "bench.png")
    assert code == 0, err
    text = " ".join(out.split())
    assert "eager PyTorch" in text and "remat (rotor)" in text and "median of 2 alternating rounds" in text
    ratio = re.search(r"(\d+\.\d\d)x\s*│\s*$", out.split("remat (rotor)")[1].splitlines()[0])
    assert ratio and float(ratio.group(1)) > 0
    assert_png(tmp_path / "bench.png")


@pytest.mark.parametrize("model", MODELS)
def test_maxbatch_finds_a_batch_and_saves_its_plan(model, tmp_path, capsys):
    saved = tmp_path / "maxbatch.json"
    code, out, err = run(capsys, "maxbatch", *model, "--memory-limit", "256MiB", "--max-batch", "2",
                         "--solver", "rotor", "--save", saved)
    assert code == 0, err
    row = next(ln for ln in out.splitlines() if "remat (rotor)" in ln)
    assert re.search(r"│\s+2\s+│", row)  # capped by --max-batch
    assert "plain PyTorch" in out
    plan = remat.Plan.load(saved)
    assert plan.peak_bytes <= plan.budget_bytes


def test_budget_min_plans_below_store_all(tmp_path, capsys):
    saved = tmp_path / "min.json"
    code, out, err = run(capsys, "plan", FACTORY, "--budget", "min", "--solver", "rotor", "--save", saved)
    assert code == 0, err
    plan = remat.Plan.load(saved)
    store_all = remat.simulate(plan.graph, *_store_all_instructions(plan.graph))
    assert plan.peak_bytes <= plan.budget_bytes < store_all.peak_bytes


def _store_all_instructions(graph):
    from remat.solvers import solve

    p = solve("store_all", graph, None)
    return p.instructions, p.boundary


def test_infeasible_budget_is_status_3_and_one_line_naming_the_minimum(capsys):
    """Its own status (3), apart from a usage error's (2): a script can tell them apart."""
    code, out, err = run(capsys, "plan", FACTORY, "--budget", "1KiB", "--solver", "rotor")
    assert code == 3
    line = assert_one_line(err)
    assert "smallest feasible budget" in line
    least = int(re.search(r"--budget (\d+)B", line).group(1))
    model, args = tiny_mlp()
    with pytest.raises(remat.InfeasibleBudgetError) as info:
        remat.plan(model, *args, budget=1024, solver="rotor")
    assert least == info.value.min_budget_bytes


def test_plan_splits_the_lm_head_into_the_chunks_asked_for(capsys):
    code, out, err = run(capsys, "plan", "gpt2", "--size", "tiny", "--solver", "checkpoint_all", "--split", "4")
    assert code == 0, err
    assert "'chunks': 4" in out and "nll_loss_forward" in out
    code, out, err = run(capsys, "plan", "gpt2", "--size", "tiny", "--split", "none")
    assert code == 2 and "expected auto, off or a number of chunks" in err


# ---------------------------------------------------------------------------- errors before any work


def test_parse_budget():
    assert parse_budget("0.5") == 0.5 and parse_budget("1") == 1.0 and isinstance(parse_budget("1"), float)
    assert parse_budget("2GiB") == 2 * 2**30 and parse_budget("800MB") == 800 * 10**6 and parse_budget("123B") == 123
    assert parse_budget("min") == "min" and parse_budget("none") is None


@pytest.mark.parametrize("budget, says", [("3", "no unit"), ("1.5", "no unit"), ("-0.5", "positive"),
                                          ("0", "positive"), ("lots", "cannot read")])
def test_bad_budget_is_one_line(budget, says, capsys):
    code, out, err = run(capsys, "plan", FACTORY, "--budget", budget)
    assert code == 2
    assert says in assert_one_line(err)


def test_memory_limit_needs_a_unit(capsys):
    code, out, err = run(capsys, "maxbatch", FACTORY, "--memory-limit", "100")
    assert code == 2
    assert "no unit" in assert_one_line(err)


@pytest.mark.parametrize("argv, status, says", [
    (["plan", "no_such_model", "--budget", "0.5"], 1, "unknown model 'no_such_model'"),
    (["plan", "cnn_bn", "--size", "huge", "--budget", "0.5"], 2, "invalid choice: 'huge'"),
    (["plan", "no_such_module_x:make"], 1, "cannot import 'no_such_module_x'"),
    (["plan", "tests.cli_models:missing"], 1, "has no 'missing'"),
    (["plan", "tests.cli_models:NOT_CALLABLE"], 1, "not callable"),
    (["plan", "tests.cli_models:not_a_model"], 1, "must return (model, args)"),
    (["sweep", FACTORY, "--solvers", "nope"], 2, "unknown solver(s) nope"),
    (["bench", FACTORY, "--budget", "0.5", "--output", "x.txt"], 2, "must end in .png or .svg"),
    (["plan"], 2, "required"),
    (["bench", FACTORY, "--budget", "0.5", "--device", "nonsense"], 1, "unknown device 'nonsense'"),
])
def test_bad_arguments_are_one_line(argv, status, says, capsys):
    code, out, err = run(capsys, *argv)
    assert code == status
    assert says in assert_one_line(err)


@pytest.mark.parametrize("content, says", [
    (None, "cannot read the plan file"),
    ("{not json", "invalid JSON"),
    ('{"format": 1}', "holds no graph"),
    ("[1, 2]", "not a remat plan"),
    ('{"format": 7}', "not a remat plan"),
])
def test_bad_plan_file_is_one_line(content, says, tmp_path, capsys):
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content)
    code, out, err = run(capsys, "plot", path, "--output", tmp_path / "x.png")
    assert code == 1
    assert says in assert_one_line(err)
    assert not (tmp_path / "x.png").exists()


def test_warnings_are_one_line_on_stderr(capsys):
    code, out, err = run(capsys, "plan", "tests.cli_models:warns", "--budget", "1")
    assert code == 0
    assert assert_one_line(err) == "UserWarning: first line second line"
