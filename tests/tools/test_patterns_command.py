"""`python -m lra_jax.tools.patterns` through its main: the maps of the variants asked, one PNG per family, one line
per map; bad input is one line and exit 2."""

import pytest

from lra_jax.research.reports import dependence_figure
from lra_jax.tools import patterns as command


def test_the_command_draws_one_png_per_family_and_a_line_per_map(tmp_path, capsys):
    assert command.main(["--variants=softmax,local", f"--out={tmp_path}", "--length=16"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "softmax: each output depends on all 16 inputs"
    assert out[1].startswith("softmax, causal: each output depends on 8.5 of the 16 inputs on average")
    assert out[1].endswith("no output depends on a later input (exactly zero)")
    assert out[2].startswith("local: each output depends on") and out[3].startswith("local, causal:")
    pngs = sorted(p.name for p in tmp_path.iterdir())
    assert pngs == ["fixed-sparse-patterns.png", "full-attention.png"]
    assert out[4:] == [f"wrote {tmp_path / 'full-attention.png'}", f"wrote {tmp_path / 'fixed-sparse-patterns.png'}"]
    for name in pngs:
        assert dependence_figure.carried_digest(str(tmp_path / name)).startswith("sha256:")


@pytest.mark.parametrize("argv, message", [
    (["--variants=nonesuch"], "unknown attention variant 'nonesuch'"),
    (["--variants=softmax", "--length=4096"], "--length=4096 is outside 16..256"),
    (["--variants=,"], "--variants names no variant"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        command.main(argv + [f"--out={tmp_path}"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []
