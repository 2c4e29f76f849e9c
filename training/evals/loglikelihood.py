"""Log-likelihood of a continuation given a context, on this rank's share of the model.

The one scorer of both paths: the in-training evals (training/evals/task_scores.py) and
lm-eval's `loglikelihood` requests (training/evals/lm_eval_model.py), so both give the same
numbers. Every rank of the run must call `score_requests` together (FSDP gathers weights, TP
exchanges activations in the forward): ranks with fewer requests run padding batches.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from training.dist import all_reduce_max
from training.evals.text_encoder import Encoder
from training.parallel_model import ParallelModel
from training.step import document_inputs


@dataclass(frozen=True, slots=True)
class TokenRequest:
    inputs: list[int]
    """The model's input: context then continuation, less the last token, cut on the left."""
    targets: list[int]
    """The continuation's tokens, predicted by the last len(targets) positions of inputs."""


def encode_request(encode: Encoder, context: str, continuation: str, *,
                   max_len: int) -> TokenRequest:
    """Tokens as lm-eval's HF model makes them: the context's trailing spaces move to the
    continuation, the whole string is encoded once and the continuation is what follows the
    context's tokens; longer than `max_len` + 1 tokens, the context is cut on the left."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = encode(context + continuation)
    context_ids = encode(context)
    targets = whole[len(context_ids):][-max_len:]
    tokens = (whole[:len(context_ids)] + targets)[-(max_len + 1):]
    return TokenRequest(inputs=tokens[:-1], targets=targets)


@torch.no_grad()
def score_requests(model: ParallelModel, requests: list[TokenRequest], *, device: torch.device,
                   autocast, batch_size: int,
                   progress: Callable[[], None] | None = None) -> list[tuple[float, bool]]:
    """(sum of the continuation's log-probabilities, whether it is the greedy one) per request.
    Collective: every rank calls it, with its own requests. `progress` is called after each
    batch (the heartbeat: a long eval is progress, not a hang)."""
    for part in model.parts:
        part.eval()
    batches = [requests[i:i + batch_size] for i in range(0, len(requests), batch_size)]
    [most] = all_reduce_max([float(len(batches))], device)
    scores: list[tuple[float, bool]] = []
    for i in range(int(most)):
        if i < len(batches):
            scores += _score_batch(model, batches[i], device=device, autocast=autocast)
        else:  # keeps this rank in step with ranks that have more batches
            _score_batch(model, [TokenRequest(inputs=[0], targets=[0])], device=device,
                         autocast=autocast)
        if progress is not None:
            progress()
    return scores


def _score_batch(model: ParallelModel, batch: list[TokenRequest], *, device: torch.device,
                 autocast) -> list[tuple[float, bool]]:
    width = _round_up(max(len(r.inputs) for r in batch), model.dims.tp)  # SP splits T by tp
    inputs = torch.zeros((len(batch), width), dtype=torch.long)
    for row, request in enumerate(batch):  # right padding: causal positions before it are exact
        inputs[row, :len(request.inputs)] = torch.tensor(request.inputs)
    inputs = inputs.to(device)
    with autocast:
        logits = model.parts[0](inputs, **document_inputs(model, inputs))
    if isinstance(logits, DTensor):  # vocabulary-sharded (tp with loss_parallel)
        logits = logits.full_tensor()
    return [_continuation_score(logits[row], request) for row, request in enumerate(batch)]


def _continuation_score(logits: torch.Tensor, request: TokenRequest) -> tuple[float, bool]:
    n, end = len(request.targets), len(request.inputs)
    log_probs = F.log_softmax(logits[end - n:end].float(), dim=-1)
    targets = torch.tensor(request.targets, device=log_probs.device)
    picked = log_probs.gather(1, targets[:, None]).squeeze(1)
    return float(picked.sum()), bool((log_probs.argmax(dim=-1) == targets).all())


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
