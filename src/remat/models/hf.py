"""``gpt2``, ``distill`` (a GPT-2 student and its frozen teacher), ``bert``, ``vit``, ``llama`` and ``t5`` (an
encoder-decoder): models of the ``transformers`` library built from configs.

The weights are random (nothing is downloaded) and the configs' default dropout is kept. Each
model is wrapped in :class:`LossOnly`, so that its output is the scalar loss it computes from
``labels``. They need the ``transformers`` package (``pip install remat[models]``), which is
imported only when one of them is built.

For ``fullgraph=True`` (checked with transformers 5.23) the one setting that is needed is
``model.loss_type = "ForCausalLM"`` on GPT-2: its class name maps to no loss type, and the
``logger.warning_once`` transformers then calls inside forward is a graph break. The rest are
for a simpler graph: ``use_cache=False`` (no KV cache objects), ``return_dict=False`` (a tuple,
the loss first), ``config.problem_type`` for ViT (not assigned during forward), and
``config._attn_implementation = "eager"``, so the joint graph holds the attention scores,
softmax and dropout as separate ops a planner can free or recompute (``"sdpa"`` captures too, as
one fused op).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .registry import register


class LossOnly(nn.Module):
    """Wraps a ``transformers`` model called with ``labels``; returns only its scalar loss
    (``return_dict=False`` puts it first), so the logits are not a graph output."""

    def __init__(self, model: nn.Module, **call_options: Any):
        super().__init__()
        self.model = model
        self.call_options = call_options

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.model(*args, **kwargs, **self.call_options, return_dict=False)[0]


def _transformers():
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the transformers models of remat.models need the 'transformers' package: "
            "pip install 'remat[models]'"
        ) from e
    return transformers


def _finish_hf(model: nn.Module, loss_type: str, **call_options: Any) -> LossOnly:
    # With no loss type, transformers logs a warning from inside forward: a graph break.
    model.loss_type = loss_type
    return LossOnly(model, **call_options)


_GPT2 = dict(n_layer=2, n_embd=128, n_head=4, vocab=1000, positions=256)


@register(
    "gpt2",
    tiny=dict(_GPT2, batch=2, seq=32),
    small=dict(_GPT2, batch=8, seq=128),
    medium=dict(_GPT2, n_layer=4, batch=8, seq=256),
)
def _gpt2(n_layer, n_embd, n_head, vocab, positions, batch, seq):
    model = _finish_hf(_gpt2_lm(n_layer, n_embd, n_head, vocab, positions), "ForCausalLM", use_cache=False)
    ids = torch.randint(0, vocab, (batch, seq))
    return model, (), {"input_ids": ids, "labels": ids.clone()}


def _gpt2_lm(n_layer, n_embd, n_head, vocab, positions) -> nn.Module:
    """A ``GPT2LMHeadModel`` with random weights and eager attention."""
    tf = _transformers()
    config = tf.GPT2Config(
        n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab, n_positions=positions,
        bos_token_id=0, eos_token_id=0,
    )
    config._attn_implementation = "eager"
    return tf.GPT2LMHeadModel(config)


class Distillation(nn.Module):
    """A knowledge-distillation step: ``alpha`` times the student's own loss on the labels plus
    ``1 - alpha`` times the KL divergence from a frozen teacher's predictions softened by
    ``temperature``. As in the Hugging Face distillation examples, the teacher runs after the
    student, under ``no_grad``; it stays in eval mode (no dropout) whatever ``train()`` says."""

    def __init__(self, student: nn.Module, teacher: nn.Module, temperature: float = 2.0, alpha: float = 0.5):
        super().__init__()
        self.student, self.teacher = student, teacher
        self.temperature, self.alpha = temperature, alpha
        teacher.requires_grad_(False)

    def train(self, mode: bool = True) -> "Distillation":
        super().train(mode)
        self.teacher.eval()
        return self

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        student_loss, logits = self.student(input_ids=input_ids, labels=labels, use_cache=False, return_dict=False)[:2]
        with torch.no_grad():
            teacher_logits = self.teacher(input_ids=input_ids, use_cache=False, return_dict=False)[0]
        t = self.temperature
        soft = torch.nn.functional.kl_div(torch.log_softmax(logits / t, -1), torch.log_softmax(teacher_logits / t, -1),
                                          log_target=True, reduction="batchmean")
        return self.alpha * student_loss + (1 - self.alpha) * soft * t * t


@register(
    "distill",
    tiny=dict(_GPT2, batch=2, seq=32),
    small=dict(_GPT2, batch=8, seq=128),
    medium=dict(_GPT2, n_layer=4, batch=8, seq=256),
)
def _distill(n_layer, n_embd, n_head, vocab, positions, batch, seq):
    """A GPT-2 student distilled from a frozen GPT-2 teacher with twice its layers and four times its width."""
    student = _gpt2_lm(n_layer, n_embd, n_head, vocab, positions)
    teacher = _gpt2_lm(2 * n_layer, 4 * n_embd, n_head, vocab, positions)
    student.loss_type = teacher.loss_type = "ForCausalLM"  # (none: a warning from inside forward, a graph break)
    model = Distillation(student, teacher)
    ids = torch.randint(0, vocab, (batch, seq))
    return model, (), {"input_ids": ids, "labels": ids.clone()}


_BERT = dict(layers=2, hidden=128, heads=4, vocab=1000, positions=256)


@register(
    "bert",
    tiny=dict(_BERT, batch=2, seq=32),
    small=dict(_BERT, batch=8, seq=128),
    medium=dict(_BERT, layers=4, batch=8, seq=256),
)
def _bert(layers, hidden, heads, vocab, positions, batch, seq):
    tf = _transformers()
    config = tf.BertConfig(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=4 * hidden, max_position_embeddings=positions, pad_token_id=0,
    )
    config._attn_implementation = "eager"
    model = _finish_hf(tf.BertForMaskedLM(config), "ForMaskedLM")
    ids = torch.randint(1, vocab, (batch, seq))
    labels = torch.where(torch.rand(batch, seq) < 0.15, ids, torch.full_like(ids, -100))
    labels[:, 0] = ids[:, 0]  # at least one labelled token per row
    return model, (), {"input_ids": ids, "labels": labels}


_VIT = dict(layers=2, hidden=128, heads=4, image=32, patch=4)


@register(
    "vit",
    tiny=dict(_VIT, batch=2, image=16),
    small=dict(_VIT, batch=32),
    medium=dict(_VIT, layers=4, batch=64),
)
def _vit(layers, hidden, heads, image, patch, batch):
    tf = _transformers()
    config = tf.ViTConfig(
        image_size=image, patch_size=patch, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, intermediate_size=4 * hidden, num_labels=10,
        problem_type="single_label_classification",  # else assigned inside forward
    )
    config._attn_implementation = "eager"
    model = _finish_hf(tf.ViTForImageClassification(config), "ForImageClassification")
    return model, (), {"pixel_values": torch.randn(batch, 3, image, image),
                       "labels": torch.randint(0, 10, (batch,))}


_LLAMA = dict(layers=2, hidden=128, heads=4, kv_heads=2, vocab=1000, positions=256)


@register(
    "llama",
    tiny=dict(_LLAMA, batch=2, seq=32),
    small=dict(_LLAMA, batch=8, seq=128),
    medium=dict(_LLAMA, layers=4, batch=8, seq=256),
)
def _llama(layers, hidden, heads, kv_heads, vocab, positions, batch, seq):
    tf = _transformers()
    config = tf.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=344, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=positions,
        bos_token_id=0, eos_token_id=0, attention_dropout=0.1,
    )
    config._attn_implementation = "eager"
    model = _finish_hf(tf.LlamaForCausalLM(config), "ForCausalLM", use_cache=False)
    ids = torch.randint(0, vocab, (batch, seq))
    return model, (), {"input_ids": ids, "labels": ids.clone()}


_T5 = dict(layers=2, d_model=128, heads=4, vocab=1000)


@register(
    "t5",
    tiny=dict(_T5, batch=2, seq=32, target=16),
    small=dict(_T5, batch=8, seq=128, target=32),
    medium=dict(_T5, layers=4, batch=8, seq=256, target=64),
)
def _t5(layers, d_model, heads, vocab, batch, seq, target):
    """An encoder-decoder: ``layers`` encoder and decoder layers, cross-attention from every
    decoder layer to the encoder's output (read far from where it is made)."""
    tf = _transformers()
    config = tf.T5Config(
        vocab_size=vocab, d_model=d_model, d_kv=d_model // heads, d_ff=4 * d_model, num_layers=layers,
        num_decoder_layers=layers, num_heads=heads, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
    )
    config._attn_implementation = "eager"
    model = _finish_hf(tf.T5ForConditionalGeneration(config), "ForMaskedLM", use_cache=False)
    ids = torch.randint(2, vocab, (batch, seq))
    labels = torch.randint(2, vocab, (batch, target))
    return model, (), {"input_ids": ids, "labels": labels}
