"""What exists: the typed entries of ``models.json`` (``specs``), the registry built from it (``store``:
``ModelStore``), and routes over its models (``routing``: weighted rendezvous picks, shadows, input types; pure)."""

from swapless.manager.registry.routing import Resolved, input_type
from swapless.manager.registry.specs import InputType, ModelSpec, RouteSpec
from swapless.manager.registry.store import ModelStore

__all__ = ["InputType", "ModelSpec", "ModelStore", "Resolved", "RouteSpec", "input_type"]
