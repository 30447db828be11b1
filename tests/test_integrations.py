"""remat in the training stacks people use: the torch.compile backend, its environment
variables, and the Hugging Face Trainer (DDP and FSDP2: test_integrations_dist.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import remat
from remat.backend import BackendOptions
from remat.budget import BudgetError, parse_size


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 32)])
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


def make_net() -> Net:
    torch.manual_seed(0)
    return Net()


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(64, 16, generator=g), torch.randn(64, 1, generator=g)


def budget_between(model, x) -> int:
    """Halfway between keeping nothing and keeping everything: a plan within it must recompute."""
    front = remat.pareto(model, x, solvers=["checkpoint_all"], budgets=[1.0])
    return (front.store_all_peak + front["checkpoint_all"][0].peak_bytes) // 2


def train(run, model, x, y, steps=2):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        ((run(x) - y) ** 2).mean().backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters()}
        opt.step()
    return grads, {k: p.detach().clone() for k, p in model.named_parameters()}


# --------------------------------------------------------------------------- torch.compile backend
@pytest.mark.parametrize("split", ["off", 2, "auto"])
def test_compile_backend_trains_like_eager(split):
    """Below store-all's peak a plan must change the step: recompute (``split="off"``), or split the
    layers into row chunks (2), or, by default, whichever the cost model predicts faster. On this
    tiny step the unsplit plan recomputes 13% and the split one nothing, so which ``"auto"`` takes
    turns on measured op times: it took the split plan on one CI machine and the recomputing one here."""
    x, y = data()
    ref = make_net()
    ref_grads, ref_params = train(ref, ref, x, y)
    model, plans = make_net(), []
    options = {"budget": budget_between(model, x), "split": split,
               "on_plan": lambda plan, capture: plans.append(plan)}
    got_grads, got_params = train(torch.compile(model, backend="remat", dynamic=False, options=options), model, x, y)
    assert len(plans) == 1 and plans[0].peak_bytes <= options["budget"]
    chunks = plans[0].info.get("split", {}).get("chunks")
    assert chunks == {"off": None, 2: 2}.get(split, chunks)
    assert plans[0].recomputations > 0 or chunks
    # the same ops in the same order, some run twice: equal up to rounding; split: weight gradients
    # are sums over chunks, in another order
    rtol, atol = (1e-6, 1e-7) if chunks is None else (1e-5, 1e-6)
    for k in ref_grads:
        torch.testing.assert_close(got_grads[k], ref_grads[k], rtol=rtol, atol=atol)
        torch.testing.assert_close(got_params[k], ref_params[k], rtol=rtol, atol=atol)


# --------------------------------------------------------------------------- REMAT_BUDGET, REMAT_SOLVER
@pytest.mark.parametrize("text, budget", [("0.5", 0.5), ("1", 1.0), (" min ", "min"), ("2GiB", 2 * 2**30), ("800 MB", 800 * 10**6)])
def test_budget_from_the_environment(text, budget):
    assert BackendOptions.from_dict({}, {"REMAT_BUDGET": text}).budget == budget


def test_explicit_options_win_over_the_environment():
    env = {"REMAT_BUDGET": "0.5", "REMAT_SOLVER": "rotor"}
    opts = BackendOptions.from_dict({"budget": "1GiB", "solver": "chen_sqrt"}, env)
    assert (opts.budget, opts.solver) == ("1GiB", "chen_sqrt")
    opts = BackendOptions.from_dict({"budget": None}, env)  # an explicit None (no limit) wins too
    assert (opts.budget, opts.solver) == (None, "rotor")
    assert BackendOptions.from_dict({}, {"REMAT_BUDGET": "  "}).budget is None  # empty: unset


@pytest.mark.parametrize("text, phrase", [("3", "has no unit"), ("0", "must be positive"),
                                          ("lots", "cannot read"), ("2 parsecs", "cannot read")])
def test_invalid_environment_budget_names_the_variable(text, phrase):
    with pytest.raises(BudgetError) as info:
        BackendOptions.from_dict({}, {"REMAT_BUDGET": text})
    assert "REMAT_BUDGET" in str(info.value) and phrase in str(info.value) and "GiB" in str(info.value)
    assert isinstance(info.value, remat.RematError)


def test_compile_backend_reads_the_environment(monkeypatch):
    x, y = data()
    model, plans = make_net(), []
    budget = f"{budget_between(model, x)}B"
    monkeypatch.setenv("REMAT_BUDGET", budget)
    monkeypatch.setenv("REMAT_SOLVER", "chen_sqrt")
    # flops costs: chen_sqrt places its cuts by compute cost, and measured costs made it miss the budget once
    compiled = torch.compile(model, backend="remat", dynamic=False,
                             options={"on_plan": lambda plan, capture: plans.append(plan), "cost_model": "flops"})
    ((compiled(x) - y) ** 2).mean().backward()
    assert [(p.solver, p.budget_bytes) for p in plans] == [("chen_sqrt", parse_size(budget))]
    assert plans[0].recomputations > 0

    monkeypatch.setenv("REMAT_BUDGET", "lots")
    with pytest.raises(Exception, match="REMAT_BUDGET"):
        torch.compile(make_net(), backend="remat", dynamic=False)(x)


# --------------------------------------------------------------------------- Hugging Face Trainer
def _hf():
    """transformers, or skip (the Trainer also needs accelerate)."""
    pytest.importorskip("accelerate")
    return pytest.importorskip("transformers")


SEQ, VOCAB = 64, 64
TRAINER_BUDGET = "1.5MiB"  # between the tiny GPT-2's keep-nothing (~1.1 MiB) and keep-all (~2.7 MiB) peaks


class TokenDataset(torch.utils.data.Dataset):
    def __init__(self, n=16):
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _train_gpt2(tmp_path, **compile_args):
    transformers = _hf()
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)  # random weights, nothing downloaded
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4, use_cpu=True, report_to=[],
        save_strategy="no", dataloader_num_workers=0, logging_steps=1, seed=0, disable_tqdm=True, **compile_args,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=TokenDataset())
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return losses, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _recorded_plans(monkeypatch) -> list:
    """The plans of every graph the remat backend plans from now on (the Trainer passes no options)."""
    plans = []
    original = BackendOptions.from_dict.__func__

    def recording(cls, options=None, environ=None):
        opts = original(cls, options, environ)
        opts.on_plan = lambda plan, capture: plans.append(plan)
        return opts

    monkeypatch.setattr(BackendOptions, "from_dict", classmethod(recording))
    return plans


def test_accelerate_accepts_the_remat_backend():
    _hf()
    from accelerate.utils import TorchDynamoPlugin

    assert TorchDynamoPlugin(backend="remat").to_kwargs()["backend"] == "remat"


def test_hf_trainer_trains_with_remat(tmp_path, monkeypatch):
    _hf()
    plans = _recorded_plans(monkeypatch)
    monkeypatch.setenv("REMAT_BUDGET", TRAINER_BUDGET)
    monkeypatch.setenv("REMAT_SOLVER", "rotor")  # fast on this chain; auto would also try the MILP
    ref_losses, ref_state = _train_gpt2(tmp_path / "eager")
    got_losses, got_state = _train_gpt2(tmp_path / "remat", torch_compile=True, torch_compile_backend="remat")

    # remat planned every graph Dynamo made, each within the budget from the environment, and the
    # model's graph recomputes
    assert plans and all(p.budget_bytes == parse_size(TRAINER_BUDGET) and p.peak_bytes <= p.budget_bytes for p in plans)
    assert any(p.recomputations > 0 for p in plans)
    assert len(got_losses) == len(ref_losses) == 4
    torch.testing.assert_close(torch.tensor(got_losses), torch.tensor(ref_losses), rtol=1e-6, atol=0)
    assert got_state.keys() == ref_state.keys()
    for k in ref_state:
        torch.testing.assert_close(got_state[k], ref_state[k], rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- Trainer, dynamic padding
def _tiny_tokenizer(transformers):
    """A word-level tokenizer built in memory (nothing downloaded): tokens t0..t63 and a pad token."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {f"t{i}": i for i in range(VOCAB)} | {"[PAD]": VOCAB, "[UNK]": VOCAB + 1}
    tk = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", unk_token="[UNK]")


class VariableLengthDataset(torch.utils.data.Dataset):
    """Sequences of 6 to 60 tokens: the collator pads each batch to its own longest."""

    def __init__(self, n=32):
        g = torch.Generator().manual_seed(1)
        lengths = torch.randint(6, SEQ - 3, (n,), generator=g)
        self.ids = [torch.randint(0, VOCAB, (int(n_,),), generator=g).tolist() for n_ in lengths]

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i]}


def _train_gpt2_padded(tmp_path, steps=8, **compile_args):
    transformers = _hf()
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB + 2, n_positions=SEQ,
                                     bos_token_id=0, eos_token_id=0, pad_token_id=VOCAB)
    model = transformers.GPT2LMHeadModel(config)  # no loss_type set: the loss comes from labels in forward
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=steps, per_device_train_batch_size=4, use_cpu=True, report_to=[],
        save_strategy="no", dataloader_num_workers=0, logging_steps=1, seed=0, disable_tqdm=True, **compile_args,
    )
    collator = transformers.DataCollatorForLanguageModeling(tokenizer=_tiny_tokenizer(transformers), mlm=False)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=VariableLengthDataset(),
                                   data_collator=collator)
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_hf_trainer_with_dynamic_padding_plans_per_bucket(tmp_path, monkeypatch):
    """Every batch has its own length: the step is captured at most twice, loss included (no graph
    break at transformers' loss), planned once per size bucket within REMAT_BUDGET=0.5, and the
    losses match a plain Trainer's step for step."""
    _hf()
    plans = _recorded_plans(monkeypatch)
    monkeypatch.setenv("REMAT_BUDGET", "0.5")
    ref = _train_gpt2_padded(tmp_path / "eager")
    got = _train_gpt2_padded(tmp_path / "remat", torch_compile=True, torch_compile_backend="remat")
    assert len(got) == len(ref) == 8
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-6, atol=0)
    assert len({p.info["capture"] for p in plans}) <= 2
    assert all(p.peak_bytes <= p.budget_bytes for p in plans)
    assert any(p.recomputations for p in plans)
    assert all(any("nll_loss" in n.op for n in p.graph.nodes) for p in plans), "the loss is in every graph"
    bucketed = [p for p in plans if p.info.get("bucket")]
    assert bucketed and len(bucketed) == len({tuple(sorted(p.info["bucket"].items())) for p in bucketed})
