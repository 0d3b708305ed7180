"""Gated Linear Attention (fla-compatible) in plain PyTorch: config, model, ops, checkpoints."""
from evalkit.model_adapters.gla.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from evalkit.model_adapters.gla.config import GLAConfig
from evalkit.model_adapters.gla.model import GLAForCausalLM, GLAState, LayerState

__all__ = ["CheckpointError", "GLAConfig", "GLAForCausalLM", "GLAState", "LayerState",
           "load_checkpoint", "save_checkpoint"]
