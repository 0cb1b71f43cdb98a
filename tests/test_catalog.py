"""``catalog()`` and ``execute()``: names, lookups and the errors that guide a caller."""

import inspect

import numpy as np
import pytest

import steadystep

EXPECTED = {
    "autograd_graph": 11,
    "autograd_ops": 10,
    "gradient_descent": 10,
    "training_stability": 10,
    "numerical_stability": 12,
}


def test_catalog_lists_every_function_of_every_module():
    entries = steadystep.catalog()
    counts = {}
    for entry in entries:
        counts[entry["module"]] = counts.get(entry["module"], 0) + 1
        assert entry["description"] and entry["formula"], entry
        assert entry["targets"] == ["cpu", "cuda"]
        function = getattr(getattr(steadystep, entry["module"]), entry["function"])
        assert list(inspect.signature(function).parameters)[: len(entry["parameters"])] == entry["parameters"]
    assert counts == EXPECTED


def test_public_functions_mirror_the_formula_sources():
    for module in steadystep.registry.MODULES:
        public = getattr(steadystep, module)
        source = __import__(f"steadystep.kernels.{module}", fromlist=["_"])
        formulas = [
            name
            for name, value in vars(source).items()
            if inspect.isfunction(value) and value.__module__ == source.__name__ and not name.startswith("_")
        ]
        formulas += [row.name for row in getattr(source, "ROWS", ())]
        assert sorted(public.__all__) == sorted(formulas)


@pytest.mark.parametrize(
    "module, function, message",
    [
        ("gradient_decent", "sgd_update", "did you mean gradient_descent"),
        ("gradient_descent", "adam_updat", "did you mean adam_update"),
        ("gradient_descent", "zzz", "gradient_descent has sgd_update"),
        ("nothing_like_it", "x", "modules: autograd_graph"),
    ],
)
def test_unknown_names_raise_key_error_with_suggestions(module, function, message):
    with pytest.raises(KeyError, match=message):
        steadystep.execute(module, function, [1.0])


def test_execute_returns_lists_for_list_arguments():
    result = steadystep.execute("gradient_descent", "sgd_update", [[1.0, 2.0], [0.5, 1.0], 0.1])
    assert result == {"result": [1.0 - 0.1 * 0.5, 2.0 - 0.1 * 1.0]}


def test_execute_rejects_the_wrong_number_of_arguments():
    with pytest.raises(TypeError, match="missing a required argument: 'grad'"):
        steadystep.execute("gradient_descent", "sgd_update", [1.0])


@pytest.mark.parametrize("args", ["1.0, 0.5, 0.1", None, 1.0])
def test_execute_names_arguments_that_are_not_a_list_or_a_dict(args):
    # a string was read as one argument per character ("too many positional arguments")
    with pytest.raises(
        TypeError, match="args must be a list of gradient_descent.sgd_update's arguments in order, or a dict"
    ):
        steadystep.execute("gradient_descent", "sgd_update", args)


def test_execute_takes_a_tuple_like_a_list():
    assert steadystep.execute("gradient_descent", "sgd_update", (1.0, 0.5, 0.1)) == {"result": 0.95}


def test_public_signature_and_docstring_show_the_formula():
    function = steadystep.gradient_descent.adamw_update
    parameters = inspect.signature(function).parameters
    assert list(parameters) == ["param", "m_hat", "v_hat", "lr", "eps", "weight_decay", "out", "target"]
    assert parameters["out"].kind is inspect.Parameter.KEYWORD_ONLY
    assert "param·(1 − lr·weight_decay) − lr·m_hat/(√v_hat + eps)" in function.__doc__
    assert function.__module__ == "steadystep.gradient_descent"


def test_numpy_results_for_numpy_inputs():
    assert isinstance(steadystep.autograd_ops.grad_add(np.ones(2)), np.ndarray)
