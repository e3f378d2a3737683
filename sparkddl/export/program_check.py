"""What a saved torch.export program may hold: checked before torch reads any of it.

torch's deserializer turns text of the program's JSON into code: ``guards_code`` is compiled
into a guard function, size expressions go through ``sympy.sympify`` (an eval), node targets
are looked up by name, and names and treespecs end up in generated Python. So the JSON must
be what sparkddl's export writes (torch 2.4 to 2.13), field by field; torch then reads it
written again, with node metadata (text torch would parse) and the batch guards left out.

Like :mod:`sparkddl.export.portable`, which uses it, this module imports nothing from sparkddl: an
MLflow model holds a copy of both (``code/sparkddl_program_check_<hash>.py``).
"""
from __future__ import annotations

import json
import keyword
import re
from typing import Any, Callable


class UntrustedProgramError(ValueError):
    """A saved program holds what sparkddl's export never writes; nothing of it was run.
    (sparkddl raises it as sparkddl.errors.UntrustedArtifactError.)"""


TRUST_HINT = ("Only for a file you trust: TorchModel.load(path, trusted=True) (or inside "
              "`with sparkddl.ml.trusted_loading():`), or, for an MLflow model, "
              "mlflow.pyfunc.load_model(uri, model_config={'trusted': True}).")

Check = Callable[[Any, str], None]


class _Refused(Exception):
    def __init__(self, path: str, value: Any, expected: str):
        shown = json.dumps(value)
        super().__init__(f"{path or 'the top level'} is {shown[:160]}"
                         f"{'...' if len(shown) > 160 else ''}, where sparkddl writes {expected}")


def _at(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _leaf(test: Callable[[Any], Any], expected: str) -> Check:
    def check(value: Any, path: str) -> None:
        if not test(value):
            raise _Refused(path, value, expected)
    return check


def _fields(required: dict[str, Check], optional: dict[str, Check] | None = None) -> Check:
    """An object with these fields (optional: written by some torch versions only)."""
    known = {**required, **(optional or {})}

    def check(value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise _Refused(path, value, "an object")
        for key in value:
            if key not in known:
                raise _Refused(_at(path, key), value[key], f"no such field (only "
                               f"{', '.join(known)})")
        for key, sub in known.items():
            if key in value:
                sub(value[key], _at(path, key))
            elif key in required:
                raise _Refused(path, {k: "..." for k in value}, f"a field {key!r} too")
    return check


def _one_of(**kinds: Check) -> Check:
    """torch's tagged union: ``{"<kind>": value}``."""
    def check(value: Any, path: str) -> None:
        if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in kinds:
            raise _Refused(path, value, f"one of {', '.join(kinds)}")
        kind, inner = next(iter(value.items()))
        kinds[kind](inner, _at(path, kind))
    return check


def _list(item: Check) -> Check:
    def check(value: Any, path: str) -> None:
        if not isinstance(value, list):
            raise _Refused(path, value, "a list")
        for i, v in enumerate(value):
            item(v, f"{path}[{i}]")
    return check


def _map(key: Check, item: Check) -> Check:
    def check(value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise _Refused(path, value, "an object")
        for k, v in value.items():
            key(k, f"{path} key")
            item(v, f"{path}[{k!r}]")
    return check


def _maybe(check: Check) -> Check:
    return lambda value, path: None if value is None else check(value, path)


def _text(pattern: str) -> Callable[[Any], bool]:
    compiled = re.compile(pattern, re.ASCII)
    return lambda v: isinstance(v, str) and compiled.fullmatch(v) is not None


_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_PART = r"(?!__)[A-Za-z0-9_]+"  # of a dotted attribute path; no dunders
_is_ident = _text(_IDENT)
is_dotted = _text(rf"{_PART}(\.{_PART})*")
# the only guard sparkddl's export leaves (torch >= 2.9, several inputs): equal batches
_BATCH_GUARD = _text(rf"L\['{_IDENT}'\]\.size\(\)\[0\] == L\['{_IDENT}'\]\.size\(\)\[0\]")
# torch >= 2.9 writes sympy's srepr (Symbol('s77', integer=True, ...)), older torch str (8*s0)
_EXPR_TOKEN = re.compile(r"\s*(Symbol\('s[0-9]+'(?:, *(?:positive|integer|nonnegative)="
                         r"(?:True|False))*\)|s[0-9]+|[0-9]+|[A-Z][A-Za-z]*|//|[-+*(),])")
_EXPR_FUNCTIONS = {"Integer", "Add", "Mul", "Min", "Max", "FloorDiv", "CleanDiv", "Mod",
                   "PythonMod"}
_SIZE_OPERATORS = {f"_operator.{op}" for op in ("getitem", "add", "sub", "mul", "floordiv",
                                                "mod", "neg")}
_ATEN_OP = _text(rf"torch\.ops\.aten\.{_PART}\.{_PART}")
_METADATA = {"stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn"}  # dropped


# what torch.fx's generated code refers to by name; torch's export never names a value so
_FX_GLOBALS = {"self", "torch", "device", "fx_pytree", "pytree", "inf", "nan", "NoneType"}


def _is_name(value: Any) -> bool:
    """A value's name: torch puts it into generated Python."""
    return _is_ident(value) and not keyword.iskeyword(value) and \
        not value.startswith("__") and value not in _FX_GLOBALS


def _is_size_expr(text: Any) -> bool:
    """Whether ``text`` is integer arithmetic (+ - * //, a few sympy functions) over size
    symbols, and nothing sympify could run."""
    if not isinstance(text, str) or len(text) > 2000:
        return False
    tokens, pos, text = [], 0, text.strip()
    while pos < len(text):
        match = _EXPR_TOKEN.match(text, pos)
        if match is None:
            return False
        tokens.append(match.group(1))
        pos = match.end()
    try:
        return _sum(tokens, 0) == len(tokens)
    except (IndexError, ValueError, RecursionError):
        return False


def _sum(t: list[str], i: int) -> int:
    i = _product(t, i)
    while i < len(t) and t[i] in ("+", "-"):
        i = _product(t, i + 1)
    return i


def _product(t: list[str], i: int) -> int:
    i = _factor(t, i)
    while i < len(t) and t[i] in ("*", "//"):
        i = _factor(t, i + 1)
    return i


def _factor(t: list[str], i: int) -> int:
    if t[i] == "-":
        return _factor(t, i + 1)
    if t[i][0].isdigit() or t[i][0] == "s" or t[i].startswith("Symbol("):
        return i + 1
    if t[i] in _EXPR_FUNCTIONS and t[i + 1] == "(":  # Name(expr, expr, ...)
        i = _sum(t, i + 2)
        while t[i] == ",":
            i = _sum(t, i + 1)
    elif t[i] == "(":
        i = _sum(t, i + 1)
    else:
        raise ValueError(t[i])
    if t[i] != ")":
        raise ValueError(t[i])
    return i + 1


def _is_operator(target: Any) -> bool:
    """An aten operator overload (resolved here, as torch would, to be sure it is one) or
    size arithmetic."""
    if target in _SIZE_OPERATORS:
        return True
    if not _ATEN_OP(target):
        return False
    import torch
    _, _, _, name, overload = target.split(".")
    try:
        op = getattr(getattr(torch.ops.aten, name), overload)
    except (AttributeError, RuntimeError):
        return False
    return isinstance(op, torch._ops.OpOverload)


def _is_treespec(text: Any) -> bool:
    """The inputs/outputs treespec: tuples and lists of tensors, an empty kwargs dict."""
    try:
        protocol, root = json.loads(text)
    except (TypeError, ValueError):
        return False
    return protocol == 1 and type(protocol) is int and _tree(root, 0)


def _tree(node: Any, depth: int) -> bool:
    if depth > 8 or not isinstance(node, dict) or \
            set(node) != {"type", "context", "children_spec"} or \
            not isinstance(node["children_spec"], list):
        return False
    kind, context, children = node["type"], node["context"], node["children_spec"]
    if kind is None or kind == "builtins.dict":  # a tensor, or the empty kwargs
        return context == (None if kind is None else "[]") and not children
    return kind in ("builtins.tuple", "builtins.list") and context == "null" and \
        all(_tree(c, depth + 1) for c in children)


# ---- the program's JSON as sparkddl's export writes it ----
_INTEGER = _leaf(lambda v: type(v) is int, "an integer")
_FLAG = _leaf(lambda v: type(v) is bool, "true or false")
_NUMBER = _leaf(lambda v: type(v) in (int, float) or v in ("Infinity", "-Infinity", "NaN"),
                "a number")
_TEXT = _leaf(lambda v: isinstance(v, str), "text")
_EMPTY = _leaf(lambda v: isinstance(v, (dict, list)) and not v, "nothing (empty)")
_NONE = _leaf(lambda v: v is True or v is None or v == [], "none")  # torch >= 2.9 | 2.4
_NAME = _leaf(_is_name, "a plain identifier")
_DOTTED = _leaf(is_dotted, "an attribute path such as net.0.weight")
_SYM_INT = _one_of(as_int=_INTEGER, as_expr=_fields(
    {"expr_str": _leaf(_is_size_expr, "a size expression such as 8*s0")},
    {"hint": _maybe(_one_of(as_int=_INTEGER))}))
_DEVICE = _fields({"type": _leaf(lambda v: v in ("cpu", "cuda"), "cpu or cuda")},
                  {"index": _maybe(_INTEGER)})
_TENSOR = _fields({"name": _NAME})
_SIZE = _one_of(as_name=_NAME, as_int=_INTEGER)
_ARGUMENT = _one_of(  # of an operator; strings are data to it (fx writes them with repr)
    as_none=_NONE, as_tensor=_TENSOR, as_tensors=_list(_TENSOR),
    as_optional_tensors=_list(_one_of(as_tensor=_TENSOR, as_none=_NONE)),
    as_int=_INTEGER, as_ints=_list(_INTEGER), as_float=_NUMBER, as_floats=_list(_NUMBER),
    as_bool=_FLAG, as_bools=_list(_FLAG), as_string=_TEXT, as_strings=_list(_TEXT),
    as_sym_int=_SIZE, as_sym_ints=_list(_SIZE), as_scalar_type=_INTEGER,
    as_memory_format=_INTEGER, as_layout=_INTEGER, as_device=_DEVICE)
_NODE = _fields({
    "target": _leaf(_is_operator, "a torch.ops.aten operator or _operator size arithmetic"),
    "inputs": _list(_fields({"name": _leaf(_is_ident, "an argument name"), "arg": _ARGUMENT},
                            {"kind": _leaf(lambda v: type(v) is int and v in (0, 1, 2),
                                           "0, 1 or 2")})),
    "outputs": _list(_one_of(as_tensor=_TENSOR, as_tensors=_list(_TENSOR),
                             as_sym_int=_one_of(as_name=_NAME), as_none=_NONE)),
    "metadata": _map(_leaf(lambda k: k in _METADATA, ", ".join(sorted(_METADATA))), _TEXT),
}, {"name": _leaf(lambda v: v == "" or _is_name(v), "a plain identifier"),
    "is_hop_single_tensor_return": _maybe(_FLAG)})
_GRAPH = _fields({
    "inputs": _list(_one_of(as_tensor=_TENSOR)), "outputs": _list(_one_of(as_tensor=_TENSOR)),
    "nodes": _list(_NODE),
    "tensor_values": _map(_NAME, _fields({
        "dtype": _INTEGER, "sizes": _list(_SYM_INT), "requires_grad": _FLAG,
        "device": _DEVICE, "strides": _list(_SYM_INT), "storage_offset": _SYM_INT,
        "layout": _INTEGER})),
    "sym_int_values": _map(_NAME, _SYM_INT), "sym_bool_values": _EMPTY,
    "custom_obj_values": _EMPTY, "is_single_tensor_return": _FLAG,
}, {"sym_float_values": _EMPTY})
_USER = _fields({"arg": _one_of(as_tensor=_TENSOR)})
_SIGNATURE = _fields({
    "input_specs": _list(_one_of(
        user_input=_USER, parameter=_fields({"arg": _TENSOR, "parameter_name": _DOTTED}),
        buffer=_fields({"arg": _TENSOR, "buffer_name": _DOTTED, "persistent": _FLAG}),
        tensor_constant=_fields({"arg": _TENSOR, "tensor_constant_name": _DOTTED}))),
    "output_specs": _list(_one_of(user_output=_USER))})
_SPEC = _leaf(_is_treespec, "a treespec of tensors in tuples")
_CALL = _fields({"fqn": _leaf(lambda v: v == "" or is_dotted(v), "a module path")},
                {"signature": _maybe(_fields(
                    {"inputs": _EMPTY, "outputs": _EMPTY, "in_spec": _SPEC, "out_spec": _SPEC},
                    {"forward_arg_names": _list(_NAME)}))})
_DIALECT = _leaf(lambda v: v in ("ATEN", "TRAINING", ""), "ATEN or TRAINING")
_PROGRAM = _fields({
    "graph_module": _fields({"graph": _GRAPH, "signature": _SIGNATURE,
                             "module_call_graph": _list(_CALL)},
                            {"metadata": _EMPTY, "treespec_namedtuple_fields": _EMPTY}),
    "opset_version": _map(_leaf(lambda k: k == "aten", "aten"), _INTEGER),
    "range_constraints": _map(_leaf(_text(r"s[0-9]+"), "a size symbol such as s0"),
                              _fields({"min_val": _maybe(_INTEGER),
                                       "max_val": _maybe(_INTEGER)})),
    "schema_version": _fields({"major": _INTEGER, "minor": _INTEGER}),
}, {"dialect": _DIALECT, "verifiers": _list(_DIALECT),  # torch 2.4 | >= 2.5
    "torch_version": _leaf(_text(r"[A-Za-z0-9.+_-]{1,40}"), "a version"),
    "guards_code": _list(_leaf(_BATCH_GUARD, "no guard but L['b'].size()[0] == "
                                             "L['a'].size()[0] (equal batches)"))})


def refusal(graph: bytes) -> str | None:
    """What in the program's JSON sparkddl's export never writes (the field and its value),
    or None."""
    try:
        _PROGRAM(json.loads(graph), "")
    except _Refused as exc:
        return str(exc)
    except (ValueError, RecursionError) as exc:  # not JSON (UnicodeDecodeError included)
        return f"not torch.export JSON ({exc})"
    return None


def checked_graph(graph: bytes, where: str) -> bytes:
    """The program's JSON, refused (UntrustedProgramError naming ``where`` and the field)
    unless it holds only what sparkddl's export writes; written again for torch without
    node metadata (debugging text torch would parse) and guards (equal batches, which the
    module's own input check enforces)."""
    why = refusal(graph)
    if why is not None:
        raise UntrustedProgramError(f"{where}: {why}. torch's loader can turn such text into "
                                    f"code, so nothing of it was loaded. {TRUST_HINT}")
    program = json.loads(graph)
    for node in program["graph_module"]["graph"]["nodes"]:
        node["metadata"] = {}
    if "guards_code" in program:
        program["guards_code"] = []
    return json.dumps(program).encode()
