"""The seed's worked examples through ``execute``: the printed float, to the last bit."""

import math

import pytest

import steadystep
from steadystep.examples import EXAMPLES


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: f"{e.module}.{e.function}{tuple(e.args)}"[:60])
def test_worked_example_is_bit_exact(example, target):
    with steadystep.use_target(target):
        result = steadystep.execute(example.module, example.function, example.args)
    assert result == {"result": example.expected}
    assert type(result["result"]) is type(example.expected)


def test_main_job_prints_every_example_and_succeeds(capsys):
    from steadystep.__main__ import _brief, main
    from steadystep.registry import positional

    assert main([]) == 0
    printed = capsys.readouterr().out
    for example in EXAMPLES:
        arguments = _brief(positional(example.module, example.function, example.args))
        assert f"{example.module}.{example.function}({arguments}) = {example.expected!r}" in printed
    for entry in steadystep.catalog():
        assert f"{entry['function']}({', '.join(entry['parameters'])})" in printed


def test_execute_takes_arguments_by_name_and_rows_in_either_form():
    by_name = steadystep.execute("gradient_descent", "sgd_update", {"param": 1.0, "grad": 0.5, "lr": 0.1})
    assert by_name == {"result": 0.95}
    for row in ([1.0, 2.0, 3.0], [[1.0, 2.0, 3.0]]):  # as the seed writes it, or as the one argument
        assert steadystep.execute("numerical_stability", "kahan_sum", row) == {"result": 6.0}
    assert steadystep.execute("numerical_stability", "logsumexp", []) == {"result": float("-inf")}
    batch = steadystep.execute("numerical_stability", "logsumexp", [[[0.0, 0.0], [1.0, 1.0]]])
    assert batch == {"result": [math.log(2.0), 1.0 + math.log(2.0)]}
