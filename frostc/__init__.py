"""frostc: a plan compiler for scaled-dot-product attention on NVIDIA GPUs.

desc = GraphBuilder("toy") ... .build()      # or load_description("graph.toml")
data = build(desc)                            # plan-file bytes (frostc.build.build)
"""

from frostc.description import Description, GraphBuilder, load_description, parse_description, to_toml
from frostc.errors import DescriptionError, FrostcError, Problem
from frostc.graph import Graph, Tensor
from frostc.ops.sdpa_node import Sdpa
from frostc.validate import validate

__version__ = "0.1.0"

__all__ = [
    "Description",
    "DescriptionError",
    "FrostcError",
    "Graph",
    "GraphBuilder",
    "Problem",
    "Sdpa",
    "Tensor",
    "load_description",
    "parse_description",
    "to_toml",
    "validate",
]
