"""What exists: the typed entries of ``models.json`` (``specs``), the registry built from it (``store``:
``ModelStore``), and routes over its models (``routing``: weighted rendezvous picks, shadows, input types; pure)."""

from manager.registry.routing import Resolved, input_type
from manager.registry.specs import InputType, ModelSpec, RouteSpec
from manager.registry.store import ModelStore

__all__ = ["InputType", "ModelSpec", "ModelStore", "Resolved", "RouteSpec", "input_type"]
