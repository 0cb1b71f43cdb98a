"""The seed's worked examples through ``execute``: the printed float, to the last bit."""

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

    assert main() == 0
    printed = capsys.readouterr().out
    for example in EXAMPLES:
        assert f"{example.module}.{example.function}({_brief(example.args)}) = {example.expected!r}" in printed
    for entry in steadystep.catalog():
        assert f"{entry['function']}({', '.join(entry['parameters'])})" in printed
