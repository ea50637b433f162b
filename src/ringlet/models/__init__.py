"""Models: the `Model` protocol, stream chunks, fallback models, token estimation."""

from ringlet.models.base import (
    Chunk,
    Finish,
    Model,
    ModelRequest,
    ModelSettings,
    ModelSwitch,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
)
from ringlet.models.fallback import FallbackModel
from ringlet.models.tokens import TokenBreakdown, breakdown, estimate_message, estimate_text, estimate_tools

__all__ = [
    "Chunk",
    "FallbackModel",
    "Finish",
    "Model",
    "ModelRequest",
    "ModelSettings",
    "ModelSwitch",
    "TextDelta",
    "TokenBreakdown",
    "ToolCallArgsDelta",
    "ToolCallStart",
    "breakdown",
    "estimate_message",
    "estimate_text",
    "estimate_tools",
]
