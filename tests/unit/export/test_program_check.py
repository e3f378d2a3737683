"""The program check field by field: for every text of a saved program torch's deserializer
turns into code or objects (guard code, size expressions, operator and attribute names, value
names, treespecs, ...), a payload there is refused before torch reads any of it, naming the
field; and the grammars of size expressions and treespecs."""
from __future__ import annotations

import functools
import json
import re
from typing import Any, Callable

import pytest
import torch

from sparkddl.errors import SparkDDLError, UntrustedArtifactError
from sparkddl.export import program as exported
from sparkddl.export.program_check import _is_size_expr, _is_treespec
from tests.unit.export.program_models import (
    append,
    code,
    exported_model,
    first_input,
    graph_of,
    load_as_read,
    put,
    root_call,
    tampered,
)

LEAF = {"type": None, "context": None, "children_spec": []}
# (what is tampered, the model, how, the field the error must name); p is the payload
TAMPERED: list[tuple[str, str, Callable[[dict, str], Any], str]] = [
    ("guards_code", "mlp", lambda d, p: put(d, "guards_code", [f"{p} is None"]),
     r"guards_code\[0\]"),
    ("guard_beside_the_batch_guard", "two_inputs",
     lambda d, p: put(d, "guards_code", [*d.get("guards_code", []), f"{p} is None"]),
     r"guards_code\[\d\]"),
    ("range_constraints_key", "mlp",
     lambda d, p: put(d, "range_constraints", {p: {"min_val": 0, "max_val": None}}),
     "range_constraints key"),
    ("range_constraints_bound", "mlp",
     lambda d, p: [put(v, "max_val", p) for v in d["range_constraints"].values()],
     r"range_constraints\['s\d+'\]\.max_val"),
    ("size_expression", "mlp",
     lambda d, p: put(first_input(d)["sizes"][0]["as_expr"], "expr_str", p),
     r"sizes\[0\]\.as_expr\.expr_str"),
    ("stride_expression", "mlp",
     lambda d, p: put(first_input(d)["strides"], 0, {"as_expr": {"expr_str": p}}),
     r"strides\[0\]\.as_expr\.expr_str"),
    ("storage_offset_expression", "mlp",
     lambda d, p: put(first_input(d), "storage_offset", {"as_expr": {"expr_str": p}}),
     r"storage_offset\.as_expr\.expr_str"),
    ("expression_in_a_symbol", "mlp",
     lambda d, p: put(first_input(d)["sizes"][0]["as_expr"], "expr_str",
                      f"Symbol('s0', positive={p})"), r"expr_str"),
    ("size_hint", "mlp",
     lambda d, p: put(first_input(d)["sizes"][0]["as_expr"], "hint", {"as_expr": p}),
     r"as_expr\.hint"),
    ("sym_int_values", "arithmetic",
     lambda d, p: put(graph_of(d)["sym_int_values"], "evil", {"as_expr": {"expr_str": p}}),
     r"sym_int_values\['evil'\]\.as_expr\.expr_str"),
    ("sym_bool_values", "mlp",
     lambda d, p: put(graph_of(d), "sym_bool_values", {"b": {"as_expr": {"expr_str": p}}}),
     "sym_bool_values"),
    ("sym_float_values", "mlp",
     lambda d, p: put(graph_of(d), "sym_float_values", {"f": {"as_expr": {"expr_str": p}}}),
     "sym_float_values"),
    ("argument_operator", "mlp",
     lambda d, p: put(graph_of(d)["nodes"][0]["inputs"][0], "arg",
                      {"as_operator": "torch.hub.load"}), r"inputs\[0\]\.arg"),
    ("argument_graph", "mlp",
     lambda d, p: put(graph_of(d)["nodes"][0]["inputs"][0], "arg",
                      {"as_graph": {"name": "g", "graph": {}}}), r"inputs\[0\]\.arg"),
    ("argument_custom_object", "mlp",
     lambda d, p: put(graph_of(d)["nodes"][0]["inputs"][0], "arg",
                      {"as_custom_obj": {"name": "o", "class_fqn": p}}), r"inputs\[0\]\.arg"),
    ("argument_dict", "mlp",
     lambda d, p: put(graph_of(d)["nodes"][0]["inputs"][0], "arg",
                      {"as_string_to_argument": {p: {"as_int": 1}}}), r"inputs\[0\]\.arg"),
    ("argument_name", "mlp",
     lambda d, p: put(graph_of(d)["nodes"][0]["inputs"][0], "name", p), r"inputs\[0\]\.name"),
    ("size_argument_name", "mlp",
     lambda d, p: put(graph_of(d)["nodes"][0]["inputs"][0], "arg",
                      {"as_sym_int": {"as_name": p}}), r"as_sym_int\.as_name"),
    ("node_output_name", "mlp",
     lambda d, p: put(graph_of(d)["nodes"][0]["outputs"][0]["as_tensor"], "name", p),
     r"outputs\[0\]\.as_tensor\.name"),
    ("node_name", "mlp", lambda d, p: put(graph_of(d)["nodes"][0], "name", p),
     r"nodes\[0\]\.name"),
    ("node_name_torch", "mlp",
     lambda d, p: put(graph_of(d)["nodes"][0]["outputs"][0]["as_tensor"], "name", "torch"),
     r"as_tensor\.name"),
    ("unknown_node_field", "mlp", lambda d, p: put(graph_of(d)["nodes"][0], "evil", p),
     r"nodes\[0\]\.evil"),
    ("metadata_custom", "mlp",
     lambda d, p: put(graph_of(d)["nodes"][0]["metadata"], "custom", json.dumps(p)),
     r"metadata key"),
    ("metadata_from_node", "mlp",
     lambda d, p: put(graph_of(d)["nodes"][0]["metadata"], "from_node",
                      json.dumps([{"name": p}])), r"metadata key"),
    ("graph_input_string", "mlp", lambda d, p: append(graph_of(d)["inputs"], {"as_string": p}),
     r"graph\.inputs\[\d\]"),
    ("graph_input_name", "mlp",
     lambda d, p: put(graph_of(d)["inputs"][-1]["as_tensor"], "name", p), r"graph\.inputs"),
    ("graph_output_name", "mlp",
     lambda d, p: put(graph_of(d)["outputs"][0]["as_tensor"], "name", p), r"graph\.outputs"),
    ("tensor_values_key", "mlp", lambda d, p: put(graph_of(d)["tensor_values"], p, {}),
     "tensor_values key"),
    ("device", "mlp", lambda d, p: put(first_input(d)["device"], "type", p),
     r"device\.type"),
    ("custom_obj_values", "mlp",
     lambda d, p: put(graph_of(d), "custom_obj_values", {"o": {"name": "o", "class_fqn": p}}),
     "custom_obj_values"),
    ("unknown_graph_field", "mlp", lambda d, p: put(graph_of(d), "evil", p), r"graph\.evil"),
    ("graph_module_metadata", "mlp",
     lambda d, p: put(d["graph_module"], "metadata", {"custom": json.dumps(p)}),
     r"graph_module\.metadata"),
    ("treespec_namedtuple_fields", "mlp",
     lambda d, p: put(d["graph_module"], "treespec_namedtuple_fields",
                      {p: {"field_names": ["a"]}}), "treespec_namedtuple_fields"),
    ("parameter_name", "mlp",
     lambda d, p: put(d["graph_module"]["signature"]["input_specs"][0]["parameter"],
                      "parameter_name", f'net.0") or {p} or ("'), r"parameter_name"),
    ("parameter_name_dunder", "mlp",
     lambda d, p: put(d["graph_module"]["signature"]["input_specs"][0]["parameter"],
                      "parameter_name", "__class__"), r"parameter_name"),
    ("buffer_name", "batchnorm",
     lambda d, p: [put(s["buffer"], "buffer_name", p)
                   for s in d["graph_module"]["signature"]["input_specs"] if "buffer" in s],
     r"buffer_name"),
    ("tensor_constant_name", "constant",
     lambda d, p: [put(s["tensor_constant"], "tensor_constant_name", p)
                   for s in d["graph_module"]["signature"]["input_specs"]
                   if "tensor_constant" in s], r"tensor_constant_name"),
    ("input_spec_custom_obj", "mlp",
     lambda d, p: append(d["graph_module"]["signature"]["input_specs"], {"custom_obj": {
         "arg": {"name": "o", "class_fqn": p}, "custom_obj_name": "o"}}), r"input_specs\[\d\]"),
    ("input_spec_constant_input", "mlp",
     lambda d, p: append(d["graph_module"]["signature"]["input_specs"], {"constant_input": {
         "name": "c", "value": {"as_string": p}}}), r"input_specs\[\d\]"),
    ("output_spec_mutation", "mlp",
     lambda d, p: append(d["graph_module"]["signature"]["output_specs"], {"buffer_mutation": {
         "arg": {"name": "linear_1"}, "buffer_name": p}}), r"output_specs\[\d\]"),
    ("module_call_fqn", "mlp", lambda d, p: put(d["graph_module"]["module_call_graph"][1],
                                                "fqn", p), r"module_call_graph\[1\]\.fqn"),
    ("in_spec_dict_key", "mlp",
     lambda d, p: put(root_call(d), "in_spec", json.dumps([1, {
         "type": "builtins.dict", "context": json.dumps([p]), "children_spec": [LEAF]}])),
     r"in_spec"),
    ("out_spec_type", "mlp",
     lambda d, p: put(root_call(d), "out_spec", json.dumps([1, {
         "type": "collections.namedtuple", "context": json.dumps(p), "children_spec": []}])),
     r"out_spec"),
    ("forward_arg_names", "mlp", lambda d, p: put(root_call(d), "forward_arg_names", [p]),
     r"forward_arg_names\[0\]"),
    ("verifiers", "mlp", lambda d, p: put(d, "verifiers", [p]), r"verifiers\[0\]"),
    ("dialect", "mlp", lambda d, p: put(d, "dialect", p), r"dialect"),
    ("torch_version", "mlp", lambda d, p: put(d, "torch_version", p), r"torch_version"),
    ("opset_version", "mlp", lambda d, p: put(d, "opset_version", {p: 1}),
     r"opset_version key"),
    ("unknown_top_level_field", "mlp", lambda d, p: put(d, "evil", p), r"evil is"),
]


# names deserialize_operator would resolve: outside torch.ops, dunders, not an overload
TARGETS = ("torch.hub.load", "_operator.methodcaller", "math.factorial", "#evil:op",
           "builtins.eval", "torch.ops.aten.relu.__call__", "torch.ops.aten.relu.op",
           "torch.ops.higher_order.cond", "torch.ops.evil.op.default")
TAMPERED += [(f"target_{t}", "mlp", functools.partial(
    lambda t, d, p: put(graph_of(d)["nodes"][0], "target", t), t), r"nodes\[0\]\.target")
    for t in TARGETS]


@pytest.mark.parametrize("kind,change,field", [pytest.param(k, c, f, id=i)
                                               for i, k, c, f in TAMPERED])
def test_a_tampered_program_is_refused_before_torch_reads_it(kind, change, field, tmp_path):
    marker = tmp_path / "payload-ran"
    graph = tampered(kind, lambda d: change(d, code(marker)))
    with pytest.raises(UntrustedArtifactError) as info:
        load_as_read(kind, graph)
    text = str(info.value)
    assert text.startswith(f"{exported.GRAPH_FILE}: ") and re.search(field, text), text
    assert "trusted=True" in text and "trusted_loading()" in text and len(text) < 1000
    assert isinstance(info.value, SparkDDLError) and isinstance(info.value, ValueError)
    assert not marker.exists()  # and no module was built: there is nothing to call


def test_metadata_text_is_dropped_unread(tmp_path):
    """Debugging text torch would split and resolve (source_fn_stack names a function):
    sparkddl's export writes it, so it is accepted, and torch never sees it."""
    marker = tmp_path / "payload-ran"
    def change(d):
        for node in graph_of(d)["nodes"]:
            for key in ("stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn"):
                node["metadata"][key] = f"x,{code(marker)},torch.hub.load"
    loaded = load_as_read("mlp", tampered("mlp", change))
    module = exported_model("mlp")[0]
    x = torch.randn(4, 6)
    assert torch.allclose(loaded(x), module(x), atol=1e-6)
    assert not marker.exists()
    assert not any("hub" in str(node.meta.get(key, "")) for node in loaded.graph.nodes
                   for key in ("stack_trace", "nn_module_stack", "source_fn_stack"))


def test_strings_given_to_an_operator_stay_data(tmp_path):
    """gelu's ``approximate``: a string argument, written by fx with repr, never as code."""
    marker = tmp_path / "payload-ran"
    def change(d):
        [arg] = [i["arg"] for n in graph_of(d)["nodes"] for i in n["inputs"] if "as_string" in
                 i["arg"]]
        arg["as_string"] = f"tanh'); {code(marker)}; ('"
    loaded = load_as_read("constant", tampered("constant", change))
    with pytest.raises(RuntimeError, match="approximate"):
        loaded(torch.randn(2, 4))
    assert not marker.exists()


def test_a_program_that_is_not_json_is_refused():
    with pytest.raises(UntrustedArtifactError, match="not torch.export JSON.*trusted=True"):
        load_as_read("mlp", b"\x80not json")


# ---- the grammars ----

@pytest.mark.parametrize("text", [
    "s0", "8*s0", "2*s0 + 1", "s0//2", "-s0 + 3", "(s0 - 1)//2 + 1", "Min(8, 8*s0)",
    "Symbol('s77', positive=True, integer=True)",
    "Mul(Integer(8), Symbol('s77', positive=True, integer=True))",
    "Min(Integer(8), Mul(Integer(8), Symbol('s77', positive=True, integer=True)))",
    "FloorDiv(Add(Symbol('s1', integer=True), Integer(-1)), Integer(2))"])
def test_size_expressions_sparkddl_writes_are_accepted(text):
    assert _is_size_expr(text)


@pytest.mark.parametrize("text", [
    "", "x", "s0.__class__", "s0()", "s0; 1", "'s0'", "lambda: 0", "S.Half", "s0**2",
    "Integer(8)(1)", "Symbol(s0)", "Symbol('x', positive=True)", "Symbol('s0', evil=True)",
    "Symbol('s0', positive=__import__('os'))", "Function('f')(s0)", "Min(8,", "((s0)",
    "__import__('os').system('id')", "eval('1')", "s0 if 1 else 2", "(" * 3000 + "s0"])
def test_anything_else_is_not_a_size_expression(text):
    assert not _is_size_expr(text)


def test_treespecs_are_tensors_in_tuples_and_an_empty_kwargs_dict():
    tuple_of = {"type": "builtins.tuple", "context": "null", "children_spec": [LEAF, LEAF]}
    kwargs = {"type": "builtins.dict", "context": "[]", "children_spec": []}
    root = {"type": "builtins.tuple", "context": "null", "children_spec": [tuple_of, kwargs]}
    assert _is_treespec(json.dumps([1, root])) and _is_treespec(json.dumps([1, LEAF]))
    for bad in ([1, {**kwargs, "context": '["x\')"]'}], [2, LEAF], [1, {**LEAF, "type": "x"}],
                [True, LEAF], [1, {**LEAF, "extra": 1}]):
        assert not _is_treespec(json.dumps(bad))
    assert not _is_treespec("not json") and not _is_treespec(None)
