"""SGLang's own request structs, from the installed `sglang` package, for the contract test.

`import sglang.srt.managers.io_struct` pulls the whole engine (the scheduler, triton kernels, tvm_ffi,
a torchvision build that needs CUDA torch): it cannot be imported on a CPU machine. What the HTTP
server parses requests with is small, so it is taken from the package's own files, never retyped here:

- `sglang/srt/utils/msgspec_utils.py` (msgspec and pydantic_core only): loaded as it is. Its
  `msgspec_struct_pydantic_core_schema` is how SGLang's FastAPI server turns a JSON body into a struct
  (`Annotated[ReleaseMemoryOccupationReqInput, Body()]`), base64 included (`Base64Bytes`).
- `sglang/srt/sampling/sampling_params.py` (msgspec and the watermarking helpers): loaded as it is,
  with the package shells `sglang` and `sglang.srt` made empty (their `__init__` imports the engine).
- `sglang/srt/managers/io_struct.py`: the class definitions named in IO_STRUCTS, compiled from the
  file's own source text (its imports are what cannot load; its classes can).

    load() -> SimpleNamespace of those classes, plus `parse(cls, body)` (a JSON body as FastAPI parses it)
    unload()                                # removes what load() put in sys.modules
"""
from __future__ import annotations

import __future__
import ast
import dataclasses
import enum
import functools
import importlib
import importlib.util
import io
import sys
import types
import typing
from pathlib import Path
from types import SimpleNamespace

IO_STRUCTS = ("BaseReq", "GenerateReqInput", "ReleaseMemoryOccupationReqInput", "ReleaseMemoryOccupationReqOutput",
              "ResumeMemoryOccupationReqInput", "ResumeMemoryOccupationReqOutput", "UpdateWeightsFromTensorReqInput",
              "UpdateWeightsFromTensorReqOutput")
# Definitions the structs' own methods call, from modules that import the engine: taken from their files.
BORROWED = {"srt/utils/common.py": {"SafeUnpickler", "MultiprocessingSerializer"},
            "srt/model_executor/forward_batch_info.py": {"CaptureHiddenMode"},
            "srt/managers/schedule_batch.py": {"ReturnHiddenStatesMode", "SamplingLogprobsMode",
                                               "get_return_hidden_states_mode"}}
SUBSET = "sglang.srt.managers.io_struct"  # the name the compiled classes live under (msgspec resolves types there)
_ADDED: list[str] = []


def root() -> Path | None:
    spec = importlib.util.find_spec("sglang")  # finds the package without running its __init__
    return Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None


def _shell(name: str, path: Path) -> None:
    """An empty package at `path`: its modules import, its __init__ (the whole engine) does not run."""
    if name not in sys.modules:
        module = types.ModuleType(name)
        module.__path__ = [str(path)]
        sys.modules[name] = module
        _ADDED.append(name)


def _file(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    _ADDED.append(name)
    spec.loader.exec_module(module)
    return module


def load() -> SimpleNamespace:
    base = root()
    if base is None:
        raise ImportError("the sglang package is not installed")
    for name, path in (("sglang", base), ("sglang.srt", base / "srt"), ("sglang.srt.utils", base / "srt/utils"),
                       ("sglang.srt.managers", base / "srt/managers")):
        _shell(name, path)
    msgspec_utils = _file("sglang.srt.utils.msgspec_utils", base / "srt/utils/msgspec_utils.py")
    sampling = importlib.import_module("sglang.srt.sampling.sampling_params")
    _ADDED.extend(n for n in list(sys.modules) if n.startswith("sglang.srt.sampling") and n not in _ADDED)
    source = base / "srt/managers/io_struct.py"
    tree = ast.parse(source.read_text())
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name in IO_STRUCTS]
    missing = set(IO_STRUCTS) - {c.name for c in classes}
    if missing:
        raise ImportError(f"io_struct.py no longer defines {sorted(missing)}")
    module = types.ModuleType(SUBSET)
    module.__file__ = str(source)
    import msgspec
    module.__dict__.update({name: getattr(typing, name) for name in typing.__all__})
    import pybase64
    from multiprocessing.reduction import ForkingPickler
    module.__dict__.update(IntEnum=enum.IntEnum, total_ordering=functools.total_ordering,  # what the borrowed use
                           io=io, pybase64=pybase64, ForkingPickler=ForkingPickler)
    module.__dict__.update(msgspec=msgspec, dataclass=dataclasses.dataclass, field=dataclasses.field,
                           Base64Bytes=msgspec_utils.Base64Bytes, SamplingParams=sampling.SamplingParams,
                           msgspec_struct_pydantic_core_schema=msgspec_utils.msgspec_struct_pydantic_core_schema)
    sys.modules[SUBSET] = module
    _ADDED.append(SUBSET)
    # The file's own imports of what loads here (uuid, copy, numpy, torch, ...) and its module-level
    # names (a logger, type aliases), each where it can run; then the classes.
    for node in tree.body:
        light = isinstance(node, (ast.Import, ast.ImportFrom)) and all(
            (alias.name if isinstance(node, ast.Import) else node.module or "").split(".")[0] in _LIGHT
            for alias in node.names)
        if light or isinstance(node, (ast.Assign, ast.AnnAssign)):
            try:
                _run([node], source, module)
            except (NameError, ImportError, AttributeError, TypeError):
                pass  # an alias of a type that needs the engine: never used by the structs we parse with
    for relative, names in BORROWED.items():  # what the structs call from modules that cannot load
        borrowed = ast.parse((base / relative).read_text())
        _run([n for n in borrowed.body if _defines(n) & names], base / relative, module)
    _run(classes, source, module)
    found = {name: getattr(module, name) for name in IO_STRUCTS}
    found["MultiprocessingSerializer"] = module.MultiprocessingSerializer
    return SimpleNamespace(**found, SamplingParams=sampling.SamplingParams, parse=parse,
                           version=_version(base), source=source)


_LIGHT = {"copy", "logging", "pickle", "uuid", "array", "collections", "dataclasses", "enum", "typing", "msgspec",
          "numpy", "torch", "pydantic", "__future__"}


def _defines(node) -> set[str]:
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    return {node.name} if isinstance(node, (ast.ClassDef, ast.FunctionDef)) else set()


def _run(nodes: list, source: Path, module: types.ModuleType) -> None:
    code = compile(ast.Module(body=nodes, type_ignores=[]), str(source), "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, module.__dict__)


def parse(cls, body: dict):
    """`body` (JSON as sent) parsed the way SGLang's FastAPI server parses it for an `Annotated[cls,
    Body()]` parameter: pydantic, with the schema the struct itself provides."""
    import json

    import pydantic
    return pydantic.TypeAdapter(cls).validate_json(json.dumps(body))


def _version(base: Path) -> str:
    from importlib.metadata import version
    try:
        return version("sglang")
    except Exception:  # noqa: BLE001 - only for the message
        return "?"


def unload() -> None:
    while _ADDED:
        sys.modules.pop(_ADDED.pop(), None)
