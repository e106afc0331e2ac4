"""The kernel contract's parametrisation: each `KernelContract` test runs once for every (case, implementation)
pair of its class's op that can run the case (`kernel_contract.Case.runs_on`)."""

import pytest

from kernel_contract import PLATFORM, KernelContract
from lra_jax.kernels import pallas_available, tpu_available

AVAILABLE = {"gpu": pallas_available, "tpu": tpu_available}


def pytest_generate_tests(metafunc):
    cls = metafunc.cls
    if cls is None or not issubclass(cls, KernelContract) or "implementation" not in metafunc.fixturenames:
        return
    name = metafunc.function.__name__
    bfloat16 = name == "test_bfloat16_within_its_rounding"
    compiled = name == "test_compiled_matches_the_reference"
    params = []
    for case_name in (cls.bfloat16_cases if bfloat16 else cls.cases):
        case = cls.cases[case_name]
        for implementation in cls.op.implementations[1:]:  # the Pallas kernels, after the XLA form
            if not case.runs_on(implementation, "bfloat16" if bfloat16 else "float32", interpreted=not compiled):
                continue
            platform = PLATFORM[implementation.backend]
            if compiled:
                marks = [pytest.mark.skipif(not AVAILABLE[platform](), reason=f"compiled on a {platform.upper()} only")]
            else:
                fast = case.fast and implementation.backend == "triton" and not bfloat16
                marks = [] if fast else [pytest.mark.slow]
            params.append(pytest.param(case, implementation, marks=marks, id=f"{case_name}-{implementation.name}"))
    metafunc.parametrize("case,implementation", params)
