"""`LoopConfig`: what an agent brings to each of its runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ringlet.hooks.dispatch import Hooks
from ringlet.loop.settings import LoopSettings
from ringlet.loop.steps import StepExecutor
from ringlet.models.base import Model
from ringlet.models.pricing import DEFAULT_PRICING, Pricing
from ringlet.tools.base import Toolset
from ringlet.tools.registry import Registry

if TYPE_CHECKING:
    from ringlet.gates import Gate
    from ringlet.gates.approval import ApprovalRules
    from ringlet.guardrails import Guardrails
    from ringlet.memory import Memory
    from ringlet.memory.compaction import CompactionConfig
    from ringlet.output import Output


@dataclass(eq=False)
class LoopConfig:
    """What an agent brings to each of its runs. Time and ids come from `steps.seam`."""

    name: str
    model: Model
    instructions: str | None
    settings: LoopSettings
    hooks: Hooks
    toolsets: Sequence[Toolset]
    steps: StepExecutor
    on_iteration: Callable[[dict[str, Any]], Any] | None = None
    registry: Registry | None = None
    """The tools, when every toolset is static: built once, shared by every run."""
    pricing: Pricing = DEFAULT_PRICING
    gates: Sequence[Gate] = ()
    """Checked in order for every call before its backend runs (the policy)."""
    approvals: ApprovalRules | None = None
    """The approval gate's rules; None: no approval stage (unless a policy requires one)."""
    audit: Callable[[dict[str, Any]], Any] | None = None
    """Where approval decisions are audited (the policy gate has its own sink)."""
    memory: Memory | None = None
    """The agent's memory: context notes before each turn (its tools are in `toolsets`)."""
    compaction: CompactionConfig | None = None
    """When and how long transcripts are compacted; None: never."""
    compaction_model: Model | None = None
    """The model that writes compaction summaries (default: `model`)."""
    output: Output | None = None
    """The run's typed output (`ringlet.output`); None: the answer is text."""
    guardrails: Guardrails | None = None
    """Checks of the run's input, answer, tool calls and results (`ringlet.guardrails`); None: none."""
