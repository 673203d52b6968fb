"""PyTorch frontend: torch.fx / dynamo graphs -> graph IR, the op registry, ``taskmap.compile``
and the ``torch.compile`` backend."""
from .dynamo import taskmap_backend
from .importer import import_fx
from .module import CompiledModule, compile, load
from .registry import NotConvertible, register, registered

__all__ = ["CompiledModule", "NotConvertible", "compile", "import_fx", "load", "register", "registered",
           "taskmap_backend"]
