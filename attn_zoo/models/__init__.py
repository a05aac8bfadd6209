"""The model family: every model is built from `attn_zoo.models.block.Block`, configured by one
`BlockConfig`, and takes any registered attention mechanism by name."""

from attn_zoo.models.block import Block, BlockConfig
from attn_zoo.models.classifier import SequenceClassifier
from attn_zoo.models.language_model import LanguageModel
from attn_zoo.models.seq2seq import Seq2Seq
from attn_zoo.models.vision import VisionClassifier

__all__ = [
    "Block",
    "BlockConfig",
    "LanguageModel",
    "Seq2Seq",
    "SequenceClassifier",
    "VisionClassifier",
]
