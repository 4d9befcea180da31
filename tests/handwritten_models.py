"""Small models that exercise FSDP's corner cases."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.relu(self.fc1(self.ln(x))))


class Stack(nn.Module):
    """Embedding-like input layer, blocks, head: the plain case."""

    def __init__(self, n: int = 4, d: int = 16) -> None:
        super().__init__()
        self.inp = nn.Linear(8, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


class CalledTwice(Stack):
    """blocks.1 runs twice per forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for i in (0, 1, 2, 1, 3):
            h = self.blocks[i](h)
        return self.head(h)


class Reordered(Stack):
    """Blocks run in an order different from registration order."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for i in (2, 0, 3, 1):
            h = self.blocks[i](h)
        return self.head(h)


class Outer(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.proj = nn.Linear(d, d)
        self.inner = nn.ModuleList(Block(d) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        for b in self.inner:
            x = b(x)
        return x


class Nested(nn.Module):
    """Units inside units: Outer and its Blocks are both wrapped."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.inp = nn.Linear(8, d)
        self.outers = nn.ModuleList(Outer(d) for _ in range(2))
        self.head = nn.Linear(d, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for o in self.outers:
            h = o(h)
        return self.head(h)


class WithAux(Stack):
    """An auxiliary branch (to be ignored) used between blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.aux = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        h = self.blocks[0](h)
        h = h + self.aux(h)
        for b in self.blocks[1:]:
            h = b(h)
        return self.head(h)


class Tied(nn.Module):
    """Input embedding and output head share one weight."""

    def __init__(self, vocab: int = 32, d: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(3))
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


class WithNorm(nn.Module):
    """BatchNorm between blocks (FSDP's mixed precision wraps it on its own)."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.inp = nn.Linear(8, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(3))
        self.bn = nn.BatchNorm1d(d)
        self.head = nn.Linear(d, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        h = self.blocks[0](h)
        h = self.bn(h)
        for b in self.blocks[1:]:
            h = b(h)
        return self.head(h)


class Checkpointed(Stack):
    """Activation checkpointing (non-reentrant) inside each block call."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = checkpoint(b, h, use_reentrant=False)
        return self.head(h)


class SideOutput(Stack):
    """blocks.3 runs in forward but its output does not reach the loss."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks[:3]:
            h = b(h)
        self.last_side = self.blocks[3](h)
        return self.head(h)


class ParamFree(nn.Module):
    """A wrapped module that owns no parameters."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.inp = nn.Linear(8, d)
        self.act = nn.GELU()
        self.blocks = nn.ModuleList(Block(d) for _ in range(2))
        self.head = nn.Linear(d, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.inp(x))
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def frozen_stack() -> Stack:
    """The input layer and the first block are frozen."""
    m = Stack()
    for p in [*m.inp.parameters(), *m.blocks[0].parameters()]:
        p.requires_grad_(False)
    return m


# The models whose autograd graph FSDP1 only extends by its views (no recomputation,
# no frozen parameters): the engine simulations are checked on all of them.
VIEW_ONLY = [Stack, CalledTwice, Reordered, Nested, WithAux, SideOutput, ParamFree]


class AgainWithoutGrad(Stack):
    """blocks.1 runs again under ``torch.no_grad()`` after the stack (an output that takes no
    gradient, added to the one that does)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        with torch.no_grad():
            extra = self.blocks[1](h)
        return self.head(h + extra)
