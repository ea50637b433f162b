"""Models: the `Model` protocol, stream chunks, token estimation."""

from ringlet.models.base import (
    Chunk,
    Finish,
    Model,
    ModelRequest,
    ModelSettings,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
)
from ringlet.models.tokens import TokenBreakdown, breakdown, estimate_message, estimate_text, estimate_tools

__all__ = [
    "Chunk",
    "Finish",
    "Model",
    "ModelRequest",
    "ModelSettings",
    "TextDelta",
    "TokenBreakdown",
    "ToolCallArgsDelta",
    "ToolCallStart",
    "breakdown",
    "estimate_message",
    "estimate_text",
    "estimate_tools",
]
