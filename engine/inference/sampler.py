"""Sampling parameters and the sampler.

Randomness is counter-based: the uniform draw for (seed, rng_step, position) is a hash of
exactly those three numbers, never the state of a shared generator, so a draw does not depend
on how many draws came before, on the other sequences in the batch, or on where generation
resumed. The draw is mapped to a token by inverse CDF over the filtered distribution, taken in
a fixed order: ascending token id over the tokens that top-k/top-p keep (which of those are
kept is decided by probability descending, lower id first on ties)."""

from __future__ import annotations

import torch

from tttr.engine.inference.sampling import SEED_LIMIT, SamplingParams, uniform  # noqa: F401 - named here too
from tttr.kernels import ops


def filtered_distribution(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept token ids ascending, their probabilities as float64 summing to 1), after
    temperature, top-k and top-p. logits: fp32 [vocab]."""
    probs = ops.softmax((logits.float() / params.temperature)[None, :], dim=-1)[0]
    vocab = probs.shape[0]
    if (not params.top_k or params.top_k >= vocab) and params.top_p >= 1.0:
        ids = torch.arange(vocab)  # nothing filtered: no sort needed
        return ids, probs.double() / probs.double().sum()
    # Candidates: every token whose probability reaches the k-th largest (ties included), so the
    # fixed order below decides the cut. For top-p alone, try the top 256 first: if they hold
    # the mass, the nucleus is among them and sorting the whole vocabulary is not needed.
    k = params.top_k if params.top_k and params.top_k < vocab else 0
    if not k and vocab > 256:
        k = 256
    ids, cand = torch.arange(vocab), probs
    total = float(probs.double().sum())
    if k:
        kth = torch.topk(probs, k).values[-1]
        sub = torch.nonzero(probs >= kth).flatten()  # ascending ids
        if params.top_k or float(probs[sub].double().sum()) >= params.top_p * total:
            ids, cand = sub, probs[sub]
    order = torch.sort(cand, descending=True, stable=True).indices  # ties keep ascending id
    ids, cand = ids[order], cand[order].double()
    if params.top_k:
        ids, cand = ids[: params.top_k], cand[: params.top_k]
    if params.top_p < 1.0:
        csum = torch.cumsum(cand, 0)
        # keep the smallest prefix whose mass reaches top_p of the tempered (top-k) distribution
        mass = float(csum[-1]) if params.top_k else total
        target = torch.tensor([params.top_p * mass], dtype=torch.float64)
        keep = min(int(torch.searchsorted(csum, target)) + 1, ids.shape[0])
        ids, cand = ids[:keep], cand[:keep]
    by_id = torch.argsort(ids)
    ids, cand = ids[by_id], cand[by_id]
    return ids, cand / cand.sum()


def sample(logits: torch.Tensor, params: SamplingParams, step: int, position: int) -> int:
    """The token for one position. Greedy takes the lowest id among the maxima."""
    return sample_rows(logits[None, :], [params], [(step, position)])[0]


def sample_rows(logits: torch.Tensor, params: list[SamplingParams], coords: list[tuple[int, int]]) -> list[int]:
    """The tokens for the rows of logits [n, vocab]: row i under params[i] at (step, position)
    coords[i]. Row i's token is `sample(logits[i], ...)` whatever the other rows: greedy rows
    take an argmax each; rows at the same temperature without top-k/top-p share one softmax
    and one inverse-CDF call (each reduces every row on its own, in an order fixed by the row);
    filtered rows go one by one through `filtered_distribution`."""
    out: list[int | None] = [None] * len(params)
    greedy = [i for i, p in enumerate(params) if p.greedy]
    if greedy:
        # numpy's argmax (first maximum, like torch's) is ~20x faster than torch's on one row
        rows = logits.detach().float().contiguous().numpy()
        for i in greedy:
            out[i] = int(rows[i].argmax())
    plain: dict[float, list[int]] = {}
    for i, p in enumerate(params):
        if p.greedy:
            continue
        if (not p.top_k or p.top_k >= logits.shape[-1]) and p.top_p >= 1.0:
            plain.setdefault(float(p.temperature), []).append(i)
            continue
        ids, probs = filtered_distribution(logits[i], p)
        out[i] = ids[ops.draw(probs[None, :], _uniforms([p.seed], [coords[i]]))[0]].item()
    for temperature, rows in plain.items():
        probs = ops.softmax(logits[rows].float() / temperature, dim=-1)
        seeds, where = [params[i].seed for i in rows], [coords[i] for i in rows]
        for i, t in zip(rows, ops.draw(probs, _uniforms(seeds, where))):
            out[i] = t
    return out


def _uniforms(seeds: list[int], coords: list[tuple[int, int]]) -> torch.Tensor:
    """The draws for the rows (seed, (step, position)) as float64 [n] (ops.draw maps each to a token)."""
    return torch.tensor([uniform(seed, step, pos) for seed, (step, pos) in zip(seeds, coords)], dtype=torch.float64)
