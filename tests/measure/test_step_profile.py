"""step_profile: the kinds of a compiled step's ops, the FLOPs of its dots, and their profiled times."""

import jax
import jax.numpy as jnp
import pytest

from lra_jax.measure import step_profile


def compiled_of(fn, *args):
    return jax.jit(fn).lower(*args).compile()


def kinds_of(compiled) -> dict[str, set[str]]:
    """kind -> the top-level instructions of that kind (the entry computation's, arguments and results aside)."""
    module = step_profile.Module(compiled.as_text())
    entry = next(c for c in module.body if compiled.as_text().count(f"ENTRY %{c} "))
    found: dict[str, set[str]] = {}
    for name in module.body[entry]:
        if module.opcode[name] in ("parameter", "constant", "tuple", "get-tuple-element", "bitcast"):
            continue
        kind = module.kind(name)
        if kind is not None:
            found.setdefault(kind, set()).add(name)
    return found


def test_dots_are_matmuls_with_their_flops_and_contraction_size():
    """[b, m, k] x [b, k, n]: 2 b m n k FLOPs, contraction k, whether XLA fuses the product or not."""
    b, m, k, n = 3, 40, 24, 56
    compiled = compiled_of(lambda x, y: jnp.tanh(jnp.einsum("bmk,bkn->bmn", x, y)) * 2.0,
                           jnp.ones((b, m, k)), jnp.ones((b, k, n)))
    module = step_profile.Module(compiled.as_text())
    dots = [name for name in module.opcode if name in module.flops]
    assert len(dots) == 1
    assert module.flops[dots[0]] == 2.0 * b * m * n * k and module.contraction[dots[0]] == k
    assert "matmul" in kinds_of(compiled)


def test_ops_without_a_dot_get_the_kind_of_what_they_compute():
    x = jnp.linspace(-1.0, 1.0, 4096).reshape(64, 64)
    assert set(kinds_of(compiled_of(lambda a: jnp.exp(a).sum(axis=0), x))) == {"transcendental"}
    assert set(kinds_of(compiled_of(lambda a: jnp.maximum(a, 0.0) + a * a, x))) == {"elementwise"}
    assert set(kinds_of(compiled_of(lambda a: jnp.sort(a, axis=-1), x))) == {"sort"}
    assert "gather" in kinds_of(compiled_of(lambda a, i: a[i], x, jnp.arange(0, 64, 3)))
    assert "fft" in kinds_of(compiled_of(lambda a: jnp.fft.fft(a).real, x))


def test_a_loops_ops_are_timed_not_the_loop():
    def loop(a):
        return jax.lax.fori_loop(0, 3, lambda i, c: jnp.tanh(c @ a), a)

    compiled = compiled_of(loop, jnp.ones((32, 32)))
    module = step_profile.Module(compiled.as_text())
    loops = [name for name, op in module.opcode.items() if op == "while"]
    assert loops and all(module.kind(name) is None for name in loops)
    body_ops = {module.kind(name) for c in module.body if "body" in c or "region" in c for name in module.body[c]}
    assert "matmul" in body_ops


@pytest.mark.slow
def test_profile_times_the_ops_of_one_run_by_kind():
    """A product of [512, 256] x [256, 512] and elementwise work on its output: the profiler's ops add
    up to the matmul's kind and the others, and the matmul's FLOPs are exact."""
    a, b = jnp.ones((512, 256)), jnp.ones((256, 512))
    fn = jax.jit(lambda x, y: jnp.sort(jnp.exp(x @ y) + 1.0, axis=-1))
    compiled = fn.lower(a, b).compile()
    compiled(a, b).block_until_ready()
    result = step_profile.profile(compiled, lambda: compiled(a, b))
    kinds = result["seconds_by_kind"]
    assert set(kinds) == set(step_profile.KINDS)
    assert kinds["matmul"] > 0 and kinds["sort"] > 0
    assert result["op_seconds"] == pytest.approx(sum(kinds.values()))
    assert 0 < result["op_seconds"] <= result["profiled_wall_seconds"]
    assert result["unmatched_seconds"] == 0
    assert result["matmuls_by_contraction"]["256"]["flops"] == 2.0 * 512 * 512 * 256
    assert result["matmuls_by_contraction"]["256"]["seconds"] > 0
