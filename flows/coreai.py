"""The stock Core AI flow: what executorch 1.5.1's Core AI backend does out of the box.

The ExecuTorch runtime has no Core AI backend, so programs from this flow run
in etprop's Core AI interpreter (``etprop.lowering.coreai_runtime``), which executes the
delegates on Apple's Linux Core AI runtime from coreai-core.

executorch and coreai are imported inside the factories, so the registry loads
on machines without the ``coreai`` extra; the flow then reports itself
unavailable with the install hint.
"""

from __future__ import annotations

from etprop.flows import register
from etprop.flows.base import Flow, Promises

# Repro-script recipe: the stock partitioner, then what every Core AI flow's
# script shares (candidates/coreai_multifunction.py reuses the tail).
COREAI_RECIPE_TAIL = """
def transform_passes():
    from executorch.backends.apple.coreai import get_default_passes

    return get_default_passes()


def compile_config():
    from executorch.backends.apple.coreai import get_default_compile_config

    return get_default_compile_config()


def make_runner(pte, program):
    # ExecuTorch's runtime has no Core AI backend: etprop's bridge runs the
    # delegates on coreai-core (and the ops around them with torch).
    from etprop.lowering.coreai_runtime import CoreAIProgram

    runner = CoreAIProgram(program, pte)
    return lambda name, args: runner.run(name, list(args))
"""

COREAI_RECIPE = (
    """
def partitioners():
    from executorch.backends.apple.coreai import CoreAIPartitioner

    return [CoreAIPartitioner()]

"""
    + COREAI_RECIPE_TAIL
)


def _partitioners() -> list:
    from executorch.backends.apple.coreai import CoreAIPartitioner

    return [CoreAIPartitioner()]


def _transform_passes() -> list:
    from executorch.backends.apple.coreai import get_default_passes

    return get_default_passes()


def _compile_config():
    from executorch.backends.apple.coreai import get_default_compile_config

    return get_default_compile_config()


COREAI = register(
    Flow(
        name="coreai",
        description="Stock CoreAIPartitioner with the backend's default passes and compile config "
        "(executorch 1.5.1, coreai-torch 0.4.2); delegates run on coreai-core's Linux runtime",
        partitioners=_partitioners,
        transform_passes=_transform_passes,
        compile_config=_compile_config,
        runtime="coreai",
        repro_recipe=COREAI_RECIPE,
        # coreai_torch converts at lowering time; coreai (coreai-core) runs the bundles.
        requires=("coreai_torch", "coreai.runtime"),
        install_hint="pip install 'etprop[coreai]'",
        baseline="portable",
        # Each delegate embeds its own bundle with its weights as constants, so
        # methods sharing weights do not share a payload or a cache key.
        promises=Promises(shared_cache=False, weights_stored_once=False),
    )
)
